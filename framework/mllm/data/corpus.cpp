// Corpus file discovery (glob), the streaming reader, and parsing of .txt / .jsonl documents
// with UTF-8 checks: simdjson parses and validates every line; a line it rejects (or that has
// the text field twice) is parsed again by nlohmann-json, whose verdict and message count.
#include "mllm/data/corpus.h"

#include <fmt/format.h>
#include <glob.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "mllm/core/error.h"
#include "mllm/data/hash.h"
#include "mllm/data/input_file.h"
#include "mllm/data/parquet_file.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// A blank line or document: nothing but Unicode White_Space (utf8.h), so that lines of U+3000
// (the CJK full-width space), U+00A0, U+2028 / U+2029 or lone CRs separate documents as an
// empty line does and never become documents themselves.
bool is_blank(std::string_view line) { return is_blank_text(line); }

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
  if (simdjson::validate_utf8(line.data(), line.size())) return std::string(line);
  const size_t bad = utf8_find_invalid(line);
  if (bad == std::string_view::npos) return std::string(line);
  if (cfg.invalid_utf8 == "replace") return utf8_replace_invalid(line);
  throw DataError(fmt::format("{}:{}: invalid UTF-8 at byte {} (1-based) of the line (bytes {}); fix the "
                              "file or {} to substitute U+FFFD",
                              path, number, bad + 1, hex_bytes(line, bad, 4), cfg.invalid_utf8_fix));
}

// The text field of a JSON-lines line through simdjson, which validates the JSON and its
// UTF-8. False when simdjson rejects the line, it is not an object, the field is missing, not a
// string or present twice: the caller then takes nlohmann-json's reading (and error message).
// `line` must be followed by simdjson::SIMDJSON_PADDING readable bytes.
bool fast_text_field(simdjson::dom::parser& parser, std::string_view line,
                     const std::string& field, std::string& text) {
  simdjson::dom::element doc;
  if (parser.parse(line.data(), line.size(), /*realloc_if_needed=*/false).get(doc)) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return false;
  int matches = 0;
  std::string_view value;
  for (auto kv : obj) {
    if (kv.key != field) continue;
    if (++matches > 1 || kv.value.get_string().get(value)) return false;
  }
  if (matches != 1) return false;
  text.assign(value.data(), value.size());
  return true;
}

void parse_jsonl_chunk(std::string_view bytes, int64_t first_line, const std::string& path,
                       const DataConfig& cfg, std::vector<std::string>& docs) {
  thread_local simdjson::dom::parser parser;
  for_each_line(bytes, first_line, [&](std::string_view raw, int64_t number) {
    if (is_blank(raw)) return;
    std::string fast;
    if (fast_text_field(parser, raw, cfg.text_field, fast)) {
      if (!is_blank(fast)) docs.push_back(std::move(fast));
      return;
    }
    const std::string line = checked_utf8(raw, path, number, cfg);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // nlohmann counts lines within the text it was given (this one line): say column only.
      std::string what = e.what();
      if (const size_t at = what.find("at line 1, column "); at != std::string::npos)
        what.replace(at, std::strlen("at line 1, column "), "at column ");
      throw DataError(fmt::format("{}:{}: not valid JSON ({}); each line of a .jsonl file must "
                                  "be one JSON object",
                                  path, number, what));
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

void parse_txt_chunk(std::string_view bytes, int64_t first_line, const std::string& path,
                     const DataConfig& cfg, std::vector<std::string>& docs) {
  const bool by_line = cfg.doc_separator == "line";
  std::string current;
  bool open = false;
  auto close_doc = [&] {
    if (open) docs.push_back(std::move(current));
    current.clear();
    open = false;
  };
  for_each_line(bytes, first_line, [&](std::string_view raw, int64_t number) {
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

// Where to cut `buf` so that the piece before holds whole documents: after a '\n' (for
// doc_separator=blank_line, after a '\n' that ends a blank line). The last such place at or
// before `limit`, else the first one after it; 0 when there is none yet.
size_t cut_point(const std::string& buf, size_t limit, bool blank_line_docs) {
  constexpr size_t npos = std::string::npos;
  auto ends_document = [&](size_t nl) {
    if (!blank_line_docs) return true;
    const size_t prev = nl == 0 ? npos : buf.rfind('\n', nl - 1);
    const size_t start = prev == npos ? 0 : prev + 1;
    std::string_view line(buf.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return is_blank(line);
  };
  const size_t pos = std::min(limit, buf.size());
  for (size_t nl = pos ? buf.rfind('\n', pos - 1) : npos; nl != npos;
       nl = nl ? buf.rfind('\n', nl - 1) : npos)
    if (ends_document(nl)) return nl + 1;
  for (size_t nl = buf.find('\n', pos); nl != npos; nl = buf.find('\n', nl + 1))
    if (ends_document(nl)) return nl + 1;
  return 0;
}

// The pieces of one stream_corpus() call between the reader, the workers and the consumer.
class Pipeline {
 public:
  Pipeline(size_t max_pieces) : max_pieces_(max_pieces) {}

  // Reader side: waits for room, then queues the piece. False when the stream was stopped.
  bool push(std::unique_ptr<CorpusChunk> c) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || live_ < max_pieces_; });
    if (stop_) return false;
    ++live_;
    todo_.push_back(std::move(c));
    cv_.notify_all();
    return true;
  }
  void reader_finished() {
    std::lock_guard<std::mutex> lock(mu_);
    reader_done_ = true;
    cv_.notify_all();
  }
  // Worker side: the next piece to parse, or null when there is none and will be none.
  std::unique_ptr<CorpusChunk> take() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || !todo_.empty() || reader_done_; });
    if (stop_ || todo_.empty()) return nullptr;
    auto c = std::move(todo_.front());
    todo_.pop_front();
    return c;
  }
  void finished(std::unique_ptr<CorpusChunk> c) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t i = c->index;
    done_.emplace(i, std::move(c));
    cv_.notify_all();
  }
  // Consumer side: piece `index` once processed; null at the end of the stream.
  std::unique_ptr<CorpusChunk> next(int64_t index) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return stop_ || done_.count(index) || (reader_done_ && live_ == 0);
    });
    auto it = done_.find(index);
    if (it == done_.end()) return nullptr;
    auto c = std::move(it->second);
    done_.erase(it);
    return c;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    --live_;
    cv_.notify_all();
  }
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  bool stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

 private:
  const size_t max_pieces_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<CorpusChunk>> todo_;
  std::map<int64_t, std::unique_ptr<CorpusChunk>> done_;
  size_t live_ = 0;  // pieces queued, being parsed, or waiting for the consumer
  bool reader_done_ = false;
  bool stop_ = false;
};

// The reader thread: decompresses each segment's parts and cuts them into pieces; every segment
// gets at least one piece, its last one flagged.
void read_pieces(const std::vector<std::string>& files, const std::vector<CorpusSegment>& segments,
                 const std::vector<CorpusFileKind>& kinds, const DataConfig& cfg,
                 size_t chunk_bytes, Pipeline& pipe, std::vector<int64_t>& disk_bytes) {
  const bool blank_line_docs = cfg.doc_separator == "blank_line";
  constexpr size_t kRead = size_t(1) << 20;
  int64_t index = 0;
  int64_t segment = segments.empty() ? 0 : segments.front().index;  // being read
  std::unique_ptr<CorpusChunk> held;  // the latest piece, sent once we know whether it is last
  auto send_held = [&](bool last) {
    if (!held) return true;
    held->last_of_segment = last;
    return pipe.push(std::move(held));
  };
  auto emit = [&](const CorpusSegment& seg, const SegmentPart& part, int64_t first_line,
                  std::string bytes) {
    if (!send_held(false)) return false;
    auto c = std::make_unique<CorpusChunk>();
    c->index = index++;
    c->segment = seg.index;
    c->file = part.file;
    c->part_begin = part.begin;
    c->first_line = first_line;
    c->text_bytes = int64_t(bytes.size());
    c->bytes = std::move(bytes);
    c->bytes.append(simdjson::SIMDJSON_PADDING, ' ');  // the JSON parser reads past the end
    held = std::move(c);
    return true;
  };
  // .parquet: documents straight from the reader.
  auto emit_docs = [&](const CorpusSegment& seg, const SegmentPart& part, int64_t row_group,
                       int64_t first_row, std::vector<std::string> docs, int64_t bytes) {
    if (!send_held(false)) return false;
    auto c = std::make_unique<CorpusChunk>();
    c->index = index++;
    c->segment = seg.index;
    c->file = part.file;
    c->parsed = true;
    c->row_group = row_group;
    c->first_row = first_row;
    c->text_bytes = bytes;
    c->docs = std::move(docs);
    held = std::move(c);
    return true;
  };
  const CorpusSegment* current = nullptr;
  auto read_parquet_part = [&](const std::string& path, const SegmentPart& part,
                               const std::string& column, int64_t piece_bytes, auto& emit,
                               int64_t& disk, bool& any) {
    ParquetFile file(path, column);
    const int64_t end = part.end < 0 ? file.row_groups() : part.end;
    for (int64_t rg = part.begin; rg < end; ++rg) {
      std::vector<std::string> docs;
      int64_t bytes = 0, row = 0, first_row = 0;
      bool ok = true;
      auto flush = [&] {
        ok = emit(*current, part, rg, first_row, std::move(docs), bytes);
        any = true;
        docs.clear();
        bytes = 0;
        first_row = row;
        return ok;
      };
      file.read_row_group(rg, [&](std::string_view text, bool is_null) {
        if (is_null) {
          if (!docs.empty() && !flush()) return false;  // the rows before it come first
          throw DataError(fmt::format("{}: row group {}, row {} (0-based): the text column '{}' "
                                      "is null; drop such rows or fill them",
                                      path, rg, row, column));
        }
        docs.emplace_back(text);
        bytes += int64_t(text.size());
        ++row;
        if (bytes >= piece_bytes && !flush()) return false;
        return !pipe.stopped();
      });
      if (!ok || pipe.stopped()) return false;
      if (!docs.empty() && !flush()) return false;
      disk += file.row_group_bytes(rg);
    }
    return true;
  };
  try {
    for (const auto& seg : segments) {
      segment = seg.index;
      current = &seg;
      bool any = false;
      for (const auto& part : seg.parts) {
        const std::string& path = files[part.file];
        if (kinds[part.file].format == "parquet") {
          if (!read_parquet_part(path, part, cfg.text_field, int64_t(chunk_bytes), emit_docs,
                                 disk_bytes[part.file], any))
            return;
          continue;
        }
        auto src = kinds[part.file].compression.empty() ? open_raw_range(path, part.begin, part.end)
                                                         : open_corpus_file(path);
        std::string buf;
        int64_t line = 1;
        bool at_start = part.begin == 0;
        for (bool eof = false; !eof;) {
          const size_t old = buf.size();
          buf.resize(old + kRead);
          const size_t got = src->read(buf.data() + old, kRead);
          buf.resize(old + got);
          eof = got == 0;
          if (at_start && (buf.size() >= 3 || eof)) {  // a UTF-8 byte order mark is not text
            if (buf.compare(0, 3, "\xEF\xBB\xBF") == 0) buf.erase(0, 3);
            at_start = false;
          }
          while (!buf.empty()) {
            size_t cut = eof ? buf.size() : 0;
            if (!eof && buf.size() >= chunk_bytes) cut = cut_point(buf, chunk_bytes, blank_line_docs);
            if (cut == 0) break;
            std::string piece = buf.substr(0, cut);
            buf.erase(0, cut);
            const int64_t first = line;
            line += std::count(piece.begin(), piece.end(), '\n');
            if (!emit(seg, part, first, std::move(piece))) return;
            any = true;
          }
          if (pipe.stopped()) return;
        }
        disk_bytes[part.file] += src->disk_bytes();
      }
      if (!any && !emit(seg, seg.parts.front(), 1, std::string())) return;  // an empty segment
      if (!send_held(true)) return;
    }
  } catch (...) {
    if (!send_held(false)) return;
    auto c = std::make_unique<CorpusChunk>();
    c->index = index++;
    c->segment = segment;
    c->error = std::current_exception();
    pipe.push(std::move(c));
  }
  pipe.reader_finished();
}

// .parquet documents as the reader gave them: UTF-8 checked (or repaired, data.invalid_utf8),
// blank ones dropped; the text is kept byte for byte otherwise.
void check_parquet_docs(CorpusChunk& c, const std::string& path, const DataConfig& cfg) {
  std::vector<std::string> kept;
  kept.reserve(c.docs.size());
  for (size_t i = 0; i < c.docs.size(); ++i) {
    std::string& d = c.docs[i];
    if (!simdjson::validate_utf8(d.data(), d.size())) {
      const size_t bad = utf8_find_invalid(d);
      if (bad != std::string_view::npos) {
        if (cfg.invalid_utf8 != "replace")
          throw DataError(fmt::format(
              "{}: row group {}, row {} (0-based): invalid UTF-8 at byte {} (1-based) of the text (bytes "
              "{}); fix the file or {} to substitute U+FFFD",
              path, c.row_group, c.first_row + int64_t(i), bad + 1, hex_bytes(d, bad, 4),
              cfg.invalid_utf8_fix));
        d = utf8_replace_invalid(d);
      }
    }
    if (!is_blank(d)) kept.push_back(std::move(d));
  }
  c.docs = std::move(kept);
}

// Splits bytes of a piece into documents; first_line is the absolute line number.
void parse_piece(std::string_view text, int64_t first_line, const std::string& path,
                 const CorpusFileKind& kind, const DataConfig& cfg, std::vector<std::string>& docs) {
  if (kind.format == "jsonl")
    parse_jsonl_chunk(text, first_line, path, cfg, docs);
  else
    parse_txt_chunk(text, first_line, path, cfg, docs);
}

// True for the bytes of the UTF-8 encodings of White_Space code points (is_unicode_space): ASCII
// 0x09-0x0D and ' ', and the bytes of C2 85, C2 A0, E1 9A 80, E2 80 80-8A, E2 80 A8-A9, E2 80 AF,
// E2 81 9F, E3 80 80. A line ending in another byte is not blank.
bool can_be_in_space(unsigned char b) {
  return b == ' ' || (b >= 0x09 && b <= 0x0D) || b == 0xC2 || b == 0x85 || b == 0xA0 ||
         b == 0xE1 || b == 0x9A || b == 0xE2 || b == 0xE3 || b == 0x81 || b == 0x9F ||
         (b >= 0x80 && b <= 0x8A) || b == 0xA8 || b == 0xA9 || b == 0xAF;
}

// The next document start at or after `from` in a plain file: a line start (for blank_line
// documents, a line start right after a blank line); the file size when there is none.
int64_t next_document_start(FileBytes& f, int64_t from, bool blank_line_docs) {
  auto line_start_from = [&](int64_t p) {  // smallest line start >= p
    if (p <= 0) return int64_t(0);
    if (p >= f.size()) return f.size();
    if (f.at(p - 1) == '\n') return p;
    const int64_t nl = f.find('\n', p);
    return nl >= f.size() ? f.size() : nl + 1;
  };
  int64_t p = line_start_from(from);
  if (!blank_line_docs) return p;
  while (p > 0 && p < f.size()) {
    // Is the line that ends at p - 1 ('\n') blank (is_blank, as the reader decides)? Walk back
    // while the bytes can belong to White_Space code points, and decide on those bytes: a line
    // with any other byte is not blank, so a long line costs no more than its blank tail.
    int64_t q = p - 2;
    std::string tail;  // the line's last bytes, reversed
    while (q >= 0 && f.at(q) != '\n' && can_be_in_space(static_cast<unsigned char>(f.at(q))))
      tail.push_back(f.at(q--));
    if (q < 0 || f.at(q) == '\n') {
      std::reverse(tail.begin(), tail.end());
      if (is_blank(tail)) return p;
    }
    p = line_start_from(p + 1);
  }
  return p;
}

}  // namespace

std::string CorpusSegment::id() const {
  Fnv1a64 h;
  h.update_u64(uint64_t(index));
  h.update_u64(parts.size());
  for (const auto& p : parts) {
    h.update_u64(p.file);
    h.update_u64(uint64_t(p.begin));
    h.update_u64(uint64_t(p.end));
  }
  return fmt::format("{:016x}", h.value());
}

std::vector<CorpusSegment> whole_file_segments(const std::vector<std::string>& files) {
  std::vector<CorpusSegment> out;
  for (size_t f = 0; f < files.size(); ++f) {
    CorpusSegment s;
    s.index = int64_t(f);
    s.parts.push_back({f, 0, -1});
    std::error_code ec;
    s.disk_bytes = int64_t(std::filesystem::file_size(files[f], ec));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<CorpusSegment> plan_segments(const std::vector<std::string>& files,
                                         const DataConfig& cfg, int64_t segment_bytes) {
  segment_bytes = std::max<int64_t>(1, segment_bytes);
  const bool blank_line_docs = cfg.doc_separator == "blank_line";
  std::vector<CorpusSegment> out;
  CorpusSegment group;  // small whole files being gathered
  auto close_group = [&] {
    if (group.parts.empty()) return;
    group.index = int64_t(out.size());
    out.push_back(std::move(group));
    group = CorpusSegment();
  };
  for (size_t f = 0; f < files.size(); ++f) {
    FileBytes bytes(files[f]);
    const int64_t size = bytes.size();
    const CorpusFileKind kind = corpus_file_kind(files[f]);
    if (kind.format == "parquet") {
      // Opened here as well when small, so that a missing column stops the plan at once.
      ParquetFile pq(files[f], cfg.text_field);
      if (size > segment_bytes) {
        close_group();
        CorpusSegment s;
        for (int64_t rg = 0; rg < pq.row_groups(); ++rg) {
          const int64_t b = pq.row_group_bytes(rg);
          if (!s.parts.empty() && s.disk_bytes + b > segment_bytes) {
            s.index = int64_t(out.size());
            out.push_back(std::move(s));
            s = CorpusSegment();
          }
          if (s.parts.empty()) s.parts.push_back({f, rg, rg + 1});
          s.parts.back().end = rg + 1;
          s.disk_bytes += b;
        }
        if (!s.parts.empty()) {
          if (s.parts.back().end == pq.row_groups()) s.parts.back().end = -1;
          s.index = int64_t(out.size());
          out.push_back(std::move(s));
        }
        continue;
      }
    }
    if (size <= segment_bytes) {
      if (group.disk_bytes + size > segment_bytes) close_group();
      group.parts.push_back({f, 0, -1});
      group.disk_bytes += size;
      continue;
    }
    close_group();
    if (!kind.compression.empty()) {  // a stream: read whole
      CorpusSegment s;
      s.index = int64_t(out.size());
      s.parts.push_back({f, 0, -1});
      s.disk_bytes = size;
      out.push_back(std::move(s));
      continue;
    }
    int64_t begin = 0;
    while (begin < size) {
      const int64_t end =
          begin + segment_bytes >= size
              ? size
              : std::max(begin + 1, next_document_start(bytes, begin + segment_bytes, blank_line_docs));
      CorpusSegment s;
      s.index = int64_t(out.size());
      s.parts.push_back({f, begin, end == size ? -1 : end});
      s.disk_bytes = end - begin;
      out.push_back(std::move(s));
      begin = end;
    }
  }
  close_group();
  return out;
}

CorpusStreamStats stream_segments(const std::vector<std::string>& files,
                                  const std::vector<CorpusSegment>& segments,
                                  const DataConfig& cfg, int threads, int64_t chunk_bytes,
                                  const ChunkWork& work, const ChunkDone& done,
                                  int64_t* failed_segment) {
  threads = std::max(1, threads);
  if (failed_segment) *failed_segment = -1;
  std::vector<CorpusFileKind> kinds;
  for (const auto& f : files) kinds.push_back(corpus_file_kind(f));
  Pipeline pipe(size_t(2 * threads + 2));
  CorpusStreamStats st;
  std::vector<int64_t> disk_bytes(files.size(), 0);

  auto worker = [&](int w) {
    while (auto c = pipe.take()) {
      if (!c->error) {
        try {
          const std::string& path = files[c->file];
          if (c->parsed) {
            check_parquet_docs(*c, path, cfg);
            work(w, *c);
            pipe.finished(std::move(c));
            continue;
          }
          const std::string_view text(c->bytes.data(), size_t(c->text_bytes));
          try {
            parse_piece(text, c->first_line, path, kinds[c->file], cfg, c->docs);
          } catch (const DataError&) {
            if (c->part_begin == 0) throw;
            // A part that starts inside its file counts lines from its own start: count the
            // lines before it (only now, on the error path) and parse again for the message.
            FileBytes f(path);
            c->docs.clear();
            parse_piece(text, c->first_line + f.count('\n', c->part_begin), path,
                        kinds[c->file], cfg, c->docs);
            throw;
          }
          std::string().swap(c->bytes);
          work(w, *c);
        } catch (...) {
          c->error = std::current_exception();
        }
      }
      pipe.finished(std::move(c));
    }
  };
  std::thread reader([&] {
    read_pieces(files, segments, kinds, cfg,
                size_t(std::max<int64_t>(1, chunk_bytes)), pipe, disk_bytes);
  });
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) pool.emplace_back(worker, w);
  struct Join {  // stops and joins the threads however this function is left
    Pipeline& pipe;
    std::thread& reader;
    std::vector<std::thread>& pool;
    ~Join() {
      pipe.stop();
      reader.join();
      for (auto& t : pool) t.join();
    }
  } join{pipe, reader, pool};

  for (int64_t i = 0;; ++i) {
    auto c = pipe.next(i);
    if (!c) break;
    if (failed_segment) *failed_segment = c->segment;
    if (c->error) std::rethrow_exception(c->error);
    st.text_bytes += c->text_bytes;
    st.documents += int64_t(c->docs.size());
    ++st.chunks;
    done(*c);
    c.reset();
    pipe.release();
  }
  if (failed_segment) *failed_segment = -1;
  std::set<size_t> used;
  for (const auto& seg : segments)
    for (const auto& p : seg.parts) used.insert(p.file);
  st.files = int64_t(used.size());
  for (int64_t b : disk_bytes) st.disk_bytes += b;
  return st;
}

CorpusStreamStats stream_corpus(const std::vector<std::string>& files, const DataConfig& cfg,
                                int threads, int64_t chunk_bytes, const ChunkWork& work,
                                const ChunkDone& done) {
  return stream_segments(files, whole_file_segments(files), cfg, threads, chunk_bytes, work, done);
}

namespace {

// The files `pattern` names, relative to the working directory: its glob(3) matches (sorted),
// or the path itself; empty when a glob matches nothing.
std::vector<std::string> expand_pattern(const std::string& pattern) {
  std::vector<std::string> matches;
  if (!has_glob_chars(pattern)) return {pattern};
  glob_t g{};
  if (::glob(pattern.c_str(), GLOB_ERR, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return matches;
}

bool names_files(const std::vector<std::string>& matches) {
  std::error_code ec;
  return !matches.empty() && std::filesystem::is_regular_file(matches.front(), ec);
}

}  // namespace

std::vector<std::string> resolve_corpus_files(const std::vector<std::string>& patterns,
                                              const std::string& option,
                                              const std::string& fallback_dir) {
  if (patterns.empty())
    throw DataError(option + " is empty; list the .txt or .jsonl files (or globs) to train on, "
                    "e.g. data.corpus: [data/tang300/*.jsonl]");
  std::vector<std::string> files;
  std::set<std::string> seen;
  const std::string cwd = std::filesystem::current_path().string();
  for (const auto& pattern : patterns) {
    std::vector<std::string> matches = expand_pattern(pattern);
    // Nothing in the working directory: the bundled folder's (a bundled recipe's data/...).
    std::string where = fmt::format("working directory '{}'", cwd);
    if (!names_files(matches) && !fallback_dir.empty() &&
        !std::filesystem::path(pattern).is_absolute()) {
      const std::string there = (std::filesystem::path(fallback_dir) / pattern).string();
      std::vector<std::string> bundled = expand_pattern(there);
      if (names_files(bundled)) {
        // Said once per process (preparation and training both resolve the corpus).
        static std::mutex said_mutex;
        static std::set<std::string> said;
        std::lock_guard<std::mutex> lock(said_mutex);
        if (said.insert(there).second)
          spdlog::info("{} '{}': not in the working directory, taken from the bundled folder {}",
                       option, pattern, fallback_dir);
        matches = std::move(bundled);
      } else {
        where += fmt::format(", nor the bundled folder '{}'", fallback_dir);
      }
    }
    if (matches.empty())
      throw DataError(fmt::format("{} pattern '{}' matches no file ({}); check the path, or run "
                                  "launch/fetch-corpus.sh for data/full/",
                                  option, pattern, where));
    for (const auto& f : matches) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(f, ec))
        throw DataError(fmt::format("{} file '{}' does not exist or is not a regular file ({}){}",
                                    option, f, where,
                                    f.rfind("data/full/", 0) == 0
                                        ? "; launch/fetch-corpus.sh puts the Tang corpus there"
                                        : ""));
      corpus_file_kind(f, option);  // throws for a name mllm cannot read
      // One file however it is spelled (./a, a, /abs/a, a link to it).
      const std::string key = std::filesystem::canonical(f, ec).string();
      if (seen.insert(ec ? f : key).second) files.push_back(f);
    }
  }
  return files;
}

std::vector<std::string> read_corpus_file(const std::string& path, const DataConfig& cfg,
                                          int64_t* bytes_read, int threads) {
  std::vector<std::string> docs;
  const auto st = stream_corpus(
      {path}, cfg, threads, int64_t(8) << 20, [](int, CorpusChunk&) {},
      [&](CorpusChunk& c) {
        docs.insert(docs.end(), std::make_move_iterator(c.docs.begin()),
                    std::make_move_iterator(c.docs.end()));
      });
  if (bytes_read) *bytes_read += st.disk_bytes;
  return docs;
}

std::vector<std::string> read_corpus(const DataConfig& cfg, int64_t* bytes_read, int threads) {
  const auto files = resolve_corpus_files(cfg.corpus, cfg.corpus_option, cfg.corpus_fallback_dir);
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

FileContentHash file_content_hash(const std::string& path) {
  const auto in = open_raw_file(path);
  std::string buf(size_t(1) << 20, '\0');
  ContentHash64 content;
  uint64_t size = 0;
  for (size_t got; (got = in->read(buf.data(), buf.size())) > 0;) {
    content.update(std::string_view(buf.data(), got));
    size += got;
  }
  return {size, content.value()};
}

uint64_t combine_content_hashes(const std::vector<FileContentHash>& files) {
  Fnv1a64 h;
  h.update_u64(files.size());
  for (const auto& f : files) {
    h.update_u64(f.size);
    h.update_u64(f.hash);
  }
  return h.value();
}

uint64_t corpus_content_hash(const std::vector<std::string>& files) {
  std::vector<FileContentHash> parts;
  for (const auto& f : files) parts.push_back(file_content_hash(f));
  return combine_content_hashes(parts);
}

}  // namespace mllm
