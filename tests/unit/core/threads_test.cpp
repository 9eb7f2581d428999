// The build compiles mllm (and these tests, through the same precompiled header) with OpenMP:
// at::parallel_for is a header template that runs everything on the calling thread where the
// including code is compiled without it, as mllm's own kernels (dropout, the gradient norm) did.
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

TEST(IntraOpThreads, AtParallelForRunsOnTheRequestedThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both threads get a chunk
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  at::set_num_threads(before);
  EXPECT_EQ(ids.size(), 2u);
}
