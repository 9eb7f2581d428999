// Shard writer (streamed, atomic) and mmap reader with validation of everything but token values.
#include "mllm/data/shard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "mllm/core/error.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/hash.h"
#include "mllm/data/tokenizer.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "shards are little-endian and read in place; add byte swapping for this host");

namespace mllm {
namespace {

constexpr size_t kHeaderHashAt = 48;  // FNV-1a 64 of header bytes [0, 48)

uint64_t align8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

void put_u32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void encode_header(const ShardHeader& h, unsigned char* out) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic, 8);
  put_u32(out + 8, h.version);
  put_u32(out + 12, h.token_bytes);
  put_u64(out + 16, h.token_count);
  put_u64(out + 24, h.doc_count);
  put_u64(out + 32, h.vocab_size);
  put_u64(out + 40, h.tokenizer_fingerprint);
  Fnv1a64 hash;
  hash.update(out, kHeaderHashAt);
  put_u64(out + kHeaderHashAt, hash.value());
}

// Expected total file size for a header.
uint64_t shard_file_bytes(const ShardHeader& h) {
  return align8(kShardHeaderBytes + h.token_count * h.token_bytes) + (h.doc_count + 1) * 8;
}

ShardHeader decode_header(const unsigned char* p, uint64_t file_bytes, const std::string& path) {
  const std::string fix = "; re-run mllm-prepare to rebuild it";
  if (file_bytes < kShardHeaderBytes)
    throw DataError(fmt::format("shard '{}' is truncated: {} bytes, shorter than the {}-byte "
                                "header{}",
                                path, file_bytes, kShardHeaderBytes, fix));
  if (std::memcmp(p, kShardMagic, 8) != 0)
    throw DataError(fmt::format("'{}' is not an mllm token shard: wrong magic (expected \"{}\" "
                                "at byte 0){}",
                                path, kShardMagic, fix));
  ShardHeader h;
  h.version = get_u32(p + 8);
  if (h.version != kShardVersion)
    throw DataError(fmt::format("shard '{}' has format version {}, this build reads version {}{}",
                                path, h.version, kShardVersion, fix));
  Fnv1a64 hash;
  hash.update(p, kHeaderHashAt);
  if (hash.value() != get_u64(p + kHeaderHashAt))
    throw DataError(fmt::format("shard '{}' has a damaged header (header hash mismatch){}", path, fix));
  h.token_bytes = get_u32(p + 12);
  h.token_count = get_u64(p + 16);
  h.doc_count = get_u64(p + 24);
  h.vocab_size = get_u64(p + 32);
  h.tokenizer_fingerprint = get_u64(p + 40);
  if (h.token_bytes != shard_token_bytes(int64_t(h.vocab_size)))
    throw DataError(fmt::format("shard '{}': token size {} bytes does not match vocab size {}{}",
                                path, h.token_bytes, h.vocab_size, fix));
  const uint64_t want = shard_file_bytes(h);
  if (file_bytes < want)
    throw DataError(fmt::format("shard '{}' is truncated: {} bytes, its header ({} tokens, {} "
                                "documents) needs {}{}",
                                path, file_bytes, h.token_count, h.doc_count, want, fix));
  if (file_bytes > want)
    throw DataError(fmt::format("shard '{}' has {} unexpected bytes after its end ({} tokens, {} "
                                "documents need {} bytes){}",
                                path, file_bytes - want, h.token_count, h.doc_count, want, fix));
  return h;
}

}  // namespace

uint32_t shard_token_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

ShardWriter::ShardWriter(const std::string& path, int64_t vocab_size,
                         uint64_t tokenizer_fingerprint)
    : path_(path) {
  if (vocab_size <= kNumSpecialIds || vocab_size > (int64_t(1) << 32))
    throw ConfigError(fmt::format("shard '{}': vocab size {} is outside [{}, 2^32]", path,
                                  vocab_size, kNumSpecialIds + 1));
  header_.vocab_size = uint64_t(vocab_size);
  header_.token_bytes = shard_token_bytes(vocab_size);
  header_.tokenizer_fingerprint = tokenizer_fingerprint;
  file_ = std::make_unique<AtomicFile>(path);
  unsigned char placeholder[kShardHeaderBytes] = {};
  file_->write(placeholder, kShardHeaderBytes);  // real header written by finish()
  offsets_.push_back(0);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::add_document(const int32_t* ids, size_t n) {
  MLLM_CHECK(file_ != nullptr, "ShardWriter used after finish(): " + path_);
  const size_t tb = header_.token_bytes;
  scratch_.resize((n + 2) * tb);
  auto put = [&](size_t i, int32_t id) {
    if (id < 0 || uint64_t(id) >= header_.vocab_size)
      throw Error(fmt::format("shard '{}': token id {} is outside [0, {})", path_, id,
                              header_.vocab_size));
    if (tb == 2) {
      const auto v = static_cast<uint16_t>(id);
      std::memcpy(scratch_.data() + i * 2, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(id);
      std::memcpy(scratch_.data() + i * 4, &v, 4);
    }
  };
  put(0, kBosId);
  for (size_t i = 0; i < n; ++i) put(i + 1, ids[i]);
  put(n + 1, kEosId);
  file_->write(scratch_.data(), scratch_.size());
  header_.token_count += n + 2;
  header_.doc_count += 1;
  offsets_.push_back(header_.token_count);
}

namespace {

// pread of exactly n bytes at offset `at`, or DataError naming the file.
void pread_all(int fd, const std::string& path, char* out, size_t n, uint64_t at) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, off_t(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw DataError(fmt::format("shard '{}': cannot read {} bytes at offset {} ({}); re-run "
                                  "mllm-prepare",
                                  path, n, at, got < 0 ? std::strerror(errno) : "end of file"));
    out += got;
    n -= size_t(got);
    at += uint64_t(got);
  }
}

class ReadFd {
 public:
  explicit ReadFd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0)
      throw DataError(fmt::format("cannot open shard '{}': {}; re-run mllm-prepare", path,
                                  std::strerror(errno)));
  }
  ~ReadFd() { ::close(fd); }
  int fd;
};

uint64_t offsets_at(const ShardHeader& h) {
  return align8(kShardHeaderBytes + h.token_count * h.token_bytes);
}

}  // namespace

std::vector<uint64_t> read_shard_offsets(const std::string& path, const ShardHeader& h,
                                         int64_t first, int64_t count) {
  MLLM_CHECK(first >= 0 && count >= 0 && uint64_t(first + count) <= h.doc_count + 1,
             "read_shard_offsets: range outside the shard");
  std::vector<uint64_t> out(static_cast<size_t>(count));
  if (count == 0) return out;
  ReadFd in(path);
  pread_all(in.fd, path, reinterpret_cast<char*>(out.data()), size_t(count) * 8,
            offsets_at(h) + uint64_t(first) * 8);
  return out;
}

void ShardWriter::append_documents(const std::string& src_path, const ShardHeader& src,
                                   int64_t first_doc, int64_t last_doc) {
  MLLM_CHECK(file_ != nullptr, "ShardWriter used after finish(): " + path_);
  if (src.tokenizer_fingerprint != header_.tokenizer_fingerprint ||
      src.vocab_size != header_.vocab_size)
    throw Error(fmt::format("shard '{}' (tokenizer {:016x}, vocab {}) cannot be appended to '{}' "
                            "(tokenizer {:016x}, vocab {})",
                            src_path, src.tokenizer_fingerprint, src.vocab_size, path_,
                            header_.tokenizer_fingerprint, header_.vocab_size));
  MLLM_CHECK(0 <= first_doc && first_doc <= last_doc && uint64_t(last_doc) <= src.doc_count,
             "append_documents: document range outside the shard");
  ReadFd in(src_path);
  constexpr int64_t kDocs = int64_t(1) << 19;  // offsets per read (4 MiB)
  constexpr size_t kBytes = size_t(4) << 20;   // token bytes per read
  const uint64_t tb = header_.token_bytes;
  std::vector<uint64_t> off;
  for (int64_t d = first_doc; d < last_doc;) {
    const int64_t n = std::min(kDocs, last_doc - d);
    off.resize(size_t(n + 1));
    pread_all(in.fd, src_path, reinterpret_cast<char*>(off.data()), size_t(n + 1) * 8,
              offsets_at(src) + uint64_t(d) * 8);
    for (int64_t i = 0; i < n; ++i)
      if (off[size_t(i + 1)] <= off[size_t(i)] || off[size_t(i + 1)] > src.token_count)
        throw DataError(fmt::format("shard '{}' is damaged: document offset {} is {} (previous "
                                    "{}); re-run mllm-prepare",
                                    src_path, d + i + 1, off[size_t(i + 1)], off[size_t(i)]));
    // Tokens of documents [d, d + n): one contiguous byte range.
    uint64_t at = kShardHeaderBytes + off[0] * tb;
    const uint64_t end = kShardHeaderBytes + off[size_t(n)] * tb;
    if (file_->append_from(in.fd, at, size_t(end - at))) at = end;
    scratch_.resize(kBytes);
    while (at < end) {
      const size_t len = size_t(std::min<uint64_t>(kBytes, end - at));
      pread_all(in.fd, src_path, scratch_.data(), len, at);
      file_->write(scratch_.data(), len);
      at += len;
    }
    for (int64_t i = 1; i <= n; ++i) {
      header_.token_count += off[size_t(i)] - off[size_t(i - 1)];
      offsets_.push_back(header_.token_count);
    }
    header_.doc_count += uint64_t(n);
    d += n;
  }
}

ShardHeader ShardWriter::finish() {
  MLLM_CHECK(file_ != nullptr, "ShardWriter::finish() called twice: " + path_);
  const uint64_t tokens_end = kShardHeaderBytes + header_.token_count * header_.token_bytes;
  const char zeros[8] = {};
  file_->write(zeros, align8(tokens_end) - tokens_end);
  file_->write(offsets_.data(), offsets_.size() * sizeof(uint64_t));
  unsigned char header[kShardHeaderBytes];
  encode_header(header_, header);
  file_->overwrite(0, header, kShardHeaderBytes);
  file_->commit();
  file_.reset();
  return header_;
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(fmt::format("cannot open shard '{}': {}; run mllm-prepare with this recipe "
                                "first",
                                path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(fmt::format("cannot stat shard '{}': {}", path, std::strerror(errno)));
  }
  map_bytes_ = size_t(st.st_size);
  if (map_bytes_ > 0) {
    void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      throw DataError(fmt::format("cannot mmap shard '{}': {}", path, std::strerror(errno)));
    }
    map_ = static_cast<const unsigned char*>(m);
    // Sequences are read at random positions: no point in read-ahead.
    ::madvise(const_cast<unsigned char*>(map_), map_bytes_, MADV_RANDOM);
  }
  ::close(fd);  // the mapping stays valid
  try {
    unsigned char empty[kShardHeaderBytes] = {};
    header_ = decode_header(map_ ? map_ : empty, map_bytes_, path);
    tokens_ = map_ + kShardHeaderBytes;
    offsets_ = map_ + align8(kShardHeaderBytes + header_.token_count * header_.token_bytes);
    uint64_t prev = 0;
    for (uint64_t d = 0; d <= header_.doc_count; ++d) {
      const uint64_t off = get_u64(offsets_ + d * 8);
      const bool ok = d == 0 ? off == 0 : (off > prev && off <= header_.token_count);
      if (!ok)
        throw DataError(fmt::format("shard '{}' is damaged: document offset {} is {} (previous "
                                    "{}, token count {}); re-run mllm-prepare",
                                    path, d, off, prev, header_.token_count));
      prev = off;
    }
    if (prev != header_.token_count)
      throw DataError(fmt::format("shard '{}' is damaged: last document offset {} != token count "
                                  "{}; re-run mllm-prepare",
                                  path, prev, header_.token_count));
  } catch (...) {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    throw;
  }
}

ShardReader::~ShardReader() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

int64_t ShardReader::doc_offset(int64_t d) const {
  MLLM_CHECK(d >= 0 && uint64_t(d) <= header_.doc_count, "document index out of range");
  return int64_t(get_u64(offsets_ + size_t(d) * 8));
}

void ShardReader::read_tokens(int64_t begin, int64_t n, int64_t* out) const {
  MLLM_CHECK(begin >= 0 && n >= 0 && uint64_t(begin + n) <= header_.token_count,
             fmt::format("token range [{}, {}) outside shard '{}' ({} tokens)", begin, begin + n,
                         path_, header_.token_count));
  uint64_t bad = 0;
  bool any_bad = false;
  if (header_.token_bytes == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, tokens_ + size_t(begin + i) * 2, 2);
      out[i] = v;
      if (v >= header_.vocab_size) any_bad = true, bad = v;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, tokens_ + size_t(begin + i) * 4, 4);
      out[i] = v;
      if (v >= header_.vocab_size) any_bad = true, bad = v;
    }
  }
  if (any_bad)
    throw DataError(fmt::format("shard '{}' is damaged: token {} in [{}, {}) is >= vocab size {}; "
                                "re-run mllm-prepare",
                                path_, bad, begin, begin + n, header_.vocab_size));
}

ShardHeader read_shard_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw DataError(fmt::format("cannot open shard '{}': {}", path, std::strerror(errno)));
  const auto size = static_cast<uint64_t>(in.tellg());
  unsigned char buf[kShardHeaderBytes] = {};
  in.seekg(0);
  in.read(reinterpret_cast<char*>(buf), std::streamsize(std::min<uint64_t>(size, kShardHeaderBytes)));
  return decode_header(buf, size, path);
}

void check_shard_tokenizer(const ShardHeader& header, const std::string& shard_path,
                           const Tokenizer& tokenizer) {
  if (header.tokenizer_fingerprint == tokenizer.fingerprint() &&
      int64_t(header.vocab_size) == tokenizer.vocab_size())
    return;
  throw DataError(fmt::format(
      "shard '{}' was made by another tokenizer: shard has fingerprint {} and vocab size {}, the "
      "tokenizer ({}) has fingerprint {} and vocab size {}; re-run mllm-prepare so shards and "
      "tokenizer match",
      shard_path, fingerprint_hex(header.tokenizer_fingerprint), header.vocab_size,
      tokenizer.type(), fingerprint_hex(tokenizer.fingerprint()), tokenizer.vocab_size()));
}

}  // namespace mllm
