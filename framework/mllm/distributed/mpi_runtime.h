// Process-wide MPI plumbing shared by the mpi and nccl backends: MPI start-up and shutdown,
// return-code checks that name the operation, rank and code, and the communication thread that
// runs every collective of our MPI communicators in FIFO order (so non-blocking all-reduces
// really progress while the training thread runs backward).
#pragma once

// C API only: without this, OpenMPI's mpi.h drags in its deprecated C++ bindings, whose symbols
// live in libmpi_cxx, which we do not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "mllm/distributed/communicator.h"

namespace mllm::detail {

// MPI_Error_string(code), or "unknown MPI error <code>".
std::string mpi_error_string(int code);

// Throws CommError "<op> failed on rank <rank>: MPI error <code> (<text>)" when code is not
// MPI_SUCCESS. `rank` is the caller's rank in the job (-1 when unknown).
void check_mpi(int code, const char* op, int rank);

// Completes a non-blocking MPI request on the communication thread without hogging a core:
// MPI_Test with a yield between tries for the first 1 ms (each try progresses the transfer;
// the yield hands the core to backward when it wants it), then with sleeps growing from 25 to
// 200 us (a peer that is still busy computing). Why not MPI_Wait: OpenMPI's wait spins, and a
// spinning communication thread takes CPU time from backward on machines without a spare core
// per rank. Throws CommError naming `op` and `rank` on failure.
void wait_request(MPI_Request* request, const char* op, int rank);

// Handle of one task queued on the communication thread. wait() blocks until the task has run;
// after `timeout_s` (> 0) it logs which collective hung on which rank and calls abort_job(1);
// if that returns (world 1 / MPI not running) it throws CommError. A task that threw has its
// exception rethrown from wait().
class AsyncWork : public Work {
 public:
  AsyncWork(std::string what, int rank, double timeout_s);
  void wait() override;
  // Called once by the communication thread when the task has run; `error` null on success.
  void finish(std::exception_ptr error);
  bool done() const;

 private:
  std::string what_;  // "all_reduce(sum) of 4096 float32 elements", for the timeout message
  int rank_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Queues `body` on the process's communication thread (started on first use; MPI must be
// initialised). Tasks run one at a time in submission order, which keeps the order of
// collectives identical on every rank as MPI requires. `what`, `rank` and `timeout_s` describe
// the task for AsyncWork. Whatever `body` throws is delivered through the handle.
std::shared_ptr<AsyncWork> submit_mpi_task(std::string what, int rank, double timeout_s,
                                           std::function<void()> body);

// The thread-support level MPI was initialised with (MPI_THREAD_*), after ensure_mpi_initialized.
int mpi_thread_level();

}  // namespace mllm::detail
