// UTF-8 decoding and validation following RFC 3629 and Unicode 15 §3.9 (Table 3-7, well-formed
// byte sequences); replacement uses the "maximal subpart" practice (Unicode §3.9, U+FFFD).
#include "mllm/data/utf8.h"

namespace mllm {
namespace {

// Valid range of the second byte for a given lead byte (Table 3-7); {0,0} = invalid lead.
struct SecondRange {
  unsigned char lo, hi;
  int len;
};

SecondRange second_range(unsigned char b0) {
  if (b0 < 0x80) return {0, 0, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF) return {0x80, 0xBF, 2};
  if (b0 == 0xE0) return {0xA0, 0xBF, 3};
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) return {0x80, 0xBF, 3};
  if (b0 == 0xED) return {0x80, 0x9F, 3};  // excludes surrogates D800-DFFF
  if (b0 == 0xF0) return {0x90, 0xBF, 4};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {0x80, 0xBF, 4};
  if (b0 == 0xF4) return {0x80, 0x8F, 4};  // <= U+10FFFF
  return {0, 0, 0};
}

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t utf8_decode_one(std::string_view s, size_t pos, char32_t& cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  const SecondRange r = second_range(b0);
  if (r.len == 0 || avail < static_cast<size_t>(r.len)) return 0;
  if (p[1] < r.lo || p[1] > r.hi) return 0;
  for (int i = 2; i < r.len; ++i)
    if (!is_cont(p[i])) return 0;
  switch (r.len) {
    case 2: cp = (char32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F); break;
    case 3: cp = (char32_t(b0 & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F); break;
    default:
      cp = (char32_t(b0 & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
           (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
  return static_cast<size_t>(r.len);
}

size_t utf8_invalid_length(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const SecondRange r = second_range(p[0]);
  if (r.len <= 1) return 1;
  // A valid lead followed by a valid-so-far prefix: that prefix is one maximal subpart.
  size_t n = 1;
  if (n < avail && p[1] >= r.lo && p[1] <= r.hi) {
    ++n;
    while (n < avail && n < static_cast<size_t>(r.len) && is_cont(p[n])) ++n;
  }
  return n;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_find_invalid(std::string_view s) {
  size_t pos = 0;
  char32_t cp;
  while (pos < s.size()) {
    // ASCII fast path: most corpus bytes of Latin text.
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = utf8_decode_one(s, pos, cp);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  char32_t cp;
  while (pos < s.size()) {
    const size_t n = utf8_decode_one(s, pos, cp);
    if (n > 0) {
      out.append(s.data() + pos, n);
      pos += n;
    } else {
      utf8_append(out, kReplacementChar);
      pos += utf8_invalid_length(s, pos);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last (up to 3) bytes can belong to an unfinished character.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if (is_cont(b)) continue;
    const SecondRange r = second_range(b);
    if (r.len <= 1 || static_cast<size_t>(r.len) <= back) return n;  // complete or invalid lead
    // A lead byte whose sequence is still short: hold it back only if what follows is a valid
    // beginning (otherwise it will never complete; emit it and let the decoder replace it).
    const size_t start = n - back;
    if (back >= 2) {
      const auto b1 = static_cast<unsigned char>(s[start + 1]);
      if (b1 < r.lo || b1 > r.hi) return n;
    }
    return start;
  }
  return n;
}

bool is_unicode_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_blank_text(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {  // the common case: ASCII
      if (b != ' ' && (b < 0x09 || b > 0x0D)) return false;
      ++pos;
      continue;
    }
    char32_t cp = 0;
    const size_t n = utf8_decode_one(s, pos, cp);
    if (n == 0 || !is_unicode_space(cp)) return false;
    pos += n;
  }
  return true;
}

}  // namespace mllm
