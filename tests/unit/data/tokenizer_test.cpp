// char and bpe tokenizers: vocabulary order, round trips, unknowns, literal "<EOS>", files,
// fingerprints, streaming decode.
#include <gtest/gtest.h>

#include <random>

#include "data_test_util.h"
#include "mllm/core/error.h"
#include "mllm/data/bpe_tokenizer.h"
#include "mllm/data/char_tokenizer.h"
#include "mllm/data/tokenizer.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

using test::TempDir;
using test::throws_with;

std::shared_ptr<Tokenizer> train_char(const std::vector<std::string>& docs, int64_t min_count = 1,
                                      int64_t max_vocab = 0, int threads = 1) {
  TokenizerConfig c;
  c.type = "char";
  c.min_count = min_count;
  c.max_vocab = max_vocab;
  return train_tokenizer(c, docs, threads);
}

TEST(CharTokenizer, VocabularyByFrequencyThenCodePoint) {
  // Counts: a 3, b 3, '\n' 1, c 1, 春 2. Order: a(97) b(98) [3], 春 [2], '\n'(10) c(99) [1].
  auto tok = train_char({"abba\nc", "春a春b"});
  ASSERT_EQ(tok->vocab_size(), 4 + 5);
  EXPECT_EQ(tok->encode("a"), std::vector<int32_t>{4});
  EXPECT_EQ(tok->encode("b"), std::vector<int32_t>{5});
  EXPECT_EQ(tok->encode("春"), std::vector<int32_t>{6});
  EXPECT_EQ(tok->encode("\n"), std::vector<int32_t>{7});
  EXPECT_EQ(tok->encode("c"), std::vector<int32_t>{8});
  // Thread count must not change the result.
  EXPECT_EQ(train_char({"abba\nc", "春a春b"}, 1, 0, 2)->fingerprint(), tok->fingerprint());
}

TEST(CharTokenizer, MinCountAndMaxVocab) {
  auto tok = train_char({"aaabbc"}, /*min_count=*/2);
  EXPECT_EQ(tok->vocab_size(), 6);  // a, b
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{4, 5, kUnkId}));
  auto capped = train_char({"aaabbc"}, 1, /*max_vocab=*/5);
  EXPECT_EQ(capped->vocab_size(), 5);  // specials + a
  EXPECT_EQ(capped->encode("ab"), (std::vector<int32_t>{4, kUnkId}));
  EXPECT_THROW(train_char({"abc"}, 1, 3), ConfigError);
  EXPECT_TRUE(throws_with<DataError>([] { train_char({"abc"}, 5); }, {"min_count = 5"}));
}

TEST(CharTokenizer, RoundTripsNewlinesBlankLinesAndCjk) {
  const std::string text = "床前明月光，\n疑是地上霜。\n\n舉頭望明月，\n低頭思故鄉。\n";
  auto tok = train_char({text});
  const auto ids = tok->encode(text);
  EXPECT_EQ(ids.size(), 29u);  // 4 lines of 6 characters + 5 newlines: code points, not bytes
  EXPECT_EQ(tok->decode(ids), text);
  for (int32_t id : ids) EXPECT_NE(id, kUnkId);
}

TEST(CharTokenizer, UnknownCharactersAndInvalidBytesBecomeUnk) {
  auto tok = train_char({"ab"});
  EXPECT_EQ(tok->encode("a😀b"), (std::vector<int32_t>{4, kUnkId, 5}));
  EXPECT_EQ(tok->encode("a\xFF" "b"), (std::vector<int32_t>{4, kUnkId, 5}));
  // Specials produce no text.
  EXPECT_EQ(tok->decode({kBosId, 4, kUnkId, 5, kEosId, kPadId}), "ab");
  EXPECT_THROW(tok->decode({99}), Error);
}

TEST(CharTokenizer, LiteralSpecialNamesAreOrdinaryText) {
  auto tok = train_char({"x<EOS>y<PAD>"});
  const auto ids = tok->encode("<EOS>");
  ASSERT_EQ(ids.size(), 5u);  // '<' 'E' 'O' 'S' '>'
  for (int32_t id : ids) EXPECT_GE(id, kNumSpecialIds);
  EXPECT_EQ(tok->decode(ids), "<EOS>");
}

TEST(CharTokenizer, SaveLoadIsIdentical) {
  TempDir dir;
  auto tok = train_char({"春眠不覺曉\n處處聞啼鳥 😀 <EOS>"});
  tok->save(dir / "tok.mllm");
  auto back = load_tokenizer(dir / "tok.mllm");
  EXPECT_EQ(back->type(), "char");
  EXPECT_EQ(back->vocab_size(), tok->vocab_size());
  EXPECT_EQ(back->fingerprint(), tok->fingerprint());
  const std::string probe = "處處 😀 聞\n";
  EXPECT_EQ(back->encode(probe), tok->encode(probe));
  // A different vocabulary has a different fingerprint.
  EXPECT_NE(train_char({"春眠不覺曉"})->fingerprint(), tok->fingerprint());
}

TEST(TokenizerFile, BadFilesAreNamed) {
  TempDir dir;
  EXPECT_TRUE(throws_with<DataError>([&] { load_tokenizer(dir / "missing.mllm"); },
                                     {"missing.mllm"}));
  test::write_file(dir / "junk.mllm", "hello\nworld");
  EXPECT_TRUE(throws_with<DataError>([&] { load_tokenizer(dir / "junk.mllm"); },
                                     {"junk.mllm", "not an mllm tokenizer"}));
  auto tok = train_char({"abc"});
  tok->save(dir / "t.mllm");
  std::string bytes = test::slurp(dir / "t.mllm");
  test::write_file(dir / "short.mllm", bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(throws_with<DataError>([&] { load_tokenizer(dir / "short.mllm"); },
                                     {"short.mllm", "truncated"}));
  std::string tampered = bytes;
  tampered.back() = 'z';  // changes the vocabulary, not the header
  test::write_file(dir / "bad.mllm", tampered);
  EXPECT_TRUE(throws_with<DataError>([&] { load_tokenizer(dir / "bad.mllm"); },
                                     {"bad.mllm", "damaged"}));
  std::string other = bytes;
  other.replace(other.find("\"char\""), 6, "\"zzzz\"");
  test::write_file(dir / "type.mllm", other);
  EXPECT_TRUE(throws_with<DataError>([&] { load_tokenizer(dir / "type.mllm"); },
                                     {"type.mllm", "zzzz"}));
}

TEST(TokenizerRegistry, UnknownTypeListsKnownNames) {
  TokenizerConfig c;
  c.type = "chars";
  EXPECT_TRUE(throws_with<ConfigError>([&] { train_tokenizer(c, {"abc"}); }, {"bpe", "char"}));
}

TEST(IncrementalDecoder, CharStreamsWholeCharacters) {
  auto tok = train_char({"春眠a"});
  IncrementalDecoder dec(tok);
  std::string out;
  for (int32_t id : tok->encode("a春眠")) out += dec.push(id);
  out += dec.push(kEosId);
  out += dec.flush();
  EXPECT_EQ(out, "a春眠");
}

// ---- bpe (sentencepiece through the libmllm_spm module) ----

std::vector<std::string> bpe_corpus() {
  std::vector<std::string> docs;
  const char* lines[] = {
      "the quick brown fox jumps over the lazy dog",
      "a quick movement of the enemy will jeopardize six gunboats",
      "pack my box with five dozen liquor jugs",
      "床前明月光 疑是地上霜 舉頭望明月 低頭思故鄉",
      "春眠不覺曉 處處聞啼鳥 夜來風雨聲 花落知多少",
      "the end <EOS> is just text",
  };
  for (int rep = 0; rep < 20; ++rep)
    for (const char* l : lines) docs.push_back(std::string(l) + "\n" + l);
  return docs;
}

std::shared_ptr<Tokenizer> train_bpe(int threads = 1) {
  TokenizerConfig c;
  c.type = "bpe";
  c.vocab_size = 400;
  return train_tokenizer(c, bpe_corpus(), threads);
}

// Documents of Latin-syllable words: `words` words each, a line break every `per_line` words
// (0: one line per document); `upper`: capital consonants (another alphabet's syllables).
std::vector<std::string> word_docs(int docs, int words, int per_line, unsigned seed,
                                   bool upper = false) {
  std::mt19937 rng(seed);
  const char* cons = upper ? "BCDFGHJKLMNPRSTVWZ" : "bcdfghjklmnprstvwz";
  const char* vows[] = {"a", "e", "i", "o", "u", "ai", "ou", "an", "en", "ing"};
  std::vector<std::string> out;
  for (int d = 0; d < docs; ++d) {
    std::string t;
    for (int w = 0; w < words; ++w) {
      if (w) t += per_line && w % per_line == 0 ? "\n" : " ";
      for (unsigned k = 0, n = 1 + rng() % 3; k < n; ++k) t += std::string(1, cons[rng() % 18]) + vows[rng() % 10];
    }
    out.push_back(t);
  }
  return out;
}

TEST(BpeTokenizer, LongLinesAreTrainedOnInPiecesNotDropped) {
  // 40 documents of 3,000 words (~20 KB) each on one line: every line is over sentencepiece's
  // max_sentence_length (4,192 bytes). Before, its trainer skipped them all and failed with
  // "[!sentences_.empty()]"; mixed with short lines, it trained on the short ones only.
  TokenizerConfig c;
  c.type = "bpe";
  c.vocab_size = 700;
  const auto long_docs = word_docs(40, 3000, 0, 1);
  for (const auto& d : long_docs) ASSERT_GT(d.size(), 4192u);
  const auto from_long = train_tokenizer(c, long_docs, 1);
  // The same text with a line break every 12 words: sentences sentencepiece takes whole.
  const auto from_lines = train_tokenizer(c, word_docs(40, 3000, 12, 1), 1);
  // Short documents of capital-consonant syllables beside a few long ones of the held-out kind:
  // trained on the short ones only, the held-out text would be spelled in single characters.
  auto mixed = word_docs(300, 10, 0, 7, true);
  for (const auto& d : word_docs(10, 3000, 0, 1)) mixed.push_back(d);
  const auto from_mixed = train_tokenizer(c, mixed, 1);
  const auto short_only = train_tokenizer(c, word_docs(300, 10, 0, 7, true), 1);
  // Held-out text of the long documents' kind.
  const std::string held = word_docs(1, 3000, 0, 99)[0];
  const double n_long = double(from_long->encode(held).size());
  const double n_lines = double(from_lines->encode(held).size());
  EXPECT_LT(n_long / n_lines, 1.05) << n_long << " vs " << n_lines;
  EXPECT_GT(n_long / n_lines, 0.95) << n_long << " vs " << n_lines;
  EXPECT_LT(1.5 * double(from_mixed->encode(held).size()), double(short_only->encode(held).size()));
  EXPECT_EQ(from_long->decode(from_long->encode(held)), held);
}

TEST(BpeTokenizer, RoundTripsNewlinesBlankLinesCjkAndEmoji) {
  auto tok = train_bpe();
  EXPECT_EQ(tok->type(), "bpe");
  EXPECT_LE(tok->vocab_size(), 400);
  EXPECT_GT(tok->vocab_size(), 4 + 256);
  for (const std::string text :
       {"the quick brown fox", "line one\n\nline three\n", "  two  spaces ", "床前明月光\n疑是地上霜",
        "emoji 😀🚀 and 鱻 unseen", "tab\there", "\n", ""}) {
    const auto ids = tok->encode(text);
    for (int32_t id : ids) {
      EXPECT_GE(id, kNumSpecialIds) << text;  // byte fallback: nothing is unknown
      EXPECT_LT(id, tok->vocab_size());
    }
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Learned merges shorten frequent text.
  EXPECT_LT(tok->encode("the quick brown fox").size(), std::string("the quick brown fox").size());
}

TEST(BpeTokenizer, LiteralEosIsTextAndSpecialsDecodeToNothing) {
  auto tok = train_bpe();
  const auto ids = tok->encode("<EOS><BOS><PAD><UNK>");
  for (int32_t id : ids) EXPECT_GE(id, kNumSpecialIds);
  EXPECT_EQ(tok->decode(ids), "<EOS><BOS><PAD><UNK>");
  auto abc = tok->encode("abc");
  std::vector<int32_t> with = {kBosId};
  with.insert(with.end(), abc.begin(), abc.end());
  with.push_back(kUnkId);
  with.push_back(kEosId);
  with.push_back(kPadId);
  EXPECT_EQ(tok->decode(with), "abc");
}

TEST(BpeTokenizer, SaveLoadAndDeterministicTraining) {
  TempDir dir;
  auto tok = train_bpe(1);
  tok->save(dir / "bpe.mllm");
  auto back = load_tokenizer(dir / "bpe.mllm");
  EXPECT_EQ(back->type(), "bpe");
  EXPECT_EQ(back->fingerprint(), tok->fingerprint());
  EXPECT_EQ(back->vocab_size(), tok->vocab_size());
  const std::string probe = "jumps over 鄉 😀\n\nend";
  EXPECT_EQ(back->encode(probe), tok->encode(probe));
  // Same corpus, other thread count: the same model.
  EXPECT_EQ(train_bpe(2)->fingerprint(), tok->fingerprint());
}

TEST(BpeTokenizer, TooSmallVocabularyIsADataError) {
  TokenizerConfig c;
  c.type = "bpe";
  c.vocab_size = 100;  // below 256 byte pieces + specials + characters
  EXPECT_TRUE(throws_with<DataError>([&] { train_tokenizer(c, bpe_corpus()); },
                                     {"vocab_size"}));
}

TEST(BpeTokenizer, CharacterCoverageNamesTheSmallestVocabularyThatWorks) {
  // 600 distinct CJK characters, each exactly 3 times (36 lines of 50). Sentencepiece keeps the
  // most frequent characters until they cover `coverage` of the 1800 occurrences: 0.9995 needs
  // all 600 (599/600 = 0.99833 < 0.9995), 0.98 needs 588 (588/600 = 0.98). Each also needs 256
  // byte pieces + 4 specials: smallest vocab_size 860 and 848.
  std::vector<std::string> docs;
  for (int line = 0; line < 36; ++line) {
    std::string text;
    for (int t = 0; t < 50; ++t) {
      const unsigned cp = 0x4E00 + unsigned((line * 50 + t) % 600);  // 3-byte UTF-8
      text += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    }
    docs.push_back(text);
  }
  TokenizerConfig c;
  c.type = "bpe";
  c.character_coverage = 0.9995;
  c.vocab_size = 859;
  EXPECT_TRUE(throws_with<DataError>([&] { train_tokenizer(c, docs); },
                                     {"smallest vocab_size that works is 860", "0.98 needs 848",
                                      "data.tokenizer.character_coverage"}));
  c.vocab_size = 860;  // sentencepiece itself agrees with the figure
  EXPECT_GE(train_tokenizer(c, docs)->vocab_size(), 860 - 1);
  c.character_coverage = 0.98;
  c.vocab_size = 848;
  EXPECT_NO_THROW(train_tokenizer(c, docs));
  // Automatic coverage goes down to 0.98 at most: vocab_size 800 is refused naming 848.
  c.character_coverage = 0;
  c.vocab_size = 800;
  EXPECT_TRUE(throws_with<DataError>([&] { train_tokenizer(c, docs); },
                                     {"smallest vocab_size that works is 848"}));
  c.character_coverage = 0.5;  // below sentencepiece's range
  EXPECT_TRUE(throws_with<ConfigError>([&] { train_tokenizer(c, docs); },
                                       {"character_coverage", "0.98"}));
}

TEST(IncrementalDecoder, BpeNeverSplitsACharacter) {
  auto tok = train_bpe();
  const std::string text = "fox 😀 鱻\n";  // emoji and 鱻 go through byte pieces
  IncrementalDecoder dec(tok);
  std::string out;
  for (int32_t id : tok->encode(text)) {
    const std::string piece = dec.push(id);
    // Every emitted chunk is valid UTF-8 on its own.
    EXPECT_EQ(utf8_find_invalid(piece), std::string_view::npos);
    out += piece;
  }
  out += dec.flush();
  EXPECT_EQ(out, text);
  // A dangling partial character is replaced on flush.
  IncrementalDecoder dec2(tok);
  const auto ids = tok->encode("😀");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(dec2.push(ids[0]), "");
  EXPECT_EQ(dec2.flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace mllm
