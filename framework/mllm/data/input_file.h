// Corpus files as byte streams: plain, gzip (zlib) and Zstandard (libzstd) files, decompressed
// on the fly in bounded memory, so corpora far larger than memory can be read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mllm {

// What a corpus file holds, from its name: FORMAT[.COMPRESSION] with FORMAT txt | jsonl and
// COMPRESSION none | gz | zst (e.g. "part-0001.jsonl.zst"), or .parquet (compressed inside).
struct CorpusFileKind {
  std::string format;       // "txt", "jsonl" or "parquet"
  std::string compression;  // "", "gz" or "zst"
};

// The kind of `path`. Throws DataError naming the file, `option` (the setting that listed it) and
// the accepted names for anything else.
CorpusFileKind corpus_file_kind(const std::string& path, const std::string& option = "data.corpus");

// Sequential reader of a corpus file's (decompressed) bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `n` bytes into `out`; returns the count, 0 at the end of the file. Throws
  // DataError naming the file (and the compressed byte offset) on an I/O error, a damaged or
  // truncated compressed stream, or bytes that are not of the announced compression.
  virtual size_t read(char* out, size_t n) = 0;
  // Bytes read from the file on disk so far (compressed bytes for gz/zst).
  virtual int64_t disk_bytes() const = 0;
};

// A reader of `path` chosen by its compression (corpus_file_kind). A gzip or zstd file may hold
// several concatenated members/frames (pigz, `cat a.gz b.gz`, zstd --long); all are read.
// Throws DataError when the file cannot be opened.
std::unique_ptr<ByteSource> open_corpus_file(const std::string& path);

// A reader of the bytes of `path` as they are on disk (no decompression), for content hashes.
// Throws DataError when the file cannot be opened.
std::unique_ptr<ByteSource> open_raw_file(const std::string& path);

// A reader of bytes [begin, end) of `path` as they are on disk (end = -1: to the end of the
// file); disk_bytes() counts from `begin`. For byte ranges of plain corpus files. Throws
// DataError when the file cannot be opened or read.
std::unique_ptr<ByteSource> open_raw_range(const std::string& path, int64_t begin, int64_t end);

// Random access to a file's bytes on disk through pread, with a small read-ahead buffer: for
// finding document boundaries and counting lines. Throws DataError naming the file when it
// cannot be opened or read.
class FileBytes {
 public:
  explicit FileBytes(const std::string& path);
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  int64_t size() const { return size_; }
  // The byte at `pos` in [0, size()).
  char at(int64_t pos);
  // Position of the first `c` at or after `from`, or size() when there is none.
  int64_t find(char c, int64_t from);
  // Number of `c` bytes in [0, end).
  int64_t count(char c, int64_t end);

 private:
  void load(int64_t pos);  // fills the buffer with bytes from pos on
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  std::string buf_;
  int64_t buf_pos_ = 0;  // file offset of buf_[0]
};

}  // namespace mllm
