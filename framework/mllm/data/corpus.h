// Reading the raw corpus named by `data.corpus`: .txt (one document per line, or blocks separated
// by blank lines) and .jsonl (one JSON object per line, text in `data.text_field`), each plain or
// compressed (.gz, .zst), and .parquet (the string column `data.text_field`), with UTF-8
// validation that names the file and line (or row group and row) of every problem.
// stream_corpus() reads any corpus size in bounded memory; read_corpus() loads a small one whole.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "mllm/core/recipe.h"

namespace mllm {

// Files of `patterns` (paths or glob(3) patterns, relative to the working directory; a relative
// one that names no file there is taken from `fallback_dir` when it names files there, with an
// info line), in list order, each glob's matches sorted, duplicates dropped. Throws DataError
// when the list is empty, a pattern matches nothing, a path is missing or not a regular file
// (naming every folder tried), or a file is not .txt / .jsonl, plain or .gz / .zst
// (corpus_file_kind in input_file.h); the errors name `option` (the setting that gave the
// patterns: data.corpus, mllm-eval's --corpus).
std::vector<std::string> resolve_corpus_files(const std::vector<std::string>& patterns,
                                              const std::string& option = "data.corpus",
                                              const std::string& fallback_dir = "");

// A unit of work of preparation: what one rank reads and encodes into one pair of piece files
// (train, val). Segments are planned from the files alone (plan_segments), so the plan, and the
// output assembled from the pieces in segment order, do not depend on the number of ranks or
// threads.
struct SegmentPart {
  size_t file = 0;     // index into the file list
  int64_t begin = 0;   // plain file: byte offset of the first document's first byte;
                       // .parquet: first row group; else 0
  int64_t end = -1;    // one past the last byte / row group; -1 = to the end of the file
};
struct CorpusSegment {
  int64_t index = 0;               // position in the plan: documents of segment s come before s+1's
  std::vector<SegmentPart> parts;  // in corpus order
  int64_t disk_bytes = 0;          // bytes on disk it reads (for balancing the ranks)
  // 16 hex digits naming the segment's parts (index and ranges), for its piece files.
  std::string id() const;
};

// The plan: files in order, cut into segments of about `segment_bytes` bytes on disk:
//   - consecutive files whose sizes sum to at most segment_bytes share one segment;
//   - a larger plain (.txt / .jsonl) file is cut into byte ranges, each boundary moved forward to
//     the next document start (a line start; for doc_separator=blank_line a line start after a
//     blank line), so every document is read whole by exactly one segment;
//   - a larger compressed file is one segment (a gzip or zstd stream is read from its start);
//   - a larger .parquet file is cut into runs of row groups (by their compressed bytes).
// Reads only the few bytes around each boundary (and Parquet footers). Throws DataError when a
// file cannot be read, or a .parquet file lacks the string column data.text_field.
std::vector<CorpusSegment> plan_segments(const std::vector<std::string>& files,
                                         const DataConfig& cfg, int64_t segment_bytes);

// One segment per file (what stream_corpus reads).
std::vector<CorpusSegment> whole_file_segments(const std::vector<std::string>& files);

// A piece of one segment, cut at document boundaries (whole lines; for
// doc_separator=blank_line, after a blank line), so that pieces parse independently.
struct CorpusChunk {
  int64_t index = 0;         // position in the stream: 0, 1, 2, ... in corpus order
  int64_t segment = 0;       // CorpusSegment::index of the segment it belongs to
  bool last_of_segment = false;  // the segment's last piece (every segment has at least one)
  size_t file = 0;           // index into the file list
  int64_t part_begin = 0;    // SegmentPart::begin of the part it was read from
  int64_t first_line = 1;    // 1-based line number of its first line, counted from part_begin
  bool parsed = false;       // .parquet: docs were filled by the reader (no text to parse)
  int64_t row_group = -1;    // .parquet: the row group its documents come from
  int64_t first_row = 0;     // .parquet: row (0-based, in the row group) of its first document
  int64_t text_bytes = 0;    // decompressed bytes of the piece
  std::vector<std::string> docs;  // its documents, in file order (filled before `work` runs)
  // Free for the caller: what `work` computes per document for `done` (token ids, lengths,
  // train/val flags).
  std::vector<int32_t> ids;
  std::vector<uint64_t> lengths;
  std::vector<uint8_t> flags;
  std::exception_ptr error;  // set when reading, parsing or `work` failed on this piece
  std::string bytes;         // raw text (+ padding); released once parsed
};

struct CorpusStreamStats {
  int64_t files = 0;
  int64_t disk_bytes = 0;  // bytes read from disk (compressed bytes for .gz / .zst)
  int64_t text_bytes = 0;  // decompressed bytes
  int64_t documents = 0;
  int64_t chunks = 0;
};

// Called on a worker thread for each parsed piece; `worker` is in [0, threads) and no two calls
// with the same worker overlap.
using ChunkWork = std::function<void(int worker, CorpusChunk& chunk)>;
// Called on the calling thread for each piece, strictly in stream order.
using ChunkDone = std::function<void(CorpusChunk& chunk)>;

// Reads `segments` (of plan_segments over `files`, any subset, in the given order): one reader
// thread decompresses and cuts pieces of about `chunk_bytes` (a longer line or blank_line
// document makes its piece longer), `threads` workers parse them into documents (rules of
// read_corpus_file) and run `work`, and `done` sees them in order. At most 2 * threads + 2
// pieces exist at any time, so memory is bounded by about (2 * threads + 2) x 3 x chunk_bytes
// plus what work/done keep.
// Errors: the first in stream order is rethrown (DataError "file:line: ..." for bad input, as
// read_corpus_file, with the line counted from the file's start; an exception of work/done as
// it is); pieces after it are not read. Documents, their order and the error reported do not
// depend on `threads` or `chunk_bytes`.
// `failed_segment` (optional) receives the CorpusSegment::index of the piece whose error is
// thrown (-1 when the error is not a piece's).
CorpusStreamStats stream_segments(const std::vector<std::string>& files,
                                  const std::vector<CorpusSegment>& segments,
                                  const DataConfig& cfg, int threads, int64_t chunk_bytes,
                                  const ChunkWork& work, const ChunkDone& done,
                                  int64_t* failed_segment = nullptr);

// stream_segments over whole_file_segments(files).
CorpusStreamStats stream_corpus(const std::vector<std::string>& files, const DataConfig& cfg,
                                int threads, int64_t chunk_bytes, const ChunkWork& work,
                                const ChunkDone& done);

// Documents of one corpus file, in file order. Empty and whitespace-only documents are
// skipped; a UTF-8 byte order mark at the start and a '\r' before each '\n' are removed.
//   .txt, doc_separator=line:       each line is a document
//   .txt, doc_separator=blank_line: lines between blank (or whitespace-only) lines, joined by '\n'
//   .jsonl: each non-blank line must be a JSON object whose `text_field` is a string
// Invalid UTF-8 throws DataError "file:line: ..." unless invalid_utf8 == "replace" (then each
// maximal invalid subpart becomes U+FFFD). Bad JSON or a missing/non-string field throws
// DataError "file:line: ...". `bytes_read` (optional) is incremented by the file size on disk.
// `threads` workers parse; the result and the error reported (the first in the file) do not
// depend on it. Loads the whole file: for small inputs and tests (prepare streams).
std::vector<std::string> read_corpus_file(const std::string& path, const DataConfig& cfg,
                                          int64_t* bytes_read = nullptr, int threads = 1);

// All documents of all files of cfg.corpus, in order, in memory (mllm-eval --corpus). Throws
// DataError as above, and when the corpus holds no document at all.
std::vector<std::string> read_corpus(const DataConfig& cfg, int64_t* bytes_read = nullptr,
                                     int threads = 1);

// FNV-1a 64 over the number of files and each file's size and content_hash64 (in order) of its
// bytes on disk: the corpus part of the data fingerprint. Streams (bounded memory). Throws
// DataError when a file cannot be read.
uint64_t corpus_content_hash(const std::vector<std::string>& files);

// One file's part of corpus_content_hash: its size in bytes and content_hash64 of its bytes on
// disk. Streams. Throws DataError when the file cannot be read.
struct FileContentHash {
  uint64_t size = 0;
  uint64_t hash = 0;
};
FileContentHash file_content_hash(const std::string& path);
// corpus_content_hash from every file's FileContentHash, in file order.
uint64_t combine_content_hashes(const std::vector<FileContentHash>& files);

}  // namespace mllm
