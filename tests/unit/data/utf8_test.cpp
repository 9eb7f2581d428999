// UTF-8 decoding / validation / repair, and the FNV-1a test vectors.
#include <gtest/gtest.h>

#include "mllm/data/hash.h"
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

TEST(Utf8, DecodesOneToFourByteSequences) {
  // "a", "é" (C3 A9), "春" (E6 98 A5), "😀" (F0 9F 98 80): code points from the Unicode charts.
  const std::string s = "a\xC3\xA9\xE6\x98\xA5\xF0\x9F\x98\x80";
  char32_t cp = 0;
  EXPECT_EQ(utf8_decode_one(s, 0, cp), 1u);
  EXPECT_EQ(cp, U'a');
  EXPECT_EQ(utf8_decode_one(s, 1, cp), 2u);
  EXPECT_EQ(cp, char32_t(0xE9));
  EXPECT_EQ(utf8_decode_one(s, 3, cp), 3u);
  EXPECT_EQ(cp, char32_t(0x6625));
  EXPECT_EQ(utf8_decode_one(s, 6, cp), 4u);
  EXPECT_EQ(cp, char32_t(0x1F600));
  std::string back;
  for (char32_t c : {U'a', char32_t(0xE9), char32_t(0x6625), char32_t(0x1F600)}) utf8_append(back, c);
  EXPECT_EQ(back, s);
}

TEST(Utf8, RejectsOverlongSurrogateAndOutOfRange) {
  char32_t cp = 0;
  EXPECT_EQ(utf8_decode_one("\xC0\xAF", 0, cp), 0u);          // overlong '/'
  EXPECT_EQ(utf8_decode_one("\xE0\x80\xAF", 0, cp), 0u);      // overlong
  EXPECT_EQ(utf8_decode_one("\xED\xA0\x80", 0, cp), 0u);      // U+D800 surrogate
  EXPECT_EQ(utf8_decode_one("\xF4\x90\x80\x80", 0, cp), 0u);  // U+110000
  EXPECT_EQ(utf8_decode_one("\xE6\x98", 0, cp), 0u);          // truncated
  EXPECT_EQ(utf8_find_invalid("ok\xE6\x98\xA5 fine"), std::string_view::npos);
  EXPECT_EQ(utf8_find_invalid("ok\xFF"), 2u);
}

TEST(Utf8, ReplacesMaximalSubparts) {
  // Unicode §3.9 example: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c
  // FFFD FFFD d (U+FFFD is EF BF BD).
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
}

TEST(Utf8, CompletePrefixHoldsBackAnUnfinishedCharacter) {
  EXPECT_EQ(utf8_complete_prefix("ab\xE6\x98"), 2u);    // 春 missing its last byte
  EXPECT_EQ(utf8_complete_prefix("ab\xE6"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE6\x98\xA5"), 5u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xFF"), 3u);        // never valid: not held back
  EXPECT_EQ(utf8_complete_prefix("ab\xE6\x41"), 4u);    // broken sequence: not held back
}

TEST(Utf8, BlankTextIsUnicodeWhiteSpaceOnly) {
  // Every White_Space code point of Unicode's PropList.txt is blank alone; the neighbours and
  // look-alikes that are not White_Space (U+180E, U+200B, U+FEFF, U+001C) are not.
  const char32_t space[] = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                            0x2000, 0x2005, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  for (char32_t cp : space) {
    std::string s;
    utf8_append(s, cp);
    EXPECT_TRUE(is_unicode_space(cp)) << uint32_t(cp);
    EXPECT_TRUE(is_blank_text(s + s)) << uint32_t(cp);
  }
  for (char32_t cp : {char32_t(0x180E), char32_t(0x200B), char32_t(0xFEFF), char32_t(0x1C),
                      char32_t(0x2081), char32_t(0x3001)}) {
    std::string s;
    utf8_append(s, cp);
    EXPECT_FALSE(is_unicode_space(cp)) << uint32_t(cp);
    EXPECT_FALSE(is_blank_text(" " + s)) << uint32_t(cp);
  }
  EXPECT_TRUE(is_blank_text(""));
  EXPECT_TRUE(is_blank_text("\r\r"));
  EXPECT_FALSE(is_blank_text(" a "));
  EXPECT_FALSE(is_blank_text("\xe3\x80"));  // a truncated U+3000: invalid, not blank
}

TEST(Fnv1a64, MatchesPublishedTestVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace mllm
