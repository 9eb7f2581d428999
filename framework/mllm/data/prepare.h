// mllm-prepare's work: read the corpus, split documents into train/val, train (or reuse) the
// tokenizer, encode with worker threads, and write tokenizer + train/val shards + manifest into
// data.cache_dir. Same input gives byte-identical output, whatever the thread count.
#pragma once

#include <cstdint>
#include <string>

#include "mllm/core/recipe.h"

namespace mllm {

struct PreparedData {
  std::string tokenizer_path;  // <cache_dir>/tokenizer.mllm (see write_tokenizer_file)
  std::string train_shard;     // <cache_dir>/train.bin (see shard.h)
  std::string val_shard;       // <cache_dir>/val.bin (may hold zero documents)
};

// Figures of one prepare_data() run (for mllm-prepare's closing line).
struct PrepareStats {
  int64_t corpus_files = 0;
  int64_t corpus_bytes = 0;          // bytes of the corpus files read
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;  // BOS/EOS included
  int64_t vocab_size = 0;
  bool tokenizer_reused = false;     // loaded from the cache instead of trained
  double seconds = 0;                // wall time of the whole run
};

// Where prepare_data writes, in cfg.cache_dir. No I/O.
PreparedData prepared_paths(const DataConfig& cfg);

// Path of the manifest (<cache_dir>/manifest.json), written last by prepare_data.
std::string manifest_path(const DataConfig& cfg);

// Hex FNV-1a 64 of everything that decides the shards' content: shard/tokenizer format
// versions, the corpus file contents in order, text_field, doc_separator, invalid_utf8,
// val_fraction, the tokenizer section. Not mode or seq_len (they only change how shards are
// read). Reads every corpus file. Throws DataError when the corpus cannot be resolved or read.
std::string data_fingerprint(const DataConfig& cfg);

// True when the manifest, tokenizer and both shards exist, the manifest's data fingerprint equals
// data_fingerprint(cfg), and both shard headers carry the manifest's tokenizer fingerprint.
// Throws DataError only when the corpus itself cannot be resolved or read.
bool is_prepared(const DataConfig& cfg);

// Builds everything (always; callers skip it when is_prepared). `threads` <= 0 uses every core.
// `show_progress` draws a progress bar on stderr when stderr is a terminal. All inputs are read
// and validated before anything is written; every file is written under a temporary name and
// renamed, the manifest last, so a failed run leaves no half-written file and is_prepared()
// false. Throws DataError (bad corpus: file:line), ConfigError (bad tokenizer settings).
PreparedData prepare_data(const DataConfig& cfg, int threads, bool show_progress,
                          PrepareStats* stats = nullptr);

// Deterministic train/val split of `num_docs` documents: round(num_docs * val_fraction) documents
// (at least 1 when val_fraction > 0 and num_docs >= 2, never all of them) chosen by
// seeded_permutation(num_docs, kValSplitSeed); returns is_val per document.
inline constexpr uint64_t kValSplitSeed = 0x5EEDDA7A5EEDDA7Aull;
std::vector<bool> val_split(int64_t num_docs, double val_fraction);

}  // namespace mllm
