// AtomicFile: write to "<path>.tmp.<pid>", fsync, rename(2) (atomic on POSIX file systems).
#include "mllm/data/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "mllm/core/error.h"

namespace mllm {
namespace {
constexpr size_t kBufferBytes = size_t(1) << 20;

std::string errno_text() { return std::strerror(errno); }
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const std::filesystem::path p(path_);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  temp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error("cannot create '" + temp_path_ + "': " + errno_text() +
                " (check that the folder is writable)");
  buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::flush_buffer() {
  size_t off = 0;
  while (off < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + off, buffer_.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_ + ": " + errno_text() + " (temporary " + temp_path_ + ")");
    }
    off += static_cast<size_t>(n);
  }
  written_ += buffer_.size();
  buffer_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t take = std::min(n, kBufferBytes - buffer_.size());
    buffer_.insert(buffer_.end(), p, p + take);
    p += take;
    n -= take;
    if (buffer_.size() == kBufferBytes) flush_buffer();
  }
}

bool AtomicFile::append_from(int src_fd, uint64_t src_offset, size_t n) {
  flush_buffer();
  auto in = off_t(src_offset);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::copy_file_range(src_fd, &in, fd_, nullptr, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && done == 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP ||
                                 errno == EINVAL))
      return false;  // not here: the caller copies through memory
    if (got < 0)
      throw Error("cannot write " + path_ + ": " + errno_text() + " (copy into " + temp_path_ + ")");
    if (got == 0) throw Error("cannot write " + path_ + ": the source ended early (copy_file_range)");
    done += size_t(got);
  }
  written_ += n;
  return true;
}

void AtomicFile::overwrite(size_t offset, const void* data, size_t n) {
  flush_buffer();
  MLLM_CHECK(offset + n <= written_, "AtomicFile::overwrite past the end of " + path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_ + ": " + errno_text() + " (temporary " + temp_path_ + ")");
    }
    p += w;
    offset += size_t(w);
    n -= size_t(w);
  }
}

void AtomicFile::commit() {
  MLLM_CHECK(!committed_, "AtomicFile committed twice: " + path_);
  flush_buffer();
  if (::fsync(fd_) != 0)
    throw Error("cannot write " + path_ + ": " + errno_text() + " (fsync of " + temp_path_ + ")");
  ::close(fd_);
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    throw Error("cannot rename '" + temp_path_ + "' to '" + path_ + "': " + errno_text());
  committed_ = true;
  // Make the rename itself durable.
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

CheckedFile::CheckedFile(std::string path, bool append) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) throw Error("cannot write " + path_ + ": " + errno_text());
}

CheckedFile::~CheckedFile() {
  if (fd_ >= 0) ::close(fd_);
}

int CheckedFile::write_some(const void* data, size_t n) {
  if (fd_ < 0) return EBADF;
  if (injected_errno_ != 0) return injected_errno_;
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

void CheckedFile::write(const void* data, size_t n) {
  if (const int err = write_some(data, n))
    throw Error("cannot write " + path_ + ": " + std::strerror(err));
}

size_t CheckedFile::write_deferred(const void* data, size_t n) noexcept {
  if (deferred_errno_ == 0) deferred_errno_ = write_some(data, n);
  return n;
}

void CheckedFile::close() {
  if (fd_ < 0) return;
  int err = deferred_errno_;
  if (err == 0 && ::fsync(fd_) != 0) err = errno;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) throw Error("cannot write " + path_ + ": " + std::strerror(err));
}

void write_file_checked(const std::string& path, std::string_view bytes) {
  CheckedFile f(path);
  f.write(bytes);
  f.close();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw DataError("cannot open '" + path + "': " + errno_text());
  const std::streamoff size = in.tellg();
  std::string bytes(size_t(std::max<std::streamoff>(0, size)), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), std::streamsize(bytes.size())))
    throw DataError("cannot read '" + path + "': " + errno_text());
  return bytes;
}

}  // namespace mllm
