// The mpi backend under mpirun: every collective against values each rank computes for all
// ranks by hand, including the exact (rank-ordered) floating-point sum on both reduction paths.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "distributed/mpi_test_util.h"
#include "mllm/core/error.h"
#include "mllm/distributed/mpi_communicator.h"
#include "mllm/distributed/mpi_runtime.h"

using namespace mllm;
using mllm::test::world;

namespace {

// Rank r's value at element i: magnitudes from 1e-3 to 1e3 and both signs, so the order of a
// float sum changes its last bits.
float value(int r, int64_t i) {
  const double base = static_cast<double>((r * 7919 + i * 104729) % 1000003) / 997.0;
  const double mag = std::pow(10.0, static_cast<double>(i % 7) - 3.0);
  return static_cast<float>(((r + i) % 2 ? -1.0 : 1.0) * base * mag);
}

}  // namespace

TEST(MpiCommunicator, WorldMatchesLauncher) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  EXPECT_EQ(c->backend(), "mpi");
  // ctest runs every rank on this machine: the shared-memory split is the whole world.
  EXPECT_EQ(c->local_size(), c->world_size());
  EXPECT_EQ(c->local_rank(), c->rank());
  DistConfig cfg;  // auto under mpirun -> mpi
  EXPECT_EQ(make_communicator(cfg)->backend(), "mpi");
}

TEST(MpiCommunicator, AllReduceOps) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  const double tri = n * (n + 1) / 2.0;  // sum of r + 1 over ranks
  auto t = torch::tensor({static_cast<float>(r + 1), -2.0f * r});
  c->all_reduce(t, ReduceOp::kSum);
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(tri));
  EXPECT_EQ(t[1].item<float>(), static_cast<float>(-2.0 * (tri - n)));
  auto a = torch::tensor({static_cast<double>(r + 1)}, torch::kDouble);
  c->all_reduce(a, ReduceOp::kAvg);
  EXPECT_DOUBLE_EQ(a.item<double>(), tri / n);
  auto mx = torch::tensor({static_cast<int64_t>(r * 10), static_cast<int64_t>(-r)}, torch::kLong);
  auto mn = mx.clone();
  c->all_reduce(mx, ReduceOp::kMax);
  c->all_reduce(mn, ReduceOp::kMin);
  EXPECT_EQ(mx[0].item<int64_t>(), 10 * (n - 1));
  EXPECT_EQ(mx[1].item<int64_t>(), 0);
  EXPECT_EQ(mn[0].item<int64_t>(), 0);
  EXPECT_EQ(mn[1].item<int64_t>(), -(n - 1));
  auto i32 = torch::full({3}, r + 1, torch::kInt);
  c->all_reduce(i32, ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(i32, torch::full({3}, static_cast<int>(tri), torch::kInt)));
}

TEST(MpiCommunicator, StagedTensorsNonContiguousAndHalf) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  // A transposed view: reduced through a contiguous copy and written back through the view.
  auto base = torch::arange(6, torch::kFloat).reshape({2, 3}) * static_cast<float>(r + 1);
  auto view = base.t();
  c->all_reduce(view, ReduceOp::kSum);
  const float tri = n * (n + 1) / 2.0f;
  EXPECT_TRUE(torch::equal(base, torch::arange(6, torch::kFloat).reshape({2, 3}) * tri));
  auto bf = torch::full({4}, static_cast<float>(r + 1), torch::kBFloat16);
  c->all_reduce(bf, ReduceOp::kSum);
  EXPECT_EQ(bf.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(bf[0].item<float>(), tri);  // small integers are exact in bfloat16
}

TEST(MpiCommunicator, FloatSumIsInRankOrderOnBothPaths) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  // 1000 floats take the all-gather path, 100003 (not a multiple of n) the all-to-all path.
  for (int64_t count : {int64_t{1000}, int64_t{100003}}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      auto t = torch::empty({count}, torch::kFloat);
      auto expect = torch::empty({count}, torch::kFloat);
      float* p = t.data_ptr<float>();
      float* e = expect.data_ptr<float>();
      for (int64_t i = 0; i < count; ++i) {
        p[i] = value(r, i);
        float acc = value(0, i);
        for (int q = 1; q < n; ++q) acc = acc + value(q, i);
        e[i] = op == ReduceOp::kAvg ? acc / static_cast<float>(n) : acc;
      }
      c->all_reduce(t, op);
      EXPECT_EQ(std::memcmp(t.data_ptr(), expect.data_ptr(), count * sizeof(float)), 0)
          << "count " << count << " op " << reduce_op_name(op);
    }
  }
}

TEST(MpiCommunicator, AsyncHandlesCompleteInAnyWaitOrder) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  std::vector<torch::Tensor> ts;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(torch::full({50000}, static_cast<float>(k * n + r)));
    works.push_back(c->all_reduce_async(ts.back(), ReduceOp::kSum));
  }
  for (int k = 3; k >= 0; --k) works[k]->wait();
  works[0]->wait();  // again: returns at once
  for (int k = 0; k < 4; ++k) {
    const float want = static_cast<float>(k * n * n + n * (n - 1) / 2);
    EXPECT_EQ(ts[k][0].item<float>(), want);
    EXPECT_EQ(ts[k][49999].item<float>(), want);
  }
}

TEST(MpiCommunicator, BroadcastBarrierAndGathers) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  const int64_t before = c->collectives_issued();
  auto t = torch::full({3, 5}, static_cast<double>(r), torch::kDouble);
  c->broadcast(t, n - 1);
  EXPECT_TRUE(torch::equal(t, torch::full({3, 5}, static_cast<double>(n - 1), torch::kDouble)));
  auto col = torch::full({4, 4}, static_cast<float>(r)).select(1, 2);  // strided view
  c->broadcast(col, 1);
  EXPECT_TRUE(torch::equal(col, torch::full({4}, 1.0f)));
  c->barrier();
  auto ints = c->all_gather(static_cast<int64_t>(100 + r));
  auto dbls = c->all_gather(0.5 * r);
  auto strs = c->all_gather(std::string("rank-") + std::string(static_cast<size_t>(r), 'x'));
  ASSERT_EQ(ints.size(), static_cast<size_t>(n));
  ASSERT_EQ(strs.size(), static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(ints[q], 100 + q);
    EXPECT_EQ(dbls[q], 0.5 * q);
    EXPECT_EQ(strs[q], "rank-" + std::string(static_cast<size_t>(q), 'x'));
  }
  EXPECT_EQ(c->all_gather(std::string())[n - 1], "");
  EXPECT_EQ(c->collectives_issued() - before, 7);
}

TEST(MpiCommunicator, BadArgumentsThrowOnEveryRankWithoutCommunicating) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int64_t before = c->collectives_issued();
  auto t = torch::zeros({2});
  EXPECT_THROW(c->broadcast(t, c->world_size()), Error);
  auto ints = torch::zeros({2}, torch::kLong);
  EXPECT_THROW(c->all_reduce(ints, ReduceOp::kAvg), Error);
  EXPECT_EQ(c->collectives_issued(), before);
  c->barrier();  // still in step with the other ranks
}

TEST(MpiCommunicator, MpiErrorsNameOperationRankAndCode) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(MPI_ERR_COUNT, text, &len);
  try {
    mllm::detail::check_mpi(MPI_ERR_COUNT, "MPI_Allreduce", 3);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MPI_Allreduce failed on rank 3: MPI error " + std::to_string(MPI_ERR_COUNT)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(std::string(text, len)), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(mllm::detail::check_mpi(MPI_SUCCESS, "MPI_Barrier", 0));
  EXPECT_GE(mllm::detail::mpi_thread_level(), MPI_THREAD_SERIALIZED);
}

// ZeRO's collectives. Each rank knows every rank's input (value(r, i)), so the expected
// reduce-scatter slice is the rank-ordered float sum computed here element by element, and the
// expected all-gather is the concatenation of every rank's slice; both on sizes that divide the
// world and that do not (the last ranks own fewer elements or none), on the small (all-gather)
// and the large (all-to-all) all_reduce paths, and against all_reduce itself, bitwise.
TEST(MpiCommunicator, ReduceScatterIsRankOrderedSliceOfAllReduce) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  for (int64_t numel : {int64_t{1}, int64_t{3}, int64_t{4} * n, int64_t{4} * n + 1,
                        int64_t{40000} + 3}) {
    auto input = torch::empty({numel});
    float* p = input.data_ptr<float>();
    for (int64_t i = 0; i < numel; ++i) p[i] = value(r, i);
    const ShardRange mine = shard_range(numel, n, r);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      auto out = torch::full({mine.numel()}, 7.0f);
      c->reduce_scatter_async(input, out, op)->wait();
      auto reduced = input.clone();
      c->all_reduce(reduced, op);
      for (int64_t i = mine.begin; i < mine.end; ++i) {
        float want = value(0, i);
        for (int q = 1; q < n; ++q)
          want = op == ReduceOp::kMax ? std::max(want, value(q, i)) : want + value(q, i);
        if (op == ReduceOp::kAvg) want = want / static_cast<float>(n);
        const float got = out[i - mine.begin].item<float>();
        ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << "numel " << numel << " op " << reduce_op_name(op) << " element " << i;
        const float ar = reduced[i].item<float>();
        ASSERT_EQ(std::memcmp(&got, &ar, sizeof got), 0) << "differs from all_reduce at " << i;
      }
      // In place: the output is the input's own slice (as DataParallel at ZeRO stage 1 uses it).
      auto buffer = input.clone();
      auto own = buffer.narrow(0, mine.begin, mine.numel());
      c->reduce_scatter_async(buffer, own, op)->wait();
      ASSERT_TRUE(torch::equal(own, out)) << "in place differs, numel " << numel;
    }
  }
}

TEST(MpiCommunicator, AllGatherOfShardsInPlaceAndNot) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int r = c->rank(), n = c->world_size();
  for (int64_t numel : {int64_t{1}, int64_t{2} * n - 1, int64_t{2} * n, int64_t{30001}}) {
    const ShardRange mine = shard_range(numel, n, r);
    auto shard = torch::empty({mine.numel()}, torch::kDouble);
    for (int64_t i = mine.begin; i < mine.end; ++i) shard[i - mine.begin] = 0.5 * i + r;
    // Out of place into a [rows, cols]-shaped output when the size allows.
    auto out = torch::full({numel}, -1.0, torch::kDouble);
    c->all_gather_async(shard, out)->wait();
    // In place: the shard is a view of the output.
    auto full = torch::full({numel}, -1.0, torch::kDouble);
    full.narrow(0, mine.begin, mine.numel()).copy_(shard);
    auto view = full.narrow(0, mine.begin, mine.numel());
    c->all_gather_async(view, full)->wait();
    for (int q = 0; q < n; ++q) {
      const ShardRange s = shard_range(numel, n, q);
      for (int64_t i = s.begin; i < s.end; ++i) {
        ASSERT_EQ(out[i].item<double>(), 0.5 * i + q) << "numel " << numel << " element " << i;
        ASSERT_EQ(full[i].item<double>(), 0.5 * i + q) << "in place, element " << i;
      }
    }
  }
  // A strided, non-float32 output goes through staging: bfloat16 values exact in bf16.
  auto grid = torch::zeros({4, 2 * n}, torch::kBFloat16).t();  // [2n, 4], not contiguous
  const ShardRange g = shard_range(grid.numel(), n, r);
  auto mine_bf = torch::full({g.numel()}, static_cast<float>(r + 1)).to(torch::kBFloat16);
  c->all_gather_async(mine_bf, grid)->wait();
  auto flat = grid.contiguous().view({-1});
  for (int q = 0; q < n; ++q) {
    const ShardRange s = shard_range(grid.numel(), n, q);
    for (int64_t i = s.begin; i < s.end; ++i) ASSERT_EQ(flat[i].item<float>(), q + 1.0f);
  }
}

TEST(MpiCommunicator, ShardCollectivesRefuseMismatches) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  const int n = c->world_size();
  auto input = torch::zeros({4 * n});
  auto wrong = torch::zeros({5});
  EXPECT_THROW(c->reduce_scatter_async(input, wrong, ReduceOp::kSum), Error);
  auto as_double = torch::zeros({4}, torch::kDouble);
  EXPECT_THROW(c->reduce_scatter_async(input, as_double, ReduceOp::kSum), Error);
  auto ints = torch::zeros({4 * n}, torch::kLong);
  auto int_out = torch::zeros({4}, torch::kLong);
  EXPECT_THROW(c->reduce_scatter_async(ints, int_out, ReduceOp::kAvg), Error);
  EXPECT_THROW(c->all_gather_async(wrong, input), Error);
  // Nothing was started by the refused calls: the next collective still pairs up.
  auto t = torch::ones({1});
  c->all_reduce(t, ReduceOp::kSum);
  EXPECT_EQ(t.item<float>(), static_cast<float>(n));
}

// The base class's fallback (all-reduce based), used by backends without their own: reached
// here through a thin wrapper around the mpi communicator, against the mpi backend's own.
namespace {
class AllReduceOnly : public Communicator {
 public:
  explicit AllReduceOnly(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  std::string backend() const override { return "wrapped"; }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  void all_reduce(torch::Tensor& t, ReduceOp op) override { inner_->all_reduce(t, op); }
  std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override {
    return inner_->all_reduce_async(t, op);
  }
  void broadcast(torch::Tensor& t, int root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  std::vector<int64_t> all_gather(int64_t v) override { return inner_->all_gather(v); }
  std::vector<double> all_gather(double v) override { return inner_->all_gather(v); }
  std::vector<std::string> all_gather(const std::string& v) override { return inner_->all_gather(v); }

 private:
  std::shared_ptr<Communicator> inner_;
};
}  // namespace

TEST(MpiCommunicator, BaseClassShardFallbackMatchesMpi) {
  MLLM_EXPECT_LAUNCHED_WORLD();
  auto c = world();
  AllReduceOnly base(c);
  const int r = c->rank(), n = c->world_size();
  const int64_t numel = 3 * n + 1;
  auto input = torch::empty({numel});
  for (int64_t i = 0; i < numel; ++i) input[i] = value(r, i);
  const ShardRange mine = shard_range(numel, n, r);
  auto a = torch::zeros({mine.numel()}), b = torch::zeros({mine.numel()});
  base.reduce_scatter_async(input, a, ReduceOp::kAvg)->wait();
  c->reduce_scatter_async(input, b, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(torch::equal(a, b));
  auto ga = torch::zeros({numel}), gb = torch::zeros({numel});
  base.all_gather_async(a, ga)->wait();
  c->all_gather_async(b, gb)->wait();
  EXPECT_TRUE(torch::equal(ga, gb));
}
