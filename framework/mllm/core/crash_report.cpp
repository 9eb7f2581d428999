// Fatal-signal reports (core/crash_report.h). Only async-signal-safe calls in the handler, apart
// from dladdr (it reads the loader's tables, takes no lock that the crashed thread could hold in
// practice) and backtrace (its first call, which may allocate, is made at install time).
#include "mllm/core/crash_report.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace mllm {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction g_previous[NSIG];
int g_rank = 0;

// Appends text / a number to a fixed buffer (no allocation, no stdio).
struct Line {
  char buf[1024];
  size_t n = 0;
  void put(const char* s) {
    while (*s && n + 1 < sizeof(buf)) buf[n++] = *s++;
  }
  void hex(uintptr_t v) {
    char t[19] = "0x";
    int k = 0;
    char d[16];
    do {
      d[k++] = "0123456789abcdef"[v & 0xF];
      v >>= 4;
    } while (v && k < 16);
    for (int i = 0; i < k; ++i) t[2 + i] = d[k - 1 - i];
    t[2 + k] = '\0';
    put(t);
  }
  void dec(long v) {
    char d[24];
    int k = 0;
    const bool neg = v < 0;
    unsigned long u = neg ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
    do {
      d[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u && k < 22);
    if (neg) d[k++] = '-';
    while (k && n + 1 < sizeof(buf)) buf[n++] = d[--k];
  }
  void flush() {
    if (n < sizeof(buf)) buf[n++] = '\n';
    ssize_t w = ::write(STDERR_FILENO, buf, n);
    (void)w;
    n = 0;
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
  }
  return "?";
}

// "symbol + 0xOFF (in /path/lib.so)" for a code address, as far as the dynamic symbols go.
void describe(Line& line, uintptr_t addr) {
  line.hex(addr);
  Dl_info info{};
  if (addr == 0 || dladdr(reinterpret_cast<void*>(addr), &info) == 0) return;
  line.put(" ");
  if (info.dli_sname) {
    line.put(info.dli_sname);
    line.put(" + ");
    line.hex(addr - reinterpret_cast<uintptr_t>(info.dli_saddr));
  } else {
    line.put("+ ");
    line.hex(addr - reinterpret_cast<uintptr_t>(info.dli_fbase));
  }
  if (info.dli_fname) {
    line.put(" (in ");
    line.put(info.dli_fname);
    line.put(")");
  }
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  Line line;
  line.put("[mllm rank ");
  line.dec(g_rank);
  line.put("] fatal signal ");
  line.dec(sig);
  line.put(" (");
  line.put(signal_name(sig));
  if (info && info->si_code <= 0) {  // sent by kill() / raise(): no faulting address
    line.put(") sent by process ");
    line.dec(static_cast<long>(info->si_pid));
  } else {
    line.put(") at address ");
    line.hex(reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr));
  }
  uintptr_t pc = 0, caller = 0;
  bool have_pc = false;
#if defined(__x86_64__)
  if (context) {
    const auto* uc = static_cast<const ucontext_t*>(context);
    pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
    // After a call to a bad address the return address is the word on top of the stack.
    if (pc < 4096) caller = *reinterpret_cast<const uintptr_t*>(uc->uc_mcontext.gregs[REG_RSP]);
    have_pc = true;
  }
#elif defined(__aarch64__)
  if (context) {
    const auto* uc = static_cast<const ucontext_t*>(context);
    pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
    if (pc < 4096) caller = static_cast<uintptr_t>(uc->uc_mcontext.regs[30]);  // the link register
    have_pc = true;
  }
#endif
  if (have_pc) {
    line.put(", pc ");
    describe(line, pc);
  }
  line.flush();
  if (have_pc && pc < 4096) {
    line.put("[mllm rank ");
    line.dec(g_rank);
    line.put("] a jump to address ");
    line.hex(pc);
    line.put(" (a call through a null function pointer or a broken object), called from ");
    describe(line, caller);
    line.flush();
  } else {
    void* frames[48];
    const int n = backtrace(frames, 48);
    line.put("[mllm rank ");
    line.dec(g_rank);
    line.put("] stack (innermost first; c++filt demangles):");
    line.flush();
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
  }
  // The handler that was there before, then the same fault again (returning re-runs the faulting
  // instruction; a signal raised by kill() is raised again).
  sigaction(sig, &g_previous[sig], nullptr);
  if (info && info->si_code <= 0) raise(sig);
}

}  // namespace

void install_crash_report(int rank) {
  g_rank = rank;
  void* warm[2];
  backtrace(warm, 2);  // loads the unwinder now, not inside the handler
  struct sigaction action {};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (const int sig : kSignals) {
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0) continue;
    if (current.sa_sigaction == on_fatal_signal && (current.sa_flags & SA_SIGINFO)) continue;
    g_previous[sig] = current;
    sigaction(sig, &action, nullptr);
  }
}

}  // namespace mllm
