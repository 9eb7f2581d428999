// Crash-safe file output: data goes to a temporary name next to the target and is renamed over
// it only when complete, so readers never see a half-written tokenizer, shard or manifest.
#pragma once

#include <cstddef>
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

// Writes `bytes` to `path` atomically (AtomicFile in one call).
void write_file_atomic(const std::string& path, std::string_view bytes);

// Whole file as bytes. Throws DataError naming the file when it cannot be read.
std::string read_file_bytes(const std::string& path);

}  // namespace mllm
