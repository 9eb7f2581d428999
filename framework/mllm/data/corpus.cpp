// Corpus file discovery (glob) and parsing of .txt / .jsonl documents with UTF-8 checks.
#include "mllm/data/corpus.h"

#include <fmt/format.h>
#include <glob.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <atomic>
#include <algorithm>

#include "mllm/core/error.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/hash.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::string extension_of(const std::string& path) {
  return std::filesystem::path(path).extension().string();
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\v\f") == std::string_view::npos;
}

// Splits `bytes` into lines (without '\n' and a trailing '\r'); calls f(line, 1-based number).
template <typename F>
void for_each_line(std::string_view bytes, int64_t first_line, F&& f) {
  size_t start = 0;
  int64_t number = first_line;
  while (start < bytes.size()) {
    size_t end = bytes.find('\n', start);
    if (end == std::string_view::npos) end = bytes.size();
    std::string_view line = bytes.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line, number++);
    start = end + 1;
  }
}

std::string hex_bytes(std::string_view s, size_t pos, size_t n) {
  std::string out;
  for (size_t i = pos; i < std::min(s.size(), pos + n); ++i)
    out += fmt::format("{}0x{:02X}", out.empty() ? "" : " ", static_cast<unsigned char>(s[i]));
  return out;
}

// The line, validated or repaired per data.invalid_utf8.
std::string checked_utf8(std::string_view line, const std::string& path, int64_t number,
                         const DataConfig& cfg) {
  const size_t bad = utf8_find_invalid(line);
  if (bad == std::string_view::npos) return std::string(line);
  if (cfg.invalid_utf8 == "replace") return utf8_replace_invalid(line);
  throw DataError(fmt::format("{}:{}: invalid UTF-8 at byte {} of the line (bytes {}); fix the "
                              "file or set data.invalid_utf8: replace to substitute U+FFFD",
                              path, number, bad + 1, hex_bytes(line, bad, 4)));
}

void parse_jsonl_chunk(std::string_view bytes, int64_t first_line, const std::string& path,
                       const DataConfig& cfg, std::vector<std::string>& docs) {
  for_each_line(bytes, first_line, [&](std::string_view raw, int64_t number) {
    if (is_blank(raw)) return;
    const std::string line = checked_utf8(raw, path, number, cfg);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw DataError(fmt::format("{}:{}: not valid JSON ({}); each line of a .jsonl file must "
                                  "be one JSON object",
                                  path, number, e.what()));
    }
    if (!j.is_object())
      throw DataError(fmt::format("{}:{}: expected a JSON object with a string field '{}', got "
                                  "a JSON {}",
                                  path, number, cfg.text_field, j.type_name()));
    auto it = j.find(cfg.text_field);
    if (it == j.end()) {
      std::vector<std::string> fields;
      for (auto f = j.begin(); f != j.end(); ++f) fields.push_back(f.key());
      throw DataError(fmt::format("{}:{}: no field '{}' (fields: {}); set data.text_field to "
                                  "the field that holds the text",
                                  path, number, cfg.text_field, fmt::join(fields, ", ")));
    }
    if (!it->is_string())
      throw DataError(fmt::format("{}:{}: field '{}' is a JSON {}, expected a string", path,
                                  number, cfg.text_field, it->type_name()));
    std::string text = it->get<std::string>();
    if (!is_blank(text)) docs.push_back(std::move(text));
  });
}

// JSON parsing dominates reading, so a .jsonl file is cut at line boundaries into chunks parsed
// by `threads` workers. Documents keep file order, and the error reported is the first in the
// file, whatever the thread count.
void read_jsonl(std::string_view bytes, const std::string& path, const DataConfig& cfg,
                int threads, std::vector<std::string>& docs) {
  if (bytes.size() >= 3 && bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);
  constexpr size_t kMinChunkBytes = size_t(1) << 20;
  const size_t n_chunks = std::max<size_t>(
      1, std::min<size_t>(size_t(threads) * 4, bytes.size() / kMinChunkBytes));
  struct Chunk {
    std::string_view bytes;
    int64_t first_line = 1;
    std::vector<std::string> docs;
    std::exception_ptr error;
  };
  std::vector<Chunk> chunks;
  size_t start = 0;
  int64_t line = 1;
  for (size_t c = 0; c < n_chunks && start < bytes.size(); ++c) {
    size_t end = c + 1 == n_chunks ? bytes.size() : (bytes.size() * (c + 1)) / n_chunks;
    if (end < start) end = start;
    end = bytes.find('\n', end);
    end = end == std::string_view::npos ? bytes.size() : end + 1;
    Chunk ch;
    ch.bytes = bytes.substr(start, end - start);
    ch.first_line = line;
    line += std::count(ch.bytes.begin(), ch.bytes.end(), '\n');
    chunks.push_back(std::move(ch));
    start = end;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t c; (c = next.fetch_add(1)) < chunks.size();) {
      try {
        parse_jsonl_chunk(chunks[c].bytes, chunks[c].first_line, path, cfg, chunks[c].docs);
      } catch (...) {
        chunks[c].error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int>(threads, int(chunks.size())); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (auto& ch : chunks) {
    if (ch.error) std::rethrow_exception(ch.error);
    docs.insert(docs.end(), std::make_move_iterator(ch.docs.begin()),
                std::make_move_iterator(ch.docs.end()));
  }
}

void read_txt(std::string_view bytes, const std::string& path, const DataConfig& cfg,
              std::vector<std::string>& docs) {
  const bool by_line = cfg.doc_separator == "line";
  std::string current;
  bool open = false;
  auto close_doc = [&] {
    if (open) docs.push_back(std::move(current));
    current.clear();
    open = false;
  };
  if (bytes.size() >= 3 && bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);
  for_each_line(bytes, 1, [&](std::string_view raw, int64_t number) {
    if (is_blank(raw)) {
      if (!by_line) close_doc();
      return;
    }
    std::string line = checked_utf8(raw, path, number, cfg);
    if (by_line) {
      docs.push_back(std::move(line));
      return;
    }
    if (open) current.push_back('\n');
    current += line;
    open = true;
  });
  close_doc();
}

}  // namespace

std::vector<std::string> resolve_corpus_files(const std::vector<std::string>& patterns) {
  if (patterns.empty())
    throw DataError("data.corpus is empty; list the .txt or .jsonl files (or globs) to train on, "
                    "e.g. data.corpus: [data/tang300/*.jsonl]");
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& pattern : patterns) {
    std::vector<std::string> matches;
    if (has_glob_chars(pattern)) {
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
      if (matches.empty())
        throw DataError(fmt::format("data.corpus pattern '{}' matches no file (working directory "
                                    "'{}'); check the path, or run launch/fetch-corpus.sh for "
                                    "data/full/",
                                    pattern, std::filesystem::current_path().string()));
    } else {
      matches.push_back(pattern);
    }
    for (const auto& f : matches) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(f, ec))
        throw DataError(fmt::format("data.corpus file '{}' does not exist or is not a regular "
                                    "file (working directory '{}')",
                                    f, std::filesystem::current_path().string()));
      const std::string ext = extension_of(f);
      if (ext != ".txt" && ext != ".jsonl")
        throw DataError(fmt::format("data.corpus file '{}' has extension '{}'; mllm reads .txt "
                                    "(plain text) and .jsonl (one JSON object per line)",
                                    f, ext));
      if (seen.insert(f).second) files.push_back(f);
    }
  }
  return files;
}

std::vector<std::string> read_corpus_file(const std::string& path, const DataConfig& cfg,
                                          int64_t* bytes_read, int threads) {
  const std::string bytes = read_file_bytes(path);
  if (bytes_read) *bytes_read += int64_t(bytes.size());
  std::vector<std::string> docs;
  if (extension_of(path) == ".jsonl")
    read_jsonl(bytes, path, cfg, std::max(1, threads), docs);
  else
    read_txt(bytes, path, cfg, docs);
  return docs;
}

std::vector<std::string> read_corpus(const DataConfig& cfg, int64_t* bytes_read, int threads) {
  const auto files = resolve_corpus_files(cfg.corpus);
  std::vector<std::string> docs;
  for (const auto& f : files) {
    auto part = read_corpus_file(f, cfg, bytes_read, threads);
    docs.insert(docs.end(), std::make_move_iterator(part.begin()),
                std::make_move_iterator(part.end()));
  }
  if (docs.empty())
    throw DataError(fmt::format("the corpus ({}) holds no document: every file is empty or "
                                "blank; point data.corpus at text",
                                fmt::join(files, ", ")));
  return docs;
}

uint64_t corpus_content_hash(const std::vector<std::string>& files) {
  Fnv1a64 h;
  h.update_u64(files.size());
  for (const auto& f : files) {
    const std::string bytes = read_file_bytes(f);
    h.update_u64(bytes.size());
    h.update_u64(content_hash64(bytes));
  }
  return h.value();
}

}  // namespace mllm
