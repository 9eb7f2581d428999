// Process-wide logging set-up on spdlog: `[rank/world]` in every line, rank 0 logs to the
// console at the chosen level, other ranks only warnings and errors, and every rank writes
// <out_dir>/logs/rank_NN.log. Use spdlog::info(...) etc. after init_logging().
#pragma once

#include <string>

namespace mllm {

// Level from the environment variable MLLM_LOG_LEVEL if set, else `recipe_level`.
// Accepts trace | debug | info | warn | error. Throws ConfigError for anything else.
std::string resolve_log_level(const std::string& recipe_level);

// Installs the default logger for this process. `log_dir` empty = console only; else the
// folder is created and rank_NN.log (NN = rank, two digits) is appended to.
// Throws mllm::Error if the log file cannot be opened.
void init_logging(int rank, int world_size, const std::string& level,
                  const std::string& log_dir = "");

// Flushes every sink (before MPI_Abort / exit).
void flush_logs();

// True when this process's console is a terminal someone watches: stderr is a terminal, or the
// process was started by an mpirun on this node whose own stderr is one (OpenMPI forwards the
// ranks' output through pipes; /proc/<parent>/fd/2 says where mpirun's goes).
bool console_is_terminal();
// The console's status line (the progress bar): redrawn in place at the bottom of the terminal
// (carriage return, clear to end of line, `line`); every console log line first clears it and
// then draws it again below itself, so log lines and the bar never share a line. "" removes
// it. Writes nothing when !console_is_terminal(). Never throws.
void set_console_status(const std::string& line);

// A duration for people: "42s", "3m05s", "2h07m" (seconds < 0 or not finite -> "?").
std::string format_duration(double seconds);

// The first failed write to a log file since init_logging (for example "cannot write
// runs/x/logs/rank_00.log: No space left on device"), or "" when none failed. spdlog reports
// sink failures to an error handler, not to the caller; the trainer checks this every step and
// stops with it, so a full disk cannot silently swallow the logs.
std::string log_write_error();

}  // namespace mllm
