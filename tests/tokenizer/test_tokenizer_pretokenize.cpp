// Pre-tokenizer regexes and Unicode helpers. Expected pieces were checked against HF
// tokenizers 0.23 (PreTokenizer.pre_tokenize_str on the real Qwen3 / Llama 3 / GPT-2 patterns).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace kestrel::tok {
namespace {

using Pieces = std::vector<std::string>;

Pieces Split(const RegexMatcher& m, std::string_view text) {
  std::vector<Span> spans;
  m.FindMatches(text, &spans);
  Pieces out;
  for (const Span& s : spans) out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

struct SplitCase {
  const char* text;
  Pieces qwen, llama, gpt2;
};

const std::vector<SplitCase>& SplitCases() {
  static const std::vector<SplitCase> cases = {
      {"Hello world", {"Hello", " world"}, {"Hello", " world"}, {"Hello", " world"}},
      {"   word", {"  ", " word"}, {"  ", " word"}, {"  ", " word"}},
      {"a  \n\n  b", {"a", "  \n\n", " ", " b"}, {"a", "  \n\n", " ", " b"},
       {"a", "  \n\n ", " b"}},
      {"IT'S", {"IT", "'S"}, {"IT", "'S"}, {"IT", "'", "S"}},
      {"'sa", {"'s", "a"}, {"'s", "a"}, {"'s", "a"}},
      {"x'\xC5\xBF", {"x", "'\xC5\xBF"}, {"x", "'\xC5\xBF"}, {"x", "'", "\xC5\xBF"}},  // 'ſ
      {"123456", {"1", "2", "3", "4", "5", "6"}, {"123", "456"}, {"123456"}},
      {"foo!!!\n\nbar", {"foo", "!!!\n\n", "bar"}, {"foo", "!!!\n\n", "bar"},
       {"foo", "!!!", "\n", "\n", "bar"}},
      {"\t!!", {"\t", "!!"}, {"\t", "!!"}, {"\t", "!!"}},
      {"\tword", {"\tword"}, {"\tword"}, {"\t", "word"}},
      {"a\xC2\xA0" "b", {"a", "\xC2\xA0" "b"}, {"a", "\xC2\xA0" "b"}, {"a", "\xC2\xA0", "b"}},
      // U+180E is not White_Space (PCRE2's \s would say it is).
      {"x \xE1\xA0\x8E", {"x", " \xE1\xA0\x8E"}, {"x", " \xE1\xA0\x8E"}, {"x", " \xE1\xA0\x8E"}},
      {"end   ", {"end", "   "}, {"end", "   "}, {"end", "   "}},
      {"don't\r\nstop", {"don", "'t", "\r\n", "stop"}, {"don", "'t", "\r\n", "stop"},
       {"don", "'t", "\r", "\n", "stop"}},
      {"\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
       {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C"},
       {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C"},
       {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C"}},
      {"\xC2\x85x", {"\xC2\x85x"}, {"\xC2\x85x"}, {"\xC2\x85", "x"}},  // U+0085 is \s
      {"x\xE2\x80\xA8\xE2\x80\xA8y", {"x", "\xE2\x80\xA8", "\xE2\x80\xA8y"},
       {"x", "\xE2\x80\xA8", "\xE2\x80\xA8y"}, {"x", "\xE2\x80\xA8", "\xE2\x80\xA8", "y"}},
  };
  return cases;
}

TEST(PreTokenize, KnownPatternsSplitLikeHuggingFace) {
  for (const bool pcre : {false, true}) {
    auto make = [&](const char* p) { return pcre ? MakePcre2Matcher(p) : MakeRegexMatcher(p); };
    auto qwen = make(kQwen2Pattern);
    auto llama = make(kLlama3Pattern);
    auto gpt2 = make(kGpt2Pattern);
    ASSERT_TRUE(qwen.ok() && llama.ok() && gpt2.ok());
    for (const SplitCase& c : SplitCases()) {
      EXPECT_EQ(Split(**qwen, c.text), c.qwen) << "qwen pcre=" << pcre << " " << c.text;
      EXPECT_EQ(Split(**llama, c.text), c.llama) << "llama pcre=" << pcre << " " << c.text;
      EXPECT_EQ(Split(**gpt2, c.text), c.gpt2) << "gpt2 pcre=" << pcre << " " << c.text;
    }
  }
}

TEST(PreTokenize, KnownPatternsUseHandWrittenMatchers) {
  EXPECT_STREQ((*MakeRegexMatcher(kQwen2Pattern))->kind(), "qwen2");
  EXPECT_STREQ((*MakeRegexMatcher(kLlama3Pattern))->kind(), "llama3");
  EXPECT_STREQ((*MakeRegexMatcher(kGpt2Pattern))->kind(), "gpt2");
  EXPECT_STREQ((*MakeRegexMatcher("\\s+|\\S+"))->kind(), "pcre2");
}

// Random strings over characters that exercise every alternative of the patterns.
std::vector<std::string> RandomTexts(size_t n, uint32_t seed) {
  const std::vector<std::string> alphabet = {
      " ", "  ", "\t", "\n", "\r", "\r\n", "\xE3\x80\x80", "\xC2\xA0", "\xE2\x80\xA8",
      "\xC2\x85", "\xE1\xA0\x8E", "\xEF\xBB\xBF", "a", "B", "\xC3\xA9", "e\xCC\x81",
      "\xE4\xB8\xAD", "\xC5\xBF", "'", "s", "S", "t", "re", "VE", "ll", "m", "D", "1", "12",
      "\xD9\xA3", "\xC2\xB2", "\xE2\x85\xAB", "!", ".", "_", "(", "\"", "\xF0\x9F\x98\x80",
      "\xCC\x81", "\xE1\xB2\x89", "\xF0\x90\xB5\x80", "<|im_end|>", std::string(1, '\0')};
  std::mt19937 rng(seed);
  std::vector<std::string> texts;
  for (size_t i = 0; i < n; ++i) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 14);
    for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  return texts;
}

TEST(PreTokenize, HandWrittenMatchersAgreeWithPcre2) {
  std::vector<std::string> texts = RandomTexts(20000, 1234);
  for (const std::string& t : testing::ReadCorpus()) texts.push_back(t);
  ASSERT_GT(texts.size(), 22000u) << "corpus missing: tests/data/tokenizer/corpus.jsonl";
  for (const char* pattern : {kQwen2Pattern, kLlama3Pattern, kGpt2Pattern}) {
    auto fast = MakeRegexMatcher(pattern);
    auto pcre = MakePcre2Matcher(pattern);
    ASSERT_TRUE(fast.ok() && pcre.ok());
    ASSERT_STRNE((*fast)->kind(), "pcre2");
    size_t n_diff = 0;
    for (const std::string& t : texts) {
      if (Split(**fast, t) != Split(**pcre, t) && ++n_diff <= 5) {
        ADD_FAILURE() << (*fast)->kind() << " differs from PCRE2 on "
                      << nlohmann::json(t).dump(-1, ' ', false,
                                                nlohmann::json::error_handler_t::replace);
      }
    }
    EXPECT_EQ(n_diff, 0u) << (*fast)->kind();
  }
}

TEST(PreTokenize, OnigurumaClassesInPcre2) {
  // \s is White_Space: U+0085 and U+3000 yes, U+180E and U+200B no.
  auto ws = MakePcre2Matcher("\\s+");
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(Split(**ws, "a\xE1\xA0\x8E\xC2\x85 \xE2\x80\x8B" "b\xE3\x80\x80"),
            (Pieces{"\xC2\x85 ", "\xE3\x80\x80"}));
  // \h is a hex digit in Oniguruma.
  auto hex = MakePcre2Matcher("\\h+");
  ASSERT_TRUE(hex.ok());
  EXPECT_EQ(Split(**hex, "beef \t cafe!"), (Pieces{"beef", "cafe"}));
  // Unicode 16 letters and digits (utf8proc and PCRE2 here predate them).
  auto letters = MakePcre2Matcher("\\p{L}+|\\d+");
  ASSERT_TRUE(letters.ok());
  EXPECT_EQ(Split(**letters, "\xE1\xB2\x89\xE1\xB2\x8A-\xF0\x90\xB5\x80"),
            (Pieces{"\xE1\xB2\x89\xE1\xB2\x8A", "\xF0\x90\xB5\x80"}));
  // Negated classes keep working inside brackets.
  auto other = MakePcre2Matcher("[^\\s\\p{L}\\p{N}]+");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(Split(**other, "ab!?\xE1\xA0\x8E 1#"), (Pieces{"!?\xE1\xA0\x8E", "#"}));
  // ^ and $ are line anchors, as in Oniguruma's Ruby syntax.
  auto anchors = MakePcre2Matcher("^x|y$");
  ASSERT_TRUE(anchors.ok());
  EXPECT_EQ(Split(**anchors, "xay\nxby"), (Pieces{"x", "y", "x", "y"}));
  // An invalid pattern is a Status, not a crash.
  auto bad = MakePcre2Matcher("(unclosed");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(PreTokenize, EmptyMatchesFollowOnigFindIter) {
  // An empty pattern matches at every character boundary; splitting keeps every character.
  auto literal = MakeLiteralMatcher("");
  std::vector<Span> spans;
  literal->FindMatches("a\xC3\xA9" "b", &spans);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[1].begin, 1u);
  EXPECT_EQ(spans[2].begin, 3u);
  std::vector<Span> pieces;
  SplitByMatches("a\xC3\xA9" "b", spans, SplitBehavior::kIsolated, false, &pieces);
  EXPECT_EQ(pieces.size(), 3u);
  auto lookahead = MakePcre2Matcher("(?=x)");
  ASSERT_TRUE(lookahead.ok());
  (*lookahead)->FindMatches("axbx", &spans);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].begin, 1u);
  EXPECT_EQ(spans[1].begin, 3u);
}

TEST(PreTokenize, SplitBehaviors) {
  const std::string text = "a-b--c";
  std::vector<Span> matches;
  MakeLiteralMatcher("-")->FindMatches(text, &matches);
  auto run = [&](SplitBehavior b, bool invert) {
    std::vector<Span> pieces;
    SplitByMatches(text, matches, b, invert, &pieces);
    Pieces out;
    for (const Span& s : pieces) out.push_back(text.substr(s.begin, s.end - s.begin));
    return out;
  };
  EXPECT_EQ(run(SplitBehavior::kRemoved, false), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(run(SplitBehavior::kIsolated, false), (Pieces{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithPrevious, false), (Pieces{"a-", "b-", "-", "c"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithNext, false), (Pieces{"a", "-b", "-", "-c"}));
  EXPECT_EQ(run(SplitBehavior::kContiguous, false), (Pieces{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(run(SplitBehavior::kRemoved, true), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithPrevious, true), (Pieces{"a", "-b", "-", "-c"}));
}

TEST(Unicode, ClassesMatchOniguruma) {
  const CharTable& t = GetCharTable();
  for (uint32_t cp : {0x09u, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x2028u, 0x2029u, 0x3000u}) {
    EXPECT_TRUE(t.Flags(cp) & kCharSpace) << std::hex << cp;
  }
  for (uint32_t cp : {0x180Eu, 0x200Bu, 0xFEFFu, 0x2060u, 0x41u}) {
    EXPECT_FALSE(t.Flags(cp) & kCharSpace) << std::hex << cp;
  }
  EXPECT_TRUE(t.Flags(0x1C89) & kCharLetter);    // Unicode 16.0
  EXPECT_TRUE(t.Flags(0x10D40) & kCharNumber);   // Unicode 16.0
  EXPECT_TRUE(t.Flags(0x2160) & kCharNumber);    // Roman numeral (Nl)
  EXPECT_FALSE(t.Flags(0x301) & kCharLetter);    // combining mark
  EXPECT_TRUE(t.Flags(0x301) & kCharNfcUnstable);
  EXPECT_FALSE(t.Flags(0x4E2D) & kCharNfcUnstable);
  EXPECT_TRUE(t.Flags(0xF900) & kCharNfcUnstable);  // CJK compatibility ideograph
}

TEST(Unicode, NfcMatchesHuggingFace) {
  std::string out;
  EXPECT_FALSE(NfcNormalize("plain ascii", &out));
  EXPECT_FALSE(NfcNormalize("\xE4\xB8\xAD\xE6\x96\x87", &out));  // already NFC
  ASSERT_TRUE(NfcNormalize("e\xCC\x81", &out));
  EXPECT_EQ(out, "\xC3\xA9");
  ASSERT_TRUE(NfcNormalize("\xE2\x84\xAB", &out));  // ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(out, "\xC3\x85");
  ASSERT_TRUE(NfcNormalize("a\xCC\x81\xCC\x96", &out));  // reordered: U+0316 (220) first
  EXPECT_EQ(out, "\xC3\xA1\xCC\x96");
  ASSERT_TRUE(NfcNormalize("\xE1\x84\x80\xE1\x85\xA1", &out));  // Hangul L+V
  EXPECT_EQ(out, "\xEA\xB0\x80");
  // HF's tables predate Unicode 10: U+0898 has class 0 there, so nothing is reordered...
  EXPECT_FALSE(NfcNormalize("a\xE0\xA2\x98\xCC\x96", &out));
  // ...and U+11935 U+11930 (Unicode 13) do not compose to U+11938.
  EXPECT_FALSE(NfcNormalize("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0", &out));
}

TEST(Unicode, LossyUtf8LikeRust) {
  EXPECT_EQ(Utf8Lossy("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"), "\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(Utf8Lossy("\xF0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xF4\x90\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xED\x9F\xBF"), "\xED\x9F\xBF");  // U+D7FF is valid
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("abcdefgh\x80"));

  EXPECT_EQ(Utf8EmittablePrefix("abc\xE4\xB8"), 3u);
  EXPECT_EQ(Utf8EmittablePrefix("\xF0\x9F\x91"), 0u);
  EXPECT_EQ(Utf8EmittablePrefix("ab\x80"), 3u);        // invalid: emit (as U+FFFD) now
  EXPECT_EQ(Utf8EmittablePrefix("\xE4\xF0\x9F"), 1u);  // E4 can no longer complete
  EXPECT_EQ(Utf8EmittablePrefix("\xF0\x9F\x91\x8D"), 4u);
}

}  // namespace
}  // namespace kestrel::tok
