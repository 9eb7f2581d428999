// TokenDataset: packed windows and padded documents, values worked out by hand from the shard
// tokens 2 5 6 7 3 | 2 8 3.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "mllm/core/error.h"
#include "mllm/data/dataset.h"
#include "mllm/data/shard.h"
#include "mllm/data/tokenizer.h"

namespace mllm {
namespace {

using test::TempDir;

std::string two_doc_shard(const TempDir& dir) {
  ShardWriter w(dir / "s.bin", 10, 0xABC);
  w.add_document({5, 6, 7});
  w.add_document({8});
  w.finish();
  return dir / "s.bin";
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t r) {
  auto c = t[r].contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(TokenDataset, PackedWindowsOverlapByOneToken) {
  TempDir dir;
  TokenDataset ds(two_doc_shard(dir), "packed", 3);
  EXPECT_EQ(ds.size(), 2);  // floor((8 - 1) / 3)
  EXPECT_EQ(ds.vocab_size(), 10);
  EXPECT_EQ(ds.tokenizer_fingerprint(), 0xABCu);
  const Batch b = ds.get({1, 0});
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.inputs.scalar_type(), torch::kInt64);
  EXPECT_EQ(b.targets.scalar_type(), torch::kInt64);
  // window 1 = tokens[3, 7) = 7 3 2 8; window 0 = tokens[0, 4) = 2 5 6 7
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{7, 3, 2}));
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{3, 2, 8}));
  EXPECT_EQ(row(b.inputs, 1), (std::vector<int64_t>{2, 5, 6}));
  EXPECT_EQ(row(b.targets, 1), (std::vector<int64_t>{5, 6, 7}));
}

TEST(TokenDataset, DocumentModeTruncatesAndPads) {
  TempDir dir;
  TokenDataset ds(two_doc_shard(dir), "document", 3);
  EXPECT_EQ(ds.size(), 2);
  const Batch b = ds.get({0, 1});
  // doc 0 = 2 5 6 7 3 truncated to 4 tokens; doc 1 = 2 8 3 padded with PAD (0)
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{2, 5, 6}));
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(row(b.inputs, 1), (std::vector<int64_t>{2, 8, 3}));
  EXPECT_EQ(row(b.targets, 1), (std::vector<int64_t>{8, 3, kPadId}));
  TokenDataset wide(dir / "s.bin", "document", 6);
  const Batch w = wide.get({1});
  EXPECT_EQ(row(w.inputs, 0), (std::vector<int64_t>{2, 8, 3, 0, 0, 0}));
  EXPECT_EQ(row(w.targets, 0), (std::vector<int64_t>{8, 3, 0, 0, 0, 0}));
}

TEST(TokenDataset, BadArgumentsThrow) {
  TempDir dir;
  const auto path = two_doc_shard(dir);
  EXPECT_THROW(TokenDataset(path, "packd", 3), ConfigError);
  EXPECT_THROW(TokenDataset(path, "packed", 0), ConfigError);
  TokenDataset ds(path, "packed", 3);
  EXPECT_THROW(ds.get({2}), Error);
  EXPECT_THROW(ds.get({-1}), Error);
  TokenDataset tiny(path, "packed", 7);  // floor(7 / 7) = 1 window
  EXPECT_EQ(tiny.size(), 1);
  TokenDataset none(path, "packed", 8);  // a window needs 9 tokens
  EXPECT_EQ(none.size(), 0);
  EXPECT_THROW(TokenDataset(dir / "missing.bin", "packed", 3), DataError);
}

}  // namespace
}  // namespace mllm
