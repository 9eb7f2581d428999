// NCCL core: MPI-bootstrapped communicator, stream/event ordering and timeouts, on raw device
// pointers. Uses only the CUDA runtime, NCCL and MPI (no LibTorch).
#include "mllm/distributed/nccl/nccl_core.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "mllm/core/error.h"

// ncclAvg (RedOp::kAvg) and ncclBfloat16 arrived in NCCL 2.10.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0), "mllm needs NCCL 2.10 or newer");

namespace mllm::nccl {
namespace {

std::string fmt_error(const char* op, int rank, const std::string& code_text) {
  std::ostringstream s;
  s << op << " failed on rank " << rank << ": " << code_text;
  return s.str();
}

void check_cuda(cudaError_t rc, const char* op, int rank) {
  if (rc == cudaSuccess) return;
  std::ostringstream s;
  s << "CUDA error " << static_cast<int>(rc) << " (" << cudaGetErrorName(rc) << ": "
    << cudaGetErrorString(rc) << ")";
  throw CommError(fmt_error(op, rank, s.str()));
}

void check_nccl(ncclResult_t rc, const char* op, int rank, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  std::ostringstream s;
  s << "NCCL error " << static_cast<int>(rc) << " (" << ncclGetErrorString(rc) << ")";
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s << ": " << last;
  }
  throw CommError(fmt_error(op, rank, s.str()));
}

void check_mpi(int rc, const char* op, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::ostringstream s;
  s << "MPI error " << rc << " (" << std::string(text, len > 0 ? len : 0) << ")";
  throw CommError(fmt_error(op, rank, s.str()));
}

ncclDataType_t to_nccl(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t to_nccl(RedOp op) {
  switch (op) {
    case RedOp::kSum: return ncclSum;
    case RedOp::kAvg: return ncclAvg;
    case RedOp::kMax: return ncclMax;
    case RedOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// Restores the calling thread's current device on scope exit (our calls switch to device_).
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice", rank);
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice", rank);
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
};

}  // namespace

NcclEvent::NcclEvent(NcclCore* core, int device) : core_(core), device_(device) {
  DeviceGuard g(device_, core_->rank());
  // Timing off: these events only order work, and timing-disabled events are cheaper.
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate",
             core_->rank());
}

NcclEvent::~NcclEvent() {
  if (event_) cudaEventDestroy(event_);
}

void NcclEvent::block_stream(Stream stream) const {
  DeviceGuard g(device_, core_->rank());
  check_cuda(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent", core_->rank());
}

bool NcclEvent::done() const {
  cudaError_t rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) return false;
  check_cuda(rc, "cudaEventQuery", core_->rank());
  return true;
}

void NcclEvent::synchronize(double timeout_s, const std::string& what) const {
  // Polling instead of cudaEventSynchronize: a peer that never joins would leave the NCCL kernel
  // spinning and cudaEventSynchronize blocked forever; polling lets us see the deadline and
  // NCCL's asynchronous errors, then abort the communicator.
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  while (!done()) {
    try {
      core_->check_async_error(what);
    } catch (const CommError&) {
      core_->abort();  // a failed communicator may leave kernels spinning; free them
      throw;
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      core_->abort();
      std::ostringstream s;
      s << "rank " << core_->rank() << ": " << what << " did not finish within dist.timeout_s = "
        << timeout_s << " s; NCCL communicator aborted. Another rank is probably stuck or dead.";
      throw CommError(s.str());
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(1000)) pause *= 2;
  }
}

NcclCore::NcclCore(MPI_Comm comm, int device) : mpi_comm_(comm), device_(device) {
  check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank", -1);
  check_mpi(MPI_Comm_size(comm, &world_), "MPI_Comm_size", rank_);
  int n_devices = 0;
  check_cuda(cudaGetDeviceCount(&n_devices), "cudaGetDeviceCount", rank_);
  if (device < 0 || device >= n_devices) {
    std::ostringstream s;
    s << "nccl backend: rank " << rank_ << " wants CUDA device " << device << " but sees "
      << n_devices << " (one rank per GPU: start at most as many ranks per node as GPUs, "
      << "or check CUDA_VISIBLE_DEVICES)";
    throw CommError(s.str());
  }
  check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank_);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", rank_);
  check_mpi(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, comm),
            "MPI_Bcast(ncclUniqueId)", rank_);
  check_nccl(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank", rank_);
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", rank_);
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate", rank_);
}

NcclCore::~NcclCore() {
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    // Outstanding collectives first: destroying a communicator in use is undefined.
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCore::abort() {
  // exchange: of two threads aborting at once (the watchdog, an error path), one calls NCCL.
  if (!comm_ || aborted_.exchange(true)) return;
  ncclCommAbort(comm_);
}

void NcclCore::check_async_error(const std::string& what) const {
  if (aborted_) throw CommError("nccl backend: " + what + " on an aborted communicator");
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", rank_, comm_);
  if (async != ncclSuccess && async != ncclInProgress)
    check_nccl(async, what.c_str(), rank_, comm_);
}

void NcclCore::order_after(Stream producer) {
  // The collective must read `buf` only after the producer (LibTorch's current stream) has
  // finished writing it: record an event there and make our stream wait on it, device-side.
  check_cuda(cudaEventRecord(ready_, producer), "cudaEventRecord(producer stream)", rank_);
  check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent(NCCL stream)", rank_);
}

template <typename F>
std::shared_ptr<NcclEvent> NcclCore::enqueue(const char* what, Stream producer, F&& call) {
  if (aborted_) throw CommError(std::string("nccl backend: ") + what + " on an aborted communicator");
  DeviceGuard g(device_, rank_);
  order_after(producer);
  call();
  std::shared_ptr<NcclEvent> done(new NcclEvent(this, device_));
  check_cuda(cudaEventRecord(done->event_, stream_), "cudaEventRecord(NCCL stream)", rank_);
  return done;
}

std::shared_ptr<NcclEvent> NcclCore::all_reduce(void* buf, size_t count, DataType dtype, RedOp op,
                                                Stream producer) {
  return all_reduce(buf, buf, count, dtype, op, producer);
}

std::shared_ptr<NcclEvent> NcclCore::all_reduce(const void* send, void* recv, size_t count,
                                                DataType dtype, RedOp op, Stream producer) {
  return enqueue("all_reduce", producer, [&] {
    check_nccl(ncclAllReduce(send, recv, count, to_nccl(dtype), to_nccl(op), comm_, stream_),
               "ncclAllReduce", rank_, comm_);
  });
}

std::shared_ptr<NcclEvent> NcclCore::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                                    DataType dtype, RedOp op, Stream producer) {
  return enqueue("reduce_scatter", producer, [&] {
    check_nccl(ncclReduceScatter(send, recv, recv_count, to_nccl(dtype), to_nccl(op), comm_, stream_),
               "ncclReduceScatter", rank_, comm_);
  });
}

std::shared_ptr<NcclEvent> NcclCore::all_gather(const void* send, void* recv, size_t send_count,
                                                DataType dtype, Stream producer) {
  return enqueue("all_gather", producer, [&] {
    check_nccl(ncclAllGather(send, recv, send_count, to_nccl(dtype), comm_, stream_),
               "ncclAllGather", rank_, comm_);
  });
}

std::shared_ptr<NcclEvent> NcclCore::broadcast(void* buf, size_t bytes, int root, Stream producer) {
  if (root < 0 || root >= world_) {
    std::ostringstream s;
    s << "nccl backend: broadcast root " << root << " is not a rank of this world of " << world_;
    throw CommError(s.str());
  }
  return enqueue("broadcast", producer, [&] {
    check_nccl(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast",
               rank_, comm_);
  });
}

std::string nccl_version_string() {
  int nccl = 0, cuda = 0;
  ncclGetVersion(&nccl);
  cudaRuntimeGetVersion(&cuda);
  std::ostringstream s;
  s << "NCCL " << nccl / 10000 << "." << (nccl % 10000) / 100 << "." << nccl % 100
    << " (CUDA runtime " << cuda << ")";
  return s.str();
}

}  // namespace mllm::nccl
