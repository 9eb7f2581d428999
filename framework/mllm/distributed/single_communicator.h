// The `single` backend: a world of one process, no MPI. Every collective is the identity (after
// the same argument checks as the other backends), so one rank runs the same training code path
// as many.
#pragma once

#include "mllm/distributed/communicator.h"

namespace mllm {

class SingleCommunicator : public Communicator {
 public:
  SingleCommunicator() = default;

  std::string backend() const override { return "single"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }

  // Leaves `t` unchanged (the reduction of one value; kAvg divides by 1).
  void all_reduce(torch::Tensor& t, ReduceOp op) override;
  // Returns an already finished handle.
  std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override;
  // The whole buffer is rank 0's shard: both copy `input` into `output` (blocking), unless they
  // are the same memory; the handle is finished.
  std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor& output,
                                             ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor& output) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  std::vector<int64_t> all_gather(int64_t value) override;
  std::vector<double> all_gather(double value) override;
  std::vector<std::string> all_gather(const std::string& value) override;
};

}  // namespace mllm
