// The single-process communicator: identity collectives with the shared argument checks.
#include "mllm/distributed/single_communicator.h"

namespace mllm {
namespace {
class DoneWork : public Work {
 public:
  void wait() override {}
};
}  // namespace

void SingleCommunicator::all_reduce(torch::Tensor& t, ReduceOp op) {
  detail::check_all_reduce_args(t, op, "single");
  count_collective();
}

std::shared_ptr<Work> SingleCommunicator::all_reduce_async(torch::Tensor& t, ReduceOp op) {
  all_reduce(t, op);
  return std::make_shared<DoneWork>();
}

namespace {
void copy_whole(const torch::Tensor& from, torch::Tensor& to) {
  if (from.numel() > 0 && to.is_contiguous() && from.is_contiguous() &&
      from.data_ptr() == to.data_ptr() && from.scalar_type() == to.scalar_type())
    return;
  torch::NoGradGuard no_grad;
  to.copy_(from.reshape(to.sizes()));
}
}  // namespace

std::shared_ptr<Work> SingleCommunicator::reduce_scatter_async(const torch::Tensor& input,
                                                               torch::Tensor& output, ReduceOp op) {
  detail::check_shard_args(input, output, 1, 0, "reduce_scatter", "single");
  detail::check_all_reduce_args(input, op, "single");
  count_collective();
  copy_whole(input, output);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> SingleCommunicator::all_gather_async(const torch::Tensor& input,
                                                           torch::Tensor& output) {
  detail::check_shard_args(output, input, 1, 0, "all_gather", "single");
  count_collective();
  copy_whole(input, output);
  return std::make_shared<DoneWork>();
}

void SingleCommunicator::broadcast(torch::Tensor& t, int root) {
  detail::check_root(root, 1, "single");
  count_collective();
}

void SingleCommunicator::barrier() { count_collective(); }

std::vector<int64_t> SingleCommunicator::all_gather(int64_t value) {
  count_collective();
  return {value};
}

std::vector<double> SingleCommunicator::all_gather(double value) {
  count_collective();
  return {value};
}

std::vector<std::string> SingleCommunicator::all_gather(const std::string& value) {
  count_collective();
  return {value};
}

}  // namespace mllm
