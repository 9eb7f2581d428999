// Stop signals (see stop_signal.h).
#include "mllm/core/stop_signal.h"

#include <csignal>

#include <atomic>

namespace mllm {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
}

}  // namespace

void install_stop_signal_handlers() {
  for (int sig : kStopSignals) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a signal must not fail a read or write on its way
    sigaction(sig, &sa, nullptr);
  }
  block_stop_signals(false);
}

bool stop_signal_received() { return g_stop_signal.load() != 0; }

int stop_signal_number() { return g_stop_signal.load(); }

void block_stop_signals(bool block) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
}

}  // namespace mllm
