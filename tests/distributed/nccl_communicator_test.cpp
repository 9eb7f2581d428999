// The nccl backend through LibTorch (GPU builds only): collectives on CUDA tensors ordered with
// LibTorch's current stream, CPU tensors over MPI, and one DataParallel step on CUDA against a
// CPU single-process reference. One GPU per rank.
#include <cmath>

#include <gtest/gtest.h>

#include "distributed/tiny_lm.h"
#include "mllm/core/error.h"
#include "mllm/distributed/data_parallel.h"
#include "mllm/distributed/mpi_communicator.h"

using namespace mllm;

namespace {
std::shared_ptr<Communicator> nccl_world() {
  static std::shared_ptr<Communicator> comm = [] {
    DistConfig cfg;
    cfg.backend = "nccl";
    cfg.timeout_s = 60;
    return make_communicator(cfg, /*want_cuda=*/true);
  }();
  return comm;
}
torch::Device my_device() { return torch::Device(torch::kCUDA, nccl_world()->local_rank()); }
}  // namespace

TEST(NcclCommunicator, WorldMatchesLauncher) {
  const char* want = std::getenv("MLLM_TEST_WORLD_SIZE");
  ASSERT_TRUE(want);
  EXPECT_EQ(nccl_world()->world_size(), std::atoi(want));
  EXPECT_EQ(nccl_world()->backend(), "nccl");
  DistConfig cfg;  // auto + CUDA model -> nccl
  EXPECT_EQ(make_communicator(cfg, true)->backend(), "nccl");
}

TEST(NcclCommunicator, AllReduceOnCurrentStreamWithoutHostSync) {
  auto c = nccl_world();
  const int n = c->world_size(), r = c->rank();
  // Produced by a kernel on LibTorch's current stream, consumed by another: no synchronize.
  auto t = torch::full({1 << 20}, static_cast<float>(r + 1), torch::TensorOptions().device(my_device()));
  t.mul_(2.0f);
  auto w = c->all_reduce_async(t, ReduceOp::kSum);
  w->wait();
  auto s = t.sum().item<double>();
  EXPECT_DOUBLE_EQ(s, (1 << 20) * 2.0 * n * (n + 1) / 2.0);
  auto cpu = torch::full({3}, static_cast<double>(r), torch::kDouble);  // goes over MPI
  c->all_reduce(cpu, ReduceOp::kMax);
  EXPECT_EQ(cpu[0].item<double>(), n - 1);
  auto b = torch::full({5}, static_cast<float>(r), torch::TensorOptions().device(my_device()));
  c->broadcast(b, n - 1);
  EXPECT_EQ(b.cpu()[4].item<float>(), static_cast<float>(n - 1));
}

TEST(NcclCommunicator, OutOfPlaceCollectiveOrderedAfterSlowKernelsOnTheCurrentStream) {
  // Meaningful at world size 1 too, where an in-place all-reduce changes nothing: all_gather
  // copies `input` into `output`. `input` gets its new value only after ~50 ms of matrix products
  // queued on LibTorch's current stream, so NCCL must wait for that stream; `output` is read on
  // the current stream after wait(), with no host synchronisation in between.
  auto c = nccl_world();
  const int n = c->world_size(), r = c->rank();
  const auto opts = torch::TensorOptions().device(my_device());
  const int64_t per_rank = 1 << 16;
  auto input = torch::full({per_rank}, -1.0f, opts);
  auto output = torch::full({per_rank * n}, -2.0f, opts);
  auto big = torch::randn({4096, 4096}, opts);
  torch::cuda::synchronize();
  auto x = big;
  for (int i = 0; i < 20; ++i) x = torch::mm(x, big) * 1e-3;  // slow, on the current stream
  input.fill_(static_cast<float>(r + 1)).add_(x.sum() * 0.0f);  // written after the products
  c->all_gather_async(input, output)->wait();
  auto got = output.view({n, per_rank}).cpu();
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(got[q].min().item<float>(), static_cast<float>(q + 1)) << "rank " << q << "'s slice";
    EXPECT_EQ(got[q].max().item<float>(), static_cast<float>(q + 1)) << "rank " << q << "'s slice";
  }
}

TEST(NcclCommunicator, DataParallelStepMatchesCpuReference) {
  auto c = nccl_world();
  const int n = c->world_size(), r = c->rank();
  std::vector<int64_t> real;
  for (int i = 0; i < 2 * n; ++i) real.push_back(1 + (i * 3) % 10);
  auto g = mllm::test::make_batch(real, 10, 13, 7);
  auto ref = mllm::test::make_tiny_lm(3);
  mllm::test::mean_loss(*ref, g.inputs, g.targets).backward();

  auto model = mllm::test::make_tiny_lm(3 + r);
  model->to(my_device());
  DataParallel dp(model, c, 1024);
  dp.broadcast_and_verify();
  auto mb = mllm::test::slice(g, 2 * r, 2);
  const double scale = dp.loss_scale(mb.real_tokens);
  (mllm::test::summed_loss(*model, mb.inputs.to(my_device()), mb.targets.to(my_device())) * scale)
      .backward();
  dp.finish_gradient_sync();
  auto rp = ref->named_parameters();
  for (const auto& kv : model->named_parameters()) {
    auto got = kv.value().grad().cpu();
    const auto& want = rp[kv.key()].grad();
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>())
        << kv.key();
    auto hashes = c->all_gather(mllm::test::bytes_hash(got));
    for (const auto& h : hashes) EXPECT_EQ(h, hashes[0]) << kv.key();
  }
}

TEST(MpiCommunicator, StagesCudaTensorsThroughPinnedHostMemory) {
  // The mpi backend with CUDA tensors (ranks sharing a GPU, no NCCL): the device-to-host copy is
  // queued without blocking the caller and must still see the kernel queued before it.
  auto world = nccl_world();  // the MPI world is up, one GPU per rank
  auto m = std::make_shared<MpiCommunicator>(60.0);
  const int n = m->world_size(), r = m->rank();
  auto t = torch::full({1 << 18}, static_cast<float>(r + 1), torch::TensorOptions().device(my_device()));
  t.mul_(3.0f);  // queued on the current stream before the all-reduce reads t
  m->all_reduce_async(t, ReduceOp::kSum)->wait();
  EXPECT_DOUBLE_EQ(t.sum().item<double>(), (1 << 18) * 3.0 * n * (n + 1) / 2.0);
  // bfloat16 goes through a float32 host copy; 0.5 * n is exact in bf16 for small n.
  auto h = torch::full({1000}, 0.5, torch::TensorOptions().dtype(torch::kBFloat16).device(my_device()));
  m->all_reduce_async(h, ReduceOp::kSum)->wait();
  EXPECT_EQ(h.to(torch::kFloat).cpu()[999].item<float>(), 0.5f * n);
}

// ZeRO's collectives on CUDA: the reduce-scatter slice and the all-gather against the same
// collectives of the mpi backend on CPU copies (rank-ordered sums; NCCL's order may differ, so
// float32 values are small integers, exact in any order), on a size that divides the world and
// one that does not (NCCL's equal-count calls on a zero-padded buffer).
TEST(NcclCommunicator, ReduceScatterAndAllGatherMatchMpi) {
  auto c = nccl_world();
  const int n = c->world_size(), r = c->rank();
  for (int64_t numel : {int64_t{4} * n, int64_t{4} * n + 3}) {
    auto cpu = torch::arange(numel, torch::kFloat).fmod(7) + r;  // integers: exact sums
    const ShardRange mine = shard_range(numel, n, r);
    auto gpu_out = torch::zeros({mine.numel()}, torch::TensorOptions().device(my_device()));
    c->reduce_scatter_async(cpu.to(my_device()), gpu_out, ReduceOp::kSum)->wait();
    torch::Tensor want = torch::zeros({mine.numel()});
    for (int q = 0; q < n; ++q) want += torch::arange(numel, torch::kFloat).fmod(7).narrow(0, mine.begin, mine.numel()) + q;
    EXPECT_TRUE(torch::equal(gpu_out.cpu(), want)) << "numel " << numel;
    auto gathered = torch::full({numel}, -1.0f, torch::TensorOptions().device(my_device()));
    c->all_gather_async(gpu_out, gathered)->wait();
    for (int q = 0; q < n; ++q) {
      const ShardRange s = shard_range(numel, n, q);
      torch::Tensor slice = torch::zeros({s.numel()});
      for (int k = 0; k < n; ++k) slice += torch::arange(numel, torch::kFloat).fmod(7).narrow(0, s.begin, s.numel()) + k;
      EXPECT_TRUE(torch::equal(gathered.cpu().narrow(0, s.begin, s.numel()), slice)) << "rank " << q;
    }
  }
}
