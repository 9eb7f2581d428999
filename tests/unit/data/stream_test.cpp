// Streaming preparation: compressed corpus files (.gz, .zst), pieces cut at document
// boundaries whatever their size, the bounded bpe sample, several shards per split read as one
// stream, and caches kept apart by data fingerprint.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

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

using test::gzip_members;
using test::jsonl_of;
using test::zstd_frames;

Docs numbered_poems(int n) {
  Docs docs;
  for (int i = 0; i < n; ++i)
    docs.push_back("第" + std::to_string(i) + "首 春眠不覺曉" + std::string(size_t(i % 7), 'x'));
  return docs;
}

TEST(CompressedCorpus, GzipAndZstdReadLikeThePlainFile) {
  TempDir dir;
  const Docs docs = numbered_poems(500);
  const std::string body = jsonl_of(docs);
  const std::string a = body.substr(0, body.size() / 3), b = body.substr(body.size() / 3);
  test::write_file(dir / "p.jsonl", body);
  test::write_file(dir / "p.jsonl.gz", gzip_members({a, b}));   // two members
  test::write_file(dir / "p.jsonl.zst", zstd_frames({a, b}));   // two frames
  DataConfig c;
  for (const char* f : {"p.jsonl", "p.jsonl.gz", "p.jsonl.zst"}) {
    int64_t disk = 0;
    EXPECT_EQ(read_corpus_file(dir / f, c, &disk, 2), docs) << f;
    EXPECT_EQ(disk, int64_t(fs::file_size(dir / f))) << f;
  }
  // .txt.gz too, with blank-line documents.
  c.doc_separator = "blank_line";
  test::write_file(dir / "b.txt.gz", gzip_members({"one\ntwo\n\nthree\n", "\nfour\n"}));
  EXPECT_EQ(read_corpus_file(dir / "b.txt.gz", c), (Docs{"one\ntwo", "three", "four"}));
}

// What `zstd --long=31` writes for a stream of unknown size: a frame that declares a 2 GiB window
// (window log 31, long-distance matching), which libzstd's decoder refuses by default (its limit
// is window log 27). Compressed in two calls so that the size is not known when the frame begins.
std::string zstd_long31(const std::string& body) {
  ZSTD_CCtx* cx = ZSTD_createCCtx();
  EXPECT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(cx, ZSTD_c_windowLog, 31)));
  EXPECT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(cx, ZSTD_c_enableLongDistanceMatching, 1)));
  std::string out(ZSTD_compressBound(body.size()) + 1024, '\0');
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  ZSTD_inBuffer ib{body.data(), body.size(), 0};
  EXPECT_FALSE(ZSTD_isError(ZSTD_compressStream2(cx, &ob, &ib, ZSTD_e_continue)));
  ZSTD_inBuffer none{nullptr, 0, 0};
  size_t left = 1;
  while (left != 0 && !ZSTD_isError(left)) left = ZSTD_compressStream2(cx, &ob, &none, ZSTD_e_end);
  EXPECT_EQ(left, 0u);
  ZSTD_freeCCtx(cx);
  out.resize(ob.pos);
  return out;
}

TEST(CompressedCorpus, ZstdLong31StreamsAreReadAndLargerWindowsNamed) {
  TempDir dir;
  const Docs docs = numbered_poems(300);
  const std::string z = zstd_long31(jsonl_of(docs));
  // The frame declares 2 GiB (RFC 8878 3.1.1.1: no single-segment flag in the header
  // descriptor, then a window descriptor of exponent 21 and mantissa 0, window log 10 + 21).
  ASSERT_GT(z.size(), 6u);
  ASSERT_EQ(uint8_t(z[4]) & 0x20, 0);
  ASSERT_EQ(uint8_t(z[5]), 21 << 3);
  test::write_file(dir / "long.jsonl.zst", z);
  DataConfig c;
  EXPECT_EQ(read_corpus_file(dir / "long.jsonl.zst", c), docs);
  // A frame header declaring a 4 GiB window (window descriptor: exponent 22, log 10 + 22), then
  // an empty last raw block: refused with the reason, not as "not a valid zstd stream".
  const std::string wide("\x28\xb5\x2f\xfd\x00\xb0\x01\x00\x00", 9);
  test::write_file(dir / "wide.jsonl.zst", wide);
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "wide.jsonl.zst", c); },
                                     {"wide.jsonl.zst", "needs a window larger than 2^31 bytes",
                                      "--long=31"}));
}

TEST(CompressedCorpus, DamagedOrTruncatedStreamsNameTheFile) {
  TempDir dir;
  const std::string body = jsonl_of(numbered_poems(2000));
  const std::string gz = gzip_members({body}), zst = zstd_frames({body});
  DataConfig c;
  test::write_file(dir / "t.jsonl.gz", gz.substr(0, gz.size() / 2));
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "t.jsonl.gz", c); },
                                     {"t.jsonl.gz", "truncated gzip"}));
  test::write_file(dir / "t.jsonl.zst", zst.substr(0, zst.size() / 2));
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "t.jsonl.zst", c); },
                                     {"t.jsonl.zst", "truncated zstd"}));
  std::string bad = gz;
  for (size_t i = 20; i < 60; ++i) bad[i] = char(~bad[i]);
  test::write_file(dir / "x.jsonl.gz", bad);
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "x.jsonl.gz", c); },
                                     {"x.jsonl.gz", "gzip"}));
  test::write_file(dir / "plain.jsonl.zst", body);  // not compressed at all
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "plain.jsonl.zst", c); },
                                     {"plain.jsonl.zst", "zstd"}));
  // Bad JSON inside a compressed file: file and line, as for a plain one.
  test::write_file(dir / "j.jsonl.zst", zstd_frames({"{\"text\": \"a\"}\n", "{\"text\": 5}\n"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "j.jsonl.zst", c); },
                                     {"j.jsonl.zst:2:", "expected a string"}));
  EXPECT_TRUE(throws_with<DataError>([&] { resolve_corpus_files({dir / "p.jsonl.bz2"}); },
                                     {"does not exist"}));
  test::write_file(dir / "p.jsonl.bz2", "x");
  EXPECT_TRUE(throws_with<DataError>([&] { resolve_corpus_files({dir / "p.jsonl.bz2"}); },
                                     {"p.jsonl.bz2", ".zst"}));
}

// Every document, in order, through stream_corpus with pieces of `chunk_bytes`.
Docs streamed(const std::string& path, const DataConfig& c, int threads, int64_t chunk_bytes,
              int64_t* chunks = nullptr) {
  Docs out;
  const auto st = stream_corpus({path}, c, threads, chunk_bytes, [](int, CorpusChunk&) {},
                                [&](CorpusChunk& ch) {
                                  for (auto& d : ch.docs) out.push_back(std::move(d));
                                });
  if (chunks) *chunks = st.chunks;
  return out;
}

TEST(StreamCorpus, PiecesOfAnySizeGiveTheSameDocumentsAndTheSameFirstError) {
  TempDir dir;
  // Blank-line documents of 1-5 lines, CRLF on some lines, a BOM at the start.
  std::mt19937 rng(7);
  std::string txt = "\xEF\xBB\xBF";
  Docs want;
  for (int d = 0; d < 400; ++d) {
    std::string doc;
    const int lines = 1 + int(rng() % 5);
    for (int l = 0; l < lines; ++l) {
      const std::string line = "詩" + std::to_string(d) + "-" + std::to_string(l);
      txt += line + (rng() % 3 == 0 ? "\r\n" : "\n");
      doc += (l ? "\n" : "") + line;
    }
    txt += rng() % 2 ? "\n" : "  \n\n";
    want.push_back(doc);
  }
  test::write_file(dir / "b.txt", txt);
  DataConfig c;
  c.doc_separator = "blank_line";
  for (int64_t chunk : {int64_t(1), int64_t(17), int64_t(4096), int64_t(1) << 20}) {
    for (int threads : {1, 3}) {
      int64_t chunks = 0;
      EXPECT_EQ(streamed(dir / "b.txt", c, threads, chunk, &chunks), want)
          << chunk << " " << threads;
      if (chunk == 17) EXPECT_GT(chunks, 100);
    }
  }
  // JSON lines: the error reported is the first in the file, for every piece size.
  const Docs poems = numbered_poems(3000);
  std::string body = jsonl_of(poems);
  auto line_start = [&](int line) {
    size_t pos = 0;
    for (int l = 1; l < line; ++l) pos = body.find('\n', pos) + 1;
    return pos;
  };
  c.doc_separator = "line";
  test::write_file(dir / "ok.jsonl", body);
  EXPECT_EQ(streamed(dir / "ok.jsonl", c, 2, 100), poems);
  body[line_start(2900)] = '[';
  body[line_start(1201)] = '#';
  test::write_file(dir / "bad.jsonl", body);
  for (int64_t chunk : {int64_t(64), int64_t(5000), int64_t(1) << 20})
    for (int threads : {1, 2, 4})
      EXPECT_TRUE(throws_with<DataError>([&] { streamed(dir / "bad.jsonl", c, threads, chunk); },
                                         {dir / "bad.jsonl:1201:"}))
          << chunk << " " << threads;
}

TEST(StreamCorpus, JsonFastPathAgreesWithNlohmannOnTheEdgeCases) {
  TempDir dir;
  // Escapes, a duplicated text field (nlohmann: the last one wins), extra fields, whitespace.
  test::write_file(dir / "e.jsonl",
                   "{\"text\": \"a\\nb\\u00e9\\ud83d\\ude00\"}\n"
                   "{\"text\": \"first\", \"text\": \"second\"}\n"
                   "  {\"id\": 1, \"text\": \"x\", \"meta\": {\"k\": [1, 2]}}  \n"
                   "{\"text\": \"   \"}\n");
  DataConfig c;
  EXPECT_EQ(read_corpus_file(dir / "e.jsonl", c),
            (Docs{"a\nb\xC3\xA9\xF0\x9F\x98\x80", "second", "x"}));
  // Invalid UTF-8 inside the string: the error names the line, or is replaced when asked.
  test::write_file(dir / "u.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xC3( here\"}\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "u.jsonl", c); },
                                     {"u.jsonl:2:", "invalid UTF-8"}));
  c.invalid_utf8 = "replace";
  EXPECT_EQ(read_corpus_file(dir / "u.jsonl", c), (Docs{"ok", "bad \xEF\xBF\xBD( here"}));
}

TEST(SampleTrainer, LongestFittingPrefixOfTheRankingInRankingOrder) {
  const Docs docs = numbered_poems(300);
  int64_t total = 0;
  for (const auto& d : docs) total += int64_t(d.size());
  // The ranking, computed here from sample_rank alone.
  Docs ranked = docs;
  std::stable_sort(ranked.begin(), ranked.end(), [](const std::string& a, const std::string& b) {
    return sample_rank(a) < sample_rank(b);
  });
  auto sample_of = [&](int64_t budget, int threads, bool shuffled) {
    Docs got;
    auto trainer = make_sample_trainer(budget, threads, [&](const Docs& sample) {
      got = sample;
      return std::shared_ptr<Tokenizer>();
    });
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937(3));
    for (size_t k = 0; k < order.size(); ++k) trainer->add(int(k % size_t(threads)), docs[order[k]]);
    trainer->finish();
    return got;
  };
  EXPECT_EQ(sample_of(total, 1, false), ranked);  // everything fits: the whole corpus
  const Docs s = sample_of(total / 3, 1, false);
  int64_t bytes = 0;
  for (const auto& d : s) bytes += int64_t(d.size());
  EXPECT_LE(bytes, total / 3);
  EXPECT_GT(bytes, total / 3 - 40);  // documents are <= 40 bytes: the prefix is as long as fits
  EXPECT_EQ(s, Docs(ranked.begin(), ranked.begin() + std::ptrdiff_t(s.size())));
  EXPECT_EQ(sample_of(total / 3, 3, true), s);  // threads and arrival order change nothing
  EXPECT_TRUE(sample_of(5, 2, false).empty());   // no document fits
}

TEST(SampleTrainer, TheSampleIsTheSameForAnyArrivalOrderAndWorkers) {
  // Documents of very different sizes (1 to ~2,000 bytes), so that a drop frees room a later,
  // worse-ranked document could fill: the case that made the BPE differ between runs and file
  // orders. The reference: the ranking by sample_rank, documents over the budget left out, the
  // longest prefix that fits (docs/data.md), computed here.
  std::mt19937 rng(11);
  Docs docs;
  for (int i = 0; i < 400; ++i)
    docs.push_back("d" + std::to_string(i) + std::string(rng() % 3 ? rng() % 60 : rng() % 2000, 'x'));
  const int64_t budget = 20000;
  Docs ranked;
  for (const auto& d : docs)
    if (int64_t(d.size()) <= budget) ranked.push_back(d);
  std::stable_sort(ranked.begin(), ranked.end(), [](const std::string& a, const std::string& b) {
    return sample_rank(a) < sample_rank(b);
  });
  Docs want;
  int64_t bytes = 0;
  for (const auto& d : ranked) {
    if (bytes + int64_t(d.size()) > budget) break;
    bytes += int64_t(d.size());
    want.push_back(d);
  }
  ASSERT_GT(want.size(), 10u);
  ASSERT_LT(want.size(), docs.size() / 2);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (trial == 1) std::reverse(order.begin(), order.end());
    if (trial > 1) std::shuffle(order.begin(), order.end(), std::mt19937(unsigned(trial)));
    const int threads = 1 + trial % 3;
    Docs got;
    auto trainer = make_sample_trainer(budget, threads, [&](const Docs& sample) {
      got = sample;
      return std::shared_ptr<Tokenizer>();
    });
    for (size_t k = 0; k < order.size(); ++k) trainer->add(int(rng() % unsigned(threads)), docs[order[k]]);
    trainer->finish();
    EXPECT_EQ(got, want) << "trial " << trial << ", " << threads << " worker(s)";
  }
}

TEST(Shards, SeveralShardsReadAsOneStream) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", jsonl_of(numbered_poems(400)));
  DataConfig one;
  one.corpus = {dir / "p.jsonl"};
  one.cache_dir = dir / "cache";
  one.val_fraction = 0.1;
  DataConfig many = one;
  many.shard_tokens = 500;
  const auto p1 = prepare_data(one, 2, false);
  const auto pm = prepare_data(many, 2, false);
  ASSERT_EQ(p1.train_shards.size(), 1u);
  ASSERT_GT(pm.train_shards.size(), 10u);
  EXPECT_NE(p1.dir, pm.dir);  // shard_tokens is part of the data fingerprint
  int64_t docs = 0;
  for (const auto& path : pm.train_shards) {
    ShardReader r(path);
    EXPECT_LE(r.token_count(), 500) << path;
    docs += r.doc_count();
  }
  for (const char* mode : {"packed", "document"}) {
    for (int64_t seq : {int64_t(7), int64_t(64), int64_t(600)}) {
      TokenDataset a(p1.train_shards, mode, seq), b(pm.train_shards, mode, seq);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(a.token_count(), b.token_count());
      EXPECT_EQ(b.doc_count(), docs);
      std::vector<int64_t> all(size_t(a.size()));
      for (int64_t i = 0; i < a.size(); ++i) all[size_t(i)] = i;
      const Batch x = a.get(all), y = b.get(all);
      EXPECT_TRUE(torch::equal(x.inputs, y.inputs)) << mode << " " << seq;
      EXPECT_TRUE(torch::equal(x.targets, y.targets)) << mode << " " << seq;
    }
  }
  // The same split either way.
  EXPECT_EQ(TokenDataset(p1.val_shards, "document", 8).size(),
            TokenDataset(pm.val_shards, "document", 8).size());
  // Shards of different tokenizers are not read together.
  DataConfig other = one;
  other.tokenizer.max_vocab = 20;
  const auto po = prepare_data(other, 1, false);
  EXPECT_TRUE(throws_with<DataError>(
      [&] { TokenDataset({p1.train_shards[0], po.train_shards[0]}, "packed", 8); },
      {"different tokenizers", "re-run mllm-prepare"}));
}

TEST(CacheFolders, AnotherDataConfigurationNeverReplacesACache) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", jsonl_of(numbered_poems(100)));
  DataConfig a;
  a.corpus = {dir / "p.jsonl"};
  a.cache_dir = dir / "cache";
  DataConfig b = a;
  b.tokenizer.max_vocab = 30;
  // A version-1 cache left in cache_dir itself is neither read nor touched.
  fs::create_directories(a.cache_dir);
  test::write_file(fs::path(a.cache_dir) / "manifest.json", "{\"format\":\"mllm-data-cache\",\"version\":1}");
  test::write_file(fs::path(a.cache_dir) / "train.bin", "old");
  const auto pa = prepare_data(a, 1, false);
  const std::string before = test::slurp(pa.train_shards[0]);
  const auto pb = prepare_data(b, 1, false);
  EXPECT_NE(pa.dir, pb.dir);
  EXPECT_TRUE(is_prepared(a));
  EXPECT_TRUE(is_prepared(b));
  EXPECT_EQ(test::slurp(pa.train_shards[0]), before);
  EXPECT_EQ(test::slurp(fs::path(a.cache_dir) / "train.bin"), "old");
  EXPECT_TRUE(throws_with<DataError>([&] { load_prepared(a, "0123456789abcdef"); },
                                     {"0123456789abcdef", "re-run mllm-prepare"}));
}

}  // namespace
}  // namespace mllm

namespace mllm {
namespace {

TEST(CorpusFiles, OneFileHoweverItIsSpelled) {
  TempDir dir;
  test::write_file(dir / "a.jsonl", test::jsonl_of({"one", "two"}));
  const std::string rel = fs::relative(dir / "a.jsonl").string();
  const auto files = resolve_corpus_files(
      {dir / "a.jsonl", dir.path() + "//a.jsonl", dir.path() + "/./a.jsonl", rel, dir / "*.jsonl"});
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], dir / "a.jsonl");  // the first spelling is kept
}

TEST(CompressedCorpus, AnEmptyCompressedFileIsAnError) {
  TempDir dir;
  test::write_file(dir / "e.jsonl.gz", "");
  test::write_file(dir / "e.txt.zst", "");
  DataConfig c;
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "e.jsonl.gz", c); },
                                     {"e.jsonl.gz", "empty file", "not a gzip stream"}));
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "e.txt.zst", c); },
                                     {"e.txt.zst", "empty file", "not a zstd stream"}));
  test::write_file(dir / "blank.txt.gz", test::gzip_members({""}));  // a valid, empty stream
  EXPECT_TRUE(read_corpus_file(dir / "blank.txt.gz", c).empty());
}

TEST(CacheFolders, ADamagedTokenizerOrABadCacheDirIsFoundBeforeReadingTheCorpus) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", test::jsonl_of(numbered_poems(50)));
  DataConfig c;
  c.corpus = {dir / "p.jsonl"};
  c.cache_dir = dir / "cache";
  const auto p = prepare_data(c, 1, false);
  EXPECT_TRUE(is_prepared(c));
  const std::string bytes = test::slurp(p.tokenizer_path);
  test::write_file(p.tokenizer_path, bytes.substr(0, bytes.size() / 2));
  EXPECT_FALSE(is_prepared(c));  // the manifest alone does not make it complete
  SingleGroup one;
  bool prepared = false;
  ensure_prepared(c, 1, false, one, false, &prepared);
  EXPECT_TRUE(prepared);
  EXPECT_EQ(test::slurp(p.tokenizer_path), bytes);
  // A cache_dir that is a file: a ConfigError naming the key, before any corpus byte is read
  // (the corpus here does not even exist).
  test::write_file(dir / "afile", "x");
  DataConfig bad = c;
  bad.corpus = {dir / "missing.jsonl"};
  bad.cache_dir = dir / "afile/cache";
  EXPECT_TRUE(throws_with<ConfigError>([&] { ensure_prepared(bad, 1, false, one); },
                                       {"data.cache_dir", "afile", "not a folder"}));
}

}  // namespace
}  // namespace mllm
