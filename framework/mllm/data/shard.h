// Token shards: the binary files mllm-prepare writes (train.bin, val.bin) and datasets read
// through mmap. Layout (little-endian; full description in docs/data.md):
//   [0, 64)   header: magic "MLLMTOKS", version, token bytes (2 = uint16, 4 = uint32), token
//             count, document count, vocab size, tokenizer fingerprint, header hash
//   [64, ..)  tokens, every document stored as BOS text EOS, back to back
//   padding   zero bytes up to a multiple of 8
//   offsets   document count + 1 uint64: start token of each document, then the token count
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mllm {

class AtomicFile;
class Tokenizer;

inline constexpr char kShardMagic[9] = "MLLMTOKS";
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;        // 2 (uint16) when vocab_size <= 65536, else 4 (uint32)
  uint64_t token_count = 0;        // tokens in the file, BOS/EOS included
  uint64_t doc_count = 0;
  uint64_t vocab_size = 0;         // every token id is < vocab_size
  uint64_t tokenizer_fingerprint = 0;
};

// Bytes per token for a vocabulary: 2 when every id fits uint16, else 4.
uint32_t shard_token_bytes(int64_t vocab_size);

// Streams documents into a shard under a temporary name; finish() renames it into place.
// Destroyed without finish(), it leaves nothing behind.
class ShardWriter {
 public:
  // Throws mllm::Error when the file cannot be created, ConfigError when vocab_size < 5 or
  // > 2^32.
  ShardWriter(const std::string& path, int64_t vocab_size, uint64_t tokenizer_fingerprint);
  ~ShardWriter();
  // Appends one document as BOS ids... EOS. Throws mllm::Error if an id is outside
  // [0, vocab_size).
  void add_document(const int32_t* ids, size_t n);
  void add_document(const std::vector<int32_t>& ids) { add_document(ids.data(), ids.size()); }
  // Appends documents [first_doc, last_doc) of the finished shard `src_path` (whose header is
  // `src`: the same vocabulary and tokenizer fingerprint) as they are stored, BOS and EOS
  // included, reading its tokens and offsets with pread in blocks of at most 4 MiB (nothing is
  // mapped, so memory does not grow with the shard). Throws DataError naming `src_path` when it
  // cannot be read or its offsets are damaged, mllm::Error when its tokenizer or vocabulary
  // differ from this shard's.
  void append_documents(const std::string& src_path, const ShardHeader& src, int64_t first_doc,
                        int64_t last_doc);
  // Tokens and documents written so far.
  const ShardHeader& header() const { return header_; }
  // Writes offsets and header, fsyncs, renames. Returns the header written.
  ShardHeader finish();

 private:
  std::string path_;
  ShardHeader header_;
  std::unique_ptr<AtomicFile> file_;
  std::vector<uint64_t> offsets_;
  std::vector<char> scratch_;
};

// A read-only, memory-mapped shard. Opening validates the header, the file size and the
// document offsets (not the tokens: those are checked as they are read).
class ShardReader {
 public:
  // Throws DataError naming the file when it is missing, too short, has the wrong magic or
  // version, a damaged header, a size that does not match the header (truncated or extra
  // bytes), or non-monotonic offsets.
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  int64_t token_count() const { return int64_t(header_.token_count); }
  int64_t doc_count() const { return int64_t(header_.doc_count); }
  // Start token of document d, d in [0, doc_count]; offset(doc_count) == token_count.
  int64_t doc_offset(int64_t d) const;
  // Copies tokens [begin, begin + n) into out as int64. Throws DataError naming the file when a
  // token is >= vocab_size (a damaged shard). Requires 0 <= begin, begin + n <= token_count.
  void read_tokens(int64_t begin, int64_t n, int64_t* out) const;

 private:
  std::string path_;
  ShardHeader header_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  const unsigned char* offsets_ = nullptr;
};

// Reads and validates only the header and size of a shard (cheap; for cache checks).
// Throws DataError as ShardReader does.
ShardHeader read_shard_header(const std::string& path);

// Document offsets [first, first + count) of the shard `path` with header `h` (count + first
// <= doc_count + 1), read with pread (nothing is mapped). Throws DataError naming the file when
// it cannot be read.
std::vector<uint64_t> read_shard_offsets(const std::string& path, const ShardHeader& h,
                                         int64_t first, int64_t count);

// Throws DataError naming `shard_path` when the shard was not made by `tokenizer` (fingerprint
// or vocabulary size differ), saying both values and how to fix it (re-run mllm-prepare).
void check_shard_tokenizer(const ShardHeader& header, const std::string& shard_path,
                           const Tokenizer& tokenizer);

}  // namespace mllm
