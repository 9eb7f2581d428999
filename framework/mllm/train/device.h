// Where a rank trains (train.device), the LibTorch facts that decide it, and CPU process settings.
#pragma once

#include <string>

#include <torch/torch.h>

namespace mllm {

// True when the LibTorch this process runs on was built with CUDA (its CUDA library is loaded),
// whether or not a GPU is visible.
bool libtorch_has_cuda();

// GPUs this process can use (0 without CUDA, without a driver, or with CUDA_VISIBLE_DEVICES="").
int visible_gpus();

// The device type train.device asks for: "cpu" -> kCPU; "cuda" -> kCUDA; "auto" -> kCUDA when
// libtorch_has_cuda() and visible_gpus() > 0, else kCPU. `source` (the recipe file) prefixes
// errors. Throws ConfigError (exit 2) for "cuda" when this LibTorch has no CUDA, or when it has
// but no GPU is visible — saying which — and for any other value.
torch::DeviceType resolve_device_type(const std::string& setting, const std::string& source);

// The device of a rank on this node: cpu, or cuda:(local_rank % visible_gpus()) — ranks beyond
// the GPU count share GPUs round robin. Makes that GPU the current CUDA device of this thread.
torch::Device rank_device(torch::DeviceType type, int local_rank);

// Waits until every kernel queued on `device` has finished (no-op on the CPU); for timings.
void synchronize(const torch::Device& device);

// CPUs this process may use: the CPUs of its affinity mask (taskset, mpirun --bind-to), capped
// by the cgroup CPU quota (containers, Slurm) rounded up; at least 1.
int usable_cpus();

// The cgroup CPU limit under `cgroup_root` (normally /sys/fs/cgroup), rounded up to whole CPUs:
// cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD"), else v1 `cpu/cpu.cfs_quota_us` and
// `cpu/cpu.cfs_period_us` (quota -1 = none). 0 when there is no limit or no such file.
int cgroup_cpu_limit(const std::string& cgroup_root);

// Keeps freed CPU memory in the process instead of returning it to the OS after every step:
// glibc's malloc serves blocks above its mmap threshold (dynamic, 128 KiB at first) with fresh
// mmap()s, and gives heap memory back above its trim threshold, so the activations and logits
// of every micro-batch page-fault in anew (measured here: ~3% of a mini step in the kernel's
// page-fault and page-clearing paths; +5% tokens/s). Sets M_MMAP_THRESHOLD to 32 MiB (glibc's
// maximum for it) and M_TRIM_THRESHOLD to 1 GiB with mallopt(3). Leaves everything alone when
// the user set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_, or LD_PRELOADs another
// allocator (jemalloc, tcmalloc). Returns what it did, for the log ("" when nothing).
std::string keep_freed_cpu_memory();

}  // namespace mllm
