// The MFU denominator: the peak matmul throughput of the hardware the job's ranks actually
// have, measured at start-up.
//
// MFU = FLOPs per token x tokens/s / peak (PaLM, Chowdhery et al. 2022, appendix B). FLOPs per
// token: LanguageModel::flops_per_token (6N for the weights' matmuls in forward + backward, plus
// the attention scores and their weighted sum, 12 x n_layers x seq x d_model per token: the
// count nanoGPT and the PyTorch peer use; docs/ARCHITECTURE.md).
#pragma once

#include <string>

#include <torch/torch.h>

namespace mllm {

class Communicator;

// This process's matmul throughput in FLOP/s on `device` at the current thread count and dtype:
// the best of a few timed n x n GEMMs on random operands after warm-up (n = 2048 on the CPU,
// 8192 on a GPU; a GPU multiplies constant operands ~13% faster). Leaves the default generators
// untouched.
double measure_peak_flops(bool bf16, const torch::Device& device = torch::Device(torch::kCPU));

// This process's CPU GEMM rates in FLOP/s at the current thread count, n = 2048 on random operands:
// ATen's float32 mm; ATen's bf16 mm with `bf16` (else 0); oneMKL's cblas_gemm_bf16bf16f32 (bf16
// operands, float32 result; kernels/cpu/bf16_linear.h) with `mkl_bf16` where libtorch_cpu.so
// exports it (else 0). Each the best of 5 after one warm-up, the kinds timed in turn (fp32, bf16,
// oneMKL, fp32, ...), so that a slowdown of the machine lasting a few products meets every kind
// rather than one of them: their ratios choose the bf16 path. Leaves the default generators
// untouched.
struct CpuGemmRates {
  double fp32 = 0, bf16 = 0, mkl_bf16 = 0;
};
CpuGemmRates measure_cpu_gemm_rates(bool bf16, bool mkl_bf16);

struct JobPeak {
  double flops = 0;        // FLOP/s of the whole job (all nodes)
  int nodes = 0;           // CPU measurements summed (one per node, or one per rank when the
                           // ranks of a node are bound to disjoint cores); 0 on a GPU
  // CPU: the job's GEMM rates in both dtypes (FLOP/s, nodes summed; `flops` is one of them, by
  // train.precision), to say whether bf16 is expected to be faster here; 0 on a GPU, and bf16's
  // 0 for an fp32 run on a CPU without bf16 units (avx512_bf16, amx_bf16: not timed there).
  double cpu_fp32_flops = 0, cpu_bf16_flops = 0;
  // CPU, bf16 runs on CPUs with avx512_bf16 and no AMX with MLLM_BF16_GEMM unset: the rate of
  // oneMKL's cblas_gemm_bf16bf16f32 (FLOP/s, nodes summed; measure_cpu_gemm_rates), which
  // choose_bf16_gemm compares with cpu_bf16_flops (ATen's); 0 elsewhere, and unless every node
  // that measured timed it.
  double cpu_mkl_bf16_flops = 0;
  std::string how;         // how it was obtained, for the log
};

// Collective. CPU: on each node one rank (local rank 0) times the GEMM with usable_cpus() threads
// (affinity and cgroup quota: the cores this node's ranks share) while the node's other ranks wait,
// sleeping, in a barrier; the nodes' rates are summed. Where the ranks of a node are bound to
// pairwise disjoint CPU sets (mpirun --bind-to core / socket), every rank times its own cores
// instead, all at once, and every rank's rate is summed. CUDA: every GPU in use is timed once (by
// the first local rank on it), all at the same moment; the rates are summed. `bf16`: the GEMM in
// bf16 (train.precision), else fp32; on the CPU the other dtype is timed too (cpu_fp32_flops,
// cpu_bf16_flops; bf16 only with bf16 units or when asked for), and for a bf16 run on a CPU with
// avx512_bf16 and no AMX, MLLM_BF16_GEMM unset, oneMKL's bf16 GEMM as well (cpu_mkl_bf16_flops:
// which one runs the products is chosen from it, kernels/cpu/bf16_linear.h). Restores this rank's
// thread count. Throws CommError if a collective fails.
JobPeak measure_job_peak_flops(Communicator& comm, bool bf16, const torch::Device& device);

}  // namespace mllm
