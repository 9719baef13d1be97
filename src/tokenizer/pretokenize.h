// Regex splitting for the pre-tokenizers (HF `Split` and `ByteLevel(use_regex=true)`).
//
// HF runs these patterns with Oniguruma. The split patterns of GPT-2 (ByteLevel), Llama 3 and
// Qwen 2/2.5/3 are matched by hand-written matchers (exact, several times faster than a regex
// engine); any other pattern runs on PCRE2 (UTF, JIT) after \s, \S, \p{L}, \p{N} (and \w, \h)
// are rewritten into explicit classes with Oniguruma's meaning (see unicode.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kestrel::tok {

struct Span {
  uint32_t begin;  // byte offsets, [begin, end)
  uint32_t end;
};

// Non-overlapping matches found left to right, as Rust's onig::Regex::find_iter reports them.
class RegexMatcher {
 public:
  virtual ~RegexMatcher() = default;
  virtual void FindMatches(std::string_view text, std::vector<Span>* matches) const = 0;
  // A short name for diagnostics ("llama3", "qwen2", "gpt2", "pcre2", "literal").
  virtual const char* kind() const = 0;
};

// The GPT-2 pattern used by ByteLevel(use_regex=true):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
extern const char kGpt2Pattern[];
// Llama 3 (max 3 digits per number) and Qwen 2/2.5/3 (one digit per number) split patterns.
extern const char kLlama3Pattern[];
extern const char kQwen2Pattern[];

// Picks the hand-written matcher for a known pattern, PCRE2 otherwise.
Result<std::unique_ptr<RegexMatcher>> MakeRegexMatcher(std::string_view pattern);
// Always PCRE2 (used by tests to cross-check the hand-written matchers).
Result<std::unique_ptr<RegexMatcher>> MakePcre2Matcher(std::string_view pattern);
// Split on a literal string (HF SplitPattern::String).
std::unique_ptr<RegexMatcher> MakeLiteralMatcher(std::string literal);

// Rewrites Oniguruma escapes whose meaning differs in PCRE2 (exposed for tests).
std::string TranslateOnigurumaPattern(std::string_view pattern);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF NormalizedString::split: turns matches into the pieces kept for the next step; empty pieces
// are dropped (as PreTokenizedString::split does).
void SplitByMatches(std::string_view text, const std::vector<Span>& matches,
                    SplitBehavior behavior, bool invert, std::vector<Span>* pieces);

}  // namespace kestrel::tok
