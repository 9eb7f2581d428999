// train.sync_debug's collector (train/sync_debug.h) on the CPU: LibTorch's sync-debug warning,
// raised here with TORCH_WARN as c10/cuda/CUDAFunctions.h raises it, is counted per call stack
// and phase; other warnings go on to the handler installed before; the report sums it up.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include "mllm/train/device.h"
#include "mllm/train/sync_debug.h"

namespace {

// A handler that only remembers what reached it.
struct Remember : c10::WarningHandler {
  std::vector<std::string> seen;
  void process(const c10::Warning& w) override { seen.push_back(w.msg()); }
};

// Two distinct call sites of the same warning (noinline: separate frames on the stack).
__attribute__((noinline)) void sync_site_a() { TORCH_WARN("called a synchronizing CUDA operation"); }
__attribute__((noinline)) void sync_site_b() { TORCH_WARN("called a synchronizing CUDA operation"); }
// One call site for `n` warnings (a trip count the compiler cannot see, so no copies of the call).
volatile int g_three = 3;
__attribute__((noinline)) void sync_site_a_times(int n) {
  for (int i = 0; i < n; ++i) sync_site_a();
}

}  // namespace

TEST(SyncDebug, CountsSyncWarningsPerStackAndPhaseAndPassesOthersOn) {
  Remember before;
  c10::WarningUtils::WarningHandlerGuard guard(&before);
  mllm::SyncDebug debug;
  ASSERT_TRUE(debug.start(/*cuda=*/false));
  EXPECT_TRUE(debug.active());
  debug.set_phase("forward");
  sync_site_a_times(g_three);
  sync_site_b();
  debug.set_phase("optimizer");
  sync_site_a_times(1);
  TORCH_WARN("something else entirely");
  debug.stop();
  EXPECT_FALSE(debug.active());
  sync_site_a();  // after stop: back to the previous handler

  ASSERT_EQ(before.seen.size(), 2u);
  EXPECT_EQ(before.seen[0], "something else entirely");
  EXPECT_EQ(before.seen[1], "called a synchronizing CUDA operation");

  const auto sites = debug.sites();
  // (forward, a) x3, (forward, b) x1, (optimizer, a) x1; most frequent first.
  ASSERT_EQ(sites.size(), 3u);
  EXPECT_EQ(sites[0].phase, "forward");
  EXPECT_EQ(sites[0].count, 3);
  EXPECT_EQ(sites[1].count + sites[2].count, 2);
  for (const auto& s : sites) {
    ASSERT_FALSE(s.stack.empty());
    for (const auto& f : s.stack) {
      EXPECT_EQ(f.find("c10::warn"), std::string::npos) << f;  // the machinery is cut off
      EXPECT_EQ(f.find("(0x"), std::string::npos) << f;        // no absolute addresses
    }
  }
  EXPECT_NE(sites[0].stack, sites[1].phase == "forward" ? sites[1].stack : sites[2].stack);

  const auto report = debug.report(/*steps=*/2);
  EXPECT_EQ(report["steps"], 2);
  EXPECT_EQ(report["total"], 5);
  EXPECT_DOUBLE_EQ(report["per_step"].get<double>(), 2.5);
  ASSERT_EQ(report["sites"].size(), 3u);
  EXPECT_DOUBLE_EQ(report["sites"][0]["per_step"].get<double>(), 1.5);
  EXPECT_EQ(report["sites"][0]["phase"], "forward");
}

TEST(SyncDebug, CleansC10Backtraces) {
  const std::string bt =
      "frame #0: c10::get_backtrace[abi:cxx11](unsigned long, unsigned long, bool) + 0x5c (0x7f01 in /x/libc10.so)\n"
      "frame #1: mllm::SyncDebug::process(c10::Warning const&) + 0x3a (0x7f02 in /x/libmllm.so)\n"
      "frame #2: c10::warn(c10::Warning const&) + 0x9 (0x7f03 in /x/libc10.so)\n"
      "frame #3: c10::cuda::warn_or_error_on_sync() + 0x61 (0x7f07 in /x/libc10_cuda.so)\n"
      "frame #3: at::native::_local_scalar_dense_cuda(at::Tensor const&) + 0x1ab (0x7f04 in /x/libtorch_cuda.so)\n"
      "frame #4: <unknown function> + 0x123 (0x7f05 in /x/libtorch_cpu.so)\n"
      "frame #5: mllm::Trainer::train_step() + 0x77 (0x7f06 in /y/libmllm.so)\n";
  const auto frames = mllm::clean_backtrace(bt);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "at::native::_local_scalar_dense_cuda(at::Tensor const&) + 0x1ab (in libtorch_cuda.so)");
  EXPECT_EQ(frames[1], "<unknown function> + 0x123 (in libtorch_cpu.so)");
  EXPECT_EQ(frames[2], "mllm::Trainer::train_step() + 0x77 (in libmllm.so)");
  EXPECT_TRUE(mllm::is_sync_debug_warning("called a synchronizing CUDA operation"));
  EXPECT_FALSE(mllm::is_sync_debug_warning("called a CUDA operation"));
}

TEST(SyncDebug, CudaModeNeedsALibTorchWithCuda) {
  // This build's LibTorch has CUDA (the torch wheel): switching the mode works without a GPU (it
  // is a flag); the handler is installed either way.
  if (!mllm::libtorch_has_cuda()) GTEST_SKIP() << "a CPU-only LibTorch";
  mllm::SyncDebug debug;
  EXPECT_TRUE(debug.start(/*cuda=*/true));
  debug.stop();
}
