// The start-up BLAS check's decision (core/blas.h), from hand-written probes and CPUs: which
// correction each case gets, and that the user's own settings are respected.
#include <gtest/gtest.h>

#include "mllm/core/blas.h"
#include "mllm/core/error.h"

namespace mllm {
namespace {

BlasProbe mkl(int level, std::string path = "generic (MKL_CBWR_COMPATIBLE)") {
  BlasProbe p;
  p.kind = BlasProbe::Kind::kMkl;
  p.library = "oneMKL 2024.2";
  p.path = std::move(path);
  p.level = level;
  return p;
}

BlasProbe openblas(const std::string& core) {
  BlasProbe p;
  p.kind = BlasProbe::Kind::kOpenBlas;
  p.library = "OpenBLAS 0.3.21";
  p.path = core;
  p.level = openblas_core_level(core);
  return p;
}

CpuIsa cpu(const std::string& vendor, bool avx2, bool avx512, bool bf16 = false, bool amx = false) {
  CpuIsa c;
  c.vendor = vendor;
  c.avx2_fma = avx2;
  c.avx512 = avx512;
  c.avx512_bf16 = bf16;
  c.amx_bf16 = amx;
  return c;
}

TEST(MklBranch, LevelsFollowMklCbwrConstants) {
  // mkl_cbwr.h: 2 COMPATIBLE, 3 SSE2, 8 SSE4_2, 9 AVX, 10 AVX2, 12 AVX512, 14 AVX512_E1.
  EXPECT_EQ(mkl_branch_level(2), 0);
  EXPECT_EQ(mkl_branch_level(3), 0);
  EXPECT_EQ(mkl_branch_level(8), 0);
  EXPECT_EQ(mkl_branch_level(9), 1);
  EXPECT_EQ(mkl_branch_level(10), 2);
  EXPECT_EQ(mkl_branch_level(12), 3);
  EXPECT_EQ(mkl_branch_level(14), 3);
  EXPECT_EQ(mkl_branch_level(1), -1);  // MKL_CBWR_AUTO is a request, not a branch
  EXPECT_EQ(mkl_branch_name(10), "AVX2");
  EXPECT_EQ(mkl_branch_name(14), "AVX-512 + VNNI/bf16");
}

TEST(OpenBlasCore, LevelsByCoreName) {
  EXPECT_EQ(openblas_core_level("Prescott"), 0);
  EXPECT_EQ(openblas_core_level("Nehalem"), 0);
  EXPECT_EQ(openblas_core_level("Sandybridge"), 1);
  EXPECT_EQ(openblas_core_level("Haswell"), 2);
  EXPECT_EQ(openblas_core_level("Zen"), 2);
  EXPECT_EQ(openblas_core_level("SkylakeX"), 3);
  EXPECT_EQ(openblas_core_level("COOPERLAKE"), 3);
  EXPECT_EQ(openblas_core_level("SapphireRapids"), 3);
  EXPECT_EQ(openblas_core_level("Loongson3R5"), -1);
}

TEST(DecideBlasFix, MklGenericOnAmdWithAvx512IsPreloaded) {
  BlasFix f = decide_blas_fix(mkl(0), cpu("AuthenticAMD", true, true, true), {});
  EXPECT_EQ(f.action, BlasFix::Action::kPreloadMklShim);
  EXPECT_FALSE(f.warn);
  EXPECT_NE(f.reason.find("AVX-512"), std::string::npos) << f.reason;
  EXPECT_NE(f.reason.find("AuthenticAMD"), std::string::npos) << f.reason;
}

TEST(DecideBlasFix, MklGenericOnAvx2CpuIsPreloaded) {
  BlasFix f = decide_blas_fix(mkl(0), cpu("AuthenticAMD", true, false), {});
  EXPECT_EQ(f.action, BlasFix::Action::kPreloadMklShim);
  EXPECT_NE(f.reason.find("AVX2 + FMA"), std::string::npos) << f.reason;
}

TEST(DecideBlasFix, MklOnItsBestPathIsLeftAlone) {
  BlasFix f = decide_blas_fix(mkl(3, "AVX-512"), cpu("GenuineIntel", true, true), {});
  EXPECT_EQ(f.action, BlasFix::Action::kNone);
  EXPECT_FALSE(f.warn);
  EXPECT_EQ(f.reason, "");
  // AVX2 path on an AVX2-only CPU: nothing better exists.
  EXPECT_EQ(decide_blas_fix(mkl(2, "AVX2"), cpu("AuthenticAMD", true, false), {}).action,
            BlasFix::Action::kNone);
  // A CPU without AVX2: the generic path is what it can run.
  EXPECT_EQ(decide_blas_fix(mkl(0), cpu("GenuineIntel", false, false), {}).action,
            BlasFix::Action::kNone);
}

TEST(DecideBlasFix, UnknownPathIsNotTouched) {
  BlasFix f = decide_blas_fix(mkl(-1, ""), cpu("AuthenticAMD", true, true), {});
  EXPECT_EQ(f.action, BlasFix::Action::kNone);
  EXPECT_FALSE(f.warn);
}

TEST(DecideBlasFix, KeepIsRespectedAndWarns) {
  BlasEnv env;
  env.mllm_blas_core = "keep";
  BlasFix f = decide_blas_fix(mkl(0), cpu("AuthenticAMD", true, true), env);
  EXPECT_EQ(f.action, BlasFix::Action::kNone);
  EXPECT_TRUE(f.warn);
  EXPECT_NE(f.reason.find("MLLM_BLAS_CORE=keep"), std::string::npos) << f.reason;
}

TEST(DecideBlasFix, UsersMklSettingIsRespected) {
  BlasEnv env;
  env.mkl_override = "MKL_ENABLE_INSTRUCTIONS=SSE4_2";
  BlasFix f = decide_blas_fix(mkl(0), cpu("AuthenticAMD", true, true), env);
  EXPECT_EQ(f.action, BlasFix::Action::kNone);
  EXPECT_TRUE(f.warn);
  EXPECT_NE(f.reason.find("MKL_ENABLE_INSTRUCTIONS=SSE4_2"), std::string::npos) << f.reason;
}

TEST(DecideBlasFix, BadKeepValueIsAConfigError) {
  BlasEnv env;
  env.mllm_blas_core = "off";
  EXPECT_THROW(decide_blas_fix(mkl(0), cpu("AuthenticAMD", true, true), env), ConfigError);
}

TEST(DecideBlasFix, OpenBlasPrescottGetsTheCoreOfTheCpu) {
  // The case of issue 13: Sapphire Rapids-class CPU (AMX), OpenBLAS 0.3.21 says Prescott.
  EXPECT_EQ(decide_blas_fix(openblas("Prescott"), cpu("GenuineIntel", true, true, true, true), {}).value,
            "SAPPHIRERAPIDS");
  EXPECT_EQ(decide_blas_fix(openblas("Prescott"), cpu("GenuineIntel", true, true, true), {}).value,
            "COOPERLAKE");
  EXPECT_EQ(decide_blas_fix(openblas("Prescott"), cpu("GenuineIntel", true, true), {}).value,
            "SKYLAKEX");
  BlasFix f = decide_blas_fix(openblas("Nehalem"), cpu("AuthenticAMD", true, false), {});
  EXPECT_EQ(f.action, BlasFix::Action::kSetOpenBlasCore);
  EXPECT_EQ(f.value, "HASWELL");
  // Haswell core on an AVX-512 CPU is below what it could run.
  EXPECT_EQ(decide_blas_fix(openblas("Haswell"), cpu("GenuineIntel", true, true), {}).value,
            "SKYLAKEX");
  EXPECT_EQ(decide_blas_fix(openblas("SkylakeX"), cpu("GenuineIntel", true, true), {}).action,
            BlasFix::Action::kNone);
}

TEST(DecideBlasFix, UsersOpenBlasCoreIsRespected) {
  BlasEnv env;
  env.openblas_coretype = "NEHALEM";
  BlasFix f = decide_blas_fix(openblas("Nehalem"), cpu("GenuineIntel", true, true), env);
  EXPECT_EQ(f.action, BlasFix::Action::kNone);
  EXPECT_TRUE(f.warn);
  EXPECT_NE(f.reason.find("OPENBLAS_CORETYPE=NEHALEM"), std::string::npos) << f.reason;
}

TEST(CpuIsa, LevelAndDescription) {
  EXPECT_EQ(cpu("AuthenticAMD", true, true, true).level(), 3);
  EXPECT_EQ(cpu("AuthenticAMD", true, false).level(), 2);
  EXPECT_EQ(cpu("GenuineIntel", false, false).level(), 0);
  EXPECT_EQ(cpu("AuthenticAMD", true, true, true).describe(), "AuthenticAMD: avx2 fma avx512 avx512_bf16");
}

TEST(CpuIsa, DetectAgreesWithProcCpuinfo) {
  // Independent source: the kernel's flags line. (x86-64 Linux only.)
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string flags;
  char line[8192];
  while (std::fgets(line, sizeof line, f))
    if (std::string(line).rfind("flags", 0) == 0) {
      flags = std::string(line) + " ";
      break;
    }
  std::fclose(f);
  if (flags.empty()) GTEST_SKIP() << "no flags line (not x86)";
  auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos ||
                                            flags.find(std::string(" ") + flag + "\n") != std::string::npos; };
  const CpuIsa isa = detect_cpu_isa();
  EXPECT_EQ(isa.avx2_fma, has("avx2") && has("fma"));
  EXPECT_EQ(isa.avx512, has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl"));
  EXPECT_EQ(isa.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(isa.amx_bf16, has("amx_bf16") && has("amx_tile"));
}

}  // namespace
}  // namespace mllm
