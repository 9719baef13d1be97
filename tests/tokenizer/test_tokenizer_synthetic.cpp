// A tiny byte-level tokenizer.json built in the test (tokenizer_test_util.h): BPE merging,
// ignore_merges, added-token matching rules, post-processing, and malformed-file errors.
// Expected ids were checked against HF tokenizers 0.23 on the same JSON.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace kestrel {
namespace {

using Ids = std::vector<int32_t>;
using json = nlohmann::json;
using testing::AddedTokenJson;
using testing::LoadJson;
using testing::TinyTokenizerJson;

TEST(TokenizerSynthetic, BpeMergesByRank) {
  auto tok = LoadJson(TinyTokenizerJson());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("hello world"), (Ids{259, 264}));
  EXPECT_EQ(tok->Encode("hellohello"), (Ids{259, 259}));
  EXPECT_EQ(tok->Encode("hel"), (Ids{256, 108}));  // "hel" is unreachable through merges
  EXPECT_EQ(tok->Decode(Ids{259, 264}), "hello world");
  EXPECT_EQ(tok->vocab_size(), 266);
}

TEST(TokenizerSynthetic, IgnoreMergesMapsWholeWords) {
  json j = TinyTokenizerJson();
  j["model"]["ignore_merges"] = true;
  auto tok = LoadJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("hel"), (Ids{265}));
  EXPECT_EQ(tok->Encode("hello world"), (Ids{259, 264}));
}

TEST(TokenizerSynthetic, MergesAsStringsOrPairs) {
  json j = TinyTokenizerJson();
  json legacy = json::array();
  for (const auto& m : j["model"]["merges"]) {
    legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  j["model"]["merges"] = legacy;
  auto tok = LoadJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("hello world"), (Ids{259, 264}));
}

TEST(TokenizerSynthetic, ByteLevelRegexWithPrefixSpace) {
  json j = TinyTokenizerJson();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = LoadJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // " hello" has no merge for (Ġ, hello); " world" is one token.
  EXPECT_EQ(tok->Encode("hello world"), (Ids{32, 259, 264}));
}

TEST(TokenizerSynthetic, AddedTokenMatchingRules) {
  json j = TinyTokenizerJson();
  j["added_tokens"] = {
      AddedTokenJson(1000, "<s>", true),
      AddedTokenJson(1001, "<L>", true, /*lstrip=*/true),
      AddedTokenJson(1002, "<R>", false, false, /*rstrip=*/true),
      AddedTokenJson(1003, "word", false, false, false, /*single_word=*/true),
      AddedTokenJson(1004, "caf\xC3\xA9", false, false, false, false, /*normalized=*/true),
      AddedTokenJson(1005, "<a><b>", true),
      AddedTokenJson(1006, "<a>", true),
      AddedTokenJson(1007, "ab", false),
      AddedTokenJson(1008, "bc", false),
      AddedTokenJson(1009, "hello", false),  // already in the vocabulary: keeps id 259
  };
  auto tok = LoadJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // HF ignores the JSON ids: new added tokens take the ids after the model vocabulary.
  EXPECT_EQ(tok->TokenToId("<s>"), std::optional<int32_t>(266));
  EXPECT_EQ(tok->TokenToId("hello"), std::optional<int32_t>(259));
  EXPECT_EQ(tok->vocab_size(), 275);
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"a  <L>b", {97, 267, 98}},       // lstrip eats the spaces before
      {"a<R>  b", {97, 268, 98}},       // rstrip eats the spaces after
      {"a word b", {97, 32, 269, 32, 98}},
      {"awordb", {97, 119, 261, 100, 98}},  // single_word: not inside a word
      {"word.", {269, 46}},
      {"cafe\xCC\x81!", {270, 33}},  // normalized=true: matched after NFC
      {"<a><b>", {271}},             // longest match
      {"<a><b", {272, 60, 98}},
      {"abc", {273, 99}},            // leftmost wins over the overlapping "bc"
      {"<s>hello</s>", {266, 259, 60, 47, 115, 62}},
      {"x\xC2\xA0<L>", {120, 267}},  // lstrip takes U+00A0 (White_Space) too
      {" <L> <L>", {267, 267}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(tok->Encode(text), ids) << text;
  EXPECT_TRUE(tok->IsSpecial(266));
  EXPECT_FALSE(tok->IsSpecial(268));
  EXPECT_EQ(tok->Decode(Ids{266, 259, 268}, /*skip_special=*/true), "hello<R>");
  // The ByteLevel decoder maps "é" (an alphabet character) to byte 0xE9: HF decodes the added
  // token "café" to "caf\uFFFD".
  EXPECT_EQ(tok->Decode(Ids{270}), "caf\xEF\xBF\xBD");
}

TEST(TokenizerSynthetic, TemplatePostProcessorAddsSpecialTokens) {
  json j = TinyTokenizerJson();
  j["added_tokens"] = {AddedTokenJson(266, "<bos>", true), AddedTokenJson(267, "<eos>", true)};
  j["post_processor"] = json::parse(R"({
    "type": "Sequence",
    "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
       "pair": [],
       "special_tokens": {
         "<bos>": {"id": "<bos>", "ids": [266], "tokens": ["<bos>"]},
         "<eos>": {"id": "<eos>", "ids": [267], "tokens": ["<eos>"]}}}]})");
  auto tok = LoadJson(j);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("hello", /*add_special_tokens=*/true), (Ids{266, 259, 267}));
  EXPECT_EQ(tok->Encode("hello", /*add_special_tokens=*/false), (Ids{259}));
  EXPECT_EQ(tok->Encode("", /*add_special_tokens=*/true), (Ids{266, 267}));
}

TEST(TokenizerSynthetic, HeapAndSmallMergePathsAgree) {
  // A random merge table over 4 base symbols, built like BPE training: each merge joins two
  // existing symbols into a new one.
  std::mt19937 rng(42);
  tok::BpeModel model;
  model.SetVocab(tok::StringIdMap(), {});
  int32_t next_id = 4;
  for (uint32_t rank = 0; rank < 300; ++rank) {
    const auto a = static_cast<int32_t>(rng() % next_id);
    const auto b = static_cast<int32_t>(rng() % next_id);
    model.AddMerge(a, b, rank, next_id++);
  }
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> symbols(1 + rng() % 96);
    for (auto& s : symbols) s = static_cast<int32_t>(rng() % 4);
    std::vector<int32_t> small = symbols, heap = symbols;
    model.MergeSymbols(&small, /*force_heap=*/false);
    model.MergeSymbols(&heap, /*force_heap=*/true);
    ASSERT_EQ(small, heap) << "trial " << trial;
  }
}

// ---- malformed files ---------------------------------------------------------------------

Status LoadErrorText(std::string_view text) {
  auto tok = Tokenizer::FromJson(text, "bad/tokenizer.json");
  return tok.ok() ? Status::Ok() : tok.status();
}

Status LoadError(const json& j) { return LoadErrorText(j.dump()); }

void ExpectError(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find("bad/tokenizer.json"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(TokenizerSynthetic, MalformedFilesAreStatusErrors) {
  ExpectError(LoadErrorText("{not json"), StatusCode::kInvalidArgument, "JSON");
  ExpectError(LoadErrorText(""), StatusCode::kInvalidArgument, "JSON");
  ExpectError(LoadErrorText("[1, 2]"), StatusCode::kInvalidArgument, "object");
  const std::string full = TinyTokenizerJson().dump();
  ExpectError(LoadErrorText(full.substr(0, full.size() / 2)), StatusCode::kInvalidArgument, "JSON");

  json j = TinyTokenizerJson();
  j.erase("model");
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "model");

  j = TinyTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  ExpectError(LoadError(j), StatusCode::kUnsupported, "Metaspace");

  j = TinyTokenizerJson();
  j["pre_tokenizer"] = nullptr;
  ExpectError(LoadError(j), StatusCode::kUnsupported, "pre_tokenizer");

  j = TinyTokenizerJson();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "regex");

  j = TinyTokenizerJson();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "Sideways");

  j = TinyTokenizerJson();
  j["normalizer"] = {{"type", "Lowercase"}};
  ExpectError(LoadError(j), StatusCode::kUnsupported, "Lowercase");

  j = TinyTokenizerJson();
  j["model"]["type"] = "WordPiece";
  ExpectError(LoadError(j), StatusCode::kUnsupported, "WordPiece");

  j = TinyTokenizerJson();
  j["model"]["byte_fallback"] = true;
  ExpectError(LoadError(j), StatusCode::kUnsupported, "byte_fallback");

  j = TinyTokenizerJson();
  j["model"]["dropout"] = 0.1;
  ExpectError(LoadError(j), StatusCode::kUnsupported, "dropout");

  j = TinyTokenizerJson();
  j["model"]["merges"].push_back({"zz", "top"});
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "'zz'");

  j = TinyTokenizerJson();
  j["model"]["merges"] = {"h e", "no-space-here"};
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "no-space-here");

  j = TinyTokenizerJson();
  j["model"]["vocab"]["he"] = "256";
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "vocab");

  j = TinyTokenizerJson();
  j["model"].erase("vocab");
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "vocab");

  j = TinyTokenizerJson();
  j["decoder"] = nullptr;
  ExpectError(LoadError(j), StatusCode::kUnsupported, "decoder");

  j = TinyTokenizerJson();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectError(LoadError(j), StatusCode::kUnsupported, "WordPiece");

  j = TinyTokenizerJson();
  j["post_processor"] = {{"type", "BertProcessing"}};
  ExpectError(LoadError(j), StatusCode::kUnsupported, "BertProcessing");

  j = TinyTokenizerJson();
  j["added_tokens"] = {{{"id", 300}, {"special", true}}};
  ExpectError(LoadError(j), StatusCode::kInvalidArgument, "content");

  j = TinyTokenizerJson();
  j["version"] = "2.0";
  ExpectError(LoadError(j), StatusCode::kUnsupported, "version");
}

TEST(TokenizerSynthetic, TokenizerConfigVariants) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kestrel_tok_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer.json") << TinyTokenizerJson().dump();
  }
  auto load_with_config = [&](const std::string& config) {
    std::ofstream(dir / "tokenizer_config.json") << config;
    return Tokenizer::FromDirectory(dir.string());
  };
  {
    auto tok = load_with_config(
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "add_bos_token": true})");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->bos_token(), "<s>");
    EXPECT_EQ(tok->eos_token(), "</s>");
    EXPECT_TRUE(tok->add_bos_token());
  }
  {
    auto tok = load_with_config(R"({"bos_token": null, "eos_token": null})");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->bos_token(), "");
    EXPECT_EQ(tok->eos_token(), "");
    EXPECT_FALSE(tok->add_bos_token());
  }
  {
    auto tok = load_with_config(R"({"bos_token": 5})");
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("tokenizer_config.json"), std::string::npos);
  }
  {
    auto tok = load_with_config("{broken");
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("tokenizer_config.json"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kestrel
