// Distributed preparation in one process: ranks are threads sharing an in-memory all_gather
// (ThreadGroup), so the unit tests see every rank. The same output for any number of ranks,
// threads, segment sizes and memory budgets; segments that cut files at document starts; the
// first error in corpus order on every rank, with the line counted from the file's start.
// (tests/e2e/prepare_ranks.sh does the same with mpirun and the real program.)
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "data_test_util.h"
#include "mllm/core/error.h"
#include "mllm/data/corpus.h"
#include "mllm/data/dataset.h"
#include "mllm/data/prepare.h"
#include "mllm/data/shard.h"
#include "mllm/data/tokenizer.h"

namespace mllm {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::throws_with;
using Docs = std::vector<std::string>;

// N ranks in one process: all_gather meets at a generation barrier.
class ThreadHub {
 public:
  explicit ThreadHub(int n) : n_(n), slots_(size_t(n)) {}
  std::vector<std::string> exchange(int rank, const std::string& mine) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    slots_[size_t(rank)] = mine;
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
    return result_;
  }
  int size() const { return n_; }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

class ThreadGroup : public PrepareGroup {
 public:
  ThreadGroup(ThreadHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_.size(); }
  std::vector<std::string> all_gather(const std::string& mine) override {
    return hub_.exchange(rank_, mine);
  }

 private:
  ThreadHub& hub_;
  int rank_;
};

// prepare_data on `ranks` thread-ranks; returns rank 0's result and every rank's error text
// ("" = none).
struct RanksResult {
  PreparedData prepared;
  PrepareStats stats;
  std::vector<std::string> errors;
  std::vector<std::string> error_types;
};
RanksResult prepare_on_ranks(const DataConfig& cfg, int ranks, int threads, bool force = true) {
  ThreadHub hub(ranks);
  RanksResult out;
  out.errors.resize(size_t(ranks));
  out.error_types.resize(size_t(ranks));
  std::vector<std::thread> pool;
  for (int r = 0; r < ranks; ++r) {
    pool.emplace_back([&, r] {
      ThreadGroup group(hub, r);
      try {
        PrepareStats st;
        auto p = ensure_prepared(cfg, threads, false, group, force, nullptr, &st);
        if (r == 0) out.prepared = p, out.stats = st;
      } catch (const DataError& e) {
        out.errors[size_t(r)] = e.what(), out.error_types[size_t(r)] = "DataError";
      } catch (const ConfigError& e) {
        out.errors[size_t(r)] = e.what(), out.error_types[size_t(r)] = "ConfigError";
      } catch (const std::exception& e) {
        out.errors[size_t(r)] = e.what(), out.error_types[size_t(r)] = "other";
      }
    });
  }
  for (auto& t : pool) t.join();
  return out;
}

// Every file of a prepared folder (name -> bytes), the lock file aside.
std::map<std::string, std::string> folder_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != ".prepare.lock")
      out[e.path().filename().string()] = test::slurp(e.path().string());
  return out;
}

std::string gzip(const std::string& body) { return test::gzip_members({body}); }
std::string zstd(const std::string& body) { return test::zstd_frames({body}); }
using test::jsonl_of;

Docs poems(int first, int n) {
  Docs docs;
  for (int i = first; i < first + n; ++i)
    docs.push_back("第" + std::to_string(i) + "首 " + std::string("春眠不覺曉處處聞啼鳥").substr(0, size_t(3 * (1 + i % 10))) +
                   std::string(size_t(i % 13), 'a' + char(i % 26)));
  return docs;
}

std::string jsonl(const Docs& docs) { return jsonl_of(docs); }

std::string lines(const Docs& docs) {
  std::string s;
  for (const auto& d : docs) s += d + "\n";
  return s;
}

// A corpus of every format: a plain .jsonl large enough to be cut into byte ranges, .gz and
// .zst files, a .txt, and small files that share a segment.
struct MixedCorpus {
  std::vector<std::string> files;
  Docs docs;  // every document, in corpus order
  explicit MixedCorpus(const TempDir& dir) {
    auto add = [&](const std::string& name, const std::string& bytes, const Docs& d) {
      test::write_file(dir / name, bytes);
      files.push_back(dir / name);
      docs.insert(docs.end(), d.begin(), d.end());
    };
    const Docs a = poems(0, 700), b = poems(700, 300), c = poems(1000, 300), d = poems(1300, 200);
    add("a.jsonl", jsonl(a), a);
    add("b.jsonl.gz", gzip(jsonl(b)), b);
    add("c.jsonl.zst", zstd(jsonl(c)), c);
    add("d.txt", lines(d), d);
    for (int k = 0; k < 4; ++k) {
      const Docs e = poems(1500 + 10 * k, 10);
      add("e" + std::to_string(k) + ".txt", lines(e), e);
    }
  }
};

DataConfig config(const TempDir& dir, const std::vector<std::string>& files) {
  DataConfig c;
  c.corpus = files;
  c.cache_dir = dir / "cache";
  c.val_fraction = 0.05;
  c.shard_tokens = 3000;
  c.prepare_segment_bytes = 4000;
  return c;
}

TEST(PlanSegments, UnicodeWhiteSpaceLinesAreBlankAtEverySegmentBoundary) {
  // Blank-line documents separated by lines of U+3000, U+2028, U+2029, U+00A0, lone CRs, and
  // their mixes; a line of U+200B (zero width space: not White_Space) and one of U+3000 with a
  // letter are text. Every segment size, each segment read alone: the same documents, and no
  // blank line becomes a document (before: the U+3000, U+2028 / U+2029 and "\r\r" lines did).
  TempDir dir;
  const std::vector<std::string> seps = {"\u3000\n", "\u2028\n", "\u2029\r\n", "\u00a0 \u3000\n",
                                         "\r\r\n", "\t\u3000\u2028\n", "\n"};
  std::string blocks;
  Docs want;
  for (int i = 0; i < 400; ++i) {
    std::string doc;
    for (int k = 0; k <= i % 3; ++k) {
      std::string l = "詩" + std::to_string(i) + "." + std::to_string(k);
      if (i % 50 == 7 && k == 0) l = "\u200b\u200b";     // not white space: text
      if (i % 50 == 9 && k == 0) l = "\u3000a\u3000";     // white space around a letter: text
      blocks += l + "\n";
      doc += (k ? "\n" : "") + l;
    }
    blocks += seps[size_t(i) % seps.size()];
    want.push_back(doc);
  }
  test::write_file(dir / "u.txt", blocks);
  DataConfig c;
  c.doc_separator = "blank_line";
  for (int64_t seg : {int64_t(1), int64_t(7), int64_t(333), int64_t(1) << 30}) {
    Docs got;
    for (const auto& s : plan_segments({dir / "u.txt"}, c, seg))
      stream_segments({dir / "u.txt"}, {s}, c, 2, 100, [](int, CorpusChunk&) {},
                      [&](CorpusChunk& ch) { got.insert(got.end(), ch.docs.begin(), ch.docs.end()); });
    EXPECT_EQ(got, want) << seg;
  }
  // One document per line: the white-space lines are skipped, not documents.
  c.doc_separator = "line";
  test::write_file(dir / "l.txt", "a\n\u3000\u3000\n\u2028\nb\n\r\r\n\u00a0\nc\n");
  EXPECT_EQ(read_corpus_file(dir / "l.txt", c), (Docs{"a", "b", "c"}));
  // And a .jsonl text of only white space is no document.
  test::write_file(dir / "w.jsonl", "{\"text\": \"\u3000\u3000\"}\n{\"text\": \"x\"}\n");
  EXPECT_EQ(read_corpus_file(dir / "w.jsonl", c), (Docs{"x"}));
}

TEST(AssignSegments, LargestFirstToTheLeastLoadedRank) {
  const auto a = assign_segments({5, 9, 1, 7, 4, 3}, 2);
  // 9 (s1) -> r0 [9]; 7 (s3) -> r1 [7]; 5 (s0) -> r1 [12]; 4 (s4) -> r0 [13]; 3 (s5) -> r1 [15];
  // 1 (s2) -> r0 [14].
  EXPECT_EQ(a[0], (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(a[1], (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(assign_segments({5, 9}, 3)[2], std::vector<int64_t>{});
}

TEST(PlanSegments, BoundariesAtDocumentStartsReadEveryDocumentOnce) {
  TempDir dir;
  // Lines of varying length; CRLF here and there; blank-line documents with blank lines of
  // spaces and \r.
  std::string txt, blocks;
  Docs want_lines, want_blocks;
  for (int i = 0; i < 2000; ++i) {
    const std::string l = "line " + std::to_string(i) + std::string(size_t(i % 37), 'x');
    txt += l + (i % 5 == 0 ? "\r\n" : "\n");
    want_lines.push_back(l);
  }
  for (int i = 0; i < 600; ++i) {
    std::string doc;
    for (int k = 0; k <= i % 4; ++k) {
      const std::string l = "b" + std::to_string(i) + "." + std::to_string(k);
      blocks += l + "\n";
      doc += (k ? "\n" : "") + l;
    }
    blocks += i % 3 == 0 ? " \t\r\n" : (i % 3 == 1 ? "\n\n" : "\n");
    want_blocks.push_back(doc);
  }
  test::write_file(dir / "l.txt", txt);
  test::write_file(dir / "b.txt", blocks);
  for (const bool blank : {false, true}) {
    DataConfig c;
    c.doc_separator = blank ? "blank_line" : "line";
    const std::string path = dir / (blank ? "b.txt" : "l.txt");
    for (int64_t seg : {int64_t(1), int64_t(333), int64_t(4096), int64_t(1) << 30}) {
      const auto plan = plan_segments({path}, c, seg);
      if (seg == 333) EXPECT_GT(plan.size(), 20u);
      if (seg == (int64_t(1) << 30)) EXPECT_EQ(plan.size(), 1u);
      Docs got;
      int64_t bytes = 0;
      for (const auto& s : plan) {  // each segment alone, then concatenated
        stream_segments({path}, {s}, c, 2, 100, [](int, CorpusChunk&) {},
                        [&](CorpusChunk& ch) { got.insert(got.end(), ch.docs.begin(), ch.docs.end()); });
        bytes += s.disk_bytes;
      }
      EXPECT_EQ(got, blank ? want_blocks : want_lines) << seg;
      EXPECT_EQ(bytes, int64_t(fs::file_size(path)));
    }
  }
  // Small files share a segment; a large compressed file is one segment.
  test::write_file(dir / "s1.txt", "a\n");
  test::write_file(dir / "s2.txt", "b\n");
  test::write_file(dir / "z.txt.gz", gzip(txt));
  DataConfig c;
  const auto plan = plan_segments({dir / "s1.txt", dir / "s2.txt", dir / "z.txt.gz"}, c, 100);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].parts.size(), 2u);
  EXPECT_EQ(plan[1].parts.size(), 1u);
  EXPECT_EQ(plan[1].parts[0].end, -1);
}

TEST(DistributedPrepare, SameBytesForAnyRanksThreadsSegmentsAndBudget) {
  TempDir dir;
  const MixedCorpus corpus(dir);
  for (const char* type : {"char", "bpe"}) {
    DataConfig c = config(dir, corpus.files);
    c.tokenizer.type = type;
    c.tokenizer.vocab_size = 400;
    c.tokenizer.sample_bytes = 20000;  // less than the corpus: the sample is used
    // The reference: one rank, one thread, whole files as segments.
    DataConfig whole = c;
    whole.prepare_segment_bytes = int64_t(1) << 40;
    const auto ref = prepare_on_ranks(whole, 1, 1);
    ASSERT_EQ(ref.errors[0], "") << type;
    const auto want = folder_bytes(ref.prepared.dir);
    ASSERT_GT(ref.prepared.train_shards.size(), 3u) << type;  // several shards per split
    EXPECT_FALSE(want.count("pieces"));                       // removed once assembled
    for (int ranks : {1, 2, 3}) {
      for (int threads : {1, 2}) {
        fs::remove_all(ref.prepared.dir);
        const auto got = prepare_on_ranks(c, ranks, threads);
        for (int r = 0; r < ranks; ++r) ASSERT_EQ(got.errors[size_t(r)], "") << type << " rank " << r;
        EXPECT_GT(got.stats.segments, 4);
        EXPECT_EQ(folder_bytes(got.prepared.dir), want) << type << " " << ranks << "x" << threads;
      }
    }
  }
}

TEST(DistributedPrepare, ShardsHoldTheCorpusInOrderSplitByContent) {
  TempDir dir;
  const MixedCorpus corpus(dir);
  DataConfig c = config(dir, corpus.files);
  const auto got = prepare_on_ranks(c, 3, 2);
  ASSERT_EQ(got.errors[0], "");
  const auto tok = load_tokenizer(got.prepared.tokenizer_path);
  const uint64_t threshold = val_threshold(c.val_fraction);
  Docs want_train, want_val;
  for (const auto& d : corpus.docs) (val_rank(d) < threshold ? want_val : want_train).push_back(d);
  auto decode_all = [&](const std::vector<std::string>& shards) {
    Docs out;
    TokenDataset ds(shards, "document", 4096);
    std::vector<int64_t> all(size_t(ds.size()));
    for (int64_t i = 0; i < ds.size(); ++i) all[size_t(i)] = i;
    const Batch b = ds.get(all);
    for (int64_t i = 0; i < ds.size(); ++i) {
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < 4096; ++t) {
        const auto id = int32_t(b.inputs[i][t].item<int64_t>());
        if (id == kPadId) break;
        ids.push_back(id);
      }
      out.push_back(tok->decode(ids));
    }
    return out;
  };
  EXPECT_EQ(decode_all(got.prepared.train_shards), want_train);
  EXPECT_EQ(decode_all(got.prepared.val_shards), want_val);
  for (const auto& s : got.prepared.train_shards) {
    const auto h = read_shard_header(s);
    EXPECT_LE(h.token_count, uint64_t(c.shard_tokens)) << s;
  }
}

TEST(DistributedPrepare, TheFirstErrorInCorpusOrderOnEveryRankAndNothingWritten) {
  TempDir dir;
  Docs a = poems(0, 3000);
  std::string body = jsonl(a);
  // Two bad lines far into the file (past several segment boundaries): the first one is
  // reported with its line number counted from the file's start, whichever rank read it.
  auto line_start = [&](int line) {
    size_t pos = 0;
    for (int l = 1; l < line; ++l) pos = body.find('\n', pos) + 1;
    return pos;
  };
  body[line_start(2777)] = '[';
  body[line_start(1999)] = '#';
  test::write_file(dir / "a.jsonl", body);
  test::write_file(dir / "b.txt.gz", gzip("fine\nbad \xC3\x28 here\n"));
  DataConfig c = config(dir, {dir / "a.jsonl", dir / "b.txt.gz"});
  for (int ranks : {1, 3}) {
    const auto got = prepare_on_ranks(c, ranks, 2);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(got.error_types[size_t(r)], "DataError") << r;
      EXPECT_NE(got.errors[size_t(r)].find(dir / "a.jsonl:1999:"), std::string::npos)
          << got.errors[size_t(r)];
      EXPECT_EQ(got.errors[size_t(r)], got.errors[0]);
    }
  }
  // Every document is validated before anything is written: not even the cache folder exists.
  EXPECT_FALSE(fs::exists(c.cache_dir));
  // A tokenizer that cannot be trained (found by rank 0 alone) stops every rank alike.
  test::write_file(dir / "a.jsonl", jsonl(a));
  DataConfig d = config(dir, {dir / "a.jsonl"});
  d.tokenizer.type = "bpe";
  d.tokenizer.vocab_size = 50;  // cannot hold the characters
  const auto bad = prepare_on_ranks(d, 2, 1);
  EXPECT_NE(bad.errors[0].find("vocab_size"), std::string::npos) << bad.errors[0];
  EXPECT_EQ(bad.errors[1], bad.errors[0]);
  EXPECT_EQ(bad.error_types[1], bad.error_types[0]);
  EXPECT_NE(bad.error_types[0], "other");
}

TEST(DistributedPrepare, ARerunAfterAnInterruptionReusesTheTokenizerAndGivesTheSameBytes) {
  TempDir dir;
  const MixedCorpus corpus(dir);
  DataConfig c = config(dir, corpus.files);
  const auto first = prepare_on_ranks(c, 2, 1);
  ASSERT_EQ(first.errors[0], "");
  const auto want = folder_bytes(first.prepared.dir);
  // As if interrupted during assembly: the manifest and some shards gone. (Finished pieces
  // being kept is shown with a rank killed mid-way, tests/e2e/prepare_ranks.sh.)
  fs::remove(manifest_path(c, fs::path(first.prepared.dir).filename().string()));
  for (const auto& s : first.prepared.train_shards) fs::remove(s);
  EXPECT_FALSE(is_prepared(c));
  const auto again = prepare_on_ranks(c, 3, 2, /*force=*/false);
  ASSERT_EQ(again.errors[0], "");
  EXPECT_TRUE(again.stats.tokenizer_reused);  // split.json and tokenizer.mllm were kept
  EXPECT_EQ(folder_bytes(again.prepared.dir), want);
}

}  // namespace
}  // namespace mllm
