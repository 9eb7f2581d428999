// Communicator registry, backend selection (make_communicator), launch detection, and the
// argument checks every backend shares.
#include "mllm/distributed/communicator.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mllm/core/error.h"
#include "mllm/distributed/mpi_communicator.h"
#include "mllm/distributed/single_communicator.h"

// Written by framework/mllm/distributed/nccl/CMakeLists.txt: MLLM_HAVE_NCCL (0/1) and, when 0, why.
#if __has_include("mllm/distributed/nccl_build_config.h")
#include "mllm/distributed/nccl_build_config.h"
#endif
#ifndef MLLM_HAVE_NCCL
#define MLLM_HAVE_NCCL 0
#define MLLM_NCCL_BUILD_NOTE "the NCCL build rules (framework/mllm/distributed/nccl) were not configured"
#endif
#if MLLM_HAVE_NCCL
#include "mllm/distributed/nccl/nccl_communicator.h"
#endif

namespace mllm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

namespace detail {

void check_all_reduce_args(const torch::Tensor& t, ReduceOp op, const std::string& backend) {
  if (!t.defined()) throw Error(backend + " backend: all_reduce of an undefined tensor");
  const auto st = t.scalar_type();
  const bool floating = st == torch::kFloat || st == torch::kDouble || st == torch::kHalf ||
                        st == torch::kBFloat16;
  const bool integer = st == torch::kInt || st == torch::kLong;
  if (!floating && !integer)
    throw Error(fmt::format("{} backend: all_reduce supports float32, float64, float16, bfloat16, "
                            "int32 and int64 tensors, not {}",
                            backend, c10::toString(st)));
  if (op == ReduceOp::kAvg && integer)
    throw Error(fmt::format("{} backend: all_reduce(avg) needs a floating tensor, got {}; use sum "
                            "and divide, or convert first",
                            backend, c10::toString(st)));
}

void check_shard_args(const torch::Tensor& full, const torch::Tensor& shard, int world, int rank,
                      const char* what, const std::string& backend) {
  if (!full.defined() || !shard.defined())
    throw Error(fmt::format("{} backend: {} of an undefined tensor", backend, what));
  check_all_reduce_args(full, ReduceOp::kSum, backend);
  if (shard.scalar_type() != full.scalar_type() || shard.device() != full.device())
    throw Error(fmt::format("{} backend: {}: the full buffer is {} on {}, the shard {} on {}",
                            backend, what, c10::toString(full.scalar_type()), full.device().str(),
                            c10::toString(shard.scalar_type()), shard.device().str()));
  const ShardRange r = shard_range(full.numel(), world, rank);
  if (shard.numel() != r.numel())
    throw Error(fmt::format("{} backend: {}: rank {} of {} owns {} of the {} elements, its shard "
                            "tensor has {}",
                            backend, what, rank, world, r.numel(), full.numel(), shard.numel()));
}

void check_root(int root, int world_size, const std::string& backend) {
  if (root < 0 || root >= world_size)
    throw Error(fmt::format("{} backend: broadcast root {} is not a rank of this world of {}",
                            backend, root, world_size));
}

}  // namespace detail

CommunicatorRegistry& communicator_registry() {
  static CommunicatorRegistry registry("communicator");
  return registry;
}

void register_builtin_communicators() {
  auto& r = communicator_registry();
  if (!r.contains("single"))
    r.add("single", [](const DistConfig&) { return std::make_shared<SingleCommunicator>(); });
  if (!r.contains("mpi"))
    r.add("mpi", [](const DistConfig& c) { return std::make_shared<MpiCommunicator>(c.timeout_s); });
#if MLLM_HAVE_NCCL
  if (!r.contains("nccl"))
    r.add("nccl", [](const DistConfig& c) { return make_nccl_communicator(c); });
#endif
}

bool launched_under_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

bool built_with_nccl() { return MLLM_HAVE_NCCL != 0; }

int launcher_local_size() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

std::shared_ptr<Communicator> make_communicator(const DistConfig& cfg, bool want_cuda) {
  register_builtin_communicators();
  std::string backend = cfg.backend;
  if (backend == "auto") {
    // NCCL needs a GPU of its own per rank; ranks sharing GPUs go over MPI, staged.
    const int local = launcher_local_size();
    const int gpus = want_cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
    if (want_cuda && built_with_nccl() && local <= gpus)
      backend = "nccl";
    else
      backend = launched_under_mpi() ? "mpi" : "single";
    if (want_cuda && backend == "mpi") {
      if (!built_with_nccl())
        spdlog::warn("dist.backend auto: the model is on CUDA but this build has no NCCL ({}); "
                     "using mpi with gradients staged through host memory", MLLM_NCCL_BUILD_NOTE);
      else
        spdlog::warn("dist.backend auto: {} ranks on this node share {} GPU(s), and NCCL needs "
                     "one GPU per rank; using mpi with gradients staged through host memory",
                     local, gpus);
    }
  }
  if (backend == "nccl" && want_cuda && communicator_registry().contains("nccl")) {
    const int local = launcher_local_size();
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (local > gpus)
      throw ConfigError(fmt::format(
          "dist.backend: nccl needs one GPU per rank, but {} ranks on this node share {} GPU(s); "
          "start at most {} ranks per node, or use dist.backend: mpi (staged through host memory)",
          local, gpus, gpus));
  }
  if (backend == "nccl" && !communicator_registry().contains("nccl"))
    throw ConfigError(fmt::format(
        "dist.backend: nccl is not available in this build ({}). Build mllm with CUDA: "
        "launch/install-deps.sh --cuda-wheels (the CUDA compiler from NVIDIA's PyPI wheels; or "
        "NVIDIA's CUDA toolkit on PATH), then cmake -S . -B build -DMLLM_WITH_NCCL=ON in a fresh "
        "build folder, against the CUDA torch wheel launch/install-deps.sh installs. Or set "
        "dist.backend: mpi (CPU tensors) or auto.",
        MLLM_NCCL_BUILD_NOTE));
  return communicator_registry().create(backend, cfg);
}

ShardRange shard_range(int64_t numel, int world, int rank) {
  if (numel < 0 || world < 1 || rank < 0 || rank >= world)
    throw Error(fmt::format("shard_range: need numel >= 0 and 0 <= rank < world, got numel {}, "
                            "rank {}, world {}",
                            numel, rank, world));
  const int64_t c = (numel + world - 1) / world;
  return {std::min(c * rank, numel), std::min(c * (rank + 1), numel)};
}

namespace {
// Waits for an all-reduce of `full`, then copies [begin, end) of it into `shard`.
class SliceAfterWork : public Work {
 public:
  SliceAfterWork(std::shared_ptr<Work> inner, torch::Tensor full, torch::Tensor shard, ShardRange r)
      : inner_(std::move(inner)), full_(std::move(full)), shard_(std::move(shard)), r_(r) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    torch::NoGradGuard no_grad;
    shard_.copy_(full_.narrow(0, r_.begin, r_.numel()).view(shard_.sizes()));
    done_ = true;
  }

 private:
  std::shared_ptr<Work> inner_;
  torch::Tensor full_, shard_;
  ShardRange r_;
  bool done_ = false;
};
// Waits for an all-reduce of the zero-filled `gathered`, then copies it into `output`.
class CopyAfterWork : public Work {
 public:
  CopyAfterWork(std::shared_ptr<Work> inner, torch::Tensor gathered, torch::Tensor output)
      : inner_(std::move(inner)), gathered_(std::move(gathered)), output_(std::move(output)) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    torch::NoGradGuard no_grad;
    output_.copy_(gathered_.view(output_.sizes()));
    done_ = true;
  }

 private:
  std::shared_ptr<Work> inner_;
  torch::Tensor gathered_, output_;
  bool done_ = false;
};
}  // namespace

std::shared_ptr<Work> Communicator::reduce_scatter_async(const torch::Tensor& input,
                                                         torch::Tensor& output, ReduceOp op) {
  detail::check_shard_args(input, output, world_size(), rank(), "reduce_scatter", backend());
  torch::Tensor full = input.reshape({-1}).clone();
  auto work = all_reduce_async(full, op);
  return std::make_shared<SliceAfterWork>(std::move(work), full, output,
                                          shard_range(input.numel(), world_size(), rank()));
}

std::shared_ptr<Work> Communicator::all_gather_async(const torch::Tensor& input,
                                                     torch::Tensor& output) {
  detail::check_shard_args(output, input, world_size(), rank(), "all_gather", backend());
  const ShardRange r = shard_range(output.numel(), world_size(), rank());
  torch::Tensor gathered = torch::zeros({output.numel()}, output.options());
  {
    torch::NoGradGuard no_grad;
    gathered.narrow(0, r.begin, r.numel()).copy_(input.reshape({-1}));
  }
  auto work = all_reduce_async(gathered, ReduceOp::kSum);
  return std::make_shared<CopyAfterWork>(std::move(work), gathered, output);
}

}  // namespace mllm
