// The mllm error family. The library throws these; programs catch them at main(), log them
// with the rank, and map them to exit codes (2 = bad input, 1 = anything else).
// Messages say what failed, where (file:line:col, key path, rank, step) and how to fix it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mllm {

// Base of every error mllm throws. `what()` is the full, user-facing message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  // Process exit code a program should use for this error: 2 for bad input, 1 otherwise.
  virtual int exit_code() const { return 1; }
};

// A recipe problem: unknown key, wrong type, out-of-range value, bad override, include cycle.
// Bad input: exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

// A corpus, tokenizer or shard problem (invalid UTF-8, missing field, wrong magic, ...).
// Bad input: exit code 2.
class DataError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

// A checkpoint that is missing, corrupt, truncated, or incompatible with the recipe.
// Bad input: exit code 2.
class CheckpointError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

// A failed collective or communicator set-up (MPI/NCCL return code, rank mismatch, timeout).
class CommError : public Error {
 public:
  using Error::Error;
};

// The training step in progress (1-based; 0 = none yet), for the messages of failures deep in
// the stack that do not otherwise know it (a collective that times out on a helper thread).
// Set by the Trainer at the start of each step; thread-safe.
void set_current_step(int64_t step);
int64_t current_step();

namespace detail {
[[noreturn]] void throw_check_failure(const char* expr, const char* file, int line,
                                      const std::string& msg);
}  // namespace detail

}  // namespace mllm

// MLLM_CHECK(cond, msg): throws mllm::Error "file:line: check `cond` failed: msg" when cond is
// false. For internal invariants; user-facing validation throws a specific subclass instead.
#define MLLM_CHECK(cond, msg)                                                  \
  do {                                                                         \
    if (!(cond)) ::mllm::detail::throw_check_failure(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
