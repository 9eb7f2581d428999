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
