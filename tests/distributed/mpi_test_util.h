// Shared by the multi-rank tests: the job's communicator, and the check that mpirun started as
// many ranks as ctest asked for (MLLM_TEST_WORLD_SIZE), so a world of one cannot pass.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "mllm/distributed/communicator.h"

namespace mllm::test {

// The world size ctest launched (MLLM_TEST_WORLD_SIZE), or -1 when unset.
inline int expected_world_size() {
  const char* v = std::getenv("MLLM_TEST_WORLD_SIZE");
  return v && *v ? std::atoi(v) : -1;
}

// The mpi communicator of this test process (built once). A short timeout: a rank that fails
// an ASSERT and skips a collective makes the others abort after 60 s instead of hanging.
inline std::shared_ptr<Communicator> world() {
  static std::shared_ptr<Communicator> comm = [] {
    DistConfig cfg;
    cfg.backend = "mpi";
    cfg.timeout_s = 60;
    return make_communicator(cfg);
  }();
  return comm;
}

// Every test starts with this: fails (on every rank) unless the job has the launched size.
#define MLLM_EXPECT_LAUNCHED_WORLD()                                                         \
  do {                                                                                       \
    ASSERT_TRUE(::mllm::launched_under_mpi()) << "run this test through ctest (mpirun)";      \
    ASSERT_GT(::mllm::test::expected_world_size(), 1) << "MLLM_TEST_WORLD_SIZE must be >= 2"; \
    ASSERT_EQ(::mllm::test::world()->world_size(), ::mllm::test::expected_world_size())       \
        << "MPI came up with another world size than mpirun -np";                            \
  } while (0)

}  // namespace mllm::test
