// The single backend, backend selection (make_communicator) and launch detection, without MPI.
#include <cstdlib>
#include <future>

#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/distributed/communicator.h"
#include "mllm/distributed/mpi_runtime.h"

using namespace mllm;

namespace {
// Unsets the launcher variables for one test and restores them after.
class NoLauncherEnv {
 public:
  NoLauncherEnv() {
    for (const char* v : kVars) {
      const char* val = std::getenv(v);
      saved_.emplace_back(v, val ? std::optional<std::string>(val) : std::nullopt);
      unsetenv(v);
    }
  }
  ~NoLauncherEnv() {
    for (auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }

 private:
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::shared_ptr<Communicator> single() {
  DistConfig cfg;
  cfg.backend = "single";
  return make_communicator(cfg);
}
}  // namespace

TEST(LaunchDetection, ReadsLauncherVariables) {
  NoLauncherEnv env;
  EXPECT_FALSE(launched_under_mpi());
  setenv("PMI_SIZE", "4", 1);
  EXPECT_TRUE(launched_under_mpi());
  unsetenv("PMI_SIZE");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_under_mpi());
}

TEST(MakeCommunicator, AutoWithoutLauncherIsSingle) {
  NoLauncherEnv env;
  DistConfig cfg;  // backend: auto
  auto c = make_communicator(cfg);
  EXPECT_EQ(c->backend(), "single");
  EXPECT_EQ(c->world_size(), 1);
}

TEST(MakeCommunicator, NcclInThisBuildIsAConfigErrorSayingHowToBuild) {
  if (built_with_nccl()) GTEST_SKIP() << "this build has the nccl backend";  // GPU builds only
  DistConfig cfg;
  cfg.backend = "nccl";
  try {
    make_communicator(cfg, /*want_cuda=*/true);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    // Why (the build's note: a CPU build without a CUDA toolkit, or a CPU-only LibTorch) and how.
    EXPECT_NE(msg.find("not available in this build ("), std::string::npos) << msg;
    EXPECT_NE(msg.find("MLLM_WITH_NCCL=ON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("launch/install-deps.sh --cuda-wheels"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUDA torch wheel"), std::string::npos) << msg;
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(MakeCommunicator, UnknownBackendListsKnownOnes) {
  DistConfig cfg;
  cfg.backend = "gloo";
  try {
    make_communicator(cfg);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("mpi"), std::string::npos) << msg;
    EXPECT_NE(msg.find("single"), std::string::npos) << msg;
  }
}

TEST(MakeCommunicator, RegistryHasBuiltins) {
  register_builtin_communicators();
  register_builtin_communicators();  // idempotent
  EXPECT_TRUE(communicator_registry().contains("mpi"));
  EXPECT_TRUE(communicator_registry().contains("single"));
  EXPECT_EQ(communicator_registry().contains("nccl"), built_with_nccl());
}

TEST(SingleCommunicator, CollectivesAreIdentityAndCounted) {
  auto c = single();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->local_rank(), 0);
  EXPECT_EQ(c->local_size(), 1);
  auto t = torch::tensor({1.5f, -2.0f});
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    c->all_reduce(t, op);
    EXPECT_TRUE(torch::equal(t, torch::tensor({1.5f, -2.0f})));
  }
  c->all_reduce_async(t, ReduceOp::kSum)->wait();
  c->broadcast(t, 0);
  c->barrier();
  EXPECT_EQ(c->all_gather(int64_t{7}), std::vector<int64_t>{7});
  EXPECT_EQ(c->all_gather(2.5), std::vector<double>{2.5});
  EXPECT_EQ(c->all_gather(std::string("abc")), std::vector<std::string>{"abc"});
  EXPECT_EQ(c->collectives_issued(), 4 + 1 + 1 + 1 + 3);
}

TEST(SingleCommunicator, RejectsWhatOtherBackendsReject) {
  auto c = single();
  auto ints = torch::tensor({1, 2}, torch::kLong);
  EXPECT_THROW(c->all_reduce(ints, ReduceOp::kAvg), Error);  // avg of integers
  auto flags = torch::tensor({true, false});
  EXPECT_THROW(c->all_reduce(flags, ReduceOp::kSum), Error);  // bool
  EXPECT_THROW(c->broadcast(ints, 1), Error);                 // root outside the world
  torch::Tensor undefined;
  EXPECT_THROW(c->all_reduce(undefined, ReduceOp::kSum), Error);
}

TEST(ReduceOpName, Names) {
  EXPECT_STREQ(reduce_op_name(ReduceOp::kSum), "sum");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMax), "max");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMin), "min");
}

TEST(AbortJob, ReturnsWithoutMpi) {
  abort_job(3);  // MPI not running here: must return so main can exit normally
  SUCCEED();
}

TEST(AsyncWork, TimeoutWithNobodyToAbortThrowsCommError) {
  // A task that cannot finish before the test lets it: the wait must time out, find no MPI job
  // to abort, and throw. Then the task is released so the communication thread drains.
  std::promise<void> release;
  auto released = release.get_future().share();
  auto work = mllm::detail::submit_mpi_task("test collective", 0, 0.05, [released] { released.wait(); });
  try {
    work->wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test collective did not finish within dist.timeout_s"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  release.set_value();
  auto after = mllm::detail::submit_mpi_task("after", 0, 0, [] {});
  after->wait();
  EXPECT_TRUE(work->done());
}

TEST(AsyncWork, TaskErrorsComeBackFromWait) {
  auto work = mllm::detail::submit_mpi_task("failing", 0, 10.0, [] { throw CommError("boom"); });
  EXPECT_THROW(work->wait(), CommError);
}

// shard_range against slices written out by hand: ceil(numel / world) per rank in rank order.
TEST(ShardRange, CeilSlicesInRankOrder) {
  auto r = [](int64_t numel, int world, int rank) {
    const ShardRange s = shard_range(numel, world, rank);
    return std::make_pair(s.begin, s.end);
  };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(r(10, 4, 0), P(0, 3));   // c = 3: 3 3 3 1
  EXPECT_EQ(r(10, 4, 3), P(9, 10));
  EXPECT_EQ(r(8, 4, 1), P(2, 4));    // c = 2: even
  EXPECT_EQ(r(5, 4, 2), P(4, 5));    // c = 2: 2 2 1 0
  EXPECT_EQ(r(5, 4, 3), P(5, 5));
  EXPECT_EQ(r(1, 3, 2), P(1, 1));    // c = 1: 1 0 0
  EXPECT_EQ(r(0, 2, 1), P(0, 0));
  EXPECT_EQ(r(7, 1, 0), P(0, 7));
  EXPECT_THROW(shard_range(-1, 2, 0), Error);
  EXPECT_THROW(shard_range(4, 0, 0), Error);
  EXPECT_THROW(shard_range(4, 2, 2), Error);
}

TEST(SingleCommunicator, ShardCollectivesCopyTheWholeBuffer) {
  auto comm = single();
  Communicator& c = *comm;
  auto input = torch::arange(6, torch::kFloat);
  auto out = torch::zeros({6});
  c.reduce_scatter_async(input, out, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(torch::equal(out, input));
  auto gathered = torch::zeros({2, 3});
  c.all_gather_async(input, gathered)->wait();
  EXPECT_TRUE(torch::equal(gathered.view({-1}), input));
  auto too_small = torch::zeros({5});
  EXPECT_THROW(c.reduce_scatter_async(input, too_small, ReduceOp::kSum), Error);
  EXPECT_EQ(c.collectives_issued(), 2);
}
