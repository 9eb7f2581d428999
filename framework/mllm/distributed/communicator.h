// The Communicator interface (rank, world, all-reduce, broadcast, barrier, all-gather), its
// registry of backends (mpi, nccl when built, single), and the job-level helpers the programs
// use: make_communicator() picks the backend for dist.backend, abort_job() fails the job fast.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mllm/core/recipe.h"
#include "mllm/core/registry.h"

namespace mllm {

// Element-wise reduction of an all-reduce. kAvg = kSum / world_size (floating tensors only),
// the convention of torch.distributed ReduceOp.AVG.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

// "sum" | "avg" | "max" | "min", for messages.
const char* reduce_op_name(ReduceOp op);

// Handle of an asynchronous collective. wait() blocks until the collective has finished and its
// result is in the tensor (the tensor must not be read or written before). Throws CommError when
// the collective failed. When the collective does not finish within dist.timeout_s, wait() logs
// the error and aborts the job (abort_job); with nobody to abort (world 1) it throws CommError.
// Calling wait() again after success returns at once.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// One process's handle on the job's group of ranks. All ranks must issue the same collectives
// in the same order (the MPI/NCCL rule); the results of floating-point all-reduces are bitwise
// identical on all ranks. Methods are called from one thread at a time (the training thread or
// the autograd thread during backward), except that wait() may run while others are queued.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // "mpi" | "nccl" | "single".
  virtual std::string backend() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rank and number of ranks on this node (from an MPI_COMM_TYPE_SHARED split; 0 and 1 for single).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // In-place all-reduce of `t` (any shape; float32/float64/int32/int64, float16/bfloat16 are
  // reduced in float32 and rounded once). Blocking. Throws Error for an unsupported dtype or kAvg
  // on an integer tensor, CommError when the collective fails.
  virtual void all_reduce(torch::Tensor& t, ReduceOp op) = 0;
  // Same, non-blocking: starts the collective and returns its handle. `t` is kept alive by the
  // handle and must not be touched until wait() returns.
  virtual std::shared_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) = 0;
  // In place: every rank's `t` (same shape and dtype everywhere) receives rank `root`'s values.
  // Throws Error for root outside [0, world_size), CommError when the collective fails.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // One small value per rank; returns world_size values indexed by rank, identical everywhere.
  virtual std::vector<int64_t> all_gather(int64_t value) = 0;
  virtual std::vector<double> all_gather(double value) = 0;
  // Strings may differ in length between ranks (hashes, error text).
  virtual std::vector<std::string> all_gather(const std::string& value) = 0;

  // Reduce-scatter, non-blocking (ZeRO stage 1's gradient collective). `input`: [n], the same n
  // and dtype on every rank (the dtypes of all_reduce). `output`: [shard_range(n, world_size(),
  // rank()).numel()] of input's dtype and device; receives this rank's slice of the reduction,
  // output[i] = reduce over ranks of input[begin + i] — for mpi bitwise what all_reduce leaves in
  // input[begin + i]. `output` may be `input`'s own slice (a view of input at this rank's range:
  // in place, no second buffer); no other overlap. Neither tensor may be touched until wait()
  // returns. Throws Error for
  // mismatched shapes, dtypes or devices (the all_reduce dtype rules otherwise), CommError when
  // the collective fails. The base implementation all-reduces a copy of `input` (twice the
  // traffic); the mpi, nccl and single backends override it with a real reduce-scatter.
  virtual std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& input,
                                                     torch::Tensor& output, ReduceOp op);
  // All-gather, non-blocking (ZeRO stage 1's parameter collective): `input` is this rank's slice
  // [shard_range(n, world_size(), rank()).numel()], `output` [n] (same dtype and device)
  // receives every rank's slice at its range, this rank's included. `input` may be a view of
  // `output` at this rank's range (in place). Same rules and errors as reduce_scatter_async; the
  // base implementation all-reduces a zero-filled [n] buffer (exact: every element has one
  // non-zero contribution).
  virtual std::shared_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor& output);

  // Number of collectives this communicator has started (every call above except the getters
  // counts one, whatever its size). For tests and metrics.
  int64_t collectives_issued() const { return collectives_issued_.load(); }

 protected:
  void count_collective() { collectives_issued_.fetch_add(1); }

 private:
  std::atomic<int64_t> collectives_issued_{0};
};

// The contiguous slice of a flat buffer of `numel` elements that `rank` owns when the buffer is
// sharded over `world` ranks (ZeRO, Rajbhandari et al. 2020): slices of c = ceil(numel / world)
// elements in rank order, rank r owning [min(r c, numel), min((r + 1) c, numel)), so the last
// ranks own fewer elements or none. This is the layout of NCCL's equal-count ncclReduceScatter
// on a buffer zero-padded to world * c (and of PyTorch FSDP's flat parameters).
struct ShardRange {
  int64_t begin = 0;  // first element (inclusive)
  int64_t end = 0;    // one past the last element
  int64_t numel() const { return end - begin; }
};
// Throws Error for numel < 0, world < 1 or rank outside [0, world).
ShardRange shard_range(int64_t numel, int world, int rank);

// Factory signature: (dist section). A factory throws ConfigError when its backend cannot run
// in this build or environment, CommError when set-up fails.
using CommunicatorRegistry = Registry<Communicator, const DistConfig&>;
// The registry of backends; register_builtin_communicators() fills it ("mpi", "single", and
// "nccl" in builds with the NCCL adapter).
CommunicatorRegistry& communicator_registry();
// Idempotent: safe to call more than once.
void register_builtin_communicators();

// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment). Never initialises MPI.
bool launched_under_mpi();

// Ranks on this node as the launcher set them (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
// SLURM_NTASKS_PER_NODE), before MPI starts; 1 when none is set.
int launcher_local_size();

// True when this build has the NCCL backend (a CUDA-enabled LibTorch and NCCL were found).
bool built_with_nccl();

// Builds the communicator for cfg.backend:
//   auto   -> nccl when want_cuda, built with NCCL and each rank of this node has a GPU of its
//             own; else mpi when launched_under_mpi(); else single;
//   mpi    -> MPI on CPU tensors (tensors on other devices are staged through host memory);
//   nccl   -> NCCL on CUDA tensors, bootstrapped over MPI;
//   single -> one process, world 1, no MPI.
// Initialises MPI once per process when needed (finalised at exit). Registers the built-in
// backends first. Throws ConfigError for an unknown backend (listing the known ones), for nccl
// in a build without it (saying how to build it) or with more ranks on a node than GPUs,
// CommError when MPI or NCCL set-up fails.
std::shared_ptr<Communicator> make_communicator(const DistConfig& cfg, bool want_cuda = false);

// Initialises MPI for this process if nobody has (MPI_THREAD_MULTIPLE requested, at least
// MPI_THREAD_SERIALIZED required) and arranges MPI_Finalize at exit. Programs may call it first
// thing to learn their rank before the recipe is read. Throws CommError when MPI cannot start.
void ensure_mpi_initialized();

// Fail-fast for a rank that cannot go on: when MPI is initialised (and not finalised) and the
// world has more than one rank, flushes the logs and calls MPI_Abort(MPI_COMM_WORLD, exit_code)
// so no other rank waits forever (never returns). Otherwise returns, and main exits normally.
void abort_job(int exit_code);

namespace detail {
// Shared argument checks of every backend's all_reduce: throws Error unless `t` is defined and
// its dtype is float32/float64/float16/bfloat16/int32/int64, and `op` is not kAvg on integers.
void check_all_reduce_args(const torch::Tensor& t, ReduceOp op, const std::string& backend);
// Shared checks of reduce_scatter_async / all_gather_async (`what` names the collective):
// defined tensors of one dtype (an all_reduce dtype) and device, `full` [n] contiguous or not,
// `shard` with shard_range(n, world, rank).numel() elements. Throws Error naming the backend.
void check_shard_args(const torch::Tensor& full, const torch::Tensor& shard, int world, int rank,
                      const char* what, const std::string& backend);
// Throws Error unless 0 <= root < world_size.
void check_root(int root, int world_size, const std::string& backend);
}  // namespace detail

}  // namespace mllm
