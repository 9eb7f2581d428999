// A report of a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL) on stderr before the process
// dies: which rank, which signal at which address, and where it came from, so that a crash on a
// machine one cannot log into (a lent GPU, a batch node) still says where to look.
//
// OpenMPI's own handler prints only the signal frame when the program jumped to address 0 (a
// call through a null function pointer: no unwinder gets past a frame at pc 0). This one then
// reads the return address the call left on the stack, which names the caller.
#pragma once

namespace mllm {

// Installs the handler for SIGSEGV, SIGBUS, SIGFPE and SIGILL, keeping the handler found there
// (OpenMPI's after MPI_Init, or the default): after its report the handler puts that one back
// and the fault happens again, so the process still ends the way it would have (OpenMPI's
// report, a core dump, exit status 128 + signal). `rank` goes into the report's first line.
// Call it again after a library that installs its own handlers (MPI_Init does). Never throws.
void install_crash_report(int rank);

}  // namespace mllm
