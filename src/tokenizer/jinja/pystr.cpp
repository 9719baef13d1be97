#include "tokenizer/jinja/pystr.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace kestrel::jinja::py {

namespace {

constexpr char32_t kReplacement = 0xFFFD;

utf8proc_category_t Category(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

// Byte offset of code point index `cp` (clamped to the end).
size_t ByteOffset(std::string_view s, int64_t cp) {
  size_t pos = 0;
  for (int64_t i = 0; i < cp && pos < s.size(); ++i) pos += CharBytes(s, pos);
  return pos;
}

std::string_view SubstrCp(std::string_view s, int64_t start, int64_t end) {
  const size_t b = ByteOffset(s, start);
  const size_t e = ByteOffset(s, end);
  return s.substr(b, e > b ? e - b : 0);
}

template <class F>
std::string MapChars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t n = 0;
    const char32_t c = CharAt(s, pos, &n);
    AppendUtf8(out, f(c));
    pos += n;
  }
  return out;
}

bool InChars(char32_t c, const std::u32string& chars) {
  return chars.find(c) != std::u32string::npos;
}

}  // namespace

// ---------------------------------------------------------------- UTF-8

size_t CharBytes(std::string_view s, size_t pos) {
  size_t n = 0;
  CharAt(s, pos, &n);
  return n;
}

char32_t CharAt(std::string_view s, size_t pos, size_t* n_bytes) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    *n_bytes = 1;
    return b0;
  }
  size_t len = 0;
  char32_t c = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    c = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    c = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    c = b0 & 0x07;
  } else {
    *n_bytes = 1;
    return kReplacement;
  }
  if (pos + len > s.size()) {
    *n_bytes = 1;
    return kReplacement;
  }
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[pos + i]);
    if ((b & 0xC0) != 0x80) {
      *n_bytes = 1;
      return kReplacement;
    }
    c = (c << 6) | (b & 0x3F);
  }
  *n_bytes = len;
  return c;
}

void AppendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    AppendUtf8(out, kReplacement);
  }
}

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t n = 0;
    out.push_back(CharAt(s, pos, &n));
    pos += n;
  }
  return out;
}

std::string Encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(out, c);
  return out;
}

size_t Length(std::string_view s) {
  size_t n = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    pos += CharBytes(s, pos);
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------- classes

bool IsSpace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

size_t SpaceBytes(std::string_view s, size_t pos) {
  size_t n = 0;
  const char32_t c = CharAt(s, pos, &n);
  return IsSpace(c) ? n : 0;
}

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const auto cat = Category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool IsDecimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return Category(c) == UTF8PROC_CATEGORY_ND;
}

bool IsDigit(char32_t c) {
  if (IsDecimal(c)) return true;
  // Superscript and circled digits carry Numeric_Type=Digit.
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0x2070 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468);
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsAlnum(char32_t c) {
  return IsAlpha(c) || IsNumeric(c);
}

bool IsUpper(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  return Category(c) == UTF8PROC_CATEGORY_LU;
}

bool IsLower(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  return Category(c) == UTF8PROC_CATEGORY_LL;
}

bool IsCased(char32_t c) {
  if (c < 0x80) return IsUpper(c) || IsLower(c);
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool IsPrintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool IsWordChar(char32_t c) {
  return c == '_' || IsAlnum(c);
}

char32_t ToUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

char32_t ToTitle(char32_t c) {
  if (c < 0x80) return ToUpper(c);
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

// ---------------------------------------------------------------- case

namespace {

// Unconditional full case mappings of SpecialCasing.txt that str.upper()/title() apply and
// the one-to-one tables lack (the common ones: sharp s, Latin ligatures, n-apostrophe).
struct FullCase {
  char32_t c;
  const char* upper;
  const char* title;
};
constexpr FullCase kFullCase[] = {
    {0x00DF, "SS", "Ss"}, {0xFB00, "FF", "Ff"},   {0xFB01, "FI", "Fi"},
    {0xFB02, "FL", "Fl"}, {0xFB03, "FFI", "Ffi"}, {0xFB04, "FFL", "Ffl"},
    {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"},   {0x0149, "\u02BCN", "\u02BCN"},
};

const FullCase* FindFullCase(char32_t c) {
  if (c < 0xDF) return nullptr;
  for (const FullCase& f : kFullCase) {
    if (f.c == c) return &f;
  }
  return nullptr;
}

void AppendUpper(std::string& out, char32_t c, bool title) {
  if (const FullCase* f = FindFullCase(c)) {
    out += title ? f->title : f->upper;
    return;
  }
  AppendUtf8(out, title ? ToTitle(c) : ToUpper(c));
}

bool IsCaseIgnorable(char32_t c) {
  if (c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xAD || c == 0xB7 ||
      c == 0x2019) {
    return true;
  }
  if (c < 0x80) return false;
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME ||
         cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK;
}

// Greek capital sigma lowercases to final sigma at the end of a word (CPython's rule).
bool IsFinalSigma(const std::u32string& u, size_t i) {
  size_t j = i;
  while (j > 0 && IsCaseIgnorable(u[j - 1])) --j;
  if (j == 0 || !IsCased(u[j - 1])) return false;
  size_t k = i + 1;
  while (k < u.size() && IsCaseIgnorable(u[k])) ++k;
  return k == u.size() || !IsCased(u[k]);
}

void AppendLower(std::string& out, const std::u32string& u, size_t i) {
  const char32_t c = u[i];
  if (c == 0x130) {  // İ -> i + combining dot above
    out += "i\u0307";
  } else if (c == 0x3A3) {
    AppendUtf8(out, IsFinalSigma(u, i) ? 0x3C2 : 0x3C3);
  } else {
    AppendUtf8(out, ToLower(c));
  }
}

bool IsAsciiOnly(std::string_view s) {
  for (unsigned char ch : s) {
    if (ch >= 0x80) return false;
  }
  return true;
}

}  // namespace

std::string Upper(std::string_view s) {
  if (IsAsciiOnly(s)) return MapChars(s, ToUpper);
  std::string out;
  for (char32_t c : Decode(s)) AppendUpper(out, c, false);
  return out;
}

std::string Lower(std::string_view s) {
  if (IsAsciiOnly(s)) return MapChars(s, ToLower);
  const std::u32string u = Decode(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) AppendLower(out, u, i);
  return out;
}

std::string SwapCase(std::string_view s) {
  return MapChars(s, [](char32_t c) {
    if (IsUpper(c)) return ToLower(c);
    if (IsLower(c)) return ToUpper(c);
    return c;
  });
}

std::string Capitalize(std::string_view s) {
  const std::u32string u = Decode(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      AppendUpper(out, u[0], true);
    } else {
      AppendLower(out, u, i);
    }
  }
  return out;
}

std::string Title(std::string_view s) {
  const std::u32string u = Decode(s);
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased) {
      AppendLower(out, u, i);
    } else {
      AppendUpper(out, u[i], true);
    }
    previous_cased = IsCased(u[i]);
  }
  return out;
}

bool StrIsUpper(std::string_view s) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    if (IsLower(c) || (IsCased(c) && !IsUpper(c))) return false;
    if (IsUpper(c)) cased = true;
  }
  return cased;
}

bool StrIsLower(std::string_view s) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    if (IsUpper(c) || (IsCased(c) && !IsLower(c))) return false;
    if (IsLower(c)) cased = true;
  }
  return cased;
}

// ---------------------------------------------------------------- strip / split

std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::u32string set = chars ? Decode(*chars) : std::u32string();
  auto strip_me = [&](char32_t c) { return chars ? InChars(c, set) : IsSpace(c); };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      size_t n = 0;
      if (!strip_me(CharAt(s, begin, &n))) break;
      begin += n;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t n = 0;
      const char32_t c = CharAt(s, start, &n);
      if (start + n != end) {  // invalid tail byte: treat as a single non-matching char
        if (!strip_me(kReplacement)) break;
        end -= 1;
        continue;
      }
      if (!strip_me(c)) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = std::numeric_limits<int64_t>::max();
  if (!sep) {
    size_t pos = 0;
    while (true) {
      while (pos < s.size() && SpaceBytes(s, pos) > 0) pos += SpaceBytes(s, pos);
      if (pos >= s.size()) break;
      if (static_cast<int64_t>(out.size()) >= maxsplit) {
        out.emplace_back(s.substr(pos));
        break;
      }
      size_t end = pos;
      while (end < s.size() && SpaceBytes(s, end) == 0) end += CharBytes(s, end);
      out.emplace_back(s.substr(pos, end - pos));
      pos = end;
    }
    return out;
  }
  if (sep->empty()) throw std::invalid_argument("empty separator");
  size_t pos = 0;
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(*sep, pos);
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep->size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = std::numeric_limits<int64_t>::max();
  if (!sep) {
    const std::u32string u = Decode(s);
    int64_t end = static_cast<int64_t>(u.size());
    while (true) {
      while (end > 0 && IsSpace(u[end - 1])) --end;
      if (end <= 0) break;
      if (static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(Encode(u.substr(0, end)));
        break;
      }
      int64_t start = end;
      while (start > 0 && !IsSpace(u[start - 1])) --start;
      out.push_back(Encode(u.substr(start, end - start)));
      end = start;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  if (sep->empty()) throw std::invalid_argument("empty separator");
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit && end >= sep->size()) {
    const size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = Decode(s);
  size_t start = 0;
  size_t i = 0;
  while (i < u.size()) {
    const char32_t c = u[i];
    const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && eol < u.size() && u[eol] == '\n') ++eol;
    out.push_back(Encode(u.substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < u.size()) out.push_back(Encode(u.substr(start)));
  return out;
}

std::string Replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                    int64_t count) {
  if (count < 0) count = std::numeric_limits<int64_t>::max();
  std::string out;
  if (old_sub.empty()) {
    // Python inserts `new` before every character and at the end.
    size_t pos = 0;
    int64_t done = 0;
    while (pos <= s.size()) {
      if (done < count) {
        out.append(new_sub);
        ++done;
      }
      if (pos == s.size()) break;
      const size_t n = CharBytes(s, pos);
      out.append(s.substr(pos, n));
      pos += n;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (done < count) {
    const size_t hit = s.find(old_sub, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_sub);
    pos = hit + old_sub.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

void AdjustIndices(int64_t n, int64_t* start, int64_t* end) {
  if (*end > n) *end = n;
  if (*end < 0) *end = std::max<int64_t>(0, *end + n);
  if (*start < 0) *start = std::max<int64_t>(0, *start + n);
}

int64_t Find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
  if (start == 0 && end == INT64_MAX) {  // whole string: search bytes
    const size_t hit = reverse ? s.rfind(sub) : s.find(sub);
    return hit == std::string_view::npos ? -1 : static_cast<int64_t>(Length(s.substr(0, hit)));
  }
  const auto n = static_cast<int64_t>(Length(s));
  AdjustIndices(n, &start, &end);
  if (start > end) return -1;
  const std::string_view window = SubstrCp(s, start, end);
  const size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos) return -1;
  return start + static_cast<int64_t>(Length(window.substr(0, hit)));
}

int64_t Count(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  std::string_view window = s;
  if (start != 0 || end != INT64_MAX) {
    const auto n = static_cast<int64_t>(Length(s));
    AdjustIndices(n, &start, &end);
    if (start > end) return 0;
    window = SubstrCp(s, start, end);
  }
  if (sub.empty()) return static_cast<int64_t>(Length(window)) + 1;
  int64_t count = 0;
  size_t pos = 0;
  while (true) {
    const size_t hit = window.find(sub, pos);
    if (hit == std::string_view::npos) break;
    ++count;
    pos = hit + sub.size();
  }
  return count;
}

std::string Center(std::string_view s, int64_t width, char32_t fill) {
  const auto n = static_cast<int64_t>(Length(s));
  if (width <= n) return std::string(s);
  const int64_t marg = width - n;
  // CPython: left = marg / 2 + (marg & width & 1)
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) AppendUtf8(out, fill);
  out.append(s);
  for (int64_t i = 0; i < marg - left; ++i) AppendUtf8(out, fill);
  return out;
}

std::string Ljust(std::string_view s, int64_t width, char32_t fill, bool right) {
  const auto n = static_cast<int64_t>(Length(s));
  if (width <= n) return std::string(s);
  std::string pad;
  for (int64_t i = 0; i < width - n; ++i) AppendUtf8(pad, fill);
  return right ? pad + std::string(s) : std::string(s) + pad;
}

std::string Zfill(std::string_view s, int64_t width) {
  const auto n = static_cast<int64_t>(Length(s));
  if (width <= n) return std::string(s);
  std::string out(s);
  const size_t insert_at = (!out.empty() && (out[0] == '+' || out[0] == '-')) ? 1 : 0;
  out.insert(insert_at, static_cast<size_t>(width - n), '0');
  return out;
}

// ---------------------------------------------------------------- repr

std::string Repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  size_t pos = 0;
  char buf[16];
  while (pos < s.size()) {
    size_t n = 0;
    const char32_t c = CharAt(s, pos, &n);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (IsPrintable(c)) {
      out.append(s.substr(pos, n));
    } else if (c <= 0xFF) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c <= 0xFFFF) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
    pos += n;
  }
  out.push_back(quote);
  return out;
}

}  // namespace kestrel::jinja::py
