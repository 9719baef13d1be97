// Python's str semantics over UTF-8 text: code-point indexing, whitespace, case mapping,
// strip/split/replace/find, repr quoting and float repr. Chat templates are Python code in
// disguise, so every string operation must give the byte-identical result CPython gives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::jinja::py {

// ---- UTF-8 ----
// Invalid bytes decode to U+FFFD (input JSON is validated upstream; this only keeps a broken
// template from crashing anything).
std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view s);
void AppendUtf8(std::string& out, char32_t c);
// Number of code points (Python len()).
size_t Length(std::string_view s);
// Byte length of the UTF-8 sequence starting at s[pos] (1 for invalid bytes).
size_t CharBytes(std::string_view s, size_t pos);
// Code point starting at s[pos]; *n_bytes receives its length.
char32_t CharAt(std::string_view s, size_t pos, size_t* n_bytes);

// ---- character classes (str.isspace, str.isalnum, ...) ----
bool IsSpace(char32_t c);
bool IsAlpha(char32_t c);
bool IsDecimal(char32_t c);
bool IsDigit(char32_t c);
bool IsNumeric(char32_t c);
bool IsAlnum(char32_t c);
bool IsUpper(char32_t c);
bool IsLower(char32_t c);
bool IsCased(char32_t c);
bool IsPrintable(char32_t c);
bool IsWordChar(char32_t c);  // regex \w
char32_t ToUpper(char32_t c);
char32_t ToLower(char32_t c);
char32_t ToTitle(char32_t c);

// Length in bytes of a Python-whitespace code point at s[pos], or 0.
size_t SpaceBytes(std::string_view s, size_t pos);

// ---- str methods ----
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Capitalize(std::string_view s);
std::string Title(std::string_view s);  // str.title()
std::string SwapCase(std::string_view s);
bool StrIsUpper(std::string_view s);
bool StrIsLower(std::string_view s);

// strip/lstrip/rstrip: chars == nullopt strips whitespace.
std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// split/rsplit: sep == nullopt splits on runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> SplitLines(std::string_view s, bool keepends);
std::string Replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                    int64_t count);
// Code-point index of the first/last occurrence of sub within [start, end), or -1.
int64_t Find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t Count(std::string_view s, std::string_view sub, int64_t start, int64_t end);
// Normalizes Python slice bounds for a sequence of length n (start/end may be negative).
void AdjustIndices(int64_t n, int64_t* start, int64_t* end);
std::string Center(std::string_view s, int64_t width, char32_t fill);
std::string Ljust(std::string_view s, int64_t width, char32_t fill, bool right);
std::string Zfill(std::string_view s, int64_t width);

// Python repr() of a str: quotes and escapes like CPython.
std::string Repr(std::string_view s);
// Python repr() of a float ("1.0", "1e+16", "inf", "nan").
std::string FloatRepr(double d);
// Python int(str, base) / float(str) parsing; nullopt when Python raises ValueError.
std::optional<int64_t> ParseInt(std::string_view s, int base);
std::optional<double> ParseFloat(std::string_view s);

}  // namespace kestrel::jinja::py
