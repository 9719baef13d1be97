// Token masks against brute force (every token tried with AcceptBytes on a copy of the matcher),
// on a small hand-made vocabulary and on the real Qwen3 vocabulary; stop tokens; dead ends;
// rollback.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "grammar/vocabulary.h"
#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;

bool Bit(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id >> 5] >> (id & 31)) & 1;
}

// Checks one mask against brute force; returns the allowed tokens.
std::vector<int32_t> CheckMask(GrammarMatcher& m, const Vocabulary& v,
                               const std::vector<int32_t>& stops, const std::string& context) {
  std::vector<uint32_t> mask(v.bitmask_words() + 1, 0xFFFFFFFFu);  // one padding word
  const MaskResult r = m.FillNextTokenBitmask(mask);
  EXPECT_EQ(mask.back(), 0u) << "padding word not cleared";
  GrammarMatcher copy = m;
  std::vector<int32_t> allowed;
  int n_wrong = 0;
  for (int32_t id = 0; id < v.vocab_size(); ++id) {
    bool expected = false;
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      expected = m.CanTerminate();
    } else if (v.is_text(id)) {
      expected = copy.AcceptBytes(v.token_bytes(id));
      if (expected) copy.Rollback(1);
    }
    if (Bit(mask, id) != expected && n_wrong++ < 5) {
      ADD_FAILURE() << context << ": token " << id << " '" << v.token_bytes(id) << "' mask says "
                    << Bit(mask, id) << ", brute force " << expected;
    }
    if (expected) allowed.push_back(id);
  }
  EXPECT_EQ(r.dead_end, allowed.empty()) << context;
  return allowed;
}

// A small vocabulary with JSON punctuation, words, digits, whitespace runs, split UTF-8, and
// special tokens (ids 0 and 1: <eos>, <pad>).
std::shared_ptr<const Vocabulary> SmallVocab() {
  std::vector<std::string> tokens = {"<eos>", "<pad>"};
  for (int b = 0x20; b < 0x7F; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"",      "\":",   "\",",          "\"}",          "\"]",      "\": \"",     "\", \"",
        "true",     "false", "null",         "name",         "age",      "tags",       "id",
        "12",       "345",   "0.",           ".5",           "-1",       "e+",         "  ",
        "\n",       "\n  ",  "\t",           " \"",          "],",       "]}",         "}}",
        "{}",       "[]",    "[\"",          "\",\"",        "abc",      "hello",      " world",
        "\\n",      "\\\"",  "\\u00",        "e9",           "\xC3\xA9", "\xC3",       "\xA9",
        "\xE4\xB8", "\xAD",  "\xE4\xB8\xAD", "\xE6\x96\x87", "caf",      "\xC3\xA9\"", "\"\xC3\xA9",
        "2024-",    "01",    "-0",           "T1",           "0:",       "00Z",        "\x01",
        "\x7F"}) {
    tokens.push_back(t);
  }
  const int32_t special[] = {0, 1};
  return Vocabulary::FromTokens(std::move(tokens), special);
}

// Random walks: at every step the mask must equal brute force; the next token is drawn from it.
void RandomWalks(const Grammar& g, std::shared_ptr<const Vocabulary> vocab,
                 const std::vector<int32_t>& stops, int n_walks, int max_steps, uint32_t seed,
                 bool check_every_step = true) {
  auto compiled = CompileOrDie(g, vocab);
  ASSERT_NE(compiled, nullptr);
  std::mt19937 rng(seed);
  for (int walk = 0; walk < n_walks; ++walk) {
    GrammarMatcher m(compiled, stops);
    for (int step = 0; step < max_steps && !m.IsTerminated(); ++step) {
      const std::string context = "walk " + std::to_string(walk) + " step " + std::to_string(step);
      std::vector<int32_t> allowed;
      if (check_every_step || step % 8 == 0) {
        allowed = CheckMask(m, *vocab, stops, context);
      } else {
        std::vector<uint32_t> mask(vocab->bitmask_words());
        m.FillNextTokenBitmask(mask);
        for (int32_t id = 0; id < vocab->vocab_size(); ++id) {
          if (Bit(mask, id)) allowed.push_back(id);
        }
      }
      if (allowed.empty()) break;
      // Prefer continuing over stopping so walks go deep.
      int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (std::find(stops.begin(), stops.end(), pick) != stops.end() && allowed.size() > 1 &&
          step < max_steps / 2) {
        pick = allowed[(std::find(allowed.begin(), allowed.end(), pick) - allowed.begin() + 1) %
                       allowed.size()];
      }
      ASSERT_TRUE(m.AcceptToken(pick)) << context;
    }
  }
}

Grammar FromSchema(std::string_view schema, const JsonSchemaOptions& options = {}) {
  auto g = JsonSchemaToGrammar(schema, options);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return std::move(g).value();
}

Grammar FromGbnf(std::string_view text) {
  auto g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return std::move(g).value();
}

const char* kPersonSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "café", "中"]}, "maxItems": 3},
    "id": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}},
  "required": ["name", "age"]})";

TEST(TokenMask, SmallVocabJsonSchemaMatchesBruteForce) {
  RandomWalks(FromSchema(kPersonSchema), SmallVocab(), {0}, 40, 60, 1);
}

TEST(TokenMask, SmallVocabJsonObjectMatchesBruteForce) {
  RandomWalks(JsonObjectGrammar(), SmallVocab(), {0}, 30, 60, 2);
}

TEST(TokenMask, SmallVocabRegexAndGbnfMatchBruteForce) {
  auto regex = RegexToGrammar(R"((caf\u00e9|[a-z]{1,5}|\d+(\.\d+)?)( [a-z\u4e00-\u9fff]+)*)");
  ASSERT_TRUE(regex.ok()) << regex.status().message();
  RandomWalks(*regex, SmallVocab(), {0}, 30, 30, 3);
  // Left recursion, nullable rules, nested references.
  RandomWalks(FromGbnf(R"(root ::= list ws
list ::= list "," ws item | item
item ::= "[" ws (list ws)? "]" | word | num
word ::= [a-z]+ opt
opt ::= "" | "é"
num ::= "-"? [0-9]+ ("." [0-9]+)?
ws ::= [ \n]*)"),
              SmallVocab(), {0}, 30, 40, 4);
  std::vector<std::string> choices = {"true", "trueish", "name", "café", "中文", "a b"};
  auto choice = ChoiceGrammar(choices);
  ASSERT_TRUE(choice.ok());
  RandomWalks(*choice, SmallVocab(), {0}, 20, 10, 5);
}

TEST(TokenMask, ThreadPoolBuildsTheSameCache) {
  auto vocab = SmallVocab();
  ThreadPool pool(3);
  CompileOptions options;
  options.pool = &pool;
  auto serial = CompileOrDie(FromSchema(kPersonSchema), vocab);
  auto parallel = CompiledGrammar::Compile(FromSchema(kPersonSchema), vocab, options);
  ASSERT_TRUE(parallel.ok());
  const TokenMaskCache& a = serial->masks();
  const TokenMaskCache& b = (*parallel)->masks();
  ASSERT_EQ(a.n_entries(), b.n_entries());
  for (int32_t i = 0; i < a.n_entries(); ++i) {
    EXPECT_EQ(a.entry(i).tokens, b.entry(i).tokens) << i;
    EXPECT_EQ(a.entry(i).bits, b.entry(i).bits) << i;
    EXPECT_EQ(a.entry(i).uncertain, b.entry(i).uncertain) << i;
  }
}

TEST(TokenMask, StopTokensOnlyWhereTheGrammarMayEnd) {
  auto compiled = CompileOrDie(FromGbnf(R"(root ::= "ab" | "abc")"), SmallVocab());
  GrammarMatcher m(compiled, {0});
  std::vector<uint32_t> mask(compiled->vocab()->bitmask_words());
  m.FillNextTokenBitmask(mask);
  EXPECT_FALSE(Bit(mask, 0));
  EXPECT_FALSE(m.AcceptToken(0));
  EXPECT_FALSE(m.AcceptToken(1));  // special, not a stop token: never text
  ASSERT_TRUE(m.AcceptBytes("ab"));
  m.FillNextTokenBitmask(mask);
  EXPECT_TRUE(Bit(mask, 0));
  EXPECT_FALSE(Bit(mask, 1));
  EXPECT_TRUE(m.CanTerminate());
  ASSERT_TRUE(m.AcceptToken(0));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.CanTerminate());
  EXPECT_FALSE(m.AcceptBytes("c"));
  const MaskResult after = m.FillNextTokenBitmask(mask);
  EXPECT_TRUE(after.dead_end);
  m.Rollback(1);  // un-terminate
  EXPECT_FALSE(m.IsTerminated());
  EXPECT_TRUE(m.AcceptBytes("c"));
}

TEST(TokenMask, DeadEndIsFlagged) {
  // No token of this vocabulary holds a 'Z'.
  auto vocab = Vocabulary::FromTokens({"<eos>", "a", "b", "ab"}, std::vector<int32_t>{0});
  auto compiled = CompileOrDie(FromGbnf(R"(root ::= "a" "Z" | "b")"), vocab);
  GrammarMatcher m(compiled, {0});
  std::vector<uint32_t> mask(vocab->bitmask_words());
  EXPECT_FALSE(m.FillNextTokenBitmask(mask).dead_end);
  EXPECT_EQ(mask[0], (1u << 1) | (1u << 2));
  ASSERT_TRUE(m.AcceptToken(1));
  const MaskResult r = m.FillNextTokenBitmask(mask);
  EXPECT_TRUE(r.dead_end);
  EXPECT_EQ(mask[0], 0u);
  // A complete match without stop tokens to end it is a dead end too.
  GrammarMatcher no_stop(compiled);
  ASSERT_TRUE(no_stop.AcceptToken(2));
  EXPECT_TRUE(no_stop.CanTerminate());
  EXPECT_TRUE(no_stop.FillNextTokenBitmask(mask).dead_end);
}

TEST(TokenMask, Utf8SplitAcrossTokens) {
  auto vocab = SmallVocab();
  auto compiled = CompileOrDie(FromSchema(R"({"enum": ["中文", "café"]})"), vocab);
  GrammarMatcher m(compiled, {0});
  ASSERT_TRUE(m.AcceptBytes("\"\xE4\xB8"));  // inside 中
  const std::vector<int32_t> allowed = CheckMask(m, *vocab, {0}, "inside 中");
  ASSERT_EQ(allowed.size(), 1u);  // the continuation byte alone
  EXPECT_EQ(vocab->token_bytes(allowed[0]), "\xAD");
  ASSERT_TRUE(m.AcceptBytes("\xAD"));
  ASSERT_TRUE(m.AcceptBytes("\xE6\x96\x87\""));
  EXPECT_TRUE(m.CanTerminate());
}

TEST(TokenMask, RollbackRestoresMasks) {
  auto vocab = SmallVocab();
  auto compiled = CompileOrDie(FromSchema(kPersonSchema), vocab);
  GrammarMatcher m(compiled, {0});
  const std::vector<std::string> pieces = {"{\"", "name", "\": \"", "caf", "\xC3", "\xA9", "\"",
                                           ",",   " \"",  "age",    "\":", "12",   "}"};
  std::vector<std::vector<uint32_t>> masks;
  for (const std::string& p : pieces) {
    masks.emplace_back(vocab->bitmask_words());
    m.FillNextTokenBitmask(masks.back());
    ASSERT_TRUE(m.AcceptBytes(p)) << p;
  }
  EXPECT_TRUE(m.CanTerminate());
  std::vector<uint32_t> mask(vocab->bitmask_words());
  for (int back : {1, 3, 6, 13}) {
    m.Rollback(back);
    ASSERT_EQ(m.n_steps(), static_cast<int32_t>(pieces.size()) - back);
    m.FillNextTokenBitmask(mask);
    EXPECT_EQ(mask, masks[pieces.size() - back]) << "after rolling back " << back;
    for (size_t i = pieces.size() - back; i < pieces.size(); ++i)
      ASSERT_TRUE(m.AcceptBytes(pieces[i]));
    EXPECT_TRUE(m.CanTerminate());
  }
  EXPECT_FALSE(m.AcceptBytes("x"));  // a rejected step leaves the state alone
  EXPECT_EQ(m.n_steps(), static_cast<int32_t>(pieces.size()));
  m.Reset();
  EXPECT_EQ(m.n_steps(), 0);
  m.FillNextTokenBitmask(mask);
  EXPECT_EQ(mask, masks[0]);
}

// ---- the real Qwen3 vocabulary ----

TEST(TokenMask, Qwen3RandomPrefixesMatchBruteForce) {
  const Tokenizer* tok = testing::Qwen3Tokenizer();
  ASSERT_NE(tok, nullptr);
  auto vocab = Vocabulary::FromTokenizer(*tok);
  const int32_t eos = *tok->TokenToId("<|im_end|>");
  const char* schema = R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12},
      "unit": {"enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 14},
      "alerts": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
    "required": ["city", "unit"]})";
  RandomWalks(FromSchema(schema), vocab, {eos}, 3, 24, 11, /*check_every_step=*/false);
  // Prefixes of a valid instance cut at every byte (inside tokens and UTF-8 characters).
  auto compiled = CompileOrDie(FromSchema(schema), vocab);
  const std::string instance =
      "{\"city\": \"Z\xC3\xBCrich \xE6\x9D\xB1\", \"unit\": \"celsius\", \"alerts\": "
      "[\"\\\"x\\\"\"]}";
  for (size_t cut : {size_t{1}, size_t{9}, size_t{12}, size_t{13}, size_t{18}, size_t{30},
                     size_t{50}, instance.size()}) {
    GrammarMatcher m(compiled, {eos});
    ASSERT_TRUE(m.AcceptBytes(instance.substr(0, cut))) << cut;
    CheckMask(m, *vocab, {eos}, "cut " + std::to_string(cut));
  }
}

// States of a long bounded string share mask entries while more characters remain than the
// longest token has bytes; near the bound each has its own. Masks must match brute force at both.
TEST(TokenMask, Qwen3LongBoundedStringNearItsLimit) {
  const Tokenizer* tok = testing::Qwen3Tokenizer();
  ASSERT_NE(tok, nullptr);
  auto vocab = Vocabulary::FromTokenizer(*tok);
  ASSERT_LT(vocab->max_token_bytes(), 150);
  const int32_t eos = *tok->TokenToId("<|im_end|>");
  auto compiled = CompileOrDie(FromSchema(R"({"type": "string", "maxLength": 300})"), vocab);
  EXPECT_LT(compiled->stats().n_mask_entries, compiled->stats().n_states / 2)
      << "bounded equivalence should share entries";
  for (int n_chars : {0, 20, 150, 290, 299, 300}) {
    GrammarMatcher m(compiled, {eos});
    std::string text = "\"";
    for (int i = 0; i < n_chars; ++i) text += (i % 7 == 3) ? "\xC3\xA9" : "x";
    ASSERT_TRUE(m.AcceptBytes(text));
    const std::vector<int32_t> allowed =
        CheckMask(m, *vocab, {eos}, "chars " + std::to_string(n_chars));
    // Space for 300 - n_chars more characters and the closing quote.
    for (int32_t id : allowed) {
      if (id == eos) continue;
      const std::string& b = vocab->token_bytes(id);
      size_t chars = 0;  // JSON characters: an escape is one
      for (size_t i = 0; i < b.size(); ++i) {
        if (b[i] == '\\') i += (i + 1 < b.size() && b[i + 1] == 'u') ? 5 : 1;
        chars += (static_cast<uint8_t>(b[i < b.size() ? i : b.size() - 1]) & 0xC0) != 0x80;
      }
      EXPECT_LE(chars, static_cast<size_t>(300 - n_chars + 1)) << b;
    }
  }
}

}  // namespace
}  // namespace kestrel::grammar
