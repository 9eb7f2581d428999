/* libmllm_mkl_cpu.so: preloaded (LD_PRELOAD) by mllm's start-up BLAS check (mllm/core/blas.h)
 * when oneMKL runs its generic code path on a non-Intel CPU that has AVX2 or AVX-512.
 *
 * oneMKL chooses its code path in two steps: "is this an Intel CPU?" (these two exported
 * functions of its service layer), then the CPU's instruction-set features. On other vendors the
 * first answer is no and it runs the generic path whatever the CPU supports. Answering yes makes
 * it pick the path for the features CPUID reports. LibTorch's wheels link oneMKL statically but
 * export these symbols, so a preloaded definition takes their place. The program checks a GEMM
 * against a float64 reference after this and drops the preload if the result is wrong. */

int mkl_serv_intel_cpu(void) { return 1; }
int mkl_serv_intel_cpu_true(void) { return 1; }
