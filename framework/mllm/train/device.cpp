// train.device: CUDA availability, per-rank device choice, synchronisation for timings.
#include "mllm/train/device.h"

#include <malloc.h>
#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "mllm/core/error.h"
#include "mllm/version.h"

namespace mllm {

bool libtorch_has_cuda() { return at::detail::getCUDAHooks().isBuilt(); }

int visible_gpus() { return libtorch_has_cuda() ? static_cast<int>(torch::cuda::device_count()) : 0; }

torch::DeviceType resolve_device_type(const std::string& setting, const std::string& source) {
  if (setting == "cpu") return torch::kCPU;
  if (setting != "cuda" && setting != "auto")
    throw ConfigError(fmt::format("{}: train.device: expected auto, cpu or cuda, got '{}'", source,
                                  setting));
  const bool cuda = libtorch_has_cuda();
  const int gpus = visible_gpus();
  if (setting == "auto") return cuda && gpus > 0 ? torch::kCUDA : torch::kCPU;
  // A CPU build (cmake/MllmTorch.cmake) does not load LibTorch's CUDA part, so its hooks say "not
  // built" even for the CUDA torch wheel; the note says why this build has no CUDA.
  if (!cuda)
    throw ConfigError(fmt::format(
        "{}: train.device=cuda, but this is a CPU build of mllm ({}). For GPUs: "
        "launch/install-deps.sh --cuda-wheels (the CUDA compiler from NVIDIA's PyPI wheels) or "
        "NVIDIA's CUDA toolkit, then configure and build again; or set train.device=cpu or auto",
        source, MLLM_CUDA_BUILD ? "LibTorch's CUDA part did not load" : MLLM_CUDA_BUILD_NOTE));
  if (gpus == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw ConfigError(fmt::format(
        "{}: train.device=cuda, but no GPU is visible on this machine (LibTorch has CUDA; "
        "CUDA_VISIBLE_DEVICES={}); check nvidia-smi, or set train.device=cpu or auto",
        source, visible ? fmt::format("'{}'", visible) : std::string("unset")));
  }
  return torch::kCUDA;
}

torch::Device rank_device(torch::DeviceType type, int local_rank) {
  if (type != torch::kCUDA) return torch::Device(type);
  const int gpus = visible_gpus();
  MLLM_CHECK(gpus > 0, "rank_device: no GPU visible");
  torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
  c10::impl::getDeviceGuardImpl(torch::kCUDA)->setDevice(device);
  return device;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

int cgroup_cpu_limit(const std::string& cgroup_root) {
  auto limit = [](double quota, double period) {
    return quota > 0 && period > 0 ? static_cast<int>(std::ceil(quota / period)) : 0;
  };
  {
    std::ifstream v2(cgroup_root + "/cpu.max");
    std::string quota;
    double period = 0;
    if (v2 >> quota >> period) return quota == "max" ? 0 : limit(std::atof(quota.c_str()), period);
  }
  std::ifstream q(cgroup_root + "/cpu/cpu.cfs_quota_us"), p(cgroup_root + "/cpu/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (q >> quota && p >> period) return limit(quota, period);
  return 0;
}

int usable_cpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  const int quota = cgroup_cpu_limit("/sys/fs/cgroup");
  if (quota > 0) cpus = std::min(cpus, quota);
  return std::max(1, cpus);
}

std::string keep_freed_cpu_memory() {
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(v) != nullptr) return "";
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload != nullptr && (std::strstr(preload, "jemalloc") || std::strstr(preload, "tcmalloc")))
    return "";
  const bool ok = ::mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && ::mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok ? "CPU allocator: glibc malloc keeps freed memory for reuse (mmap threshold 32 MiB, "
              "trim threshold 1 GiB; MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ override)"
            : "";
}

}  // namespace mllm
