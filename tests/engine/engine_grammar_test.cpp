// Structured output on the engine (EngineRequest::grammar) with the embedded model, whose free
// output is far from JSON: sampled at temperature 1 under a grammar, every request's text must
// parse and validate, under batching, asynchronous scheduling and a prefix-cache hit alike, and
// end with kStop where the grammar completes. Requests without a grammar are unaffected.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "grammar/compiled_grammar.h"
#include "grammar/front_ends.h"
#include "grammar/vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {
namespace {

using testing::Collected;
using testing::RunConcurrently;

class EngineGrammarTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<Tokenizer> tok = Tokenizer::FromDirectory(testing::TinyModelDir());
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tokenizer_ = new Tokenizer(std::move(*tok));
    vocab_ = new std::shared_ptr<const grammar::Vocabulary>(
        grammar::Vocabulary::FromTokenizer(*tokenizer_));
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete tokenizer_;
  }
  static std::shared_ptr<const grammar::CompiledGrammar> Compile(Result<grammar::Grammar> g) {
    EXPECT_TRUE(g.ok()) << g.status().message();
    Result<std::shared_ptr<const grammar::CompiledGrammar>> c =
        grammar::CompiledGrammar::Compile(*g, *vocab_);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return *c;
  }
  static EngineRequest Request(const std::string& prompt, int32_t max_new_tokens,
                               std::shared_ptr<const grammar::CompiledGrammar> g, uint64_t seed) {
    EngineRequest r;
    r.prompt_ids = tokenizer_->Encode(prompt);
    r.max_new_tokens = max_new_tokens;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.grammar = std::move(g);
    return r;
  }
  static EngineConfig Config(bool async) {
    EngineConfig c;
    c.max_num_seqs = 16;
    c.max_batched_tokens = 256;
    c.async_scheduling = async;
    return c;
  }
  static Tokenizer* tokenizer_;
  static std::shared_ptr<const grammar::Vocabulary>* vocab_;
};

Tokenizer* EngineGrammarTest::tokenizer_ = nullptr;
std::shared_ptr<const grammar::Vocabulary>* EngineGrammarTest::vocab_ = nullptr;

constexpr const char* kToolSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "enum": ["read_file", "write_file"]},
    "arguments": {
      "type": "object",
      "properties": {
        "path": {"type": "string", "maxLength": 24},
        "line": {"type": "integer", "minimum": 1, "maximum": 500}
      },
      "required": ["path", "line"]
    }
  },
  "required": ["name", "arguments"]
})";

void ExpectValidToolCall(const Collected& c, const std::string& what) {
  SCOPED_TRACE(what + ": " + c.text);
  ASSERT_TRUE(c.finished);
  ASSERT_TRUE(c.error.ok()) << c.error.message();
  EXPECT_EQ(c.reason, FinishReason::kStop);
  const nlohmann::json j = nlohmann::json::parse(c.text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON";
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j.at("name") == "read_file" || j.at("name") == "write_file");
  const nlohmann::json& a = j.at("arguments");
  EXPECT_TRUE(a.at("path").is_string());
  EXPECT_LE(a.at("path").get<std::string>().size(), 24u * 4);
  ASSERT_TRUE(a.at("line").is_number_integer());
  EXPECT_GE(a.at("line").get<int64_t>(), 1);
  EXPECT_LE(a.at("line").get<int64_t>(), 500);
}

TEST_F(EngineGrammarTest, JsonSchemaOutputValidatesUnderBatchingAndAsyncScheduling) {
  // Compact layout for most; the default (up to 16 bytes of whitespace per gap, which a random
  // model fills) for the last two, with room for it.
  grammar::JsonSchemaOptions compact;
  compact.max_whitespace_bytes = 0;
  auto g = Compile(grammar::JsonSchemaToGrammar(kToolSchema, compact));
  auto spaced = Compile(grammar::JsonSchemaToGrammar(kToolSchema));
  std::vector<EngineRequest> reqs;
  const std::string context =
      "import os\nimport sys\n\n\ndef read_config(path):\n    result = {}\n    with open(path) "
      "as f:\n        for line in f:\n";
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(Request(context + "# call " + std::to_string(i), i < 10 ? 200 : 800,
                           i < 10 ? g : spaced, 100 + i));
  }
  // Unconstrained requests in the same batch stay unconstrained.
  reqs.push_back(Request("import os\n", 24, nullptr, 7));
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    Engine engine(testing::LoadModel(testing::TinyModelDir(), 8192), tokenizer_, {8002, 8000},
                  Config(async));
    const std::vector<Collected> got = RunConcurrently(engine, reqs, /*start_after_submit=*/true);
    for (size_t i = 0; i + 1 < reqs.size(); ++i) ExpectValidToolCall(got[i], std::to_string(i));
    EXPECT_TRUE(got.back().error.ok());
    EXPECT_EQ(got.back().tokens.size(), 24u);  // no grammar: runs to max_new_tokens
    // The same request again hits the prefix cache and still validates.
    const std::vector<Collected> again = testing::RunOneByOne(engine, {reqs[3]});
    EXPECT_GT(again[0].usage.cached_tokens, 0);
    ExpectValidToolCall(again[0], "prefix hit");
  }
}

TEST_F(EngineGrammarTest, RegexChoiceAndJsonObject) {
  Engine engine(testing::LoadModel(testing::TinyModelDir(), 8192), tokenizer_, {8002, 8000},
                Config(true));
  engine.Start();
  auto date = Compile(grammar::RegexToGrammar(R"(\d{4}-(0[1-9]|1[0-2])-[0-3]\d)"));
  const std::vector<std::string> options = {"yes", "no", "maybe later"};
  auto choice = Compile(grammar::ChoiceGrammar(options));
  auto object = Compile(grammar::JsonObjectGrammar());
  for (int i = 0; i < 4; ++i) {
    const Collected d = testing::RunOneByOne(engine, {Request("when? ", 40, date, 10 + i)})[0];
    ASSERT_TRUE(d.error.ok()) << d.error.message();
    EXPECT_TRUE(std::regex_match(d.text, std::regex(R"(\d{4}-(0[1-9]|1[0-2])-[0-3]\d)"))) << d.text;
    const Collected c = testing::RunOneByOne(engine, {Request("ok? ", 40, choice, 20 + i)})[0];
    EXPECT_NE(std::find(options.begin(), options.end(), c.text), options.end()) << c.text;
    const Collected o = testing::RunOneByOne(engine, {Request("{", 120, object, 30 + i)})[0];
    if (o.reason == FinishReason::kStop) {
      const nlohmann::json j = nlohmann::json::parse(o.text, nullptr, false);
      EXPECT_TRUE(j.is_object()) << o.text;
    } else {
      // max_new_tokens before the object closed: a prefix of valid JSON, never invalid text.
      EXPECT_EQ(o.reason, FinishReason::kLength);
      EXPECT_EQ(o.text.front(), '{') << o.text;
    }
  }
}

TEST_F(EngineGrammarTest, JumpForwardAppendsForcedTokensWithoutADecodeStepEach) {
  // A choice with one long option: after its first token everything is forced.
  const std::vector<std::string> one = {"def read_config(path): return open(path).read()"};
  auto forced = Compile(grammar::ChoiceGrammar(one));
  auto schema = Compile(grammar::JsonSchemaToGrammar(kToolSchema));
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    std::vector<Collected> outs;
    std::vector<EngineMetrics> metrics;
    for (bool jump : {false, true}) {
      EngineConfig c = Config(async);
      c.jump_forward = jump;
      Engine engine(testing::LoadModel(testing::TinyModelDir(), 8192), tokenizer_, {8002, 8000}, c);
      engine.Start();
      outs.push_back(testing::RunOneByOne(engine, {Request("x = ", 60, forced, 3)})[0]);
      const Collected call = testing::RunOneByOne(engine, {Request("y = ", 200, schema, 4)})[0];
      ExpectValidToolCall(call, jump ? "jump-forward" : "masked");
      metrics.push_back(testing::WaitIdle(engine));
    }
    EXPECT_EQ(outs[0].text, one[0]);
    EXPECT_EQ(outs[1].text, one[0]);
    EXPECT_EQ(outs[1].reason, FinishReason::kStop);
    EXPECT_EQ(metrics[0].jump_forward_tokens, 0u);
    EXPECT_GT(metrics[1].jump_forward_tokens, 10u);
    // Fewer engine steps for the same (or shorter) outputs.
    EXPECT_LT(metrics[1].steps, metrics[0].steps);
  }
}

TEST_F(EngineGrammarTest, GrammarsAreRefusedWithoutTheModelsVocabulary) {
  Engine engine(testing::LoadModel(testing::TinyModelDir(), 8192), tokenizer_, {8002, 8000},
                Config(false));
  Result<grammar::Grammar> g = grammar::RegexToGrammar("a+");
  ASSERT_TRUE(g.ok());
  auto no_vocab = grammar::CompiledGrammar::Compile(*g, nullptr);
  ASSERT_TRUE(no_vocab.ok());
  Result<std::shared_ptr<RequestHandle>> h = engine.Submit(Request("x", 4, *no_vocab, 1));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel
