// Unicode helpers for the tokenizer: UTF-8 decoding, lossy repair, character classes and NFC,
// all matching what Hugging Face `tokenizers` (Rust, Oniguruma regexes) does.
//
// Unicode versions differ between the libraries involved, so the classes here are not plain
// utf8proc data:
//  - Oniguruma (HF's regex engine) uses Unicode 16.0 for \p{L} and \p{N}; utf8proc here is 15.0.
//    The letters and numbers added in 16.0 are patched in (kUnicode16Additions in unicode.cpp).
//  - \s is exactly the White_Space property (U+0085, U+00A0, U+2028, U+3000 ... but not U+180E,
//    U+200B or U+FEFF), verified code point by code point against tokenizers 0.23.
//  - HF's NFC (unicode-normalization-alignments) predates Unicode 10: combining marks added since
//    then have class 0 there, and U+11930 does not compose. Such code points are "NFC barriers":
//    text is normalized in segments between them, which reproduces HF exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::tok {

// Per-code-point class bits.
enum CharFlag : uint8_t {
  kCharLetter = 1,       // \p{L} (Oniguruma, Unicode 16)
  kCharNumber = 2,       // \p{N}
  kCharSpace = 4,        // \s = White_Space
  kCharWord = 8,         // Rust regex \w (Alphabetic, M, Nd, Pc, Join_Control): single_word tokens
  kCharNfcUnstable = 16,  // may change under NFC (decomposes, combines, or reorders)
  kCharNfcBarrier = 32,   // class 0 / non-composing in HF's older NFC tables (see above)
};

// Two-stage lookup table over all code points, built once from utf8proc.
struct CharTable {
  std::vector<uint16_t> stage1;  // (0x1100,) block index per 256 code points
  std::vector<uint8_t> stage2;   // (n_blocks * 256,) flags
  uint8_t Flags(uint32_t cp) const {
    if (cp > 0x10FFFF) return 0;
    return stage2[(static_cast<size_t>(stage1[cp >> 8]) << 8) | (cp & 0xFF)];
  }
};
const CharTable& GetCharTable();

// Decodes one code point of valid UTF-8 at p (n_bytes >= 1 available); sets *len.
inline uint32_t DecodeUtf8(const char* p, int* len) {
  const auto b0 = static_cast<uint8_t>(p[0]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    *len = 2;
    return ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(p[1]) & 0x3Fu);
  }
  if (b0 < 0xF0) {
    *len = 3;
    return ((b0 & 0x0Fu) << 12) | ((static_cast<uint8_t>(p[1]) & 0x3Fu) << 6) |
           (static_cast<uint8_t>(p[2]) & 0x3Fu);
  }
  *len = 4;
  return ((b0 & 0x07u) << 18) | ((static_cast<uint8_t>(p[1]) & 0x3Fu) << 12) |
         ((static_cast<uint8_t>(p[2]) & 0x3Fu) << 6) | (static_cast<uint8_t>(p[3]) & 0x3Fu);
}

void AppendUtf8(uint32_t cp, std::string* out);

// Length of the valid UTF-8 sequence starting at s[i]; 0 when the bytes there are invalid.
// When the sequence is a valid but truncated prefix at the end of s, *truncated is set and the
// return value is 0.
size_t Utf8SequenceLength(std::string_view s, size_t i, bool* truncated);

bool IsValidUtf8(std::string_view s);

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
void AppendUtf8Lossy(std::string_view s, std::string* out);
std::string Utf8Lossy(std::string_view s);

// Splits s into a prefix that can be emitted now and a tail that may still become valid UTF-8
// when more bytes arrive. Returns the prefix length (the tail is at most 3 bytes).
size_t Utf8EmittablePrefix(std::string_view s);

// NFC as HF computes it. Returns false (and leaves *out untouched) when s is already normalized.
bool NfcNormalize(std::string_view s, std::string* out);

// Inclusive code point ranges of an Oniguruma class as HF's regexes see it: "s", "w", "d", "h"
// (\s \w \d \h) or a general category ("L", "N", "Lu", "P", ...). \s, \w, \d, \h, L and N
// are exact (Unicode 16 as in tokenizers 0.23); other categories follow utf8proc (Unicode 15).
// Returns false for an unknown name (surrogates are never included).
bool OnigClassRanges(std::string_view name, std::vector<std::pair<uint32_t, uint32_t>>* ranges);

}  // namespace kestrel::tok
