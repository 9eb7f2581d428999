// Crash-safe file output: data goes to a temporary name next to the target and is renamed over
// it only when complete, so readers never see a half-written tokenizer, shard or manifest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mllm {

class AtomicFile {
 public:
  // Creates "<path>.tmp.<pid>" (and the parent folder). Throws mllm::Error naming the file.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes (buffered). Throws mllm::Error on a write failure (e.g. disk full).
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Replaces already-written bytes at `offset` (e.g. a header finalised at the end). Throws
  // mllm::Error on failure or when [offset, offset + n) is past what was written.
  void overwrite(size_t offset, const void* data, size_t n);
  // Appends bytes [src_offset, src_offset + n) of the open file `src_fd` inside the kernel
  // (copy_file_range(2): no copy through this process, a reflink where the file system has
  // them). Returns false, having written nothing, when the kernel cannot do it for these files;
  // throws mllm::Error on a write failure.
  bool append_from(int src_fd, uint64_t src_offset, size_t n);
  // Bytes written so far.
  size_t size() const { return written_ + buffer_.size(); }
  // Flushes, fsyncs and renames onto the target path. Throws mllm::Error on failure.
  void commit();

 private:
  void flush_buffer();

  std::string path_, temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  size_t written_ = 0;
  std::vector<char> buffer_;
};

// A file written in place (checkpoint members inside a temporary folder, metrics.jsonl lines,
// samples.txt) where every failure is named: "cannot write <path>: <strerror>" (for example
// "No space left on device"), thrown as mllm::Error (exit 1). Unbuffered: each write() reaches
// the kernel, so a full disk is reported by the write that hits it.
class CheckedFile {
 public:
  // Opens `path` for writing: truncated, or appended to with `append`. Throws mllm::Error.
  explicit CheckedFile(std::string path, bool append = false);
  // Closes without checking (use close() to learn about failures). Never throws.
  ~CheckedFile();
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;

  // Writes all n bytes. Throws mllm::Error naming the file on failure.
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // For writers that must not see an exception (LibTorch's archive writer, whose destructor
  // turns a short write into std::terminate): remembers the first failure, returns n, and
  // drops later bytes; close() throws the remembered failure.
  size_t write_deferred(const void* data, size_t n) noexcept;
  // Fault injection (MLLM_FAULT enospc): from now on writes fail with `err`.
  void inject_error(int err) { injected_errno_ = err; }
  // fsync + close. Throws mllm::Error naming the file for a remembered write failure or a
  // failed fsync/close. Idempotent.
  void close();
  const std::string& path() const { return path_; }

 private:
  int write_some(const void* data, size_t n);  // 0 or an errno value

  std::string path_;
  int fd_ = -1;
  int deferred_errno_ = 0;
  int injected_errno_ = 0;
};

// Writes `bytes` to `path` in place through CheckedFile (write, fsync, close).
void write_file_checked(const std::string& path, std::string_view bytes);

// Writes `bytes` to `path` atomically (AtomicFile in one call).
void write_file_atomic(const std::string& path, std::string_view bytes);

// Whole file as bytes. Throws DataError naming the file when it cannot be read.
std::string read_file_bytes(const std::string& path);

}  // namespace mllm
