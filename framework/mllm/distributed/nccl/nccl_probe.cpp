// mllm_nccl_probe: links the NCCL core against the CUDA runtime and NCCL (the compile-and-link
// proof CI builds where there is no GPU) and, run on a machine, prints the NCCL and CUDA
// versions and the visible GPUs. Exit code 0 even without a GPU: it is a probe, not a test.
#include <cstdio>

#include <cuda_runtime_api.h>

#include "mllm/distributed/nccl/nccl_core.h"

int main() {
  std::printf("%s\n", mllm::nccl::nccl_version_string().c_str());
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess)
    std::printf("no usable CUDA device: %s\n", cudaGetErrorString(rc));
  else
    std::printf("%d CUDA device(s) visible\n", n);
  return 0;
}
