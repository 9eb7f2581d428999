// Corpus reading (.txt / .jsonl, globs), every bad-input case with file and line, and
// prepare_data end to end: shard contents, byte-identical reruns, cache fingerprint, no
// half-written files, and the committed tang300 sample.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "mllm/core/error.h"
#include "mllm/data/corpus.h"
#include "mllm/data/dataset.h"
#include "mllm/data/prepare.h"
#include "mllm/data/shard.h"
#include "mllm/data/tokenizer.h"

namespace mllm {
namespace {

using test::TempDir;
using test::throws_with;
using Docs = std::vector<std::string>;

DataConfig config_for(const TempDir& dir, std::vector<std::string> corpus) {
  DataConfig c;
  c.corpus = std::move(corpus);
  c.cache_dir = dir / "cache";
  c.val_fraction = 0.25;
  return c;
}

TEST(Corpus, TxtLinesBlankLineBlocksAndJsonl) {
  TempDir dir;
  test::write_file(dir / "a.txt", "\xEF\xBB\xBFone\r\ntwo\n\n  \nthree\n");
  DataConfig c = config_for(dir, {dir / "a.txt"});
  EXPECT_EQ(read_corpus_file(dir / "a.txt", c), (Docs{"one", "two", "three"}));
  c.doc_separator = "blank_line";
  test::write_file(dir / "b.txt", "l1\nl2\n\n\n l3 \n\nl4");
  EXPECT_EQ(read_corpus_file(dir / "b.txt", c), (Docs{"l1\nl2", " l3 ", "l4"}));
  test::write_file(dir / "c.jsonl",
                   "{\"text\": \"春眠\\n不覺曉\", \"title\": \"x\"}\n\n{\"text\": \"<EOS>\"}\n"
                   "{\"text\": \"\"}\n");
  EXPECT_EQ(read_corpus_file(dir / "c.jsonl", c), (Docs{"春眠\n不覺曉", "<EOS>"}));
  int64_t bytes = 0;
  c.corpus = {dir / "*.jsonl", dir / "a.txt", dir / "c.jsonl"};  // duplicate dropped
  c.doc_separator = "line";
  EXPECT_EQ(read_corpus(c, &bytes), (Docs{"春眠\n不覺曉", "<EOS>", "one", "two", "three"}));
  EXPECT_EQ(bytes, int64_t(test::slurp(dir / "c.jsonl").size() + test::slurp(dir / "a.txt").size()));
}

TEST(Corpus, BadInputNamesFileAndLine) {
  TempDir dir;
  DataConfig c = config_for(dir, {});
  test::write_file(dir / "u.txt", "fine\nbad \xC3\x28 here\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "u.txt", c); },
                                     {dir / "u.txt:2", "invalid UTF-8", "byte 5", "0xC3",
                                      "invalid_utf8: replace"}));
  c.invalid_utf8 = "replace";
  EXPECT_EQ(read_corpus_file(dir / "u.txt", c), (Docs{"fine", "bad \xEF\xBF\xBD( here"}));
  c.invalid_utf8 = "error";
  test::write_file(dir / "u.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xFF\"}\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "u.jsonl", c); },
                                     {dir / "u.jsonl:2", "invalid UTF-8"}));
  test::write_file(dir / "j.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "j.jsonl", c); },
                                     {dir / "j.jsonl:2", "not valid JSON"}));
  test::write_file(dir / "f.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"ok\", \"id\": 1}\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "f.jsonl", c); },
                                     {dir / "f.jsonl:3", "no field 'text'", "body, id",
                                      "data.text_field"}));
  test::write_file(dir / "n.jsonl", "{\"text\": 5}\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "n.jsonl", c); },
                                     {dir / "n.jsonl:1", "number"}));
  test::write_file(dir / "arr.jsonl", "[1]\n");
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "arr.jsonl", c); },
                                     {dir / "arr.jsonl:1", "JSON object"}));
  test::write_file(dir / "empty.txt", "\n  \n");
  c.corpus = {dir / "empty.txt"};
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus(c); }, {"empty.txt", "no document"}));
  c.corpus = {dir / "nothing*.jsonl"};
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus(c); }, {"nothing*.jsonl", "matches no file"}));
  c.corpus = {dir / "missing.txt"};
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus(c); }, {"missing.txt", "does not exist"}));
  test::write_file(dir / "x.csv", "a,b\n");
  c.corpus = {dir / "x.csv"};
  EXPECT_TRUE(throws_with<DataError>([&] { read_corpus(c); }, {"x.csv", ".jsonl"}));
  c.corpus = {};
  EXPECT_THROW(read_corpus(c), DataError);
}

TEST(Corpus, ParallelJsonlKeepsOrderAndReportsTheFirstBadLine) {
  TempDir dir;
  // ~3.5 MB so that the file is cut into several chunks.
  std::string body;
  Docs want;
  for (int i = 1; i <= 30000; ++i) {
    want.push_back("poem " + std::to_string(i) + std::string(100, 'x'));
    body += "{\"text\": \"" + want.back() + "\"}\n";
  }
  test::write_file(dir / "big.jsonl", body);
  DataConfig c = config_for(dir, {dir / "big.jsonl"});
  EXPECT_EQ(read_corpus_file(dir / "big.jsonl", c, nullptr, 3), want);
  std::string bad = body;
  auto line_start = [&](int line) {  // byte offset of 1-based line
    size_t pos = 0;
    for (int l = 1; l < line; ++l) pos = bad.find('\n', pos) + 1;
    return pos;
  };
  bad[line_start(29500)] = '[';  // later error, parsed by another worker
  bad[line_start(20001)] = '#';
  test::write_file(dir / "bad.jsonl", bad);
  for (int threads : {1, 2, 4})
    EXPECT_TRUE(throws_with<DataError>([&] { read_corpus_file(dir / "bad.jsonl", c, nullptr, threads); },
                                       {dir / "bad.jsonl:20001:"}));
}

TEST(ValSplit, RankAndThresholdMatchAnIndependentComputation) {
  // Values from a Python transcription of content_hash64 + the splitmix64 finaliser
  // (docs/data.md), not from this code.
  EXPECT_EQ(val_rank("床前明月光"), 0xc34d063765dbf2b5ull);
  EXPECT_EQ(val_rank("<EOS> is text"), 0x4d73fece2fac7004ull);
  EXPECT_EQ(val_rank(""), 0x89cd4e68e170c82aull);
  EXPECT_EQ(val_rank("abcdefghij"), 0xf3366c5898caa00full);  // 8-byte word + 2-byte tail
  EXPECT_EQ(val_threshold(0.25), 0x4000000000000000ull);
  EXPECT_EQ(val_threshold(0.0), 0u);
  EXPECT_EQ(val_threshold(0.01), uint64_t(0.01 * 18446744073709551616.0));
}

// Decoded documents of a shard (BOS ... EOS stripped by decode).
Docs shard_docs(const std::string& path, const Tokenizer& tok) {
  ShardReader r(path);
  Docs out;
  for (int64_t d = 0; d < r.doc_count(); ++d) {
    const int64_t b = r.doc_offset(d), e = r.doc_offset(d + 1);
    std::vector<int64_t> t(size_t(e - b));
    r.read_tokens(b, e - b, t.data());
    EXPECT_EQ(t.front(), kBosId);
    EXPECT_EQ(t.back(), kEosId);
    out.push_back(tok.decode(std::vector<int32_t>(t.begin(), t.end())));
  }
  return out;
}

const Docs kPoems = {"春眠不覺曉\n處處聞啼鳥", "夜來風雨聲\n花落知多少", "床前明月光",
                     "疑是地上霜", "<EOS> is text", "舉頭望明月", "低頭思故鄉", "白日依山盡"};

std::string jsonl_of(const Docs& docs) {
  std::string s;
  for (const auto& d : docs) s += nlohmann::json({{"text", d}}).dump() + "\n";
  return s;
}

TEST(PrepareData, WritesShardsThatDecodeToTheCorpus) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", jsonl_of(kPoems));
  DataConfig c = config_for(dir, {dir / "p.jsonl"});
  EXPECT_FALSE(is_prepared(c));
  PrepareStats st;
  const PreparedData p = prepare_data(c, 2, false, &st);
  EXPECT_TRUE(is_prepared(c));
  EXPECT_EQ(st.train_documents + st.val_documents, 8);
  // No poem's rank is below 0.25 * 2^64 (Python, see ValSplit), so the small-corpus rule holds
  // out the lowest-ranked one, "<EOS> is text" (rank 0x4d73...).
  EXPECT_EQ(st.val_documents, 1);
  auto tok = load_tokenizer(p.tokenizer_path);
  EXPECT_EQ(st.vocab_size, tok->vocab_size());
  Docs want_train, want_val = {"<EOS> is text"};
  for (const auto& d : kPoems)
    if (d != "<EOS> is text") want_train.push_back(d);
  // Val characters missing from the train split decode as nothing (UNK); compare train exactly
  // and val after encoding with the same tokenizer.
  ASSERT_EQ(p.train_shards.size(), 1u);
  ASSERT_EQ(p.val_shards.size(), 1u);
  EXPECT_EQ(shard_docs(p.train_shards[0], *tok), want_train);
  Docs val_expect;
  for (const auto& d : want_val) val_expect.push_back(tok->decode(tok->encode(d)));
  EXPECT_EQ(shard_docs(p.val_shards[0], *tok), val_expect);
  // Token count: code points + BOS + EOS per document (train split).
  int64_t want_tokens = 0;
  for (const auto& d : want_train) want_tokens += int64_t(tok->encode(d).size()) + 2;
  EXPECT_EQ(st.train_tokens, want_tokens);
  TokenDataset ds(p.train_shards, "packed", 4);
  EXPECT_NO_THROW(ds.check_tokenizer(*tok));
  const std::string fp = data_fingerprint(c);
  EXPECT_EQ(test::list_dir(c.cache_dir), fp + ";");
  EXPECT_EQ(p.dir, (std::filesystem::path(c.cache_dir) / fp).string());
  // The pass-1 record (split.json) stays for re-runs; the lock file stays (deleting it would let
  // a waiting job lock a file a third one no longer sees); the pieces are gone.
  EXPECT_EQ(test::list_dir(p.dir),
            ".prepare.lock;manifest.json;split.json;tokenizer.mllm;train-00000.bin;val-00000.bin;");
}

TEST(PrepareData, ByteIdenticalAcrossRunsAndThreadCounts) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", jsonl_of(kPoems));
  for (const char* type : {"char", "bpe"}) {
    DataConfig a = config_for(dir, {dir / "p.jsonl"});
    a.tokenizer.type = type;
    a.tokenizer.vocab_size = 400;
    DataConfig b = a;
    a.cache_dir = dir / (std::string(type) + "_a");
    b.cache_dir = dir / (std::string(type) + "_b");
    b.prepare_memory_mb = 64;  // the budget never changes the output
    const auto pa = prepare_data(a, 1, false);
    const auto pb = prepare_data(b, 3, false);
    for (auto [fa, fb] : {std::pair{pa.tokenizer_path, pb.tokenizer_path},
                          std::pair{pa.train_shards[0], pb.train_shards[0]},
                          std::pair{pa.val_shards[0], pb.val_shards[0]}}) {
      EXPECT_EQ(test::slurp(fa), test::slurp(fb)) << type << " " << fa;
      EXPECT_FALSE(test::slurp(fa).empty());
    }
    const std::string fp = data_fingerprint(a);
    EXPECT_EQ(fp, data_fingerprint(b));
    EXPECT_EQ(test::slurp(manifest_path(a, fp)), test::slurp(manifest_path(b, fp)));
  }
}

TEST(PrepareData, CacheIsStaleWhenCorpusOrSettingsChange) {
  TempDir dir;
  test::write_file(dir / "p.jsonl", jsonl_of(kPoems));
  DataConfig c = config_for(dir, {dir / "p.jsonl"});
  prepare_data(c, 1, false);
  EXPECT_TRUE(is_prepared(c));
  DataConfig seq = c;
  seq.seq_len = 512;
  seq.mode = "document";
  EXPECT_TRUE(is_prepared(seq));  // reading settings do not change the shards
  DataConfig val = c;
  val.val_fraction = 0.5;
  EXPECT_FALSE(is_prepared(val));
  DataConfig tok = c;
  tok.tokenizer.min_count = 2;
  EXPECT_FALSE(is_prepared(tok));
  test::write_file(dir / "p.jsonl", jsonl_of({"one more", "poem"}));
  EXPECT_FALSE(is_prepared(c));
  // A removed shard or a manifest from a killed run also means "not prepared".
  test::write_file(dir / "p.jsonl", jsonl_of(kPoems));
  EXPECT_TRUE(is_prepared(c));
  std::filesystem::remove(load_prepared(c, data_fingerprint(c)).val_shards[0]);
  EXPECT_FALSE(is_prepared(c));
  // Re-preparing from the same data reuses the cached tokenizer (prepare_data, like
  // mllm-prepare --force, would train it again).
  PrepareStats st;
  SingleGroup one;
  bool prepared = false;
  ensure_prepared(c, 1, false, one, /*force=*/false, &prepared, &st);
  EXPECT_TRUE(prepared);
  EXPECT_TRUE(st.tokenizer_reused);
  ensure_prepared(c, 1, false, one, /*force=*/true, &prepared, &st);
  EXPECT_FALSE(st.tokenizer_reused);
  EXPECT_TRUE(is_prepared(c));
}

TEST(PrepareData, BadCorpusWritesNothing) {
  TempDir dir;
  test::write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xC3\"}\n");
  DataConfig c = config_for(dir, {dir / "bad.jsonl"});
  try {
    prepare_data(c, 1, false);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(c.cache_dir));
  c.corpus = {dir / "nomatch*.txt"};
  EXPECT_THROW(prepare_data(c, 1, false), DataError);
  EXPECT_FALSE(std::filesystem::exists(c.cache_dir));
}

TEST(PrepareData, CommittedTang300Sample) {
  TempDir dir;
  DataConfig c = config_for(dir, {std::string(MLLM_SOURCE_DIR) + "/data/tang300/tang300.jsonl"});
  c.val_fraction = 0.01;
  PrepareStats st;
  prepare_data(c, 2, false, &st);
  // Counted independently with Python: 366 poems, 29202 code points of text.
  EXPECT_EQ(st.train_documents + st.val_documents, 366);
  EXPECT_EQ(st.val_documents, 1);  // ranks below 0.01 * 2^64, counted with Python
  // Train tokens + val tokens = text code points + 2 per poem.
  EXPECT_EQ(st.train_tokens + st.val_tokens, 29202 + 2 * 366);
  EXPECT_TRUE(is_prepared(c));
}

}  // namespace
}  // namespace mllm
