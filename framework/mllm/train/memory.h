// Measured peak memory of this process, per logging interval: the resident set on the CPU
// (Linux's VmHWM, reset through /proc/self/clear_refs), the caching allocator's peaks on CUDA.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace mllm {

struct PeakMemory {
  int64_t rss_bytes = -1;               // peak resident set since the last reset; -1: unknown
  int64_t device_allocated_bytes = -1;  // CUDA: peak bytes in tensors since the last reset
  int64_t device_reserved_bytes = -1;   // CUDA: peak bytes the caching allocator held
  bool rss_resettable = false;          // false: rss_bytes is the process's lifetime peak
};

// Peaks since the last reset_peak_memory() (or the start). `device`: CUDA peaks are read for a
// CUDA device (when LibTorch was built with CUDA), -1 otherwise. Never throws: what cannot be
// read stays -1.
PeakMemory peak_memory(const torch::Device& device);

// Starts a new interval: writes "5" to /proc/self/clear_refs (Linux >= 4.0: resets VmHWM to
// the current RSS; refused in some containers, then rss_resettable is false and the peak stays
// the lifetime one) and resets the CUDA allocator's peak statistics for `device`. Never throws.
void reset_peak_memory(const torch::Device& device);

}  // namespace mllm
