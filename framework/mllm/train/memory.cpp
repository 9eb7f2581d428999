// Peak memory per logging interval: /proc/self/status VmHWM and clear_refs on the CPU, the CUDA
// caching allocator's statistics on a GPU.
#include "mllm/train/memory.h"

#include <fstream>
#include <string>

#ifdef MLLM_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace mllm {
namespace {

bool g_resettable = false;  // the last reset took effect

int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    try {
      return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
    } catch (...) {
      return -1;
    }
  }
  return -1;
}

}  // namespace

PeakMemory peak_memory(const torch::Device& device) {
  PeakMemory m;
  m.rss_bytes = vm_hwm_bytes();
  m.rss_resettable = g_resettable;
#ifdef MLLM_TORCH_HAS_CUDA
  if (device.is_cuda()) {
    try {
      using c10::CachingAllocator::StatType;
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
      const auto all = static_cast<size_t>(StatType::AGGREGATE);
      m.device_allocated_bytes = stats.allocated_bytes[all].peak;
      m.device_reserved_bytes = stats.reserved_bytes[all].peak;
    } catch (...) {
    }
  }
#else
  (void)device;
#endif
  return m;
}

void reset_peak_memory(const torch::Device& device) {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  g_resettable = static_cast<bool>(out);
#ifdef MLLM_TORCH_HAS_CUDA
  if (device.is_cuda()) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
    } catch (...) {
    }
  }
#else
  (void)device;
#endif
}

}  // namespace mllm
