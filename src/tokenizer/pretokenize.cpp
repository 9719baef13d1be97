#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>

#include "tokenizer/unicode.h"

namespace kestrel::tok {

const char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

constexpr uint8_t kLetterOrNumber = kCharLetter | kCharNumber;
constexpr uint8_t kNotOther = kCharLetter | kCharNumber | kCharSpace;

struct CharInfo {
  uint32_t cp;
  uint32_t len;
  uint8_t flags;
};

// Code point classes with an ASCII shortcut; text must be valid UTF-8.
class Classifier {
 public:
  Classifier() : table_(GetCharTable()) {
    for (uint32_t c = 0; c < 128; ++c) ascii_[c] = table_.Flags(c);
  }
  CharInfo At(std::string_view text, size_t i) const {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) return {b, 1, ascii_[b]};
    int len;
    const uint32_t cp = DecodeUtf8(text.data() + i, &len);
    return {cp, static_cast<uint32_t>(len), table_.Flags(cp)};
  }
  // End of the run of characters, starting at i, whose flags intersect `mask`.
  size_t ScanWhile(std::string_view text, size_t i, uint8_t mask) const {
    while (i < text.size()) {
      const CharInfo c = At(text, i);
      if (!(c.flags & mask)) break;
      i += c.len;
    }
    return i;
  }
  // End of the run of characters that are neither letters, numbers nor whitespace.
  size_t ScanOther(std::string_view text, size_t i) const {
    while (i < text.size()) {
      const CharInfo c = At(text, i);
      if (c.flags & kNotOther) break;
      i += c.len;
    }
    return i;
  }

 private:
  const CharTable& table_;
  std::array<uint8_t, 128> ascii_{};
};

bool IsFold(uint32_t cp, char lower, bool case_insensitive) {
  if (cp == static_cast<uint32_t>(lower)) return true;
  if (!case_insensitive) return false;
  if (cp == static_cast<uint32_t>(lower - 'a' + 'A')) return true;
  return lower == 's' && cp == 0x17F;  // LATIN SMALL LETTER LONG S folds to 's'
}

// 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at p; returns the match end or 0.
size_t MatchContraction(const Classifier& cls, std::string_view text, size_t p,
                        bool case_insensitive) {
  const size_t q = p + 1;
  if (q >= text.size()) return 0;
  const CharInfo c = cls.At(text, q);
  for (char single : {'s', 't', 'm', 'd'}) {
    if (IsFold(c.cp, single, case_insensitive)) return q + c.len;
  }
  if (q + 1 >= text.size()) return 0;
  const auto next = static_cast<uint8_t>(text[q + 1]);
  if ((IsFold(c.cp, 'r', case_insensitive) || IsFold(c.cp, 'v', case_insensitive)) &&
      IsFold(next, 'e', case_insensitive)) {
    return q + 2;
  }
  if (IsFold(c.cp, 'l', case_insensitive) && IsFold(next, 'l', case_insensitive)) return q + 2;
  return 0;
}

// End of the match of \s+(?!\S) or \s+ at p (a whitespace character). With `newline_rule`,
// \s*[\r\n]+ is tried first (Llama 3 / Qwen patterns).
size_t MatchWhitespace(const Classifier& cls, std::string_view text, size_t p,
                       bool newline_rule) {
  size_t last_newline = std::string_view::npos;
  size_t last_start = p;
  size_t end = p;
  while (end < text.size()) {
    const CharInfo c = cls.At(text, end);
    if (!(c.flags & kCharSpace)) break;
    if (c.cp == '\r' || c.cp == '\n') last_newline = end;
    last_start = end;
    end += c.len;
  }
  if (newline_rule && last_newline != std::string_view::npos) return last_newline + 1;
  if (end == text.size()) return end;
  // \s+(?!\S) backtracks one character so that the last space goes with the next word.
  if (last_start > p) return last_start;
  return end;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
class LlamaFamilyMatcher final : public RegexMatcher {
 public:
  LlamaFamilyMatcher(int max_digits, const char* name) : max_digits_(max_digits), name_(name) {}

  void FindMatches(std::string_view text, std::vector<Span>* matches) const override {
    matches->clear();
    size_t p = 0;
    while (p < text.size()) {
      const size_t end = MatchAt(text, p);
      matches->push_back({static_cast<uint32_t>(p), static_cast<uint32_t>(end)});
      p = end;
    }
  }
  const char* kind() const override { return name_; }

 private:
  size_t MatchAt(std::string_view text, size_t p) const {
    const CharInfo c = cls_.At(text, p);
    const size_t q = p + c.len;
    if (c.cp == '\'') {
      const size_t end = MatchContraction(cls_, text, p, /*case_insensitive=*/true);
      if (end) return end;
    }
    if (c.flags & kCharLetter) return cls_.ScanWhile(text, q, kCharLetter);
    if (!(c.flags & kCharNumber) && c.cp != '\r' && c.cp != '\n' && q < text.size()) {
      const CharInfo d = cls_.At(text, q);
      if (d.flags & kCharLetter) return cls_.ScanWhile(text, q + d.len, kCharLetter);
    }
    if (c.flags & kCharNumber) {
      size_t end = q;
      for (int n = 1; n < max_digits_ && end < text.size(); ++n) {
        const CharInfo d = cls_.At(text, end);
        if (!(d.flags & kCharNumber)) break;
        end += d.len;
      }
      return end;
    }
    size_t other_start = std::string_view::npos;
    if (!(c.flags & kCharSpace)) {
      other_start = q;
    } else if (c.cp == ' ' && q < text.size()) {
      const CharInfo d = cls_.At(text, q);
      if (!(d.flags & kNotOther)) other_start = q + d.len;
    }
    if (other_start != std::string_view::npos) {
      size_t end = cls_.ScanOther(text, other_start);
      while (end < text.size() && (text[end] == '\r' || text[end] == '\n')) ++end;
      return end;
    }
    return MatchWhitespace(cls_, text, p, /*newline_rule=*/true);
  }

  Classifier cls_;
  int max_digits_;
  const char* name_;
};

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
class Gpt2Matcher final : public RegexMatcher {
 public:
  void FindMatches(std::string_view text, std::vector<Span>* matches) const override {
    matches->clear();
    size_t p = 0;
    while (p < text.size()) {
      const size_t end = MatchAt(text, p);
      matches->push_back({static_cast<uint32_t>(p), static_cast<uint32_t>(end)});
      p = end;
    }
  }
  const char* kind() const override { return "gpt2"; }

 private:
  size_t ClassRun(std::string_view text, size_t i, const CharInfo& first) const {
    if (first.flags & kCharLetter) return cls_.ScanWhile(text, i + first.len, kCharLetter);
    if (first.flags & kCharNumber) return cls_.ScanWhile(text, i + first.len, kCharNumber);
    return cls_.ScanOther(text, i + first.len);
  }

  size_t MatchAt(std::string_view text, size_t p) const {
    const CharInfo c = cls_.At(text, p);
    if (c.cp == '\'') {
      const size_t end = MatchContraction(cls_, text, p, /*case_insensitive=*/false);
      if (end) return end;
    }
    if (!(c.flags & kCharSpace)) return ClassRun(text, p, c);
    if (c.cp == ' ' && p + 1 < text.size()) {
      const CharInfo d = cls_.At(text, p + 1);
      if (!(d.flags & kCharSpace)) return ClassRun(text, p + 1, d);
    }
    return MatchWhitespace(cls_, text, p, /*newline_rule=*/false);
  }

  Classifier cls_;
};

class LiteralMatcher final : public RegexMatcher {
 public:
  explicit LiteralMatcher(std::string literal) : literal_(std::move(literal)) {}
  void FindMatches(std::string_view text, std::vector<Span>* matches) const override {
    matches->clear();
    if (literal_.empty()) {
      // An empty pattern matches at every character boundary, the end included.
      size_t i = 0;
      while (true) {
        matches->push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(i)});
        if (i >= text.size()) break;
        int len;
        DecodeUtf8(text.data() + i, &len);
        i += static_cast<size_t>(len);
      }
      return;
    }
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      matches->push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + literal_.size())});
      pos += literal_.size();
    }
  }
  const char* kind() const override { return "literal"; }

 private:
  std::string literal_;
};

// ---- PCRE2 -------------------------------------------------------------------------------

std::string RangesToClassBody(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::string body;
  char buf[48];
  for (const auto& [lo, hi] : ranges) {
    if (lo == hi) {
      std::snprintf(buf, sizeof(buf), "\\x{%X}", lo);
    } else {
      std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", lo, hi);
    }
    body += buf;
  }
  return body;
}

std::vector<std::pair<uint32_t, uint32_t>> Complement(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  // PCRE2 rejects surrogates in classes: cut them out.
  std::vector<std::pair<uint32_t, uint32_t>> clean;
  for (auto [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      clean.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) clean.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) clean.emplace_back(0xE000, hi);
  }
  return clean;
}

// The body of a PCRE2 character class (without brackets) equal to an Oniguruma class, or
// nullptr when the name is not one we translate. Cached: each table takes a pass over Unicode.
const std::string* OnigClassBody(const std::string& name, bool negated) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<std::string>> cache;
  const std::string key = (negated ? "^" : "") + name;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::unique_ptr<std::string> body;
  if (OnigClassRanges(name, &ranges)) {
    body = std::make_unique<std::string>(RangesToClassBody(negated ? Complement(ranges) : ranges));
  }
  return cache.emplace(key, std::move(body)).first->second.get();
}

// Per-thread match context with a JIT stack larger than PCRE2's 32 KiB default.
pcre2_match_context* JitContext() {
  struct Context {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    Context() {
      if (stack != nullptr && context != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~Context() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
    }
  };
  thread_local Context ctx;
  return ctx.context;
}

class Pcre2Matcher final : public RegexMatcher {
 public:
  explicit Pcre2Matcher(pcre2_code* code) : code_(code) {}
  ~Pcre2Matcher() override { pcre2_code_free(code_); }
  Pcre2Matcher(const Pcre2Matcher&) = delete;
  Pcre2Matcher& operator=(const Pcre2Matcher&) = delete;

  void FindMatches(std::string_view text, std::vector<Span>* matches) const override {
    matches->clear();
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t last_end = 0;
    size_t last_match_end = std::string_view::npos;
    while (last_end <= text.size()) {
      int rc = pcre2_match(code_, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, md,
                           JitContext());
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        // JIT stack exhausted (very long runs): the interpreter keeps its state on the heap.
        rc = pcre2_match(code_, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md, nullptr);
      }
      // No match, or a matching error past every limit: the rest of the text is not a match.
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t s = ov[0], e = ov[1];
      if (s == e && last_match_end == e) {
        // Like onig's find_iter: no empty match right after the previous match.
        int len = 1;
        if (last_end < text.size()) DecodeUtf8(text.data() + last_end, &len);
        last_end += static_cast<size_t>(len);
        continue;
      }
      last_end = e;
      last_match_end = e;
      matches->push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(e)});
    }
    pcre2_match_data_free(md);
  }
  const char* kind() const override { return "pcre2"; }

 private:
  pcre2_code* code_;
};

}  // namespace

std::string TranslateOnigurumaPattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      std::string name;
      bool negated = false;
      size_t next = i + 2;  // index after the escape
      if (e == 'p' || e == 'P') {
        // \p{L}, \pL, \P{N}, \p{^L}
        negated = e == 'P';
        if (next < pattern.size() && pattern[next] == '{') {
          const size_t close = pattern.find('}', next);
          if (close != std::string_view::npos) {
            name = std::string(pattern.substr(next + 1, close - next - 1));
            next = close + 1;
          }
        } else if (next < pattern.size()) {
          name = std::string(1, pattern[next]);
          next += 1;
        }
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name = name.substr(1);
        }
      } else if (std::string_view("sSwWdDhH").find(e) != std::string_view::npos) {
        // Oniguruma: \s is White_Space, \w is Unicode word, \d is Nd, \h is a hex digit.
        name = std::string(1, static_cast<char>(std::tolower(static_cast<unsigned char>(e))));
        negated = std::isupper(static_cast<unsigned char>(e)) != 0;
      }
      const std::string* body = name.empty() ? nullptr : OnigClassBody(name, negated);
      if (body != nullptr) {
        if (in_class) {
          out += *body;
        } else {
          out += "[";
          out += *body;
          out += "]";
        }
        i = next - 1;
        continue;
      }
      out += ch;
      out += e;
      ++i;
      continue;
    }
    if (!in_class && ch == '[') {
      in_class = true;
      out += ch;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (in_class && ch == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // POSIX class such as [:alpha:]: copy through its closing ":]".
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && ch == ']' && i != class_start) in_class = false;
    out += ch;
  }
  return out;
}

Result<std::unique_ptr<RegexMatcher>> MakePcre2Matcher(std::string_view pattern) {
  // Oniguruma (Ruby syntax) treats ^ and $ as line anchors: PCRE2's MULTILINE.
  constexpr uint32_t kCompileOptions = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  const std::string translated = TranslateOnigurumaPattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), kCompileOptions, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return InvalidArgument("cannot compile split regex '" + std::string(pattern) +
                           "': " + reinterpret_cast<const char*>(message));
  }
  // JIT is an optimization; the interpreter gives the same matches when it is unavailable.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<RegexMatcher>(new Pcre2Matcher(code));
}

Result<std::unique_ptr<RegexMatcher>> MakeRegexMatcher(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return std::unique_ptr<RegexMatcher>(new Gpt2Matcher());
  if (pattern == kLlama3Pattern) {
    return std::unique_ptr<RegexMatcher>(new LlamaFamilyMatcher(3, "llama3"));
  }
  if (pattern == kQwen2Pattern) {
    return std::unique_ptr<RegexMatcher>(new LlamaFamilyMatcher(1, "qwen2"));
  }
  return MakePcre2Matcher(pattern);
}

std::unique_ptr<RegexMatcher> MakeLiteralMatcher(std::string literal) {
  return std::make_unique<LiteralMatcher>(std::move(literal));
}

void SplitByMatches(std::string_view text, const std::vector<Span>& matches,
                    SplitBehavior behavior, bool invert, std::vector<Span>* pieces) {
  pieces->clear();
  // Pieces covering the whole text, each flagged as a match or not (HF Pattern::find_matches).
  struct Part {
    Span span;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  uint32_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.begin) parts.push_back({{prev, m.begin}, false});
    parts.push_back({m, true});
    prev = m.end;
  }
  if (prev != text.size()) parts.push_back({{prev, static_cast<uint32_t>(text.size())}, false});
  if (invert) {
    for (Part& p : parts) p.is_match = !p.is_match;
  }
  std::vector<Span> out;
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.push_back(p.span);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) out.push_back(p.span);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.span.end;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().begin = p.span.begin;
        } else {
          out.push_back(p.span);
        }
        previous_match = p.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  for (const Span& s : out) {
    if (s.end > s.begin) pieces->push_back(s);
  }
}

}  // namespace kestrel::tok
