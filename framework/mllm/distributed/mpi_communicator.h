// The `mpi` backend: collectives on CPU tensors over OpenMPI, run on the communication thread
// (mpi_runtime.h). Floating-point all-reduces sum in rank order, so the result is bitwise the
// same on every rank and does not depend on how a buffer is split into buckets or messages.
#pragma once

// C API only: without this, OpenMPI's mpi.h drags in its deprecated C++ bindings, whose symbols
// live in libmpi_cxx, which we do not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mllm/distributed/communicator.h"

namespace mllm {

class MpiCommunicator : public Communicator {
 public:
  // Collective over MPI_COMM_WORLD: duplicates it (errors returned, not fatal) and splits it by
  // shared memory for local rank/size. Initialises MPI if needed. `timeout_s` (> 0) bounds every
  // wait (see Work). Throws CommError when MPI fails.
  explicit MpiCommunicator(double timeout_s);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  // Tensors that are not contiguous CPU float32/float64/int32/int64 are reduced through a
  // contiguous CPU copy (float32 for float16/bfloat16) that is copied back when done. CUDA
  // tensors (ranks sharing a GPU, no NCCL) go through pinned host memory: the device-to-host
  // copy is queued on LibTorch's current stream without blocking the caller, the communication
  // thread waits for it (a CUDA event), reduces and copies the result back before wait() returns.
  void all_reduce(torch::Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override;
  // Rank-ordered like all_reduce: rank r's output slice is bitwise what all_reduce leaves at its
  // range. MPI_Ialltoallv of the slices + local reduction (reduce-scatter), MPI_Iallgatherv
  // (all-gather): each rank sends and receives (N-1)/N of the buffer, half an all-reduce. Staging
  // as in all_reduce (CPU copies for other dtypes or devices). Throws Error for buffers over
  // INT_MAX elements (MPI's int counts), besides the shared checks.
  std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                             ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor& output) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  std::vector<int64_t> all_gather(int64_t value) override;
  std::vector<double> all_gather(double value) override;
  std::vector<std::string> all_gather(const std::string& value) override;

  // The duplicated world communicator (for the nccl backend's bootstrap and for benchmarks).
  // Only use it while no collective of this communicator is in flight.
  MPI_Comm mpi_comm() const { return comm_; }

 private:
  // Runs `body` on the communication thread after everything queued before it and waits.
  void run_blocking(const std::string& what, std::function<void()> body);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_s_;
  // Receive buffer of the reductions; touched only by the communication thread, which runs one
  // task at a time, and kept between calls so a 25 MiB bucket does not allocate every step.
  std::vector<char> scratch_;
};

namespace detail {

// In-place all-reduce of `count` elements of `dtype` at `data` over `comm`, summing (or taking
// max/min) in rank order r = 0, 1, ..., N-1 for every element, then dividing by N for kAvg.
// Small buffers: one MPI_Allgather and a local reduction; large ones: MPI_Alltoallv of 1/N
// slices, local reduction of this rank's slice, MPI_Allgatherv (the bandwidth of a ring
// all-reduce, 2 (N-1)/N of the buffer per rank). `scratch` is resized as needed.
// Throws CommError (naming the MPI call, `rank` and the code) when MPI fails.
void rank_ordered_all_reduce(void* data, int64_t count, torch::ScalarType dtype, ReduceOp op,
                             MPI_Comm comm, int rank, int world, std::vector<char>& scratch);

// Rank-ordered reduce-scatter of `count` elements of `dtype` at `in` over `comm`: `out` receives
// shard_range(count, world, rank)'s slice, reduced in rank order (bitwise all_reduce's values).
// `out` may be `in`'s own slice (in place: out = in + its begin); no other overlap. Throws
// CommError when MPI fails, Error for count > INT_MAX.
void rank_ordered_reduce_scatter(const void* in, int64_t count, torch::ScalarType dtype, ReduceOp op,
                                 void* out, MPI_Comm comm, int rank, int world,
                                 std::vector<char>& scratch);
// All-gather of the shard_range slices: `in` (this rank's slice; may be `out` + its begin, in
// place) into `out` [count]. Throws CommError when MPI fails, Error for count > INT_MAX.
void shard_all_gather(const void* in, int64_t count, torch::ScalarType dtype, void* out,
                      MPI_Comm comm, int rank, int world);

// Buffers up to this many bytes take the all-gather path (latency-bound anyway).
constexpr int64_t kAllGatherPathMaxBytes = 64 * 1024;

}  // namespace detail
}  // namespace mllm
