// Reading the raw corpus named by `data.corpus`: .txt (one document per line, or blocks separated
// by blank lines) and .jsonl (one JSON object per line, text in `data.text_field`), with UTF-8
// validation that names the file and line of every problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mllm/core/recipe.h"

namespace mllm {

// Files of `patterns` (paths or glob(3) patterns, relative to the working directory), in list
// order, each glob's matches sorted, duplicates dropped. Throws DataError when the list is
// empty, a pattern matches nothing, a path is missing or not a regular file, or a file is
// neither .txt nor .jsonl.
std::vector<std::string> resolve_corpus_files(const std::vector<std::string>& patterns);

// Documents of one corpus file, in file order. Empty and whitespace-only documents are
// skipped; a UTF-8 byte order mark at the start and a '\r' before each '\n' are removed.
//   .txt, doc_separator=line:       each line is a document
//   .txt, doc_separator=blank_line: lines between blank (or whitespace-only) lines, joined by '\n'
//   .jsonl: each non-blank line must be a JSON object whose `text_field` is a string
// Invalid UTF-8 throws DataError "file:line: ..." unless invalid_utf8 == "replace" (then each
// maximal invalid subpart becomes U+FFFD). Bad JSON or a missing/non-string field throws
// DataError "file:line: ...". `bytes_read` (optional) is incremented by the file size.
// `threads` workers parse a .jsonl file; the result and the error reported (the first in the
// file) do not depend on it.
std::vector<std::string> read_corpus_file(const std::string& path, const DataConfig& cfg,
                                          int64_t* bytes_read = nullptr, int threads = 1);

// All documents of all files of cfg.corpus, in order. Throws DataError as above, and when the
// corpus holds no document at all.
std::vector<std::string> read_corpus(const DataConfig& cfg, int64_t* bytes_read = nullptr,
                                     int threads = 1);

// FNV-1a 64 over the number of files and each file's size and content_hash64 (in order): the
// corpus part of the data fingerprint. Throws DataError when a file cannot be read.
uint64_t corpus_content_hash(const std::vector<std::string>& files);

}  // namespace mllm
