// The CPU GEMM rates of train/mfu.h that choose the bf16 path (kernels/cpu/bf16_linear.h): what is
// timed when, and that timing leaves the default generator alone.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "mllm/core/blas.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/train/mfu.h"

namespace {

TEST(Mfu, CpuGemmRatesTimeWhatIsAskedFor) {
  const mllm::CpuGemmRates fp32_only = mllm::measure_cpu_gemm_rates(false, false);
  EXPECT_GT(fp32_only.fp32, 1e8);  // FLOP/s: any CPU that runs the tests does 0.1 GFLOP/s
  EXPECT_EQ(fp32_only.bf16, 0.0);
  EXPECT_EQ(fp32_only.mkl_bf16, 0.0);
  const mllm::CpuIsa isa = mllm::detect_cpu_isa();
  // Without bf16 units a 2048^3 bf16 product takes seconds (a Zen 3: 1.4 GFLOP/s).
  if (!isa.avx512_bf16 && !isa.amx_bf16) GTEST_SKIP() << "no bf16 units: bf16 not timed";
  const mllm::CpuGemmRates all = mllm::measure_cpu_gemm_rates(true, true);
  EXPECT_GT(all.fp32, 1e8);
  EXPECT_GT(all.bf16, 1e8);
  // oneMKL's rate exactly where libtorch_cpu.so exports its bf16 GEMM.
  EXPECT_EQ(all.mkl_bf16 > 0, mllm::mkl_gemm_bf16bf16f32() != nullptr);
  const mllm::CpuGemmRates no_mkl = mllm::measure_cpu_gemm_rates(true, false);
  EXPECT_GT(no_mkl.bf16, 1e8);
  EXPECT_EQ(no_mkl.mkl_bf16, 0.0);
}

// Dropout and bit-exact resume draw from the default CPU generator: timing must not move it.
TEST(Mfu, CpuGemmRatesLeaveTheDefaultGeneratorAlone) {
  torch::manual_seed(123);
  const torch::Tensor want = torch::randn({8});
  torch::manual_seed(123);
  mllm::measure_cpu_gemm_rates(false, false);
  EXPECT_TRUE(torch::equal(torch::randn({8}), want));
}

}  // namespace
