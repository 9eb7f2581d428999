// prepare_data: corpus -> tokenizer + train/val shards + manifest in the cache folder.
#include "mllm/data/prepare.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "mllm/core/error.h"
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
constexpr int kManifestVersion = 1;
constexpr size_t kDocsPerBlock = 256;  // encoding work unit

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

struct EncodedBlock {
  std::vector<int32_t> ids;
  std::vector<size_t> lengths;  // tokens per document
};

// Encodes `docs` with `threads` workers (blocks of kDocsPerBlock documents taken in turn) and
// writes them in document order, so the shard does not depend on the thread count.
ShardHeader encode_to_shard(const std::vector<std::string>& docs, const Tokenizer& tok,
                            const std::string& path, int threads, bool show_progress,
                            const std::string& label) {
  const size_t n_blocks = (docs.size() + kDocsPerBlock - 1) / kDocsPerBlock;
  std::vector<EncodedBlock> blocks(n_blocks);
  int64_t total_bytes = 0;
  for (const auto& d : docs) total_bytes += int64_t(d.size());
  ProgressBar bar(label, total_bytes, show_progress);
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr error;
  auto worker = [&] {
    try {
      for (size_t b; (b = next.fetch_add(1)) < n_blocks;) {
        EncodedBlock& out = blocks[b];
        const size_t end = std::min(docs.size(), (b + 1) * kDocsPerBlock);
        for (size_t i = b * kDocsPerBlock; i < end; ++i) {
          auto ids = tok.encode(docs[i]);
          out.lengths.push_back(ids.size());
          out.ids.insert(out.ids.end(), ids.begin(), ids.end());
          bar.add(int64_t(docs[i].size()));
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!error) error = std::current_exception();
      next = n_blocks;  // stop the others
    }
  };
  const int n_workers = std::max(1, std::min<int>(threads, int(std::max<size_t>(1, n_blocks))));
  std::vector<std::thread> pool;
  for (int t = 1; t < n_workers; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  bar.finish();
  if (error) std::rethrow_exception(error);

  ShardWriter writer(path, tok.vocab_size(), tok.fingerprint());
  for (const auto& blk : blocks) {
    size_t pos = 0;
    for (size_t len : blk.lengths) {
      writer.add_document(blk.ids.data() + pos, len);
      pos += len;
    }
  }
  return writer.finish();
}

nlohmann::json read_manifest(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return nullptr;
  try {
    auto j = nlohmann::json::parse(read_file_bytes(path));
    if (j.is_object() && j.value("format", "") == kManifestFormat &&
        j.value("version", 0) == kManifestVersion)
      return j;
  } catch (const std::exception&) {
  }
  return nullptr;
}

// Tokenizer from the cache when the manifest says it was made from the same data; else null.
std::shared_ptr<Tokenizer> reusable_tokenizer(const DataConfig& cfg, const std::string& fp) {
  const auto manifest = read_manifest(manifest_path(cfg));
  if (manifest.is_null() || manifest.value("data_fingerprint", "") != fp) return nullptr;
  try {
    auto tok = load_tokenizer(prepared_paths(cfg).tokenizer_path);
    if (fingerprint_hex(tok->fingerprint()) == manifest.value("tokenizer_fingerprint", ""))
      return tok;
  } catch (const Error&) {
  }
  return nullptr;
}

}  // namespace

PreparedData prepared_paths(const DataConfig& cfg) {
  const fs::path dir(cfg.cache_dir);
  return {(dir / "tokenizer.mllm").string(), (dir / "train.bin").string(),
          (dir / "val.bin").string()};
}

std::string manifest_path(const DataConfig& cfg) {
  return (fs::path(cfg.cache_dir) / "manifest.json").string();
}

std::string data_fingerprint(const DataConfig& cfg) {
  const auto files = resolve_corpus_files(cfg.corpus);
  Fnv1a64 h;
  h.update(std::string_view("mllm-data"));
  h.update_u64(kManifestVersion);
  h.update_u64(kShardVersion);
  h.update_u64(corpus_content_hash(files));
  h.update(cfg.text_field);
  h.update(cfg.doc_separator);
  h.update(cfg.invalid_utf8);
  uint64_t val_bits;
  std::memcpy(&val_bits, &cfg.val_fraction, 8);
  h.update_u64(val_bits);
  h.update(cfg.tokenizer.type);
  h.update_u64(uint64_t(cfg.tokenizer.vocab_size));
  h.update_u64(uint64_t(cfg.tokenizer.min_count));
  h.update_u64(uint64_t(cfg.tokenizer.max_vocab));
  if (cfg.tokenizer.character_coverage != 0) {  // (not hashed at 0: older caches stay valid)
    uint64_t bits;
    std::memcpy(&bits, &cfg.tokenizer.character_coverage, 8);
    h.update_u64(bits);
  }
  return fingerprint_hex(h.value());
}

std::vector<bool> val_split(int64_t num_docs, double val_fraction) {
  int64_t n_val = std::llround(double(num_docs) * val_fraction);
  if (val_fraction > 0 && num_docs >= 2) n_val = std::max<int64_t>(n_val, 1);
  n_val = std::min(n_val, num_docs - 1);
  std::vector<bool> is_val(size_t(std::max<int64_t>(0, num_docs)), false);
  if (n_val <= 0) return is_val;
  const auto perm = seeded_permutation(num_docs, kValSplitSeed);
  for (int64_t i = 0; i < n_val; ++i) is_val[size_t(perm[size_t(i)])] = true;
  return is_val;
}

bool is_prepared(const DataConfig& cfg) {
  const auto paths = prepared_paths(cfg);
  const auto manifest = read_manifest(manifest_path(cfg));
  if (manifest.is_null()) {
    spdlog::debug("data cache '{}': no valid manifest", cfg.cache_dir);
    return false;
  }
  const std::string fp = data_fingerprint(cfg);
  if (manifest.value("data_fingerprint", "") != fp) {
    spdlog::info("data cache '{}' was made from other data or settings; it will be rebuilt",
                 cfg.cache_dir);
    return false;
  }
  std::error_code ec;
  if (!fs::is_regular_file(paths.tokenizer_path, ec)) return false;
  const std::string tok_fp = manifest.value("tokenizer_fingerprint", "");
  for (const auto& shard : {paths.train_shard, paths.val_shard}) {
    try {
      if (fingerprint_hex(read_shard_header(shard).tokenizer_fingerprint) != tok_fp) return false;
    } catch (const DataError& e) {
      spdlog::debug("data cache: {}", e.what());
      return false;
    }
  }
  return true;
}

PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareStats* stats) {
  const auto t0 = Clock::now();
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  PrepareStats st;
  const auto paths = prepared_paths(cfg);

  // 1. Read and validate everything before writing anything (a typo in the tokenizer type
  //    should not wait for the corpus to be read).
  register_builtin_tokenizers();
  if (!tokenizer_registry().contains(cfg.tokenizer.type))
    throw ConfigError("data.tokenizer.type: " +
                      detail::unknown_name_message("tokenizer", cfg.tokenizer.type,
                                                   tokenizer_registry().names()));
  const auto files = resolve_corpus_files(cfg.corpus);
  st.corpus_files = int64_t(files.size());
  const std::string fp = data_fingerprint(cfg);
  const auto t_read = Clock::now();
  auto docs = read_corpus(cfg, &st.corpus_bytes, threads);
  spdlog::info("corpus: {} documents, {:.1f} MB from {} file(s) (fingerprint {:.2f} s, read {:.2f} s)",
               docs.size(), double(st.corpus_bytes) / 1e6, files.size(),
               std::chrono::duration<double>(t_read - t0).count(), seconds_since(t_read));

  // 2. Deterministic split; documents keep their corpus order inside each split.
  const auto is_val = val_split(int64_t(docs.size()), cfg.val_fraction);
  std::vector<std::string> train_docs, val_docs;
  for (size_t i = 0; i < docs.size(); ++i)
    (is_val[i] ? val_docs : train_docs).push_back(std::move(docs[i]));
  docs.clear();
  docs.shrink_to_fit();

  // 3. Tokenizer: trained on the train split only (val stays held out).
  auto tok = reusable_tokenizer(cfg, fp);
  st.tokenizer_reused = tok != nullptr;
  const auto t_tok = Clock::now();
  if (!tok) tok = train_tokenizer(cfg.tokenizer, train_docs, threads);
  spdlog::info("tokenizer: {} with {} ids ({} in {:.2f} s), fingerprint {}", tok->type(),
               tok->vocab_size(), st.tokenizer_reused ? "reused from the cache" : "trained",
               seconds_since(t_tok), fingerprint_hex(tok->fingerprint()));

  // 4. Write: the manifest goes first so that an interrupted run is never taken as complete.
  std::error_code ec;
  fs::create_directories(cfg.cache_dir, ec);
  fs::remove(manifest_path(cfg), ec);
  if (!st.tokenizer_reused) tok->save(paths.tokenizer_path);
  const auto train_h =
      encode_to_shard(train_docs, *tok, paths.train_shard, threads, show_progress, "encode train");
  const auto val_h =
      encode_to_shard(val_docs, *tok, paths.val_shard, threads, show_progress, "encode val");

  st.train_documents = int64_t(train_h.doc_count);
  st.val_documents = int64_t(val_h.doc_count);
  st.train_tokens = int64_t(train_h.token_count);
  st.val_tokens = int64_t(val_h.token_count);
  st.vocab_size = tok->vocab_size();

  nlohmann::ordered_json manifest = {
      {"format", kManifestFormat},
      {"version", kManifestVersion},
      {"data_fingerprint", fp},
      {"tokenizer_fingerprint", fingerprint_hex(tok->fingerprint())},
      {"tokenizer_type", tok->type()},
      {"vocab_size", tok->vocab_size()},
      {"tokenizer", fs::path(paths.tokenizer_path).filename().string()},
      {"train", fs::path(paths.train_shard).filename().string()},
      {"val", fs::path(paths.val_shard).filename().string()},
      {"train_documents", st.train_documents},
      {"val_documents", st.val_documents},
      {"train_tokens", st.train_tokens},
      {"val_tokens", st.val_tokens},
      {"corpus", files},
  };
  write_file_atomic(manifest_path(cfg), manifest.dump(2) + "\n");
  st.seconds = seconds_since(t0);
  if (stats) *stats = st;
  return paths;
}

}  // namespace mllm
