// NCCL adapter: maps torch tensors and LibTorch's current CUDA stream onto NcclCore calls.
#include "mllm/distributed/nccl/nccl_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/core/logging.h"
#include "mllm/distributed/mpi_runtime.h"

namespace mllm {

// Watches the collectives in flight: the host no longer waits for each one (NcclWork::wait only
// orders LibTorch's stream after it), so this thread is where dist.timeout_s and NCCL's
// asynchronous errors are enforced, as PyTorch's ProcessGroupNCCL watchdog does.
class NcclCommunicator::Watchdog {
 public:
  Watchdog(nccl::NcclCore& core, int device, double timeout_s)
      : core_(core), device_(device), timeout_s_(timeout_s), thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void watch(std::shared_ptr<nccl::NcclEvent> event, std::string what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({std::move(event), std::move(what), current_step(),
                          std::chrono::steady_clock::now()});
    }
    cv_.notify_all();
  }

 private:
  struct Pending {
    std::shared_ptr<nccl::NcclEvent> event;
    std::string what;
    int64_t step;
    std::chrono::steady_clock::time_point start;
  };

  [[noreturn]] void fail(const Pending& p, const std::string& why) {
    const std::string msg = fmt::format("rank {}: {}{} {}; NCCL communicator aborted, aborting the "
                                        "job", core_.rank(), p.step > 0 ? fmt::format("step {}: ", p.step) : "",
                                        p.what, why);
    spdlog::error("{}", msg);
    flush_logs();
    core_.abort();  // frees kernels spinning on a peer that will never come
    abort_job(1);
    std::_Exit(1);  // one rank alone: nobody else to stop, and the main thread may be blocked
  }

  void loop() {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (pending_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        continue;
      }
      // Collectives finish in issue order on the one NCCL stream: only the oldest can be late.
      Pending p = pending_.front();
      lock.unlock();
      bool done = false;
      try {
        done = p.event->done();
        if (!done) core_.check_async_error(p.what);
      } catch (const std::exception& e) {
        fail(p, fmt::format("failed: {}", e.what()));
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
      if (!done && timeout_s_ > 0 && waited > timeout_s_)
        fail(p, fmt::format("did not finish within dist.timeout_s = {} s; another rank is "
                            "probably stuck or dead (see its log)", timeout_s_));
      lock.lock();
      if (done) {
        pending_.pop_front();
      } else {
        cv_.wait_for(lock, std::chrono::milliseconds(2));
      }
    }
  }

  nccl::NcclCore& core_;
  int device_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

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

// One collective in flight. wait() orders LibTorch's current stream after it (no host wait;
// the watchdog enforces the timeout) and copies a non-contiguous result back on that stream.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<nccl::NcclEvent> event, torch::Tensor target, torch::Tensor work)
      : event_(std::move(event)), target_(std::move(target)), work_(std::move(work)) {}

  void wait() override {
    if (done_) return;
    const auto device = work_.device().index();
    event_->block_stream(c10::cuda::getCurrentCUDAStream(device).stream());
    if (!work_.is_same(target_)) {
      torch::NoGradGuard no_grad;
      target_.copy_(work_);  // on the current stream, after the collective
    }
    done_ = true;
  }

 private:
  std::shared_ptr<nccl::NcclEvent> event_;
  torch::Tensor target_, work_;
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
  watchdog_ = std::make_unique<Watchdog>(*core_, device, timeout_s);
  spdlog::info("nccl backend: rank {} on CUDA device {}, {}", mpi_->rank(), device,
               nccl::nccl_version_string());
}

NcclCommunicator::~NcclCommunicator() {
  // Destroyed while an exception unwinds (a rank failed mid-step): its NCCL stream may hold a
  // collective that the peers never issue, and a clean teardown (stream sync, ncclCommDestroy)
  // would wait for it. Abort instead: the watchdog first, which also calls into the communicator.
  if (std::uncaught_exceptions() > 0 && core_) {
    watchdog_.reset();
    core_->abort();
  }
}

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
  watchdog_->watch(event, fmt::format("all_reduce({}) of {} {} elements", reduce_op_name(op),
                                      t.numel(), c10::toString(t.scalar_type())));
  return std::make_shared<NcclWork>(std::move(event), t, work);
}

void NcclCommunicator::all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

std::shared_ptr<Work> NcclCommunicator::reduce_scatter_async(const torch::Tensor& input,
                                                             torch::Tensor& output, ReduceOp op) {
  if (!input.is_cuda()) return mpi_->reduce_scatter_async(input, output, op);
  detail::check_shard_args(input, output, world_size(), rank(), "reduce_scatter", "nccl");
  detail::check_all_reduce_args(input, op, "nccl");
  count_collective();
  const int64_t n = input.numel(), world = world_size();
  const int64_t c = (n + world - 1) / world;
  torch::Tensor send = input.reshape({-1});
  if (c * world != n || !send.is_contiguous()) {
    torch::Tensor padded = torch::zeros({c * world}, input.options());
    padded.narrow(0, 0, n).copy_(send);
    send = padded;
  }
  // NCCL writes c elements; a shorter last shard receives them through a scratch buffer.
  torch::Tensor recv = (output.is_contiguous() && output.numel() == c)
                           ? output.view({-1})
                           : torch::empty({c}, input.options());
  const auto device = send.device().index();
  auto producer = c10::cuda::getCurrentCUDAStream(device);
  auto event = core_->reduce_scatter(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(c),
                                     to_core(send.scalar_type()), to_core(op), producer.stream());
  auto nccl_stream = c10::cuda::getStreamFromExternal(core_->stream(), device);
  c10::cuda::CUDACachingAllocator::recordStream(send.storage().data_ptr(), nccl_stream);
  c10::cuda::CUDACachingAllocator::recordStream(recv.storage().data_ptr(), nccl_stream);
  watchdog_->watch(event, fmt::format("reduce_scatter({}) of {} {} elements", reduce_op_name(op), n,
                                      c10::toString(input.scalar_type())));
  torch::Tensor result = recv.narrow(0, 0, output.numel()).view(output.sizes());
  return std::make_shared<NcclWork>(std::move(event), output,
                                    recv.data_ptr() == output.data_ptr() && output.is_contiguous()
                                        ? output
                                        : result);
}

std::shared_ptr<Work> NcclCommunicator::all_gather_async(const torch::Tensor& input,
                                                         torch::Tensor& output) {
  if (!output.is_cuda()) return mpi_->all_gather_async(input, output);
  detail::check_shard_args(output, input, world_size(), rank(), "all_gather", "nccl");
  count_collective();
  const int64_t n = output.numel(), world = world_size();
  const int64_t c = (n + world - 1) / world;
  torch::Tensor send = input.reshape({-1});
  if (send.numel() != c || !send.is_contiguous()) {
    torch::Tensor padded = torch::zeros({c}, output.options());
    padded.narrow(0, 0, send.numel()).copy_(send);
    send = padded;
  }
  torch::Tensor recv = (output.is_contiguous() && c * world == n)
                           ? output.view({-1})
                           : torch::empty({c * world}, output.options());
  const auto device = recv.device().index();
  auto producer = c10::cuda::getCurrentCUDAStream(device);
  auto event = core_->all_gather(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(c),
                                 to_core(recv.scalar_type()), producer.stream());
  auto nccl_stream = c10::cuda::getStreamFromExternal(core_->stream(), device);
  c10::cuda::CUDACachingAllocator::recordStream(send.storage().data_ptr(), nccl_stream);
  c10::cuda::CUDACachingAllocator::recordStream(recv.storage().data_ptr(), nccl_stream);
  watchdog_->watch(event, fmt::format("all_gather of {} {} elements", n,
                                      c10::toString(output.scalar_type())));
  torch::Tensor result = recv.narrow(0, 0, n).view(output.sizes());
  return std::make_shared<NcclWork>(std::move(event), output,
                                    recv.data_ptr() == output.data_ptr() && output.is_contiguous()
                                        ? output
                                        : result);
}

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
  watchdog_->watch(event, fmt::format("broadcast of {} {} elements from rank {}", t.numel(),
                                      c10::toString(t.scalar_type()), root));
  NcclWork(std::move(event), t, work).wait();
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
