// Helpers shared by the tokenizer tests: real tokenizer data (tests/data/npm, fetched by
// scripts/setup.sh), the corpus, and a tiny synthetic byte-level tokenizer.json.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace kestrel::testing {

inline std::string SourcePath(const std::string& relative) {
  return std::string(KESTREL_SOURCE_DIR) + "/" + relative;
}

// Loads tests/data/npm/<name> once per test binary. Fails (never skips) when the data is
// missing; returns nullptr then.
inline const Tokenizer* LoadRealTokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second.get();
  const std::string dir = SourcePath("tests/data/npm/" + name);
  if (!FileExists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run scripts/setup.sh to fetch the "
                  << "tokenizer test data";
    return nullptr;
  }
  auto tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    ADD_FAILURE() << "loading " << dir << ": " << tok.status().message();
    return nullptr;
  }
  auto owned = std::make_unique<Tokenizer>(std::move(tok).value());
  const Tokenizer* ptr = owned.get();
  cache.emplace(name, std::move(owned));
  return ptr;
}

// One JSON object per line ("\n" only ends a line).
inline std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

inline std::vector<std::string> ReadCorpus() {
  std::vector<std::string> texts;
  for (const auto& row : ReadJsonl(SourcePath("tests/data/tokenizer/corpus.jsonl"))) {
    texts.push_back(row.at("text").get<std::string>());
  }
  return texts;
}

// A byte-level tokenizer.json: ids 0..255 are the 256 bytes, then a few merged tokens
//   256 he, 257 ll, 258 hell, 259 hello, 260 Ġw, 261 or, 262 Ġwor, 263 ld, 264 Ġworld, 265 hel
// ("hel" is in the vocabulary but no merge builds it: only ignore_merges reaches it).
inline nlohmann::json TinyTokenizerJson() {
  const auto& alphabet = tok::GetByteLevelAlphabet();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet.Encode(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::string> merged = {"he", "ll", "hell", "hello", "Ġw",
                                           "or", "Ġwor", "ld", "Ġworld", "hel"};
  for (size_t i = 0; i < merged.size(); ++i) vocab[merged[i]] = 256 + static_cast<int>(i);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"h", "e"}, {"l", "l"},  {"he", "ll"}, {"hell", "o"},  {"Ġ", "w"},
      {"o", "r"}, {"Ġw", "or"}, {"l", "d"},  {"Ġwor", "ld"}};  // in rank order
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : pairs) merges.push_back(nlohmann::json::array({a, b}));
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", std::string(tok::kQwen2Pattern)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j;
}

inline nlohmann::json AddedTokenJson(int id, const std::string& content, bool special,
                                     bool lstrip = false, bool rstrip = false,
                                     bool single_word = false, bool normalized = false) {
  return {{"id", id},         {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

inline Result<Tokenizer> LoadJson(const nlohmann::json& j) {
  return Tokenizer::FromJson(j.dump(), "tiny/tokenizer.json");
}

}  // namespace kestrel::testing
