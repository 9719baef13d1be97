#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <functional>
#include <map>

#include "core/check.h"

namespace kestrel::tok {
namespace {

struct CpRange {
  uint32_t first;
  uint32_t last;
  uint8_t flag;
};

// Letters and numbers new in Unicode 16.0 (Oniguruma in tokenizers 0.23 knows them; utf8proc 2.8
// does not). Verified against tokenizers 0.23.2 for every code point.
constexpr CpRange kUnicode16Additions[] = {
    {0x1C89, 0x1C8A, kCharLetter},   {0xA7CB, 0xA7CD, kCharLetter},
    {0xA7DA, 0xA7DC, kCharLetter},   {0x105C0, 0x105F3, kCharLetter},
    {0x10D40, 0x10D49, kCharNumber}, {0x10D4A, 0x10D65, kCharLetter},
    {0x10D6F, 0x10D85, kCharLetter}, {0x10EC2, 0x10EC4, kCharLetter},
    {0x11380, 0x11389, kCharLetter}, {0x1138B, 0x1138B, kCharLetter},
    {0x1138E, 0x1138E, kCharLetter}, {0x11390, 0x113B5, kCharLetter},
    {0x113B7, 0x113B7, kCharLetter}, {0x113D1, 0x113D1, kCharLetter},
    {0x113D3, 0x113D3, kCharLetter}, {0x116D0, 0x116E3, kCharNumber},
    {0x11BC0, 0x11BE0, kCharLetter}, {0x11BF0, 0x11BF9, kCharNumber},
    {0x13460, 0x143FA, kCharLetter}, {0x16100, 0x1611D, kCharLetter},
    {0x16130, 0x16139, kCharNumber}, {0x16D40, 0x16D6C, kCharLetter},
    {0x16D70, 0x16D79, kCharNumber}, {0x18CFF, 0x18CFF, kCharLetter},
    {0x1CCF0, 0x1CCF9, kCharNumber}, {0x1E5D0, 0x1E5ED, kCharLetter},
    {0x1E5F0, 0x1E5F0, kCharLetter}, {0x1E5F1, 0x1E5FA, kCharNumber},
    {0x2EBF0, 0x2EE5D, kCharLetter},
};

// Code points that HF's NFC tables (pre-Unicode-10) treat as class-0, non-composing characters:
// marks added since (utf8proc gives them a non-zero combining class) and U+11930 (second half of
// the Unicode 13 composition U+11938). Verified against tokenizers 0.23.2.
constexpr std::pair<uint32_t, uint32_t> kNfcBarriers[] = {
    {0x898, 0x898},     {0x89C, 0x89F},     {0x8CA, 0x8CE},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1AC1, 0x1AC2},   {0x1AC5, 0x1AC9},   {0x1ACB, 0x1ACE},   {0x1DF6, 0x1DF8},
    {0x1DFA, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
    {0x10F48, 0x10F4A}, {0x10F4C, 0x10F4C}, {0x10F82, 0x10F82}, {0x10F84, 0x10F84},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0},
    {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4ED}, {0x1E4EF, 0x1E4EF},
};

// Unicode White_Space (what Oniguruma's and Rust regex's \s match).
constexpr std::pair<uint32_t, uint32_t> kWhiteSpace[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
    {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
    {0x205F, 0x205F}, {0x3000, 0x3000},
};

// What Oniguruma's \w matches beyond utf8proc's L, M, Nd and Pc: Latin-1 superscripts and
// fractions (its ISO-8859-1 ctype table), letter numbers, other alphabetic symbols and Unicode
// 16.0 additions. Verified against tokenizers 0.23.2 for every code point.
constexpr std::pair<uint32_t, uint32_t> kOnigWordExtra[] = {
    {0xB2, 0xB3},       {0xB9, 0xB9},       {0xBC, 0xBE},       {0x897, 0x897},
    {0x16EE, 0x16F0},   {0x1C89, 0x1C8A},   {0x2160, 0x2182},   {0x2185, 0x2188},
    {0x24B6, 0x24E9},   {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303A},
    {0xA6E6, 0xA6EF},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x10140, 0x10174},
    {0x10341, 0x10341}, {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x105C0, 0x105F3},
    {0x10D40, 0x10D65}, {0x10D69, 0x10D6D}, {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4},
    {0x10EFC, 0x10EFC}, {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E},
    {0x11390, 0x113B5}, {0x113B7, 0x113C0}, {0x113C2, 0x113C2}, {0x113C5, 0x113C5},
    {0x113C7, 0x113CA}, {0x113CC, 0x113D3}, {0x113E1, 0x113E2}, {0x116D0, 0x116E3},
    {0x11BC0, 0x11BE0}, {0x11BF0, 0x11BF9}, {0x11F5A, 0x11F5A}, {0x12400, 0x1246E},
    {0x13460, 0x143FA}, {0x16100, 0x16139}, {0x16D40, 0x16D6C}, {0x16D70, 0x16D79},
    {0x18CFF, 0x18CFF}, {0x1CCF0, 0x1CCF9}, {0x1E5D0, 0x1E5FA}, {0x1F130, 0x1F149},
    {0x1F150, 0x1F169}, {0x1F170, 0x1F189}, {0x2EBF0, 0x2EE5D},
};

// Other_Alphabetic code points outside the mark categories (symbols such as circled letters);
// with L, Nl and M they make up Alphabetic for Rust's \w.
constexpr std::pair<uint32_t, uint32_t> kOtherAlphabeticSymbols[] = {
    {0x24B6, 0x24E9}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189},
};

template <class Ranges>
void SetFlags(const Ranges& ranges, uint8_t flag, std::vector<uint8_t>* flat) {
  for (const auto& r : ranges) {
    for (uint32_t cp = r.first; cp <= r.second; ++cp) (*flat)[cp] |= flag;
  }
}

// NFC of a single code point differs from itself (singletons, composition exclusions).
bool NfcChangesAlone(uint32_t cp) {
  std::string utf8;
  AppendUtf8(cp, &utf8);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                          static_cast<utf8proc_ssize_t>(utf8.size()), &mapped,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE |
                                                                         UTF8PROC_COMPOSE));
  const bool changed = n < 0 || std::string_view(reinterpret_cast<const char*>(mapped),
                                                 static_cast<size_t>(n)) != utf8;
  std::free(mapped);
  return changed;
}

CharTable BuildCharTable() {
  constexpr uint32_t kNumCodePoints = 0x110000;
  std::vector<uint8_t> flat(kNumCodePoints, 0);
  for (uint32_t cp = 0; cp < kNumCodePoints; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const utf8proc_property_t* prop = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    const int cat = prop->category;
    uint8_t flags = 0;
    if (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) flags |= kCharLetter;
    if (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) flags |= kCharNumber;
    if ((cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ND) ||
        cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC) {
      flags |= kCharWord;
    }
    if (prop->combining_class != 0) flags |= kCharNfcUnstable;
    flat[cp] |= flags;
    // Canonical decompositions: a code point after the first position may be the second half
    // of a composition, so it may combine with what precedes it; the decomposing code point
    // itself only changes on its own when its NFC differs (otherwise any change involves the
    // unstable code points that follow it).
    const bool hangul = cp >= 0xAC00 && cp <= 0xD7A3;
    if (!hangul && (prop->decomp_seqindex == UINT16_MAX || prop->decomp_type != 0)) continue;
    std::array<utf8proc_int32_t, 8> buf{};
    int boundclass = 0;
    const utf8proc_ssize_t n = utf8proc_decompose_char(
        static_cast<utf8proc_int32_t>(cp), buf.data(), static_cast<utf8proc_ssize_t>(buf.size()),
        UTF8PROC_DECOMPOSE, &boundclass);
    if (n <= 0 || n > static_cast<utf8proc_ssize_t>(buf.size())) continue;
    if (n == 1 && static_cast<uint32_t>(buf[0]) == cp) continue;
    for (utf8proc_ssize_t i = 1; i < n; ++i) flat[static_cast<uint32_t>(buf[i])] |= kCharNfcUnstable;
    if (!hangul && NfcChangesAlone(cp)) flat[cp] |= kCharNfcUnstable;
  }
  SetFlags(kWhiteSpace, kCharSpace, &flat);
  SetFlags(kOtherAlphabeticSymbols, kCharWord, &flat);
  flat[0x200C] |= kCharWord;  // Join_Control
  flat[0x200D] |= kCharWord;
  for (const auto& r : kUnicode16Additions) {
    for (uint32_t cp = r.first; cp <= r.last; ++cp) flat[cp] |= r.flag | kCharWord;
  }
  SetFlags(kNfcBarriers, kCharNfcUnstable | kCharNfcBarrier, &flat);
  CharTable table;
  table.stage1.resize(kNumCodePoints >> 8);
  std::map<std::string, uint16_t> blocks;
  for (uint32_t b = 0; b < (kNumCodePoints >> 8); ++b) {
    const std::string block(reinterpret_cast<const char*>(flat.data()) + (b << 8), 256);
    auto [it, inserted] = blocks.emplace(block, static_cast<uint16_t>(blocks.size()));
    if (inserted) table.stage2.insert(table.stage2.end(), block.begin(), block.end());
    table.stage1[b] = it->second;
  }
  return table;
}

}  // namespace

const CharTable& GetCharTable() {
  static const CharTable table = BuildCharTable();
  return table;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t Utf8SequenceLength(std::string_view s, size_t i, bool* truncated) {
  *truncated = false;
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *truncated = true;
      return 0;
    }
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return 0;
  }
  return need;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool truncated;
    const size_t len = Utf8SequenceLength(s, i, &truncated);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendUtf8Lossy(std::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    bool truncated;
    const size_t len = Utf8SequenceLength(s, i, &truncated);
    if (len > 0) {
      out->append(s.data() + i, len);
      i += len;
      continue;
    }
    // Maximal subpart: the lead byte plus the continuation bytes that were still acceptable.
    size_t skip = 1;
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 >= 0xC2 && b0 <= 0xF4) {
      uint8_t lo = 0x80, hi = 0xBF;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
      const size_t need = b0 < 0xE0 ? 2 : (b0 < 0xF0 ? 3 : 4);
      while (skip < need && i + skip < s.size()) {
        const auto b = static_cast<uint8_t>(s[i + skip]);
        const uint8_t min = skip == 1 ? lo : 0x80;
        const uint8_t max = skip == 1 ? hi : 0xBF;
        if (b < min || b > max) break;
        ++skip;
      }
    }
    out->append("\xEF\xBF\xBD");
    i += skip;
  }
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  AppendUtf8Lossy(s, &out);
  return out;
}

size_t Utf8EmittablePrefix(std::string_view s) {
  // Only a valid-but-truncated sequence at the very end is held back; it starts within the
  // last 3 bytes.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0xC2 || b > 0xF4) continue;  // not a lead byte
    bool truncated;
    Utf8SequenceLength(s, i, &truncated);
    if (truncated) return i;
  }
  return s.size();
}

namespace {

void AppendNfcSegment(std::string_view seg, std::string* out) {
  if (seg.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(seg.data()),
                   static_cast<utf8proc_ssize_t>(seg.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  // The input is valid UTF-8 (callers repair it first), so utf8proc cannot fail here.
  KCHECK_MSG(n >= 0 && mapped != nullptr, "utf8proc_map failed on valid UTF-8");
  out->append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
}

}  // namespace

bool NfcNormalize(std::string_view s, std::string* out) {
  // NFC only changes text around "unstable" code points (see BuildCharTable). A stable code
  // point can neither combine with what precedes it nor be reordered, so the text splits into
  // segments, each a stable code point followed by unstable ones, that normalize independently;
  // only segments holding an unstable code point are passed to utf8proc. A barrier code point
  // (class 0 in HF's older tables) is a segment of its own that is copied as is.
  const CharTable& table = GetCharTable();
  std::string result;
  bool changed = false;
  size_t copied = 0;     // s[0, copied) is already in result
  size_t seg_start = 0;  // start of the current segment
  bool seg_dirty = false;
  auto flush = [&](size_t seg_end) {
    if (!seg_dirty) return;
    if (!changed) result.reserve(s.size() + 16);
    changed = true;
    result.append(s.data() + copied, seg_start - copied);
    AppendNfcSegment(s.substr(seg_start, seg_end - seg_start), &result);
    copied = seg_end;
    seg_dirty = false;
  };
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {  // ASCII is stable
      flush(i);
      seg_start = i;
      ++i;
      continue;
    }
    int len;
    const uint8_t flags = table.Flags(DecodeUtf8(s.data() + i, &len));
    if (flags & kCharNfcBarrier) {
      flush(i);
      seg_start = i + static_cast<size_t>(len);
    } else if (flags & kCharNfcUnstable) {
      seg_dirty = true;
    } else {
      flush(i);
      seg_start = i;
    }
    i += static_cast<size_t>(len);
  }
  flush(s.size());
  if (!changed) return false;
  result.append(s.data() + copied, s.size() - copied);
  if (result == s) return false;
  *out = std::move(result);
  return true;
}

bool OnigClassRanges(std::string_view name, std::vector<std::pair<uint32_t, uint32_t>>* ranges) {
  static const char* const kCategoryNames[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc",
                                               "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
                                               "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs",
                                               "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};
  const CharTable& table = GetCharTable();
  auto in_list = [](uint32_t cp, const auto& list) {
    for (const auto& r : list) {
      if (cp >= r.first && cp <= r.second) return true;
    }
    return false;
  };
  auto category = [](uint32_t cp) {
    return kCategoryNames[utf8proc_category(static_cast<utf8proc_int32_t>(cp))];
  };
  std::function<bool(uint32_t)> pred;
  if (name == "s") {
    pred = [&](uint32_t cp) { return (table.Flags(cp) & kCharSpace) != 0; };
  } else if (name == "L") {
    pred = [&](uint32_t cp) { return (table.Flags(cp) & kCharLetter) != 0; };
  } else if (name == "N") {
    pred = [&](uint32_t cp) { return (table.Flags(cp) & kCharNumber) != 0; };
  } else if (name == "h") {
    pred = [](uint32_t cp) {
      return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'f') || (cp >= 'A' && cp <= 'F');
    };
  } else if (name == "d" || name == "Nd") {
    pred = [&](uint32_t cp) {
      if (std::string_view(category(cp)) == "Nd") return true;
      for (const auto& r : kUnicode16Additions) {
        if (r.flag == kCharNumber && cp >= r.first && cp <= r.last) return true;
      }
      return false;
    };
  } else if (name == "w") {
    pred = [&](uint32_t cp) {
      const std::string_view c = category(cp);
      return c[0] == 'L' || c[0] == 'M' || c == "Nd" || c == "Pc" || in_list(cp, kOnigWordExtra);
    };
  } else if (name.size() == 1 && std::string_view("MPSZC").find(name[0]) != std::string_view::npos) {
    pred = [&](uint32_t cp) { return category(cp)[0] == name[0]; };
  } else if (name.size() == 2) {
    bool known = false;
    for (const char* c : kCategoryNames) known = known || name == c;
    if (!known) return false;
    pred = [&](uint32_t cp) { return name == category(cp); };
  } else {
    return false;
  }
  ranges->clear();
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (!pred(cp)) continue;
    if (!ranges->empty() && ranges->back().second + 1 == cp) {
      ranges->back().second = cp;
    } else {
      ranges->emplace_back(cp, cp);
    }
  }
  return true;
}

}  // namespace kestrel::tok
