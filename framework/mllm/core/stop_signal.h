// The signals that ask a training run for a checkpointed stop at the end of the step: SIGTERM,
// SIGINT, SIGUSR1, SIGUSR2 (under mpirun use SIGUSR1: mpirun forwards it to every rank, and on
// SIGTERM/SIGINT it kills the ranks itself after a timeout; README).
#pragma once

namespace mllm {

// Installs the handlers (they only set a flag) and unblocks the signals, which may arrive
// blocked across a BLAS re-execution (core/blas.h): one sent while the new program image loaded
// is delivered now, to the handler. mllm-train calls it first thing in main. Never throws.
void install_stop_signal_handlers();
// True once one of those signals arrived in this process.
bool stop_signal_received();
// The signal number received first, 0 if none.
int stop_signal_number();
// Blocks (true) or unblocks (false) the stop signals for the calling thread (sigprocmask; the
// mask survives execve). Async-signal-safe. Never throws.
void block_stop_signals(bool block);

}  // namespace mllm
