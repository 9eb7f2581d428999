// One writer per run folder: an exclusive, advisory lock on <run.out_dir>/.lock (flock(2)),
// taken by rank 0 before anything else is written there and released by the kernel when the
// process ends, however it ends (exit, crash, SIGKILL). A second run started on the same folder
// is refused instead of resuming from, and overwriting, the first one's files.
#pragma once

#include <string>

namespace mllm {

class RunFolderLock {
 public:
  // Creates `run_dir` if needed and locks `run_dir`/.lock without waiting; writes
  // "pid <pid> host <hostname>" into the file for whoever finds it locked.
  // Throws ConfigError (exit 2) "run folder <dir> is in use by another run (pid P on host H)..."
  // when another process holds it, and mllm::Error when the folder or file cannot be created.
  // On NFS, flock is emulated with POSIX record locks by Linux clients (2.6.12 and later), so
  // the lock also holds between hosts.
  explicit RunFolderLock(const std::string& run_dir);
  // Releases the lock (the file stays: deleting it would let a waiting process lock a file
  // that a third one no longer sees).
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace mllm
