// Plain, gzip and Zstandard corpus readers.
#include "mllm/data/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "mllm/core/error.h"

namespace mllm {
namespace {

constexpr size_t kInBytes = size_t(1) << 20;  // compressed input buffer

class Fd {
 public:
  explicit Fd(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw DataError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
#ifdef POSIX_FADV_SEQUENTIAL
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  size_t read(char* out, size_t n) {
    for (;;) {
      const ssize_t got = ::read(fd_, out, n);
      if (got >= 0) {
        offset_ += got;
        return size_t(got);
      }
      if (errno != EINTR)
        throw DataError(fmt::format("{}: read error at byte {} ({})", path_, offset_,
                                    std::strerror(errno)));
    }
  }
  void seek(int64_t pos) {
    if (::lseek(fd_, off_t(pos), SEEK_SET) < 0)
      throw DataError(fmt::format("{}: cannot seek to byte {} ({})", path_, pos,
                                  std::strerror(errno)));
    offset_ = start_ = pos;
  }
  int64_t offset() const { return offset_; }
  int64_t start() const { return start_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
  int64_t start_ = 0;
};

class PlainSource : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : fd_(path) {}
  // Bytes [begin, end) only (end < 0: to the end of the file).
  PlainSource(const std::string& path, int64_t begin, int64_t end) : fd_(path), left_(-1) {
    if (begin > 0) fd_.seek(begin);
    if (end >= 0) left_ = std::max<int64_t>(0, end - begin);
  }
  size_t read(char* out, size_t n) override {
    if (left_ >= 0) n = size_t(std::min<int64_t>(int64_t(n), left_));
    if (n == 0) return 0;
    const size_t got = fd_.read(out, n);
    if (left_ >= 0) left_ -= int64_t(got);
    return got;
  }
  int64_t disk_bytes() const override { return fd_.offset() - fd_.start(); }

 private:
  Fd fd_;
  int64_t left_ = -1;  // bytes left in the range; -1 = no limit
};

// zlib's inflate with automatic gzip header detection (windowBits 15 + 16); a new member may
// follow the end of one.
class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : fd_(path), in_(kInBytes) {
    if (inflateInit2(&zs_, 15 + 16) != Z_OK)
      throw Error(fmt::format("{}: zlib inflateInit2 failed", path));
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  int64_t disk_bytes() const override { return fd_.offset(); }
  size_t read(char* out, size_t n) override {
    const uInt want = uInt(std::min<size_t>(n, UINT32_MAX));
    zs_.next_out = reinterpret_cast<Bytef*>(out);
    zs_.avail_out = want;
    while (zs_.avail_out == want) {
      if (zs_.avail_in == 0) {
        const size_t got = fd_.read(reinterpret_cast<char*>(in_.data()), in_.size());
        if (got == 0) {
          if (mid_member_)
            throw DataError(fmt::format("{}: truncated gzip stream (ends inside a member at "
                                        "byte {})",
                                        fd_.path(), fd_.offset()));
          if (fd_.offset() == 0)  // gzip -t refuses it too: an interrupted download, say
            throw DataError(fmt::format("{}: an empty file (0 bytes) is not a gzip stream; "
                                        "remove it or fetch it again",
                                        fd_.path()));
          return 0;
        }
        zs_.next_in = in_.data();
        zs_.avail_in = uInt(got);
      }
      if (!mid_member_) {
        if (inflateReset(&zs_) != Z_OK) throw Error(fd_.path() + ": zlib inflateReset failed");
        mid_member_ = true;
      }
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        mid_member_ = false;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DataError(fmt::format("{}: not a valid gzip stream near byte {} ({})", fd_.path(),
                                    fd_.offset() - int64_t(zs_.avail_in),
                                    zs_.msg ? zs_.msg : zError(rc)));
      }
    }
    return size_t(want - zs_.avail_out);
  }

 private:
  Fd fd_;
  std::vector<Bytef> in_;
  z_stream zs_{};
  bool mid_member_ = false;
};

constexpr int kZstdWindowLogMax = 31;  // 2 GiB: zstd --long=31

class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : fd_(path), in_(kInBytes) {
    ds_ = ZSTD_createDStream();
    if (!ds_) throw Error(path + ": ZSTD_createDStream failed");
    ZSTD_initDStream(ds_);
    // Windows up to 2 GiB (`zstd --long=31`, the largest the format allows on 64-bit), not only
    // libzstd's default 128 MiB (ZSTD_WINDOWLOG_LIMIT_DEFAULT = 27): the window a frame declares
    // is what decoding it needs, reserved per open file (touched only as the data fills it).
    const size_t rc = ZSTD_DCtx_setParameter(ds_, ZSTD_d_windowLogMax, kZstdWindowLogMax);
    if (ZSTD_isError(rc))
      throw Error(fmt::format("{}: libzstd refused a window limit of 2^{} ({})", path,
                              kZstdWindowLogMax, ZSTD_getErrorName(rc)));
  }
  ~ZstdSource() override { ZSTD_freeDStream(ds_); }
  int64_t disk_bytes() const override { return fd_.offset(); }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer ob{out, n, 0};
    while (ob.pos == 0) {
      if (ib_.pos == ib_.size) {
        const size_t got = fd_.read(in_.data(), in_.size());
        if (got == 0) {
          if (mid_frame_)
            throw DataError(fmt::format("{}: truncated zstd stream (ends inside a frame at "
                                        "byte {})",
                                        fd_.path(), fd_.offset()));
          if (fd_.offset() == 0)  // zstd -t refuses it too
            throw DataError(fmt::format("{}: an empty file (0 bytes) is not a zstd stream; "
                                        "remove it or fetch it again",
                                        fd_.path()));
          return 0;
        }
        ib_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      const size_t rc = ZSTD_decompressStream(ds_, &ob, &ib_);
      if (ZSTD_isError(rc)) {
        const int64_t at = fd_.offset() - int64_t(ib_.size - ib_.pos);
        if (ZSTD_getErrorCode(rc) == ZSTD_error_frameParameter_windowTooLarge)
          throw DataError(fmt::format(
              "{}: a zstd frame near byte {} needs a window larger than 2^{} bytes, the most mllm "
              "decodes ({}); compress it with --long=31 or less",
              fd_.path(), at, kZstdWindowLogMax, ZSTD_getErrorName(rc)));
        throw DataError(fmt::format("{}: not a valid zstd stream near byte {} (zstd: {})",
                                    fd_.path(), at, ZSTD_getErrorName(rc)));
      }
      mid_frame_ = rc != 0;  // 0: a frame ended (another may follow)
    }
    return ob.pos;
  }

 private:
  Fd fd_;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  ZSTD_DStream* ds_ = nullptr;
  bool mid_frame_ = false;
};

}  // namespace

CorpusFileKind corpus_file_kind(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  fs::path p(path);
  CorpusFileKind kind;
  std::string ext = p.extension().string();
  if (ext == ".gz" || ext == ".zst") {
    kind.compression = ext.substr(1);
    p = p.stem();
    ext = p.extension().string();
  }
  if (ext == ".txt" || ext == ".jsonl" || (ext == ".parquet" && kind.compression.empty())) {
    kind.format = ext.substr(1);
    return kind;
  }
  throw DataError(fmt::format("{} file '{}': mllm reads .txt (plain text) and .jsonl "
                              "(one JSON object per line), each also compressed as .gz or .zst "
                              "(e.g. .jsonl.zst), and .parquet (a string column); got '{}'",
                              option, path, std::filesystem::path(path).filename().string()));
}

std::unique_ptr<ByteSource> open_corpus_file(const std::string& path) {
  const auto kind = corpus_file_kind(path);
  if (kind.compression == "gz") return std::make_unique<GzipSource>(path);
  if (kind.compression == "zst") return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path);
}

std::unique_ptr<ByteSource> open_raw_file(const std::string& path) {
  return std::make_unique<PlainSource>(path);
}

std::unique_ptr<ByteSource> open_raw_range(const std::string& path, int64_t begin, int64_t end) {
  return std::make_unique<PlainSource>(path, begin, end);
}

FileBytes::FileBytes(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DataError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw DataError(fmt::format("{}: cannot stat ({})", path, std::strerror(errno)));
  }
  size_ = int64_t(st.st_size);
}

FileBytes::~FileBytes() { ::close(fd_); }

void FileBytes::load(int64_t pos) {
  constexpr size_t kBlock = size_t(64) << 10;
  buf_.resize(kBlock);
  size_t have = 0;
  while (have < kBlock && pos + int64_t(have) < size_) {
    const ssize_t got = ::pread(fd_, buf_.data() + have, kBlock - have, off_t(pos + int64_t(have)));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw DataError(fmt::format("{}: read error at byte {} ({})", path_, pos + int64_t(have),
                                  std::strerror(errno)));
    if (got == 0) break;  // the file shrank: the caller sees the bytes that are there
    have += size_t(got);
  }
  buf_.resize(have);
  buf_pos_ = pos;
}

char FileBytes::at(int64_t pos) {
  if (pos < buf_pos_ || pos >= buf_pos_ + int64_t(buf_.size())) load(pos);
  if (pos - buf_pos_ >= int64_t(buf_.size()))
    throw DataError(fmt::format("{}: byte {} is past the end of the file (it changed while being "
                                "read)",
                                path_, pos));
  return buf_[size_t(pos - buf_pos_)];
}

int64_t FileBytes::find(char c, int64_t from) {
  for (int64_t pos = from; pos < size_;) {
    if (pos < buf_pos_ || pos >= buf_pos_ + int64_t(buf_.size())) load(pos);
    if (buf_.empty()) break;
    const size_t i = buf_.find(c, size_t(pos - buf_pos_));
    if (i != std::string::npos) return buf_pos_ + int64_t(i);
    pos = buf_pos_ + int64_t(buf_.size());
  }
  return size_;
}

int64_t FileBytes::count(char c, int64_t end) {
  std::vector<char> block(size_t(1) << 20);
  int64_t n = 0;
  for (int64_t pos = 0; pos < end;) {
    const size_t want = size_t(std::min<int64_t>(int64_t(block.size()), end - pos));
    const ssize_t got = ::pread(fd_, block.data(), want, off_t(pos));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw DataError(fmt::format("{}: read error at byte {} ({})", path_, pos,
                                  std::strerror(errno)));
    if (got == 0) break;
    n += std::count(block.data(), block.data() + got, c);
    pos += got;
  }
  return n;
}

}  // namespace mllm
