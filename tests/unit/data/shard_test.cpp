// Shard format: bytes written by hand-checked layout, read back through mmap, and every
// bad-input case (wrong magic / version, damaged header, truncated, extra bytes, bad token,
// another tokenizer) named in the error.
#include <gtest/gtest.h>

#include <cstring>

#include "data_test_util.h"
#include "mllm/core/error.h"
#include "mllm/data/char_tokenizer.h"
#include "mllm/data/shard.h"

namespace mllm {
namespace {

using test::TempDir;
using test::throws_with;

uint64_t u64_at(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t u32_at(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

// Two documents [5 6 7] and [8]: tokens 2 5 6 7 3 2 8 3 (BOS=2, EOS=3).
std::string write_two_docs(const TempDir& dir, int64_t vocab = 10, uint64_t fp = 0x1234) {
  ShardWriter w(dir / "s.bin", vocab, fp);
  w.add_document({5, 6, 7});
  w.add_document({8});
  const ShardHeader h = w.finish();
  EXPECT_EQ(h.token_count, 8u);
  EXPECT_EQ(h.doc_count, 2u);
  return dir / "s.bin";
}

TEST(Shard, ByteLayoutMatchesTheDocumentedFormat) {
  TempDir dir;
  const std::string b = test::slurp(write_two_docs(dir));
  // 64 header + 8 tokens x 2 bytes (already 8-aligned) + 3 offsets x 8 = 104 bytes.
  ASSERT_EQ(b.size(), 104u);
  EXPECT_EQ(b.substr(0, 8), "MLLMTOKS");
  EXPECT_EQ(u32_at(b, 8), 1u);    // version
  EXPECT_EQ(u32_at(b, 12), 2u);   // uint16 tokens
  EXPECT_EQ(u64_at(b, 16), 8u);   // tokens
  EXPECT_EQ(u64_at(b, 24), 2u);   // documents
  EXPECT_EQ(u64_at(b, 32), 10u);  // vocab size
  EXPECT_EQ(u64_at(b, 40), 0x1234u);
  const unsigned char want_tokens[16] = {2, 0, 5, 0, 6, 0, 7, 0, 3, 0, 2, 0, 8, 0, 3, 0};
  EXPECT_EQ(std::memcmp(b.data() + 64, want_tokens, 16), 0);
  EXPECT_EQ(u64_at(b, 80), 0u);
  EXPECT_EQ(u64_at(b, 88), 5u);
  EXPECT_EQ(u64_at(b, 96), 8u);
}

TEST(Shard, PadsTokensToEightBytesAndUsesUint32ForLargeVocabularies) {
  TempDir dir;
  {
    ShardWriter w(dir / "odd.bin", 10, 1);
    w.add_document({5});  // 3 tokens = 6 bytes -> 2 zero bytes of padding
    w.finish();
  }
  const std::string b = test::slurp(dir / "odd.bin");
  ASSERT_EQ(b.size(), 64u + 8u + 16u);
  EXPECT_EQ(u64_at(b, 72), 0u);
  EXPECT_EQ(u64_at(b, 80), 3u);
  {
    ShardWriter w(dir / "big.bin", 70000, 1);
    w.add_document({69999});
    w.finish();
  }
  const std::string big = test::slurp(dir / "big.bin");
  EXPECT_EQ(u32_at(big, 12), 4u);
  EXPECT_EQ(u32_at(big, 64 + 4), 69999u);
  ShardReader r(dir / "big.bin");
  std::vector<int64_t> t(3);
  r.read_tokens(0, 3, t.data());
  EXPECT_EQ(t, (std::vector<int64_t>{2, 69999, 3}));
}

TEST(Shard, ReaderRoundTrip) {
  TempDir dir;
  ShardReader r(write_two_docs(dir));
  EXPECT_EQ(r.token_count(), 8);
  EXPECT_EQ(r.doc_count(), 2);
  EXPECT_EQ(r.doc_offset(0), 0);
  EXPECT_EQ(r.doc_offset(1), 5);
  EXPECT_EQ(r.doc_offset(2), 8);
  std::vector<int64_t> t(8);
  r.read_tokens(0, 8, t.data());
  EXPECT_EQ(t, (std::vector<int64_t>{2, 5, 6, 7, 3, 2, 8, 3}));
  EXPECT_EQ(read_shard_header(r.path()).tokenizer_fingerprint, 0x1234u);
}

TEST(Shard, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    ShardWriter w(dir / "x.bin", 10, 1);
    w.add_document({5});
    EXPECT_THROW(w.add_document({10}), Error);  // id >= vocab size
  }
  EXPECT_EQ(test::list_dir(dir.path()), "");
}

TEST(Shard, BadFilesAreRejectedWithTheirName) {
  TempDir dir;
  const std::string good = test::slurp(write_two_docs(dir));
  auto variant = [&](const std::string& name, std::string bytes) {
    test::write_file(dir / name, bytes);
    return dir / name;
  };
  std::string magic = good;
  magic[0] = 'X';
  const auto p_magic = variant("magic.bin", magic);
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_magic); }, {"magic.bin", "magic"}));
  std::string version = good;
  version[8] = 9;
  const auto p_version = variant("version.bin", version);
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_version); },
                                     {"version.bin", "version 9"}));
  std::string header = good;
  header[16] = 7;  // token count 8 -> 7 without fixing the header hash
  const auto p_header = variant("header.bin", header);
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_header); }, {"header.bin", "damaged"}));
  const auto p_trunc = variant("trunc.bin", good.substr(0, good.size() - 1));
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_trunc); }, {"trunc.bin", "truncated"}));
  const auto p_tiny = variant("tiny.bin", good.substr(0, 10));
  EXPECT_TRUE(throws_with<DataError>([&] { read_shard_header(p_tiny); }, {"tiny.bin", "truncated"}));
  const auto p_empty = variant("empty.bin", "");
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_empty); }, {"empty.bin", "truncated"}));
  const auto p_extra = variant("extra.bin", good + "xx");
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader r(p_extra); }, {"extra.bin", "2 unexpected"}));
  std::string token = good;
  token[64 + 2] = 10;  // token 5 -> 10 == vocab size
  const auto p_token = variant("token.bin", token);
  ShardReader r(p_token);  // tokens are checked when read
  std::vector<int64_t> t(8);
  EXPECT_TRUE(throws_with<DataError>([&] { r.read_tokens(0, 8, t.data()); }, {"token.bin", "10"}));
  EXPECT_TRUE(throws_with<DataError>([&] { ShardReader m(dir / "none.bin"); }, {"none.bin"}));
}

TEST(Shard, FromAnotherTokenizerNamesWhatDiffers) {
  TempDir dir;
  CharTokenizer tok({U'a', U'b'});  // vocab 6
  {
    ShardWriter w(dir / "t.bin", tok.vocab_size(), tok.fingerprint());
    w.add_document({4, 5});
    w.finish();
  }
  EXPECT_NO_THROW(check_shard_tokenizer(read_shard_header(dir / "t.bin"), dir / "t.bin", tok));
  CharTokenizer other({U'a', U'c'});
  EXPECT_TRUE(throws_with<DataError>(
      [&] { check_shard_tokenizer(read_shard_header(dir / "t.bin"), dir / "t.bin", other); },
      {"t.bin", "another tokenizer", fingerprint_hex(tok.fingerprint()),
       fingerprint_hex(other.fingerprint())}));
}

}  // namespace
}  // namespace mllm
