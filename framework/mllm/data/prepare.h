// mllm-prepare's work: stream the corpus, split documents into train/val, train (or reuse) the
// tokenizer, encode with worker threads, and write tokenizer + train/val shards + manifest into
// <data.cache_dir>/<data fingerprint>/, in memory bounded by data.prepare_memory_mb per rank
// whatever the corpus size. The work is spread over the ranks of a PrepareGroup (segments of the
// corpus, plan_segments in corpus.h); the output is byte-identical whatever the number of ranks,
// the thread count and the memory budget.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mllm/core/recipe.h"
#include "mllm/data/prepare_group.h"

namespace mllm {

// One corpus file as the data fingerprint saw it: its path as resolved, the data.sources index
// of its source (0 for data.corpus), its size in bytes and content_hash64 of its bytes on disk.
struct CorpusFileRecord {
  std::string path;
  int source = 0;
  uint64_t size = 0;
  uint64_t hash = 0;
};

// A prepared cache, as its manifest lists it.
struct PreparedData {
  std::string dir;                       // <cache_dir>/<data fingerprint>
  std::string tokenizer_path;            // <dir>/tokenizer.mllm (see write_tokenizer_file)
  std::vector<std::string> train_shards; // <dir>/train-00000.bin, ... (see shard.h), in order
  std::vector<std::string> val_shards;   // <dir>/val-00000.bin, ... (one, maybe empty, at least)
  // Per source of a mixture (data.sources; shards s<k>-train-NNNNN.bin), in recipe order;
  // train_shards / val_shards above are all of them in turn. One entry for data.corpus.
  struct Source {
    std::vector<std::string> train_shards, val_shards;
  };
  std::vector<Source> sources;
  // The data fingerprint (the folder's name) and, when ensure_prepared computed it, the corpus
  // files it hashed: what a checkpoint records so that a resume notices changed data.
  std::string data_fingerprint;
  std::vector<CorpusFileRecord> corpus_files;
};

// Figures of one prepare_data() run (for mllm-prepare's closing lines); counts are of the whole
// group, times of this rank.
struct PrepareStats {
  int64_t corpus_files = 0;
  int64_t corpus_bytes = 0;          // bytes of the corpus files on disk (compressed if so)
  int64_t text_bytes = 0;            // decompressed bytes read by the encoding pass (all ranks)
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;  // BOS/EOS included
  int64_t train_shards = 0, val_shards = 0;
  int64_t vocab_size = 0;
  int64_t chunk_bytes = 0;           // piece size the memory budget allowed
  int64_t segments = 0;              // units of work of the plan
  int64_t segments_reused = 0;       // finished by an earlier, interrupted run (all ranks)
  int ranks = 1;
  bool tokenizer_reused = false;     // loaded from the cache instead of trained
  double seconds = 0;                // wall time of the whole run
  double tokenizer_seconds = 0;      // the counting / sampling pass and training
  double encode_seconds = 0;         // the encoding pass
  double assemble_seconds = 0;       // pieces into shards, manifest
};

// Hex FNV-1a 64 of everything that decides the cache's content: shard/manifest format
// versions, the corpus file contents in order (a mixture's source by source; not the weights or
// names, which do not change the data), text_field, doc_separator, invalid_utf8,
// val_fraction, shard_tokens, the tokenizer section. Not mode or seq_len (they only change how
// shards are read) nor prepare_memory_mb / prepare_segment_bytes (they never change the
// output). Reads every corpus file; with a group, each rank hashes a share of the files.
// Throws DataError when the corpus cannot be resolved or read.
// `files` (optional): every corpus file's CorpusFileRecord, source by source, on every rank.
std::string data_fingerprint(const DataConfig& cfg);
std::string data_fingerprint(const DataConfig& cfg, PrepareGroup& group,
                             std::vector<CorpusFileRecord>* files = nullptr);

// <cfg.cache_dir>/<fingerprint>: where the data of that fingerprint is cached. No I/O.
std::string prepared_dir(const DataConfig& cfg, const std::string& fingerprint);
// <prepared_dir>/manifest.json, written last by prepare_data. No I/O.
std::string manifest_path(const DataConfig& cfg, const std::string& fingerprint);

// True when the manifest of `fingerprint` (data_fingerprint(cfg)) exists, matches it, and the
// tokenizer and every shard it lists exist with the manifest's tokenizer fingerprint. Throws
// nothing for a missing or damaged cache (false).
bool is_prepared(const DataConfig& cfg, const std::string& fingerprint);
// is_prepared(cfg, data_fingerprint(cfg)): throws DataError only when the corpus itself cannot
// be resolved or read.
bool is_prepared(const DataConfig& cfg);

// The cache of `fingerprint`, read from its manifest. Throws DataError naming the folder, with
// "re-run mllm-prepare", when the manifest is missing, of another format or version, or does
// not match.
PreparedData load_prepared(const DataConfig& cfg, const std::string& fingerprint);

// Builds everything (always; callers skip it when is_prepared), on every rank of `group`
// together (every rank calls it with the same cfg). `threads` <= 0 uses every core.
// `show_progress` draws a progress bar on stderr (rank 0) when stderr is a terminal.
//   1. every rank streams its segments: validates every document, splits train/val, counts /
//      samples the train split; the trainers are merged and rank 0 trains the tokenizer and
//      writes tokenizer.mllm and split.json (kept: a re-run reuses them);
//   2. every rank encodes its segments into piece files (<dir>/pieces/), skipping the pieces
//      an earlier, interrupted run finished;
//   3. the pieces are cut into shards of at most shard_tokens tokens in corpus order (every
//      rank writes some), rank 0 writes the manifest last and removes the pieces.
// Every file is written under a temporary name and renamed, so a failed run leaves no
// half-written file, nothing another rank finished is removed, and is_prepared() stays false
// until the manifest exists. A preparation of the same fingerprint by another job waits for
// this one (a lock file in the folder). Other fingerprints' folders are never touched.
// Errors reach every rank as the same exception (the first in corpus order): DataError (bad
// corpus: file:line), ConfigError (bad tokenizer settings), mllm::Error (I/O).
PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareGroup& group, PrepareStats* stats = nullptr);
// The same on one rank (a SingleGroup).
PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareStats* stats = nullptr);

// The cache of `cfg` on every rank of `group`: prepared (by prepare_data) unless it already is,
// with the fingerprint computed once and agreed on. `prepared` (optional) is set to whether
// this call prepared it. Throws what data_fingerprint and prepare_data throw, on every rank.
PreparedData ensure_prepared(const DataConfig& cfg, int threads, bool show_progress,
                             PrepareGroup& group, bool force = false, bool* prepared = nullptr,
                             PrepareStats* stats = nullptr);

// The train/val split, decided per document by its content (so copies of a text land in the
// same split, and no document count or order is needed): a document is held out for
// validation when val_rank(text) < the threshold. The threshold is val_threshold(val_fraction)
// = floor(val_fraction * 2^64), adjusted by prepare_data only for tiny corpora (at least one
// val document when val_fraction > 0 and there are two distinct documents; never all).
inline constexpr uint64_t kValSplitSeed = 0x5EEDDA7A5EEDDA7Aull;
uint64_t val_rank(std::string_view text);  // splitmix64 finaliser of content_hash64(text) ^ seed
uint64_t val_threshold(double val_fraction);

// Which rank prepares which segment: segments sorted by bytes (largest first, ties by index)
// each go to the rank with the fewest bytes so far (ties: the lowest rank). Returns, per rank,
// its segment indices in ascending order. Any assignment gives the same output; this one
// balances the work.
std::vector<std::vector<int64_t>> assign_segments(const std::vector<int64_t>& segment_bytes,
                                                  int ranks);

}  // namespace mllm
