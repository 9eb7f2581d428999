// prepare_data: corpus -> tokenizer + train/val shards + manifest in the cache folder. Over 1,000
// lines as one concept: the three passes of distributed preparation (docs/ARCHITECTURE.md, "Data
// preparation") share its failure agreement between ranks, the split rule and the shard layout,
// which must stay together to keep the output the same at any rank or thread count.
#include "mllm/data/prepare.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fcntl.h>
#include <malloc.h>
#include <sys/file.h>

#include <array>
#include <atomic>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "mllm/core/error.h"
#include "mllm/core/fault.h"
#include "mllm/core/logging.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/corpus.h"
#include "mllm/data/hash.h"
#include "mllm/data/sampler.h"
#include "mllm/data/shard.h"
#include "mllm/data/tokenizer.h"

namespace mllm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kManifestFormat = "mllm-data-cache";
constexpr int kManifestVersion = 2;  // 1: one train.bin/val.bin in cache_dir itself
constexpr const char* kSplitFormat = "mllm-prepare-split";
constexpr int kSplitVersion = 1;
// What the process needs besides the pieces in flight (libmllm + LibTorch loaded, tokenizer,
// shard writer offsets): subtracted from the budget before sizing pieces.
constexpr int64_t kBaseBytes = int64_t(256) << 20;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A one-line progress bar on stderr, redrawn by its own thread every 200 ms; off when stderr is
// not a terminal (logs and CI stay clean).
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled)
      : label_(std::move(label)), total_(std::max<int64_t>(1, total)),
        enabled_(enabled && ::isatty(STDERR_FILENO)), t0_(Clock::now()) {
    if (enabled_) thread_ = std::thread([this] { run(); });
  }
  ~ProgressBar() { finish(); }
  void add(int64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }
  void finish() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    draw();
    std::fputc('\n', stderr);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) draw();
  }
  void draw() {
    const int64_t done = std::min(done_.load(std::memory_order_relaxed), total_);
    const double frac = double(done) / double(total_);
    constexpr int kWidth = 30;
    const int fill = int(frac * kWidth);
    const double s = std::max(1e-9, seconds_since(t0_));
    std::fprintf(stderr, "\r%-14s [%s%s] %3d%%  %7.1f MB/s", label_.c_str(),
                 std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(kWidth - fill), '.').c_str(), int(frac * 100),
                 double(done) / 1e6 / s);
    std::fflush(stderr);
  }

  std::string label_;
  int64_t total_;
  bool enabled_;
  Clock::time_point t0_;
  std::atomic<int64_t> done_{0};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};


// Splitmix64's finaliser: spreads a hash over all 64 bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A single corpus's shards are train-00000.bin, ...; source k of a mixture's s<k>-train-00000.bin.
std::string shard_name(int source, bool mixture, const char* split, size_t n) {
  if (!mixture) return fmt::format("{}-{:05d}.bin", split, n);
  return fmt::format("s{:02d}-{}-{:05d}.bin", source, split, n);
}

// The corpus as sources: data.corpus is one source; data.sources are each one.
struct Sources {
  std::vector<std::string> files;           // every file, source by source
  std::vector<size_t> first_file;            // per source: index of its first file; then files.size()
  bool mixture = false;
  size_t count() const { return first_file.size() - 1; }
};
Sources resolve_sources(const DataConfig& cfg) {
  Sources s;
  s.mixture = !cfg.sources.empty();
  if (!s.mixture) {
    s.files = resolve_corpus_files(cfg.corpus, cfg.corpus_option, cfg.corpus_fallback_dir);
    s.first_file = {0, s.files.size()};
    return s;
  }
  s.first_file.push_back(0);
  for (size_t k = 0; k < cfg.sources.size(); ++k) {
    std::vector<std::string> files;
    try {
      files = resolve_corpus_files(cfg.sources[k].corpus, "data.corpus", cfg.corpus_fallback_dir);
    } catch (const DataError& e) {
      throw DataError(fmt::format("data.sources[{}] ({}): {}", k, cfg.sources[k].name, e.what()));
    }
    s.files.insert(s.files.end(), files.begin(), files.end());
    s.first_file.push_back(s.files.size());
  }
  return s;
}

// The plan of every source in turn (a segment never holds two sources' files); `source_of`
// receives each segment's source.
std::vector<CorpusSegment> plan_sources(const Sources& src, const DataConfig& cfg,
                                        std::vector<int>& source_of) {
  std::vector<CorpusSegment> plan;
  source_of.clear();
  for (size_t k = 0; k < src.count(); ++k) {
    const std::vector<std::string> files(src.files.begin() + std::ptrdiff_t(src.first_file[k]),
                                         src.files.begin() + std::ptrdiff_t(src.first_file[k + 1]));
    for (auto seg : plan_segments(files, cfg, cfg.prepare_segment_bytes)) {
      seg.index = int64_t(plan.size());
      for (auto& part : seg.parts) part.file += src.first_file[k];
      plan.push_back(std::move(seg));
      source_of.push_back(int(k));
    }
  }
  return plan;
}

// The corpus part of the data fingerprint from every file's hash: the single corpus's as it
// always was; a mixture's source by source.
uint64_t corpus_hash_of(const Sources& src, const std::vector<FileContentHash>& hashes) {
  if (!src.mixture) return combine_content_hashes(hashes);
  Fnv1a64 h;
  h.update(std::string_view("mllm-sources"));
  h.update_u64(src.count());
  for (size_t k = 0; k < src.count(); ++k)
    h.update_u64(combine_content_hashes(std::vector<FileContentHash>(
        hashes.begin() + std::ptrdiff_t(src.first_file[k]),
        hashes.begin() + std::ptrdiff_t(src.first_file[k + 1]))));
  return h.value();
}

std::string piece_path(const std::string& dir, const CorpusSegment& seg, const char* split) {
  return (fs::path(dir) / "pieces" / fmt::format("seg-{:06d}-{}.{}.bin", seg.index, seg.id(), split))
      .string();
}

// ---- errors and agreement between ranks ----

// What one rank hit in a phase, sent to every rank so that all throw the same error (the first
// in corpus order) instead of leaving the others waiting in the next collective.
struct Failure {
  int kind = 0;              // 0 none, 1 DataError, 2 ConfigError, 3 other
  int64_t order = INT64_MAX; // segment index (corpus order) or INT64_MAX
  std::string what;
};

Failure failure_of(std::exception_ptr e, int64_t order) {
  Failure f;
  f.order = order < 0 ? INT64_MAX : order;
  try {
    std::rethrow_exception(e);
  } catch (const DataError& x) {
    f.kind = 1, f.what = x.what();
  } catch (const ConfigError& x) {
    f.kind = 2, f.what = x.what();
  } catch (const std::exception& x) {
    f.kind = 3, f.what = x.what();
  }
  return f;
}

// All-gathers every rank's (failure, payload); throws the first failure (lowest order, then
// rank) on every rank, else returns the payloads by rank.
std::vector<std::string> agree(PrepareGroup& group, const Failure& mine,
                               const std::string& payload = std::string()) {
  std::string out;
  put_u64(out, uint64_t(mine.kind));
  put_u64(out, uint64_t(mine.order));
  put_str(out, mine.what);
  put_str(out, payload);
  const auto all = group.all_gather(out);
  Failure first;
  int first_rank = -1;
  std::vector<std::string> payloads;
  for (size_t r = 0; r < all.size(); ++r) {
    WireReader in(all[r]);
    Failure f;
    f.kind = int(in.u64());
    f.order = int64_t(in.u64());
    f.what = std::string(in.str());
    payloads.emplace_back(in.str());
    if (f.kind != 0 && (first_rank < 0 || f.order < first.order)) {
      first = f;
      first_rank = int(r);
    }
  }
  if (first_rank >= 0) {
    const std::string where =
        group.size() > 1 && first_rank != group.rank() ? fmt::format(" (on rank {})", first_rank) : "";
    if (first.kind == 1) throw DataError(first.what);
    if (first.kind == 2) throw ConfigError(first.what);
    throw Error(first.what + where);
  }
  return payloads;
}

// Runs `f` and returns what it threw (as a Failure of order `order`), or no failure.
template <typename F>
Failure attempt(F&& f, const int64_t* order = nullptr) {
  try {
    f();
  } catch (...) {
    return failure_of(std::current_exception(), order ? *order : -1);
  }
  return {};
}

// ---- cache files ----

nlohmann::json read_json(const std::string& path, const char* format, int version) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return nullptr;
  try {
    auto j = nlohmann::json::parse(read_file_bytes(path));
    if (j.is_object() && j.value("format", "") == format && j.value("version", 0) == version)
      return j;
  } catch (const std::exception&) {
  }
  return nullptr;
}

nlohmann::json read_manifest(const std::string& path) {
  return read_json(path, kManifestFormat, kManifestVersion);
}

std::vector<std::string> shard_paths(const std::string& dir, const nlohmann::json& split) {
  std::vector<std::string> out;
  for (const auto& s : split.at("shards")) out.push_back((fs::path(dir) / s.at("file").get<std::string>()).string());
  return out;
}

std::string split_path(const std::string& dir) { return (fs::path(dir) / "split.json").string(); }

// Tokenizer and split threshold of an earlier run of the same fingerprint (split.json is
// written right after the tokenizer), or nothing.
struct Reused {
  std::shared_ptr<Tokenizer> tokenizer;
  uint64_t threshold = 0;
};
Reused reusable(const std::string& dir, const std::string& fp) {
  const auto split = read_json(split_path(dir), kSplitFormat, kSplitVersion);
  if (split.is_null() || split.value("data_fingerprint", "") != fp) return {};
  try {
    auto tok = load_tokenizer((fs::path(dir) / "tokenizer.mllm").string());
    if (fingerprint_hex(tok->fingerprint()) != split.value("tokenizer_fingerprint", "")) return {};
    return {tok, std::stoull(split.at("val_threshold").get<std::string>(), nullptr, 16)};
  } catch (const std::exception&) {
  }
  return {};
}

// data.cache_dir can be made and written, found out before pass 1 reads the corpus (nothing is
// created here): the path is a folder, or its nearest existing ancestor is a writable folder.
void check_cache_dir(const std::string& cache_dir) {
  std::error_code ec;
  fs::path p = fs::absolute(cache_dir, ec);
  while (!p.empty() && !fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path())
    p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw ConfigError(fmt::format("data.cache_dir '{}': '{}' exists and is not a folder; choose "
                                  "another data.cache_dir",
                                  cache_dir, p.string()));
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    throw ConfigError(fmt::format("data.cache_dir '{}': the folder '{}' is not writable ({}); "
                                  "choose another data.cache_dir",
                                  cache_dir, p.string(), std::strerror(errno)));
}

// A version-1 cache (train.bin / val.bin in cache_dir itself) is never read: say so once.
void note_old_cache(const DataConfig& cfg) {
  const auto old = fs::path(cfg.cache_dir) / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(old, ec)) return;
  spdlog::warn("data cache '{}' holds a cache of an earlier mllm (one train.bin / val.bin, "
               "manifest format 1); it is not read: data is prepared into a sub-folder per data "
               "fingerprint now. Delete {}/{{manifest.json,tokenizer.mllm,train.bin,val.bin}} to "
               "free the space",
               cfg.cache_dir, cfg.cache_dir);
}

// One preparation per cache folder at a time: rank 0 holds an exclusive flock on
// <dir>/.prepare.lock (released by the kernel however the process ends). Another job waits.
class PrepareLock {
 public:
  explicit PrepareLock(const std::string& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string path = (fs::path(dir) / ".prepare.lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(fmt::format("cannot create '{}': {} (check that data.cache_dir is writable)",
                              path, std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    spdlog::info("data cache '{}' is being prepared by another process; waiting for it", dir);
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw Error(fmt::format("cannot lock '{}': {}", path, std::strerror(errno)));
  }
  ~PrepareLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  PrepareLock(const PrepareLock&) = delete;
  PrepareLock& operator=(const PrepareLock&) = delete;

 private:
  int fd_ = -1;
};

// Piece size for the memory budget: (budget - base) spread over the pieces in flight, each
// costing about kPieceCost x its bytes (raw text, parsed documents, token ids, and the malloc
// arenas of the threads that made them: measured, docs/data.md).
constexpr int64_t kPieceCost = 6;
int64_t chunk_bytes_for(const DataConfig& cfg, int threads) {
  const int64_t budget = cfg.prepare_memory_mb << 20;
  int64_t per_piece = (budget - kBaseBytes) / (int64_t(2 * threads + 2) * kPieceCost);
  if (cfg.tokenizer.type != "char")  // the bpe sample: threads x sample_bytes at most
    per_piece -= cfg.tokenizer.sample_bytes * threads / (int64_t(2 * threads + 2) * kPieceCost);
  return std::clamp<int64_t>(per_piece, int64_t(1) << 20, int64_t(64) << 20);
}

std::error_code& ec_ignore() {
  thread_local std::error_code ec;
  return ec;
}

std::vector<CorpusSegment> pick(const std::vector<CorpusSegment>& plan,
                                const std::vector<int64_t>& indices) {
  std::vector<CorpusSegment> out;
  for (int64_t i : indices) out.push_back(plan[size_t(i)]);
  return out;
}

int64_t disk_bytes_of(const std::vector<CorpusSegment>& segs) {
  int64_t n = 0;
  for (const auto& s : segs) n += s.disk_bytes;
  return n;
}

// ---- pass 1: split counts and the tokenizer trainer ----

struct SplitCounts {
  int64_t documents = 0, val = 0;
  uint64_t min_rank = UINT64_MAX, max_rank = 0;
  int64_t text_bytes = 0;
  void add(const SplitCounts& o) {
    documents += o.documents;
    val += o.val;
    min_rank = std::min(min_rank, o.min_rank);
    max_rank = std::max(max_rank, o.max_rank);
    text_bytes += o.text_bytes;
  }
  std::string wire() const {
    std::string s;
    for (uint64_t v : {uint64_t(documents), uint64_t(val), min_rank, max_rank, uint64_t(text_bytes)})
      put_u64(s, v);
    return s;
  }
  static SplitCounts from_wire(std::string_view w) {
    WireReader in(w);
    SplitCounts c;
    c.documents = int64_t(in.u64());
    c.val = int64_t(in.u64());
    c.min_rank = in.u64();
    c.max_rank = in.u64();
    c.text_bytes = int64_t(in.u64());
    return c;
  }
};

// Streams `segs`, feeding the train documents (val_rank >= threshold) to `trainer`; returns
// this rank's counts. `failed` receives the segment of an error.
SplitCounts count_pass(const std::vector<std::string>& files, const std::vector<CorpusSegment>& segs,
                       const DataConfig& cfg, int threads, int64_t chunk_bytes, uint64_t threshold,
                       TokenizerTrainer& trainer, ProgressBar& bar, int64_t* failed) {
  std::vector<SplitCounts> part(static_cast<size_t>(threads));
  const auto st = stream_segments(
      files, segs, cfg, threads, chunk_bytes,
      [&](int w, CorpusChunk& c) {
        SplitCounts& p = part[size_t(w)];
        for (const auto& doc : c.docs) {
          const uint64_t r = val_rank(doc);
          p.min_rank = std::min(p.min_rank, r);
          p.max_rank = std::max(p.max_rank, r);
          if (r < threshold)
            ++p.val;
          else
            trainer.add(w, doc);
        }
      },
      [&](CorpusChunk& c) { bar.add(c.text_bytes); }, failed);
  SplitCounts counts;
  for (const auto& p : part) counts.add(p);
  counts.documents = st.documents;
  counts.text_bytes = st.text_bytes;
  return counts;
}

// The threshold after the small-corpus rules: >= 1 val document when val_fraction > 0 and the
// documents are not all the same text; never all documents.
uint64_t adjusted_threshold(const DataConfig& cfg, uint64_t t, const SplitCounts& c) {
  if (c.documents < 2 || c.min_rank == c.max_rank) return c.val == c.documents ? 0 : t;
  if (cfg.val_fraction > 0 && c.val == 0) return c.min_rank + 1;  // the lowest-ranked go to val
  if (c.val == c.documents) return c.max_rank;                    // the highest-ranked to train
  return t;
}

// ---- pass 3: pieces into shards ----

// One output shard: document ranges of pieces, in order.
struct Range {
  size_t piece;
  int64_t first, last;  // documents [first, last)
};
struct ShardLayout {
  std::vector<Range> ranges;
  int64_t tokens = 0, documents = 0;
};

// The shards of one split, by the rule of a sequential writer: a new shard starts when the next
// document would take the current one past shard_tokens (never before its first document).
std::vector<ShardLayout> layout_split(const std::vector<std::string>& pieces,
                                      const std::vector<ShardHeader>& headers,
                                      int64_t shard_tokens) {
  std::vector<ShardLayout> out(1);
  for (size_t p = 0; p < pieces.size(); ++p) {
    const ShardHeader& h = headers[p];
    const auto docs = int64_t(h.doc_count), tokens = int64_t(h.token_count);
    if (docs == 0) continue;
    ShardLayout* cur = &out.back();
    if (cur->tokens + tokens <= shard_tokens) {  // the whole piece fits: no cut inside
      cur->ranges.push_back({p, 0, docs});
      cur->tokens += tokens;
      cur->documents += docs;
      continue;
    }
    const auto off = read_shard_offsets(pieces[p], h, 0, docs + 1);
    int64_t first = 0;
    for (int64_t d = 0; d < docs; ++d) {
      const int64_t len = int64_t(off[size_t(d + 1)] - off[size_t(d)]);
      if (cur->tokens > 0 && cur->tokens + len > shard_tokens) {
        if (d > first) cur->ranges.push_back({p, first, d});
        out.emplace_back();
        cur = &out.back();
        first = d;
      }
      cur->tokens += len;
      cur->documents += 1;
    }
    cur->ranges.push_back({p, first, docs});
  }
  return out;
}

// Writes `shard` to `path`: a hard link of its piece when it is exactly one whole piece, else
// the documents copied.
void write_shard(const std::string& path, const ShardLayout& shard,
                 const std::vector<std::string>& pieces, const std::vector<ShardHeader>& headers,
                 const Tokenizer& tok) {
  if (shard.ranges.size() == 1) {
    const Range& r = shard.ranges[0];
    if (r.first == 0 && uint64_t(r.last) == headers[r.piece].doc_count) {
      const std::string tmp = path + ".link." + std::to_string(::getpid());
      std::error_code ec;
      fs::remove(tmp, ec);
      if (::link(pieces[r.piece].c_str(), tmp.c_str()) == 0) {
        if (::rename(tmp.c_str(), path.c_str()) == 0) return;
        fs::remove(tmp, ec);
      }
      // No hard links here (some file systems): copy.
    }
  }
  ShardWriter w(path, tok.vocab_size(), tok.fingerprint());
  for (const Range& r : shard.ranges)
    w.append_documents(pieces[r.piece], headers[r.piece], r.first, r.last);
  w.finish();
}

}  // namespace

uint64_t val_rank(std::string_view text) { return mix64(content_hash64(text) ^ kValSplitSeed); }

uint64_t val_threshold(double val_fraction) {
  if (!(val_fraction > 0)) return 0;
  if (val_fraction >= 1) return UINT64_MAX;
  return uint64_t(std::ldexp(val_fraction, 64));  // exact: a power-of-two scaling, < 2^64
}

std::vector<std::vector<int64_t>> assign_segments(const std::vector<int64_t>& segment_bytes,
                                                  int ranks) {
  ranks = std::max(1, ranks);
  std::vector<int64_t> order(segment_bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return segment_bytes[size_t(a)] > segment_bytes[size_t(b)];
  });
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(ranks));
  std::vector<int64_t> load(size_t(ranks), 0);
  for (int64_t s : order) {
    const size_t r = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    out[r].push_back(s);
    load[r] += std::max<int64_t>(1, segment_bytes[size_t(s)]);
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

std::string prepared_dir(const DataConfig& cfg, const std::string& fingerprint) {
  return (fs::path(cfg.cache_dir) / fingerprint).string();
}

std::string manifest_path(const DataConfig& cfg, const std::string& fingerprint) {
  return (fs::path(prepared_dir(cfg, fingerprint)) / "manifest.json").string();
}

namespace {

std::string fingerprint_of(const DataConfig& cfg, uint64_t corpus_hash) {
  Fnv1a64 h;
  h.update(std::string_view("mllm-data"));
  h.update_u64(kManifestVersion);
  h.update_u64(kShardVersion);
  h.update_u64(corpus_hash);
  h.update(cfg.text_field);
  h.update(cfg.doc_separator);
  h.update(cfg.invalid_utf8);
  uint64_t val_bits;
  std::memcpy(&val_bits, &cfg.val_fraction, 8);
  h.update_u64(val_bits);
  h.update_u64(uint64_t(cfg.shard_tokens));
  h.update(cfg.tokenizer.type);
  h.update_u64(uint64_t(cfg.tokenizer.vocab_size));
  h.update_u64(uint64_t(cfg.tokenizer.min_count));
  h.update_u64(uint64_t(cfg.tokenizer.max_vocab));
  uint64_t bits;
  std::memcpy(&bits, &cfg.tokenizer.character_coverage, 8);
  h.update_u64(bits);
  if (cfg.tokenizer.type != "char") h.update_u64(uint64_t(cfg.tokenizer.sample_bytes));
  return fingerprint_hex(h.value());
}

}  // namespace

std::string data_fingerprint(const DataConfig& cfg) {
  SingleGroup one;
  return data_fingerprint(cfg, one);
}

std::string data_fingerprint(const DataConfig& cfg, PrepareGroup& group,
                             std::vector<CorpusFileRecord>* records) {
  Sources src;
  std::vector<std::string>& files = src.files;
  std::string mine;
  const Failure failed = attempt([&] {
    src = resolve_sources(cfg);
    std::vector<int64_t> sizes;
    for (const auto& f : files) sizes.push_back(int64_t(fs::file_size(f, ec_ignore())));
    const auto assigned = assign_segments(sizes, group.size());
    for (int64_t i : assigned[size_t(group.rank())]) {
      const auto h = file_content_hash(files[size_t(i)]);
      put_u64(mine, uint64_t(i));
      put_u64(mine, h.size);
      put_u64(mine, h.hash);
    }
  });
  std::vector<FileContentHash> hashes(files.size());
  for (const auto& part : agree(group, failed, mine)) {
    WireReader in(part);
    while (!in.done()) {
      const auto i = size_t(in.u64());
      hashes.at(i).size = in.u64();
      hashes.at(i).hash = in.u64();
    }
  }
  if (records) {
    records->clear();
    for (size_t k = 0; k < src.count(); ++k)
      for (size_t i = src.first_file[k]; i < src.first_file[k + 1]; ++i)
        records->push_back({files[i], int(k), hashes[i].size, hashes[i].hash});
  }
  return fingerprint_of(cfg, corpus_hash_of(src, hashes));
}

bool is_prepared(const DataConfig& cfg, const std::string& fp) {
  const auto manifest = read_manifest(manifest_path(cfg, fp));
  if (manifest.is_null()) {
    spdlog::debug("data cache '{}': no valid manifest", prepared_dir(cfg, fp));
    return false;
  }
  // A manifest is there, so the cache was complete once: say why it is not any more.
  auto stale = [&](const std::string& why) {
    spdlog::info("data cache '{}' is damaged ({}); it will be prepared again",
                 prepared_dir(cfg, fp), why);
    return false;
  };
  try {
    if (manifest.value("data_fingerprint", "") != fp) return stale("its manifest is of other data");
    const auto p = load_prepared(cfg, fp);
    const std::string tok_fp = manifest.value("tokenizer_fingerprint", "");
    // Loading checks the header, size and fingerprint of the file (the payload is small).
    if (fingerprint_hex(load_tokenizer(p.tokenizer_path)->fingerprint()) != tok_fp)
      return stale("tokenizer.mllm is not the manifest's tokenizer");
    for (const auto* list : {&p.train_shards, &p.val_shards})
      for (const auto& shard : *list)
        if (fingerprint_hex(read_shard_header(shard).tokenizer_fingerprint) != tok_fp)
          return stale(shard + " was made by another tokenizer");
  } catch (const std::exception& e) {
    return stale(e.what());
  }
  return true;
}

bool is_prepared(const DataConfig& cfg) { return is_prepared(cfg, data_fingerprint(cfg)); }

PreparedData load_prepared(const DataConfig& cfg, const std::string& fp) {
  const std::string dir = prepared_dir(cfg, fp);
  const auto manifest = read_manifest(manifest_path(cfg, fp));
  if (manifest.is_null() || manifest.value("data_fingerprint", "") != fp)
    throw DataError(fmt::format("data cache '{}' has no valid manifest (format {} version {}) for "
                                "data fingerprint {}; re-run mllm-prepare",
                                dir, kManifestFormat, kManifestVersion, fp));
  try {
    PreparedData p;
    p.dir = dir;
    p.data_fingerprint = fp;
    p.tokenizer_path = (fs::path(dir) / manifest.at("tokenizer").get<std::string>()).string();
    p.train_shards = shard_paths(dir, manifest.at("train"));
    p.val_shards = shard_paths(dir, manifest.at("val"));
    if (manifest.contains("sources")) {
      for (const auto& one : manifest.at("sources"))
        p.sources.push_back({shard_paths(dir, one.at("train")), shard_paths(dir, one.at("val"))});
    } else {
      p.sources.push_back({p.train_shards, p.val_shards});
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("data cache '{}': damaged manifest ({}); re-run mllm-prepare", dir,
                                e.what()));
  }
}

namespace {

// prepare_data's body. Nothing is written before the corpus is validated (pass 1); from then
// on rank 0 holds the folder's lock, and another job that finished the same folder meanwhile
// is taken as done (unless `force`).
PreparedData prepare_body(const DataConfig& cfg, const std::string& fp, int threads,
                          bool show_progress, bool force, PrepareGroup& group,
                          PrepareStats* stats, bool* completed_elsewhere) {
  const auto t0 = Clock::now();
  const int rank = group.rank(), ranks = group.size();
  const bool lead = rank == 0;
  // Pieces and buffers of a MiB or more come from mmap and go back to the system when freed;
  // with glibc's default (a threshold that rises to 32 MiB as large blocks are freed) the
  // threads' arenas keep them, and the peak RSS grows ~1.5x (measured: docs/data.md).
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  PrepareStats st;
  st.ranks = ranks;
  const Sources src = resolve_sources(cfg);
  const auto& files = src.files;
  st.corpus_files = int64_t(files.size());
  const std::string dir = prepared_dir(cfg, fp);
  st.chunk_bytes = chunk_bytes_for(cfg, threads);
  std::vector<CorpusSegment> plan;
  std::vector<int> source_of;
  const Failure plan_failed = attempt([&] { plan = plan_sources(src, cfg, source_of); });
  agree(group, plan_failed);
  st.segments = int64_t(plan.size());
  std::vector<int64_t> seg_bytes;
  for (const auto& s : plan) seg_bytes.push_back(s.disk_bytes);
  const auto mine = pick(plan, assign_segments(seg_bytes, ranks)[size_t(rank)]);
  st.corpus_bytes = disk_bytes_of(plan);
  if ((cfg.prepare_memory_mb << 20) - kBaseBytes < int64_t(2 * threads + 2) * kPieceCost * (int64_t(1) << 20))
    spdlog::warn("data.prepare_memory_mb = {} MiB is less than the process needs (about {} MiB "
                 "for itself and {} pieces of 1 MiB at {} thread(s)): pieces are 1 MiB and the "
                 "peak memory will be above the budget",
                 cfg.prepare_memory_mb, kBaseBytes >> 20, 2 * threads + 2, threads);
  spdlog::info("preparing {} corpus file(s), {:.1f} MB, into {}: {} segment(s) over {} rank(s), "
               "{} of them ({:.1f} MB) on this rank with {} thread(s); memory budget {} MiB "
               "(pieces of {:.1f} MiB, {} in flight)",
               files.size(), double(st.corpus_bytes) / 1e6, dir, plan.size(), ranks, mine.size(),
               double(disk_bytes_of(mine)) / 1e6, threads, cfg.prepare_memory_mb,
               double(st.chunk_bytes) / double(1 << 20), 2 * threads + 2);

  // 1. Tokenizer and split: counted or sampled over the train split in one streaming pass,
  //    which also validates every document before anything is written.
  const auto t_tok = Clock::now();
  Reused reused;
  if (lead && !force) reused = reusable(dir, fp);  // --force: everything again
  const auto reuse_votes = agree(group, {}, reused.tokenizer ? "1" : "0");
  st.tokenizer_reused = reuse_votes[0] == "1";
  std::shared_ptr<Tokenizer> tok = reused.tokenizer;
  std::unique_ptr<PrepareLock> lock;
  // Rank 0 takes the lock; true (on every rank) when the cache turned out to be complete.
  auto lock_and_check = [&] {
    bool done = false;
    const Failure locked = attempt([&] {
      if (!lead) return;
      lock = std::make_unique<PrepareLock>(dir);
      done = !force && is_prepared(cfg, fp);
    });
    return agree(group, locked, done ? "1" : "0")[0] == "1";
  };
  auto done_elsewhere = [&] {
    spdlog::info("data cache '{}' was completed by another job meanwhile; using it", dir);
    *completed_elsewhere = true;
    return load_prepared(cfg, fp);
  };
  if (st.tokenizer_reused && lock_and_check()) return done_elsewhere();
  uint64_t threshold = val_threshold(cfg.val_fraction);
  if (!st.tokenizer_reused) {
    register_builtin_tokenizers();
    std::shared_ptr<TokenizerTrainer> trainer;
    SplitCounts counts;
    for (int round = 0; round < 2; ++round) {
      trainer = tokenizer_registry().create(cfg.tokenizer.type, cfg.tokenizer, threads);
      const bool merged = ranks > 1 && trainer->supports_merge();
      // Without merge(), rank 0 reads everything (the others wait).
      const auto& segs = merged ? mine : (lead ? plan : std::vector<CorpusSegment>());
      int64_t failed_segment = -1;
      SplitCounts local;
      const Failure failed = attempt(
          [&] {
            ProgressBar bar("read + count", disk_bytes_of(segs), show_progress && lead && round == 0);
            local = count_pass(files, segs, cfg, threads, st.chunk_bytes, threshold, *trainer, bar,
                               &failed_segment);
          },
          &failed_segment);
      counts = SplitCounts();
      for (const auto& w : agree(group, failed, local.wire())) counts.add(SplitCounts::from_wire(w));
      if (counts.documents == 0)
        throw DataError(fmt::format("the corpus ({}) holds no document: every file is empty or "
                                    "blank; point data.corpus at text",
                                    fmt::join(files, ", ")));
      const uint64_t adjusted = adjusted_threshold(cfg, threshold, counts);
      if (adjusted == threshold || round == 1) {
        if (merged) trainer->merge(group);
        break;
      }
      // Tiny corpora only: count again with the final split.
      spdlog::info("val split: {} of {} documents fall below val_fraction's threshold; the "
                   "small-corpus rule moves it (at least one val document, never all)",
                   counts.val, counts.documents);
      threshold = adjusted;
    }
    if (lock_and_check()) return done_elsewhere();
    const Failure trained = attempt([&] {
      if (!lead) return;
      tok = trainer->finish();
      std::error_code ec;
      fs::create_directories(dir, ec);
      fs::remove(manifest_path(cfg, fp), ec);
      tok->save((fs::path(dir) / "tokenizer.mllm").string());
      const nlohmann::ordered_json split = {
          {"format", kSplitFormat},
          {"version", kSplitVersion},
          {"data_fingerprint", fp},
          {"tokenizer_fingerprint", fingerprint_hex(tok->fingerprint())},
          {"val_threshold", fmt::format("{:016x}", threshold)},
          {"documents", counts.documents},
          {"val_documents", counts.val},
      };
      write_file_atomic(split_path(dir), split.dump(2) + "\n");
    });
    agree(group, trained);
  }
  {
    const Failure loaded = attempt([&] {
      if (lead && !st.tokenizer_reused) return;  // trained it
      const Reused r = reusable(dir, fp);
      if (!r.tokenizer)
        throw Error(fmt::format("rank {} cannot read the tokenizer rank 0 wrote into '{}' (is "
                                "data.cache_dir on a file system every rank shares?)",
                                rank, dir));
      tok = r.tokenizer;
      threshold = r.threshold;
    });
    agree(group, loaded);
  }
  st.tokenizer_seconds = seconds_since(t_tok);
  spdlog::info("tokenizer: {} with {} ids ({} in {:.2f} s), fingerprint {}", tok->type(),
               tok->vocab_size(), st.tokenizer_reused ? "reused from the cache" : "trained",
               st.tokenizer_seconds, fingerprint_hex(tok->fingerprint()));

  // 2. Pieces: every rank encodes its segments; pieces of an interrupted run are kept.
  const auto t_enc = Clock::now();
  const std::string pieces_dir = (fs::path(dir) / "pieces").string();
  const Failure cleaned = attempt([&] {
    if (!lead) return;
    std::error_code ec;
    fs::remove(manifest_path(cfg, fp), ec);
    fs::create_directories(pieces_dir, ec);
    std::set<std::string> wanted;
    for (const auto& seg : plan)
      for (const char* split : {"train", "val"}) wanted.insert(fs::path(piece_path(dir, seg, split)).filename());
    for (const auto& e : fs::directory_iterator(pieces_dir, ec))
      if (!wanted.count(e.path().filename().string())) fs::remove(e.path(), ec);
  });
  agree(group, cleaned);
  auto finished = [&](const CorpusSegment& seg) {
    if (force) return false;
    try {
      for (const char* split : {"train", "val"}) {
        const auto h = read_shard_header(piece_path(dir, seg, split));
        if (h.tokenizer_fingerprint != tok->fingerprint() || int64_t(h.vocab_size) != tok->vocab_size())
          return false;
      }
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  std::vector<CorpusSegment> todo;
  int64_t reused_here = 0;
  for (const auto& seg : mine) {
    if (finished(seg))
      ++reused_here;
    else
      todo.push_back(seg);
  }
  int64_t failed_segment = -1;
  int64_t text_here = 0;
  const Failure encoded = attempt(
      [&] {
        std::unique_ptr<ShardWriter> train, val;
        const CorpusSegment* open = nullptr;
        std::map<int64_t, const CorpusSegment*> by_index;
        for (const auto& seg : todo) by_index[seg.index] = &seg;
        ProgressBar bar("encode", disk_bytes_of(todo), show_progress && lead);
        const auto cs = stream_segments(
            files, todo, cfg, threads, st.chunk_bytes,
            [&](int, CorpusChunk& c) {
              c.flags.resize(c.docs.size());
              c.lengths.resize(c.docs.size());
              for (size_t i = 0; i < c.docs.size(); ++i) {
                c.flags[i] = val_rank(c.docs[i]) < threshold;
                const auto ids = tok->encode(c.docs[i]);
                c.lengths[i] = ids.size();
                c.ids.insert(c.ids.end(), ids.begin(), ids.end());
                std::string().swap(c.docs[i]);  // the text is no longer needed
              }
            },
            [&](CorpusChunk& c) {
              if (!open) {
                open = by_index.at(c.segment);
                if (injected_fault("prepare_throw", -1, open->index))
                  throw Error(fmt::format("MLLM_FAULT: prepare_throw at segment {}", open->index));
                train = std::make_unique<ShardWriter>(piece_path(dir, *open, "train"),
                                                      tok->vocab_size(), tok->fingerprint());
                val = std::make_unique<ShardWriter>(piece_path(dir, *open, "val"),
                                                    tok->vocab_size(), tok->fingerprint());
              }
              size_t pos = 0;
              for (size_t i = 0; i < c.lengths.size(); ++i) {
                (c.flags[i] ? *val : *train).add_document(c.ids.data() + pos, c.lengths[i]);
                pos += c.lengths[i];
              }
              bar.add(c.text_bytes);
              if (c.last_of_segment) {  // train first: a val piece means a finished segment
                train->finish();
                val->finish();
                train.reset();
                val.reset();
                if (injected_fault("prepare_kill", -1, open->index)) {
                  flush_logs();
                  ::raise(SIGKILL);
                }
                open = nullptr;
              }
            },
            &failed_segment);
        text_here = cs.text_bytes;
      },
      &failed_segment);
  {
    std::string mine_stats;
    put_u64(mine_stats, uint64_t(reused_here));
    put_u64(mine_stats, uint64_t(text_here));
    for (const auto& w : agree(group, encoded, mine_stats)) {
      WireReader in(w);
      st.segments_reused += int64_t(in.u64());
      st.text_bytes += int64_t(in.u64());
    }
  }
  st.encode_seconds = seconds_since(t_enc);
  if (st.segments_reused > 0)
    spdlog::info("{} of {} segment(s) were encoded by an earlier, interrupted run: kept",
                 st.segments_reused, plan.size());

  // 3. Shards: the pieces in corpus order, cut at shard_tokens; every rank computes the same
  //    layout and writes every ranks-th shard.
  const auto t_asm = Clock::now();
  const char* names[2] = {"train", "val"};
  // layouts[source][split]
  std::vector<std::array<std::vector<ShardLayout>, 2>> layouts(src.count());
  const Failure assembled = attempt([&] {
    size_t next = 0;
    for (size_t k = 0; k < src.count(); ++k) {
      for (int sp = 0; sp < 2; ++sp) {
        std::vector<std::string> pieces;
        std::vector<ShardHeader> headers;
        for (const auto& seg : plan) {
          if (source_of[size_t(seg.index)] != int(k)) continue;
          pieces.push_back(piece_path(dir, seg, names[sp]));
          headers.push_back(read_shard_header(pieces.back()));
        }
        layouts[k][size_t(sp)] = layout_split(pieces, headers, cfg.shard_tokens);
        for (size_t j = 0; j < layouts[k][size_t(sp)].size(); ++j, ++next)
          if (int(next % size_t(ranks)) == rank)
            write_shard((fs::path(dir) / shard_name(int(k), src.mixture, names[sp], j)).string(),
                        layouts[k][size_t(sp)][j], pieces, headers, *tok);
      }
    }
  });
  agree(group, assembled);

  // Per split: every source's shards in turn ("train" / "val"), and per source for mixtures.
  nlohmann::ordered_json split_j[2], sources_j = nlohmann::ordered_json::array();
  int64_t docs[2] = {0, 0}, tokens[2] = {0, 0}, count[2] = {0, 0};
  for (int sp = 0; sp < 2; ++sp) split_j[sp] = nlohmann::ordered_json::array();
  for (size_t k = 0; k < src.count(); ++k) {
    nlohmann::ordered_json one = nlohmann::ordered_json::object();
    for (int sp = 0; sp < 2; ++sp) {
      nlohmann::ordered_json shards = nlohmann::ordered_json::array();
      int64_t d = 0, t = 0;
      const auto& l = layouts[k][size_t(sp)];
      for (size_t i = 0; i < l.size(); ++i) {
        const nlohmann::ordered_json entry = {
            {"file", shard_name(int(k), src.mixture, names[sp], i)},
            {"documents", l[i].documents},
            {"tokens", l[i].tokens}};
        shards.push_back(entry);
        split_j[sp].push_back(entry);
        d += l[i].documents;
        t += l[i].tokens;
      }
      docs[sp] += d, tokens[sp] += t, count[sp] += int64_t(l.size());
      one[names[sp]] = {{"documents", d}, {"tokens", t}, {"shards", shards}};
    }
    sources_j.push_back(one);
  }
  if (src.mixture)
    for (size_t k = 0; k < src.count(); ++k)
      spdlog::info("source {} '{}': train {} documents / {} tokens in {} shard(s), val {} documents "
                   "/ {} tokens", k, cfg.sources[k].name,
                   sources_j[k]["train"]["documents"].get<int64_t>(),
                   sources_j[k]["train"]["tokens"].get<int64_t>(),
                   sources_j[k]["train"]["shards"].size(),
                   sources_j[k]["val"]["documents"].get<int64_t>(),
                   sources_j[k]["val"]["tokens"].get<int64_t>());
  st.train_documents = docs[0], st.train_tokens = tokens[0], st.train_shards = count[0];
  st.val_documents = docs[1], st.val_tokens = tokens[1], st.val_shards = count[1];
  const nlohmann::ordered_json train_j = {{"documents", docs[0]}, {"tokens", tokens[0]}, {"shards", split_j[0]}};
  const nlohmann::ordered_json val_j = {{"documents", docs[1]}, {"tokens", tokens[1]}, {"shards", split_j[1]}};
  st.vocab_size = tok->vocab_size();
  const Failure written = attempt([&] {
    if (!lead) return;
    nlohmann::ordered_json manifest = {
        {"format", kManifestFormat},
        {"version", kManifestVersion},
        {"data_fingerprint", fp},
        {"tokenizer_fingerprint", fingerprint_hex(tok->fingerprint())},
        {"tokenizer_type", tok->type()},
        {"vocab_size", tok->vocab_size()},
        {"tokenizer", "tokenizer.mllm"},
        {"val_threshold", fmt::format("{:016x}", threshold)},
        {"shard_tokens", cfg.shard_tokens},
        {"train", train_j},
        {"val", val_j},
        {"corpus", files},
    };
    if (src.mixture) manifest["sources"] = sources_j;
    write_file_atomic(manifest_path(cfg, fp), manifest.dump(2) + "\n");
    std::error_code ec;
    fs::remove_all(pieces_dir, ec);  // their content is in the shards now
  });
  agree(group, written);  // no rank returns before the manifest is there
  st.assemble_seconds = seconds_since(t_asm);
  st.seconds = seconds_since(t0);
  if (stats) *stats = st;
  return load_prepared(cfg, fp);
}

}  // namespace

PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareGroup& group, PrepareStats* stats) {
  bool prepared = false;
  return ensure_prepared(cfg, threads, show_progress, group, /*force=*/true, &prepared, stats);
}

PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareStats* stats) {
  SingleGroup one;
  return prepare_data(cfg, threads, show_progress, one, stats);
}

PreparedData ensure_prepared(const DataConfig& cfg, int threads, bool show_progress,
                             PrepareGroup& group, bool force, bool* prepared,
                             PrepareStats* stats) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  register_builtin_tokenizers();
  if (!tokenizer_registry().contains(cfg.tokenizer.type))
    throw ConfigError("data.tokenizer.type: " +
                      detail::unknown_name_message("tokenizer", cfg.tokenizer.type,
                                                   tokenizer_registry().names()));
  // A cache folder that cannot be made is found before any corpus byte is read.
  agree(group, attempt([&] {
          if (group.rank() == 0) check_cache_dir(cfg.cache_dir);
        }));
  std::vector<CorpusFileRecord> records;
  const std::string fp = data_fingerprint(cfg, group, &records);
  bool need = true;
  const Failure checked = attempt([&] {
    if (group.rank() != 0) return;
    note_old_cache(cfg);
    need = force || !is_prepared(cfg, fp);
  });
  need = agree(group, checked, need ? "1" : "0")[0] == "1";
  if (prepared) *prepared = need;
  PreparedData out;
  if (!need) {
    out = load_prepared(cfg, fp);
  } else {
    bool elsewhere = false;
    out = prepare_body(cfg, fp, threads, show_progress, force, group, stats, &elsewhere);
    if (prepared && elsewhere) *prepared = false;
  }
  out.corpus_files = std::move(records);
  return out;
}

}  // namespace mllm
