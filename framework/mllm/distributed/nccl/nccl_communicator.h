// The `nccl` backend: a thin LibTorch adapter over NcclCore for CUDA tensors; host-side values
// (all-gathers, barrier) and CPU tensors go over MPI. Built only against a CUDA-enabled LibTorch.
#pragma once

#include <memory>

#include "mllm/distributed/communicator.h"
#include "mllm/distributed/mpi_communicator.h"
#include "mllm/distributed/nccl/nccl_core.h"

namespace mllm {

class NcclCommunicator : public Communicator {
 public:
  // Collective: builds an MpiCommunicator (bootstrap, host values), binds this rank to CUDA
  // device local_rank % visible GPUs (train/device.h's rule), and creates the NCCL communicator.
  // Throws CommError on failure (no GPU visible; NCCL refuses two ranks on one GPU, which
  // make_communicator() rules out beforehand).
  explicit NcclCommunicator(double timeout_s);
  // Waits for the collectives in flight and destroys the NCCL communicator; while an exception
  // unwinds, aborts it instead (ncclCommAbort), which does not wait for peers.
  ~NcclCommunicator() override;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return mpi_->rank(); }
  int world_size() const override { return mpi_->world_size(); }
  int local_rank() const override { return mpi_->local_rank(); }
  int local_size() const override { return mpi_->local_size(); }

  // CUDA tensors: NCCL on its own stream, started after the work already queued on LibTorch's
  // current stream (event record + stream wait). wait() does not block the host: LibTorch's
  // current stream waits for the collective's event, so kernels queued afterwards (the
  // optimizer) see the result, and the host reads it only when something copies it back (a
  // .item()). A watchdog thread bounds every collective by dist.timeout_s and watches for NCCL's
  // asynchronous errors: on either it logs the operation, rank and step, aborts the NCCL
  // communicator (ncclCommAbort, freeing kernels spinning on a dead peer) and the job (exit 1).
  // The tensor's memory is recorded on the NCCL stream so the caching allocator does not reuse
  // it too early. CPU tensors: delegated to MPI.
  void all_reduce(torch::Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override;
  // ncclReduceScatter / ncclAllGather on CUDA tensors (ordered like all_reduce). NCCL slices
  // equally, so a buffer whose size is not a multiple of the world size goes through a
  // zero-padded copy of world * ceil(n / world) elements (shard_range's layout); CPU tensors go
  // to MPI.
  std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                             ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor& output) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  std::vector<int64_t> all_gather(int64_t value) override;
  std::vector<double> all_gather(double value) override;
  std::vector<std::string> all_gather(const std::string& value) override;

  nccl::NcclCore& core() { return *core_; }

  class Watchdog;

 private:
  std::shared_ptr<MpiCommunicator> mpi_;
  std::unique_ptr<nccl::NcclCore> core_;
  double timeout_s_;
  std::unique_ptr<Watchdog> watchdog_;  // declared last: stopped before core_ is destroyed
};

// Registry factory (communicator.cpp registers it as "nccl" in builds that have it).
std::shared_ptr<Communicator> make_nccl_communicator(const DistConfig& cfg);

}  // namespace mllm
