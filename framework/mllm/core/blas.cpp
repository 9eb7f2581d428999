#include "mllm/core/blas.h"

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <fmt/format.h>
#include <torch/torch.h>

#include "mllm/core/error.h"
#include "mllm/core/stop_signal.h"

extern char** environ;

namespace mllm {
namespace {

constexpr const char* kPhaseVar = "MLLM_BLAS_REEXEC";     // "verify" in the re-executed process
constexpr const char* kFromVar = "MLLM_BLAS_FROM";        // "<level>|<library> <path>" before
constexpr const char* kSavedPreloadVar = "MLLM_BLAS_SAVED_LD_PRELOAD";  // "-" = was unset
constexpr const char* kSetCoreVar = "MLLM_BLAS_SET_CORETYPE";  // "1": we set OPENBLAS_CORETYPE
constexpr const char* kFailedVar = "MLLM_BLAS_FAILED";    // why the corrected BLAS was dropped
constexpr const char* kShimName = "libmllm_mkl_cpu.so";

BlasStartupNote g_note;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Whether MLLM_BLAS_TEST (a comma-separated list) names `what`.
bool test_mode(const std::string& what) {
  const std::string list = "," + env_or_empty("MLLM_BLAS_TEST") + ",";
  return list.find("," + what + ",") != std::string::npos;
}

#if defined(__x86_64__) || defined(__i386__)
uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}
#endif

// OpenBLAS core names by level (OpenBLAS driver/others/dynamic.c, gotoblas_corename()).
int core_level_lower(const std::string& c) {
  static const char* generic[] = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                  "katmai", "coppermine", "northwood", "banias", "athlon",
                                  "opteron", "opteron_sse3", "barcelona", "bobcat", "nano",
                                  "generic"};
  static const char* avx[] = {"sandybridge", "bulldozer", "piledriver"};
  static const char* avx2[] = {"haswell", "zen", "steamroller", "excavator", "skylake"};
  static const char* avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  for (const char* n : generic) if (c == n) return 0;
  for (const char* n : avx) if (c == n) return 1;
  for (const char* n : avx2) if (c == n) return 2;
  for (const char* n : avx512) if (c == n) return 3;
  return -1;
}

std::string shim_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&detect_cpu_isa), &info) && info.dli_fname)
    return (std::filesystem::path(info.dli_fname).parent_path() / kShimName).string();
  return kShimName;
}

// 256x256 fp32 GEMM of fixed operands against the float64 product; max relative error.
double gemm_check_error() {
  torch::NoGradGuard no_grad;
  const int64_t n = 256;
  auto idx = torch::arange(n * n, torch::kFloat64).reshape({n, n});
  torch::Tensor a = torch::sin(idx * 0.37), b = torch::cos(idx * 0.11);
  torch::Tensor c = torch::mm(a.to(torch::kFloat32), b.to(torch::kFloat32)).to(torch::kFloat64);
  torch::Tensor ref = torch::mm(a, b);
  double err = ((c - ref).abs().max() / ref.abs().max()).item<double>();
  if (test_mode("bad-gemm")) err = 1.0;
  return err;
}

// This program's file, resolved once (before any signal handler may need it): re-executing it
// by this path, not /proc/self/exe, keeps the process name (`ps`, `pgrep mllm-train`, `pkill`,
// Slurm's accounting), which the kernel takes from the executed file's name.
const std::string& self_path() {
  static const std::string path = [] {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("/proc/self/exe") : p.string();
  }();
  return path;
}

// The fallback process image: argv, and the environment without the correction, with
// MLLM_BLAS_CORE=keep and MLLM_BLAS_FAILED=why. Built before the check so that a signal
// handler can execve it (execve is async-signal-safe; building it there would not be).
struct Fallback {
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  char** argv = nullptr;
  void build(char** args, const std::string& why) {
    argv = args;
    self_path();  // resolved now: exec() runs in a signal handler
    env_strings.clear();
    const std::string saved = env_or_empty(kSavedPreloadVar);
    const bool unset_core = env_or_empty(kSetCoreVar) == "1";
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key == "LD_PRELOAD" && !saved.empty()) continue;
      if (key == "OPENBLAS_CORETYPE" && unset_core) continue;
      if (key == kSavedPreloadVar || key == kSetCoreVar || key == kFromVar ||
          key == kPhaseVar || key == kFailedVar || key == "MLLM_BLAS_CORE")
        continue;
      env_strings.push_back(kv);
    }
    if (saved.size() > 1 && saved[0] == '=') env_strings.push_back("LD_PRELOAD" + saved);
    env_strings.push_back("MLLM_BLAS_CORE=keep");
    env_strings.push_back(std::string(kFailedVar) + "=" + why);
    envp.clear();
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
  }
  [[noreturn]] void exec() {
    block_stop_signals(true);  // a stop signal waits for the next image's handler (stop_signal.h)
    ::execve(self_path().c_str(), argv, envp.data());
    ::_exit(127);
  }
};

Fallback g_crash_fallback;

extern "C" void on_check_crash(int) { g_crash_fallback.exec(); }

// Removes the variables of the re-execution protocol from this process's environment.
void clear_protocol_env() {
  for (const char* v : {kPhaseVar, kFromVar, kSavedPreloadVar, kSetCoreVar, kFailedVar})
    ::unsetenv(v);
}

void verify_corrected(char** argv) {
  const std::string from = env_or_empty(kFromVar);
  const auto bar = from.find('|');
  const int from_level = bar == std::string::npos ? 0 : std::atoi(from.substr(0, bar).c_str());
  const std::string from_text = bar == std::string::npos ? from : from.substr(bar + 1);
  ::unsetenv(kPhaseVar);
  const BlasProbe now = probe_blas();
  Fallback wrong;
  if (now.level <= from_level) {
    wrong.build(argv, fmt::format("the code path stayed {} ({})", now.path.empty() ? "unknown" : now.path,
                                  now.library));
    wrong.exec();
  }
  g_crash_fallback.build(argv, "the check GEMM died of a signal (SIGILL/SIGSEGV/SIGBUS)");
  struct sigaction sa{}, old_ill{}, old_segv{}, old_bus{};
  sa.sa_handler = on_check_crash;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGILL, &sa, &old_ill);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  double err = 1.0;
  try {
    err = gemm_check_error();
  } catch (const std::exception&) {
    err = 1.0;
  }
  sigaction(SIGILL, &old_ill, nullptr);
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  if (!(err < 1e-4)) {
    wrong.build(argv, fmt::format("a 256x256 fp32 GEMM had max relative error {:.2e} against "
                                  "float64 (limit 1e-4)", err));
    wrong.exec();
  }
  clear_protocol_env();
  g_note.text = fmt::format("corrected: {} -> {} {} (fp32 GEMM check against float64: max "
                            "relative error {:.1e}; MLLM_BLAS_CORE=keep turns this off)",
                            from_text, now.library, now.path, err);
}

}  // namespace

int CpuIsa::level() const { return avx512 ? 3 : avx2_fma ? 2 : 0; }

std::string CpuIsa::describe() const {
  std::string s = vendor.empty() ? "CPU" : vendor;
  s += ":";
  if (avx2_fma) s += " avx2 fma";
  if (avx512) s += " avx512";
  if (avx512_bf16) s += " avx512_bf16";
  if (amx_bf16) s += " amx_bf16";
  if (!avx2_fma && !avx512) s += " no avx2/avx512";
  return s;
}

CpuIsa detect_cpu_isa() {
  CpuIsa isa;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return isa;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  isa.vendor = vendor;
  if (max_leaf < 7) return isa;
  __get_cpuid(1, &a, &b, &c, &d);
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27);
  if (!osxsave) return isa;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const unsigned sub_leaves = a;
  const bool avx2 = b & (1u << 5);
  const bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
  isa.avx2_fma = avx2 && fma && ymm_os;
  isa.avx512 = f && dq && bw && vl && zmm_os;
  // AMX also needs the OS to manage the tile state: XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA).
  const bool tiles_os = (xcr0 & (3ull << 17)) == (3ull << 17);
  isa.amx_bf16 = (d & (1u << 24)) && (d & (1u << 22)) && tiles_os;
  if (sub_leaves >= 1) {
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    isa.avx512_bf16 = isa.avx512 && (a & (1u << 5));
  }
#endif
  return isa;
}

std::string mkl_branch_name(int branch) {
  switch (branch) {
    case 2: return "generic (MKL_CBWR_COMPATIBLE)";
    case 3: return "SSE2";
    case 4: case 5: case 6: return "SSSE3";
    case 7: return "SSE4.1";
    case 8: return "SSE4.2";
    case 9: return "AVX";
    case 10: return "AVX2";
    case 11: case 13: return "AVX-512 (Xeon Phi)";
    case 12: return "AVX-512";
    case 14: return "AVX-512 + VNNI/bf16";
    default: return branch > 14 ? fmt::format("branch {} (newer than AVX-512)", branch)
                                : fmt::format("branch {}", branch);
  }
}

int mkl_branch_level(int branch) {
  if (branch < 2) return -1;
  if (branch <= 8) return 0;
  if (branch == 9) return 1;
  if (branch == 10 || branch == 11 || branch == 13) return 2;
  return 3;
}

int openblas_core_level(const std::string& core) {
  std::string lower = core;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return core_level_lower(lower);
}

BlasProbe probe_blas() {
  BlasProbe p;
  if (auto version = reinterpret_cast<void (*)(char*, int)>(
          ::dlsym(RTLD_DEFAULT, "MKL_Get_Version_String"))) {
    p.kind = BlasProbe::Kind::kMkl;
    char buf[256] = {};
    version(buf, sizeof buf - 1);
    std::string v = buf;  // "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build ..."
    const auto at = v.find("Version ");
    p.library = "oneMKL " + (at == std::string::npos ? std::string("?")
                                                     : v.substr(at + 8, v.find_first_of("- ", at + 8) - at - 8));
    if (auto branch = reinterpret_cast<int (*)()>(
            ::dlsym(RTLD_DEFAULT, "mkl_serv_cbwr_get_auto_branch"))) {
      const int b = branch();
      p.path = mkl_branch_name(b);
      p.level = mkl_branch_level(b);
    }
  } else if (auto core = reinterpret_cast<char* (*)()>(
                 ::dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    p.kind = BlasProbe::Kind::kOpenBlas;
    auto config = reinterpret_cast<char* (*)()>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
    std::string cfg = config ? config() : "OpenBLAS";
    p.library = cfg.substr(0, cfg.find(' ', cfg.find(' ') + 1));  // "OpenBLAS 0.3.21"
    p.path = core() ? core() : "";
    p.level = openblas_core_level(p.path);
  } else {
    const std::string config = at::show_config();
    const auto at = config.find("BLAS_INFO=");
    p.library = at == std::string::npos ? "unknown"
                                        : config.substr(at + 10, config.find_first_of(",\n", at) - at - 10);
  }
  return p;
}

BlasEnv BlasEnv::from_environment() {
  BlasEnv e;
  e.mllm_blas_core = env_or_empty("MLLM_BLAS_CORE");
  e.openblas_coretype = env_or_empty("OPENBLAS_CORETYPE");
  for (const char* v : {"MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE"})
    if (!env_or_empty(v).empty()) {
      e.mkl_override = std::string(v) + "=" + env_or_empty(v);
      break;
    }
  return e;
}

BlasFix decide_blas_fix(const BlasProbe& probe, const CpuIsa& cpu, const BlasEnv& env) {
  if (!env.mllm_blas_core.empty() && env.mllm_blas_core != "keep")
    throw ConfigError(fmt::format("MLLM_BLAS_CORE={}: expected 'keep' (or unset)",
                                  env.mllm_blas_core));
  BlasFix fix;
  const int want = cpu.level();
  if (probe.level < 0) {
    fix.reason = fmt::format("{} runs an unknown code path; not checked", probe.library);
    return fix;
  }
  if (probe.level >= want) return fix;  // nothing better to run
  const std::string is_slow = fmt::format(
      "{} runs its {} code path although the CPU has {}", probe.library,
      probe.path.empty() ? "generic" : probe.path, want == 3 ? "AVX-512" : "AVX2 + FMA");
  fix.warn = true;
  if (env.mllm_blas_core == "keep") {
    fix.reason = is_slow + "; kept because MLLM_BLAS_CORE=keep (unset it to correct this)";
    return fix;
  }
  if (probe.kind == BlasProbe::Kind::kMkl) {
    if (!env.mkl_override.empty()) {
      fix.reason = is_slow + "; kept because the environment sets " + env.mkl_override;
      return fix;
    }
    fix.action = BlasFix::Action::kPreloadMklShim;
    fix.warn = false;
    fix.reason = is_slow + " (MKL dispatches on the CPU vendor, " + cpu.vendor + ")";
    return fix;
  }
  if (probe.kind == BlasProbe::Kind::kOpenBlas) {
    if (!env.openblas_coretype.empty()) {
      fix.reason = is_slow + "; kept because the environment sets OPENBLAS_CORETYPE=" +
                   env.openblas_coretype;
      return fix;
    }
    fix.action = BlasFix::Action::kSetOpenBlasCore;
    fix.warn = false;
    fix.value = cpu.amx_bf16 ? "SAPPHIRERAPIDS" : cpu.avx512_bf16 ? "COOPERLAKE"
                : want == 3 ? "SKYLAKEX" : "HASWELL";
    fix.reason = is_slow + " (OpenBLAS does not know this CPU model)";
    return fix;
  }
  fix.reason = is_slow + "; no known correction for this BLAS";
  return fix;
}

void ensure_fast_blas(char** argv) {
  // Re-executed (verify, or back after a failed check): the previous image blocked the stop
  // signals for the exec; one that came meanwhile is delivered now (to mllm-train's handler).
  if (!env_or_empty(kPhaseVar).empty() || !env_or_empty(kFailedVar).empty()) block_stop_signals(false);
  if (env_or_empty(kPhaseVar) == "verify") {
    verify_corrected(argv);
    return;
  }
  const std::string failed = env_or_empty(kFailedVar);
  if (!failed.empty()) {
    const BlasProbe p = probe_blas();
    g_note.warn = true;
    g_note.text = fmt::format(
        "the BLAS correction was undone: {}; running {} {} as it chose itself, slower than this "
        "CPU allows (report this with the log; MLLM_BLAS_CORE=keep skips the attempt)",
        failed, p.library, p.path);
    clear_protocol_env();
    ::unsetenv("MLLM_BLAS_CORE");
    return;
  }
  BlasFix fix;
  BlasProbe probe = probe_blas();
  if (test_mode("generic")) {
    probe.path = probe.kind == BlasProbe::Kind::kOpenBlas ? "Prescott" : mkl_branch_name(2);
    probe.level = 0;
  }
  try {
    fix = decide_blas_fix(probe, detect_cpu_isa(), BlasEnv::from_environment());
  } catch (const Error& e) {
    // Bad input, found before logging or MPI exist: every rank says it the same way and stops.
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    std::exit(e.exit_code());
  }
  g_note = {fix.reason, fix.warn};
  if (fix.action == BlasFix::Action::kNone) return;
  const char* old_preload = std::getenv("LD_PRELOAD");
  const std::string saved = old_preload ? std::string("=") + old_preload : "-";
  if (fix.action == BlasFix::Action::kPreloadMklShim) {
    const std::string shim = shim_path();
    if (::access(shim.c_str(), R_OK) != 0) {
      g_note = {fix.reason + "; cannot correct it: " + shim + " is missing (rebuild or "
                "reinstall mllm)", true};
      return;
    }
    ::setenv(kSavedPreloadVar, saved.c_str(), 1);
    const std::string preload = old_preload && *old_preload ? shim + ":" + old_preload : shim;
    ::setenv("LD_PRELOAD", preload.c_str(), 1);
  } else {
    ::setenv(kSetCoreVar, "1", 1);
    ::setenv("OPENBLAS_CORETYPE", fix.value.c_str(), 1);
  }
  ::setenv(kFromVar, fmt::format("{}|{} {}", probe.level, probe.library, probe.path).c_str(), 1);
  ::setenv(kPhaseVar, "verify", 1);
  // A stop signal that arrives from here on, or already arrived (mllm-train's handlers are
  // installed before this), is delivered in the new image once its handlers are in place.
  block_stop_signals(true);
  if (const int sig = stop_signal_number()) ::raise(sig);  // pending, blocked: survives execv
  ::execv(self_path().c_str(), argv);
  // execv failed: run on as we are.
  const int err = errno;
  block_stop_signals(false);
  if (fix.action == BlasFix::Action::kPreloadMklShim) {
    if (old_preload) ::setenv("LD_PRELOAD", saved.c_str() + 1, 1);
    else ::unsetenv("LD_PRELOAD");
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
  clear_protocol_env();
  g_note = {fix.reason + "; cannot correct it: re-executing " + self_path() + " failed: " +
            std::strerror(err), true};
}

const BlasStartupNote& blas_startup_note() { return g_note; }

namespace {
// GFLOP/s of an n x n GEMM in `dtype`, best of `reps` after one warm-up.
double gemm_gflops(torch::ScalarType dtype, int64_t n, int reps) {
  torch::NoGradGuard no_grad;
  auto opts = torch::TensorOptions().dtype(dtype);
  torch::Tensor a = torch::full({n, n}, 0.5, opts), b = torch::full({n, n}, 0.25, opts);
  torch::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    torch::mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

// A rate for the log: n=256 first; n=1024 when that is fast enough to take well under a second.
// Best of 3 at n=256: one product there is a few milliseconds, as long as waking a thread pool
// can take (16 threads of a GPU machine's VM read 4.2 GFLOP/s from a single product).
double quick_gflops(torch::ScalarType dtype) {
  const double small = gemm_gflops(dtype, 256, 3);
  return small > 5.0 ? gemm_gflops(dtype, 1024, 2) : small;
}
}  // namespace

std::string describe_blas() {
  const BlasProbe p = probe_blas();
  const CpuIsa cpu = detect_cpu_isa();
  std::string line = fmt::format(
      "BLAS {}, code path {}; CPU {}; GEMM at {} thread(s): fp32 {:.1f} GFLOP/s, bf16 {:.1f} "
      "GFLOP/s", p.library, p.path.empty() ? "unknown" : p.path, cpu.describe(),
      at::get_num_threads(), quick_gflops(torch::kFloat32), quick_gflops(torch::kBFloat16));
  if (!g_note.text.empty()) line += "; " + g_note.text;
  return line;
}

}  // namespace mllm
