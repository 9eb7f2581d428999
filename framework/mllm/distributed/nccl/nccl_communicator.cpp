// NCCL adapter: maps torch tensors and LibTorch's current CUDA stream onto NcclCore calls.
#include "mllm/distributed/nccl/nccl_communicator.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/distributed/mpi_runtime.h"

namespace mllm {
namespace {

nccl::DataType to_core(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return nccl::DataType::kFloat32;
    case torch::kDouble: return nccl::DataType::kFloat64;
    case torch::kHalf: return nccl::DataType::kFloat16;
    case torch::kBFloat16: return nccl::DataType::kBFloat16;
    case torch::kInt: return nccl::DataType::kInt32;
    case torch::kLong: return nccl::DataType::kInt64;
    default: throw Error(fmt::format("nccl backend: unsupported dtype {}", c10::toString(t)));
  }
}

nccl::RedOp to_core(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return nccl::RedOp::kSum;
    case ReduceOp::kAvg: return nccl::RedOp::kAvg;
    case ReduceOp::kMax: return nccl::RedOp::kMax;
    case ReduceOp::kMin: return nccl::RedOp::kMin;
  }
  return nccl::RedOp::kSum;
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<nccl::NcclEvent> event, torch::Tensor target, torch::Tensor work,
           std::string what, int rank, double timeout_s)
      : event_(std::move(event)), target_(std::move(target)), work_(std::move(work)),
        what_(std::move(what)), rank_(rank), timeout_s_(timeout_s) {}

  void wait() override {
    if (done_) return;
    const auto device = work_.device().index();
    // Device side first, so later kernels on LibTorch's stream see the result even if the host
    // moves on; then the host waits, which is where dist.timeout_s can be enforced.
    event_->block_stream(c10::cuda::getCurrentCUDAStream(device).stream());
    try {
      event_->synchronize(timeout_s_, what_);
    } catch (const CommError& e) {
      spdlog::error("{}", e.what());
      abort_job(1);
      throw;
    }
    if (!work_.is_same(target_)) {
      torch::NoGradGuard no_grad;
      target_.copy_(work_);
    }
    done_ = true;
  }

 private:
  std::shared_ptr<nccl::NcclEvent> event_;
  torch::Tensor target_, work_;
  std::string what_;
  int rank_;
  double timeout_s_;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(double timeout_s)
    : mpi_(std::make_shared<MpiCommunicator>(timeout_s)), timeout_s_(timeout_s) {
  // The trainer's rule (train/device.h rank_device): ranks beyond the GPU count share GPUs.
  const int gpus = static_cast<int>(c10::cuda::device_count());
  if (gpus == 0)
    throw CommError(fmt::format("nccl backend: rank {} sees no GPU (CUDA_VISIBLE_DEVICES?)",
                                mpi_->rank()));
  const int device = mpi_->local_rank() % gpus;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  // The bootstrap MPI_Bcast runs on the communication thread like every other MPI call.
  std::unique_ptr<nccl::NcclCore> core;
  detail::submit_mpi_task("NCCL communicator set-up", mpi_->rank(), timeout_s, [&] {
    core = std::make_unique<nccl::NcclCore>(mpi_->mpi_comm(), device);
  })->wait();
  core_ = std::move(core);
  spdlog::info("nccl backend: rank {} on CUDA device {}, {}", mpi_->rank(), device,
               nccl::nccl_version_string());
}

NcclCommunicator::~NcclCommunicator() = default;

std::shared_ptr<Work> NcclCommunicator::all_reduce_async(torch::Tensor& t, ReduceOp op) {
  if (!t.is_cuda()) return mpi_->all_reduce_async(t, op);
  detail::check_all_reduce_args(t, op, "nccl");
  count_collective();
  torch::Tensor work = t.is_contiguous() ? t : t.contiguous();
  const auto device = work.device().index();
  auto producer = c10::cuda::getCurrentCUDAStream(device);
  auto event = core_->all_reduce(work.data_ptr(), static_cast<size_t>(work.numel()),
                                 to_core(work.scalar_type()), to_core(op), producer.stream());
  // The allocator must not hand this memory to someone else before NCCL is done with it.
  c10::cuda::CUDACachingAllocator::recordStream(
      work.storage().data_ptr(), c10::cuda::getStreamFromExternal(core_->stream(), device));
  const std::string what = fmt::format("all_reduce({}) of {} {} elements", reduce_op_name(op),
                                       t.numel(), c10::toString(t.scalar_type()));
  return std::make_shared<NcclWork>(std::move(event), t, work, what, rank(), timeout_s_);
}

void NcclCommunicator::all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

void NcclCommunicator::broadcast(torch::Tensor& t, int root) {
  if (!t.is_cuda()) return mpi_->broadcast(t, root);
  detail::check_root(root, world_size(), "nccl");
  count_collective();
  torch::Tensor work = t.is_contiguous() ? t : t.contiguous();
  const auto device = work.device().index();
  auto producer = c10::cuda::getCurrentCUDAStream(device);
  auto event = core_->broadcast(work.data_ptr(), work.numel() * work.element_size(), root,
                                producer.stream());
  c10::cuda::CUDACachingAllocator::recordStream(
      work.storage().data_ptr(), c10::cuda::getStreamFromExternal(core_->stream(), device));
  NcclWork(std::move(event), t, work, "broadcast", rank(), timeout_s_).wait();
}

void NcclCommunicator::barrier() {
  count_collective();
  mpi_->barrier();
}

std::vector<int64_t> NcclCommunicator::all_gather(int64_t value) {
  count_collective();
  return mpi_->all_gather(value);
}

std::vector<double> NcclCommunicator::all_gather(double value) {
  count_collective();
  return mpi_->all_gather(value);
}

std::vector<std::string> NcclCommunicator::all_gather(const std::string& value) {
  count_collective();
  return mpi_->all_gather(value);
}

std::shared_ptr<Communicator> make_nccl_communicator(const DistConfig& cfg) {
  return std::make_shared<NcclCommunicator>(cfg.timeout_s);
}

}  // namespace mllm
