// The PrepareGroup (data/prepare_group.h) of a job: every rank of MPI_COMM_WORLD when the
// process was started by an MPI launcher, else the group of one.
#pragma once

#include <memory>

#include "mllm/data/prepare_group.h"

namespace mllm {

// Under an MPI launcher (launched_under_mpi()): initialises MPI if nobody has, and returns a
// group over a duplicate of MPI_COMM_WORLD whose collectives run on the communication thread
// (one MPI caller per process) and wait without spinning (detail::wait_request), with no
// timeout. Otherwise a SingleGroup. Collective over all ranks (MPI_Comm_dup). Throws CommError
// when MPI cannot start.
std::unique_ptr<PrepareGroup> make_prepare_group();

}  // namespace mllm
