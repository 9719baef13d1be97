// Forced bytes and jump-forward tokens (real Qwen3 tokenizer).
#include <gtest/gtest.h>

#include <string>

#include "grammar/jump_forward.h"
#include "grammar/vocabulary.h"
#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;

const char* kToolSchema = R"({"type": "object", "properties": {
    "name": {"const": "get_weather"},
    "arguments": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}},
  "required": ["name", "arguments"]})";

std::shared_ptr<const CompiledGrammar> CompileSchema(
    std::string_view schema, const JsonSchemaOptions& options,
    std::shared_ptr<const Vocabulary> vocab = nullptr) {
  auto g = JsonSchemaToGrammar(schema, options);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return CompileOrDie(*g, std::move(vocab));
}

JsonSchemaOptions Python() {
  JsonSchemaOptions o;
  o.layout = JsonSchemaOptions::Layout::kPythonSeparators;
  return o;
}

TEST(ForcedBytes, FixedKeysAndSeparators) {
  auto g = CompileSchema(kToolSchema, Python());
  GrammarMatcher m(g);
  EXPECT_EQ(m.ForcedBytes(), R"({"name": "get_weather", "arguments": {"city": ")");
  ASSERT_TRUE(m.AcceptBytes(R"({"name": "get_weather", "arguments": {"city": "Oslo)"));
  EXPECT_EQ(m.ForcedBytes(), "");  // more of the string, or its end
  ASSERT_TRUE(m.AcceptBytes("\""));
  EXPECT_EQ(m.ForcedBytes(), R"(, "unit": ")");
  ASSERT_TRUE(m.AcceptBytes(R"(, "unit": "f)"));
  EXPECT_EQ(m.ForcedBytes(), R"(ahrenheit"}})");
  ASSERT_TRUE(m.AcceptBytes(m.ForcedBytes()));
  EXPECT_TRUE(m.CanTerminate());
  EXPECT_EQ(m.ForcedBytes(), "");
  // ForcedBytes leaves the matcher as it was.
  EXPECT_EQ(m.n_steps(), 4);
}

TEST(ForcedBytes, BoundedWhitespaceForcesLess) {
  auto g = CompileSchema(kToolSchema, JsonSchemaOptions{});
  GrammarMatcher m(g);
  EXPECT_EQ(m.ForcedBytes(), "{");
  ASSERT_TRUE(m.AcceptBytes("{"));
  EXPECT_EQ(m.ForcedBytes(), "");  // whitespace or the key
  ASSERT_TRUE(m.AcceptBytes("\""));
  EXPECT_EQ(m.ForcedBytes(), "name\"");
}

TEST(ForcedBytes, StopsWhereTheGrammarMayEndAndInsideCharacters) {
  auto g = CompileOrDie(*RegexToGrammar("abc(d)?"));
  GrammarMatcher m(g);
  EXPECT_EQ(m.ForcedBytes(), "abc");
  auto cjk = CompileOrDie(*RegexToGrammar("\xE4\xB8\xAD[\xE6\x96\x87\xE5\xAD\x97]"));
  GrammarMatcher c(cjk);
  // 文 and 字 share no first byte: the forced text ends after 中.
  EXPECT_EQ(c.ForcedBytes(), "\xE4\xB8\xAD");
  auto shared_lead =
      CompileOrDie(*RegexToGrammar("[\xE4\xB8\xAD\xE4\xB8\x8A]"));  // 中 上: E4 B8 xx
  GrammarMatcher s(shared_lead);
  EXPECT_EQ(s.ForcedBytes(), "\xE4\xB8");
}

TEST(JumpForward, Qwen3TokensAreAStablePrefix) {
  const Tokenizer* tok = testing::Qwen3Tokenizer();
  ASSERT_NE(tok, nullptr);
  auto vocab = Vocabulary::FromTokenizer(*tok);
  auto g = CompileSchema(kToolSchema, Python(), vocab);
  GrammarMatcher m(g, {*tok->TokenToId("<|im_end|>")});
  const JumpForward jf = ComputeJumpForward(m, *tok);
  EXPECT_EQ(jf.forced_bytes, R"({"name": "get_weather", "arguments": {"city": ")");
  ASSERT_FALSE(jf.tokens.empty());
  std::string bytes;
  for (int32_t id : jf.tokens) bytes += tok->TokenBytes(id);
  EXPECT_EQ(bytes.size(), jf.n_token_bytes);
  EXPECT_LT(bytes.size(), jf.forced_bytes.size());  // the last token waits for what follows
  EXPECT_EQ(jf.forced_bytes.compare(0, bytes.size(), bytes), 0);
  // The kept tokens are the canonical tokenization's prefix, also with any continuation.
  const std::vector<int32_t> full =
      tok->Encode(jf.forced_bytes + "Paris\", \"unit\": \"celsius\"}}");
  ASSERT_GE(full.size(), jf.tokens.size());
  EXPECT_TRUE(std::equal(jf.tokens.begin(), jf.tokens.end(), full.begin()));
  for (int32_t id : jf.tokens) ASSERT_TRUE(m.AcceptToken(id));
  // After the jump the masks still allow the rest of the forced text.
  std::vector<uint32_t> mask(vocab->bitmask_words());
  EXPECT_FALSE(m.FillNextTokenBitmask(mask).dead_end);
  const std::string rest = jf.forced_bytes.substr(jf.n_token_bytes);
  EXPECT_TRUE(m.AcceptBytes(rest));
  // Nothing forced: no tokens.
  const JumpForward none = ComputeJumpForward(m, *tok);
  EXPECT_TRUE(none.forced_bytes.empty());
  EXPECT_TRUE(none.tokens.empty());
  // Forced bytes that end inside a character are cut before it.
  auto partial = CompileOrDie(*RegexToGrammar("ab\u4e2d[\u4e2d\u4e0a]"), vocab);
  GrammarMatcher p(partial);
  const JumpForward cut = ComputeJumpForward(p, *tok);
  EXPECT_EQ(cut.forced_bytes, "ab\xE4\xB8\xAD\xE4\xB8");
  std::string cut_bytes;
  for (int32_t id : cut.tokens) cut_bytes += tok->TokenBytes(id);
  EXPECT_LT(cut_bytes.size(), 5u);  // within "ab中", the last token withheld
  EXPECT_EQ(std::string("ab\xE4\xB8\xAD").compare(0, cut_bytes.size(), cut_bytes), 0);
}

}  // namespace
}  // namespace kestrel::grammar
