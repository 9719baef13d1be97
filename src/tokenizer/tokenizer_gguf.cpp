#include "tokenizer/tokenizer_gguf.h"

namespace kestrel::tok {
namespace {

using nlohmann::json;

enum TokenType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen35Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
  const char* regex;
  bool nfc;
  bool ignore_merges;
};

Result<PreTokenizer> PreFor(const std::string& pre, const std::string& path) {
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return PreTokenizer{kQwen2Regex, true, false};
  if (pre == "qwen35") return PreTokenizer{kQwen35Regex, true, false};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "default") {
    return PreTokenizer{kLlama3Regex, false, true};
  }
  return Unsupported(path + ": GGUF pre-tokenizer '" + pre +
                     "' is not supported (qwen2, qwen35, llama-bpe are)");
}

}  // namespace

Result<json> TokenizerConfigFromGguf(const GgufFile& g) {
  const json& m = g.metadata();
  const auto tokens_it = m.find("tokenizer.ggml.tokens");
  KASSIGN(std::optional<int64_t> bos, g.Int("tokenizer.ggml.bos_token_id"));
  KASSIGN(std::optional<int64_t> eos, g.Int("tokenizer.ggml.eos_token_id"));
  KASSIGN(std::optional<bool> add_bos, g.Bool("tokenizer.ggml.add_bos_token"));
  auto token = [&](std::optional<int64_t> id) -> json {
    if (tokens_it == m.end() || !tokens_it->is_array() || !id || *id < 0 ||
        static_cast<size_t>(*id) >= tokens_it->size()) {
      return nullptr;
    }
    return (*tokens_it)[static_cast<size_t>(*id)];
  };
  json cfg = json::object();
  cfg["bos_token"] = token(bos);
  cfg["eos_token"] = token(eos);
  cfg["add_bos_token"] = add_bos.value_or(false) && cfg["bos_token"].is_string();
  KASSIGN(std::optional<std::string> tmpl, g.String("tokenizer.chat_template"));
  if (tmpl) cfg["chat_template"] = *tmpl;
  return cfg;
}

Result<GgufTokenizerFiles> TokenizerFilesFromGguf(const GgufFile& g) {
  const std::string& path = g.path();
  const json& m = g.metadata();
  KASSIGN(std::optional<std::string> model, g.String("tokenizer.ggml.model"));
  if (!model) return NotFound(path + ": the GGUF file has no tokenizer (tokenizer.ggml.model)");
  if (*model != "gpt2") {
    return Unsupported(path + ": GGUF tokenizer model '" + *model +
                       "' is not supported (byte-level BPE, \"gpt2\", is)");
  }
  KASSIGN(std::optional<std::string> pre_name, g.String("tokenizer.ggml.pre"));
  KASSIGN(PreTokenizer pre, PreFor(pre_name.value_or("default"), path));
  auto tokens_it = m.find("tokenizer.ggml.tokens");
  auto merges_it = m.find("tokenizer.ggml.merges");
  if (tokens_it == m.end() || !tokens_it->is_array() || tokens_it->empty()) {
    return InvalidArgument(path + ": tokenizer.ggml.tokens must be a non-empty string array");
  }
  if (merges_it == m.end() || !merges_it->is_array()) {
    return InvalidArgument(path + ": tokenizer.ggml.merges must be a string array");
  }
  const json* types = nullptr;
  if (auto it = m.find("tokenizer.ggml.token_type"); it != m.end()) {
    if (!it->is_array() || it->size() != tokens_it->size()) {
      return InvalidArgument(path + ": tokenizer.ggml.token_type must have one entry per token");
    }
    types = &*it;
  }
  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens_it->size(); ++id) {
    const json& t = (*tokens_it)[id];
    if (!t.is_string()) return InvalidArgument(path + ": tokenizer.ggml.tokens holds a non-string");
    const int type = types != nullptr && (*types)[id].is_number_integer() ? (*types)[id].get<int>() : kNormal;
    if (type == kUnused) continue;
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id}, {"content", t}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", type == kControl}});
      continue;
    }
    vocab[t.get<std::string>()] = id;
  }
  for (const json& merge : *merges_it) {
    if (!merge.is_string()) return InvalidArgument(path + ": tokenizer.ggml.merges holds a non-string");
  }
  GgufTokenizerFiles out;
  KASSIGN(out.tokenizer_config, TokenizerConfigFromGguf(g));
  const json& cfg = out.tokenizer_config;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                           {"trim_offsets", false}, {"use_regex", false}};
  json& tj = out.tokenizer;
  tj["version"] = "1.0";
  tj["added_tokens"] = std::move(added);
  tj["normalizer"] = pre.nfc ? json{{"type", "NFC"}} : json(nullptr);
  tj["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", pre.regex}}},
                                      {"behavior", "Isolated"}, {"invert", false}},
                                     byte_level})}};
  if (cfg["add_bos_token"].get<bool>()) {
    const std::string b = cfg["bos_token"].get<std::string>();
    const int64_t bos = g.metadata().at("tokenizer.ggml.bos_token_id").get<int64_t>();
    tj["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{b, {{"id", b}, {"ids", json::array({bos})}, {"tokens", json::array({b})}}}}}};
  } else {
    tj["post_processor"] = byte_level;
  }
  tj["decoder"] = byte_level;
  tj["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false}, {"byte_fallback", false},
                 {"ignore_merges", pre.ignore_merges}, {"vocab", std::move(vocab)},
                 {"merges", *merges_it}};
  return out;
}

}  // namespace kestrel::tok
