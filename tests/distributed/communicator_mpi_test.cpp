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
