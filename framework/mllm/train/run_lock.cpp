// flock(2)-based run-folder lock.
#include "mllm/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "mllm/core/error.h"

namespace mllm {

RunFolderLock::RunFolderLock(const std::string& run_dir) : path_(run_dir + "/.lock") {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw Error("cannot create run folder " + run_dir + ": " + ec.message());
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path_ + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw Error("cannot lock " + path_ + ": " + std::strerror(err));
    throw ConfigError(fmt::format(
        "run folder {} is in use by another run ({}); two runs in one folder would overwrite "
        "each other's checkpoints, metrics and logs. Wait for it to end, stop it, or choose "
        "another run.out_dir", run_dir, who.empty() ? "holder unknown" : who));
  }
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("pid {} on host {}\n", ::getpid(), host);
  // Best effort: on a full disk the lock still holds, only the holder's name is missing.
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace mllm
