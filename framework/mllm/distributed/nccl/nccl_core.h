// The NCCL core of the nccl backend: communicator set-up from a unique id broadcast over MPI,
// and collectives on raw device pointers on NCCL's own stream, ordered after a caller's stream
// with CUDA events. Free of LibTorch (and of CUDA headers in this header), so CI compiles and
// links it against the CUDA toolkit and NCCL even where LibTorch has no CUDA.
#pragma once

// C API only: without this, OpenMPI's mpi.h drags in its deprecated C++ bindings, whose symbols
// live in libmpi_cxx, which we do not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

// Opaque CUDA/NCCL handles (cudaStream_t = CUstream_st*, cudaEvent_t = CUevent_st*,
// ncclComm_t = ncclComm*), declared here so users need not include cuda_runtime.h or nccl.h.
struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace mllm::nccl {

using Stream = CUstream_st*;

enum class DataType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
enum class RedOp { kSum, kAvg, kMax, kMin };  // kAvg: ncclAvg (NCCL >= 2.10)

class NcclCore;

// Completion of one enqueued collective: an event recorded on the NCCL stream right after it.
class NcclEvent {
 public:
  ~NcclEvent();
  NcclEvent(const NcclEvent&) = delete;
  NcclEvent& operator=(const NcclEvent&) = delete;
  // Device-side ordering: work enqueued on `stream` afterwards starts only after the collective.
  // Does not block the host. Throws CommError when CUDA fails.
  void block_stream(Stream stream) const;
  // True when the collective has finished on the device.
  bool done() const;
  // Blocks the host until the collective has finished, polling the communicator for
  // asynchronous NCCL errors. After `timeout_s` (> 0), or on an NCCL error, aborts the NCCL
  // communicator (ncclCommAbort, so no kernel spins forever) and throws CommError naming
  // `what`, the rank and the error.
  void synchronize(double timeout_s, const std::string& what) const;

 private:
  friend class NcclCore;
  NcclEvent(NcclCore* core, int device);
  NcclCore* core_;
  int device_;
  CUevent_st* event_ = nullptr;
};

class NcclCore {
 public:
  // Collective over `comm` (every rank calls it): selects `device` (cudaSetDevice), creates a
  // non-blocking stream, and builds the NCCL communicator from a unique id that rank 0 makes and
  // MPI_Bcast's. Throws CommError naming the call, the rank and the code on any failure.
  NcclCore(MPI_Comm comm, int device);
  // Destroys the communicator (ncclCommDestroy, or nothing after abort()), stream and events.
  ~NcclCore();
  NcclCore(const NcclCore&) = delete;
  NcclCore& operator=(const NcclCore&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int device() const { return device_; }
  Stream stream() const { return stream_; }

  // Enqueues an in-place all-reduce of `count` elements at device pointer `buf` on the NCCL
  // stream, after all work already enqueued on `producer` (the stream that wrote `buf`; may be
  // null for the legacy default stream). Returns its completion event. Throws CommError.
  std::shared_ptr<NcclEvent> all_reduce(void* buf, size_t count, DataType dtype, RedOp op,
                                        Stream producer);
  // Out of place: the reduction of every rank's `send` lands in `recv` (`send` is left as it
  // was; at world size 1 NCCL copies send into recv). Ordered and returned like all_reduce.
  std::shared_ptr<NcclEvent> all_reduce(const void* send, void* recv, size_t count, DataType dtype,
                                        RedOp op, Stream producer);
  // Reduce-scatter: `send` holds world_size * `recv_count` elements, this rank's `recv` receives
  // the reduction of send[rank * recv_count, (rank + 1) * recv_count) (ncclReduceScatter; `recv`
  // may be send + rank * recv_count). Ordered and returned like all_reduce.
  std::shared_ptr<NcclEvent> reduce_scatter(const void* send, void* recv, size_t recv_count,
                                            DataType dtype, RedOp op, Stream producer);
  // All-gather: `send_count` elements from every rank into `recv` [world_size * send_count] in
  // rank order (ncclAllGather; `send` may be recv + rank * send_count). Ordered like all_reduce.
  std::shared_ptr<NcclEvent> all_gather(const void* send, void* recv, size_t send_count,
                                        DataType dtype, Stream producer);
  // In-place broadcast of `bytes` bytes at device pointer `buf` from `root`, ordered the same way.
  std::shared_ptr<NcclEvent> broadcast(void* buf, size_t bytes, int root, Stream producer);

  // ncclCommAbort: frees a communicator stuck in a collective. Later calls throw CommError.
  void abort();
  bool aborted() const { return aborted_.load(); }
  // Throws CommError when NCCL reports an asynchronous error for this communicator.
  void check_async_error(const std::string& what) const;

 private:
  friend class NcclEvent;
  void order_after(Stream producer);  // NCCL stream waits for producer's current work
  // The frame of every collective: refuse after abort(), select the device, order after
  // `producer`, run `call` (which enqueues the NCCL call on stream_), record the completion event.
  template <typename F>
  std::shared_ptr<NcclEvent> enqueue(const char* what, Stream producer, F&& call);

  MPI_Comm mpi_comm_;
  int rank_ = 0, world_ = 1, device_ = 0;
  ncclComm* comm_ = nullptr;
  Stream stream_ = nullptr;
  CUevent_st* ready_ = nullptr;  // recorded on the producer stream, waited on by ours
  // Set by abort() on the watchdog thread while the training and autograd threads read it.
  std::atomic<bool> aborted_{false};
};

// "NCCL 2.28.9 (CUDA runtime 13000)" from the linked libraries, for logs.
std::string nccl_version_string();

}  // namespace mllm::nccl
