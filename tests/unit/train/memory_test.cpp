// train/memory.h: the peak RSS follows what the test itself touches, and a reset starts a new
// interval (where the kernel allows it).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "mllm/train/memory.h"

namespace mllm {
namespace {

TEST(PeakMemory, FollowsTouchedMemoryAndResets) {
  const torch::Device cpu(torch::kCPU);
  reset_peak_memory(cpu);
  const PeakMemory before = peak_memory(cpu);
  ASSERT_GT(before.rss_bytes, 0);
  EXPECT_EQ(before.device_allocated_bytes, -1);  // no CUDA device
  constexpr size_t kBytes = size_t(256) << 20;
  {
    std::unique_ptr<char[]> block(new char[kBytes]);
    std::memset(block.get(), 1, kBytes);  // resident now
    const PeakMemory during = peak_memory(cpu);
    EXPECT_GE(during.rss_bytes - before.rss_bytes, int64_t(kBytes) * 9 / 10);
  }
  // Freed (a block this large is returned to the system at once: mmap'ed by malloc).
  reset_peak_memory(cpu);
  const PeakMemory after = peak_memory(cpu);
  if (!after.rss_resettable) GTEST_SKIP() << "/proc/self/clear_refs refused here";
  EXPECT_LT(after.rss_bytes, before.rss_bytes + int64_t(kBytes) / 2);
}

}  // namespace
}  // namespace mllm
