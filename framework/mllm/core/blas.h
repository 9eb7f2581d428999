// The BLAS under LibTorch: which library and code path it runs, what the CPU could run, and a
// start-up correction when a BLAS runs a generic kernel on a CPU that has better (docs/blas.md).
//
// oneMKL (LibTorch's wheels link it statically) dispatches on the CPU vendor: on a non-Intel CPU
// it runs its generic "compatible" path even where the CPU has AVX2 or AVX-512. Its vendor test
// is the exported function mkl_serv_intel_cpu(); the correction preloads libmllm_mkl_cpu.so,
// which answers "Intel" to it, so that MKL picks the path for the CPU's instruction set.
// OpenBLAS (Debian's LibTorch) picks its core from a table of CPU models, falls back to a
// generic core ("Prescott") on a model it does not know, and reads OPENBLAS_CORETYPE once when
// it loads; the correction sets that variable.
//
// Either way the setting must exist before the library loads, so ensure_fast_blas() re-executes
// the program once (same pid, so it works under a plain mpirun), checks a GEMM against a float64
// reference in the re-executed process, and goes back to the library's own choice (with a
// warning) when the product is wrong or the program dies of SIGILL / SIGSEGV in the check.
//
// Environment:
//   MLLM_BLAS_CORE=keep        no correction (the log still says what would be better)
//   OPENBLAS_CORETYPE, MKL_ENABLE_INSTRUCTIONS, MKL_CBWR, MKL_DEBUG_CPU_TYPE set by the user:
//                              the user's choice, respected (no correction)
//   MLLM_BLAS_TEST=LIST        tests only, a comma-separated list of:
//                              generic   the decision sees a generic path whatever the BLAS runs
//                              bad-gemm  the check GEMM of the corrected BLAS fails
#pragma once

#include <string>

namespace mllm {

// Instruction-set features of this CPU, from CPUID (Intel SDM vol. 2A, CPUID leaves 0, 1, 7).
struct CpuIsa {
  std::string vendor;        // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  bool avx2_fma = false;     // AVX2 and FMA3, with OS support for the YMM state
  bool avx512 = false;       // AVX-512 F, BW, DQ and VL (the set BLAS kernels need), OS-enabled
  bool avx512_bf16 = false;  // AVX512_BF16 (leaf 7 subleaf 1 EAX bit 5)
  bool amx_bf16 = false;     // AMX-TILE and AMX-BF16 (leaf 7 EDX bits 24 and 22), OS-enabled
                             // (XCR0 bits 17 and 18)
  // 3 = AVX-512, 2 = AVX2 + FMA, 0 = neither (the scale of BlasProbe::level).
  int level() const;
  // "AuthenticAMD: avx2 fma avx512 avx512_bf16".
  std::string describe() const;
};

// This CPU's features (CPUID); all false off x86-64.
CpuIsa detect_cpu_isa();

// What LibTorch's BLAS is and which kernels it chose, read from the loaded library.
struct BlasProbe {
  enum class Kind { kMkl, kOpenBlas, kOther } kind = Kind::kOther;
  std::string library;  // "oneMKL 2024.2", "OpenBLAS 0.3.21", or LibTorch's BLAS_INFO
  std::string path;     // MKL code path ("AVX2", "AVX-512 + VNNI/bf16", "generic") or
                        // OpenBLAS core ("Haswell", "Prescott"); "" when unknown
  int level = -1;       // 3 AVX-512, 2 AVX2, 1 AVX, 0 generic/SSE, -1 unknown
};

// Reads the BLAS of this process: MKL by mkl_serv_cbwr_get_auto_branch() (the implementation
// of the documented mkl_cbwr_get_auto_branch(); branch constants from mkl_cbwr.h), OpenBLAS by
// openblas_get_corename() (core names from OpenBLAS's driver/others/dynamic.c).
BlasProbe probe_blas();

// The correction to make, decided from a probe, the CPU and the environment.
struct BlasFix {
  enum class Action { kNone, kPreloadMklShim, kSetOpenBlasCore } action = Action::kNone;
  std::string value;   // the OpenBLAS core to set (kSetOpenBlasCore)
  std::string reason;  // why (for the log), also when no correction is made
  bool warn = false;   // the BLAS stays slower than the CPU allows: the log warns
};

// Environment inputs of decide_blas_fix: the values of the variables named in the file comment,
// "" when unset.
struct BlasEnv {
  std::string mllm_blas_core;     // MLLM_BLAS_CORE
  std::string openblas_coretype;  // OPENBLAS_CORETYPE
  std::string mkl_override;       // first of MKL_ENABLE_INSTRUCTIONS, MKL_CBWR, MKL_DEBUG_CPU_TYPE
                                  // set, as NAME=value
  static BlasEnv from_environment();
};

// The pure decision: no correction when the BLAS's level is unknown or already matches the
// CPU's, or the user chose (MLLM_BLAS_CORE=keep, their own OpenBLAS core or MKL setting; these
// warn when the BLAS is below the CPU). Else MKL on a non-Intel CPU -> kPreloadMklShim;
// OpenBLAS -> kSetOpenBlasCore with SAPPHIRERAPIDS (AMX), COOPERLAKE (avx512_bf16), SKYLAKEX
// (AVX-512) or HASWELL (AVX2 + FMA). Throws ConfigError for an MLLM_BLAS_CORE other than
// "" or "keep".
BlasFix decide_blas_fix(const BlasProbe& probe, const CpuIsa& cpu, const BlasEnv& env);

// Call first in main(), before MPI_Init and any thread: when decide_blas_fix() asks for a
// correction, re-executes this program's file (/proc/self/exe resolved, so the process keeps
// its name) with the same argv and the corrected environment (does not return), the stop
// signals blocked across the exec (core/stop_signal.h: mllm-train installs their handlers
// before this call, and a signal that arrives meanwhile is delivered once the new image has
// them); in the re-executed process checks a 256x256 fp32 GEMM against float64
// (max relative error < 1e-4) and returns on success, or re-executes once more with the
// library's own choice and MLLM_BLAS_CORE=keep. Never throws: an MLLM_BLAS_CORE other than
// "keep" prints the error to stderr and exits with code 2 (bad input); other problems become
// the warning of blas_startup_note().
void ensure_fast_blas(char** argv);

// What ensure_fast_blas() found and did, for the log: "corrected: ...", "kept: ...", or "".
struct BlasStartupNote {
  std::string text;
  bool warn = false;
};
const BlasStartupNote& blas_startup_note();

// One line for every program's and rank's log: library, code path, CPU ISA, measured fp32 and
// bf16 GEMM rates in GFLOP/s at this process's thread count (square GEMMs of constant operands,
// so the default random generator is untouched), and the start-up note. Takes ~0.1-1 s.
std::string describe_blas();

// The MKL path corresponding to an MKL CBWR branch (mkl_cbwr.h: 2 COMPATIBLE ... 10 AVX2,
// 12 AVX512, 14 AVX512_E1) and its level; for tests and describe_blas().
std::string mkl_branch_name(int branch);
int mkl_branch_level(int branch);
// The level of an OpenBLAS core name (case-insensitive); -1 when the name is unknown.
int openblas_core_level(const std::string& core);

}  // namespace mllm
