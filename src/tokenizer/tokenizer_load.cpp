// tokenizer.json / tokenizer_config.json parsing. Every malformed or unsupported field is a
// Status naming the file and the component; nothing here may crash on bad input.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <unordered_map>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"

namespace kestrel {
namespace {

using json = nlohmann::json;
using tok::AddedToken;
using tok::PreTokenizerStep;
using tok::SplitBehavior;

const json* Field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool IsNull(const json* v) { return v == nullptr || v->is_null(); }

Status GetBool(const json& obj, const char* key, bool default_value, const std::string& where,
               bool* out) {
  const json* v = Field(obj, key);
  if (IsNull(v)) {
    *out = default_value;
    return Status::Ok();
  }
  if (!v->is_boolean()) return InvalidArgument(where + "." + key + " must be a boolean");
  *out = v->get<bool>();
  return Status::Ok();
}

Status GetString(const json& obj, const char* key, const std::string& where, std::string* out) {
  const json* v = Field(obj, key);
  if (v == nullptr || !v->is_string()) {
    return InvalidArgument(where + "." + key + " must be a string");
  }
  *out = v->get<std::string>();
  return Status::Ok();
}

std::string TypeOf(const json& obj) {
  const json* t = Field(obj, "type");
  return (t != nullptr && t->is_string()) ? t->get<std::string>() : std::string();
}

// ---- normalizer --------------------------------------------------------------------------

Status ParseNormalizer(const json& n, Tokenizer::Impl* impl) {
  if (n.is_null()) return Status::Ok();
  if (!n.is_object()) return InvalidArgument("normalizer must be an object or null");
  const std::string type = TypeOf(n);
  if (type == "NFC") {
    impl->nfc = true;
    return Status::Ok();
  }
  if (type == "Sequence") {
    const json* list = Field(n, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("normalizer Sequence needs a 'normalizers' array");
    }
    for (const json& item : *list) KTRY(ParseNormalizer(item, impl));
    return Status::Ok();
  }
  return Unsupported("unsupported normalizer type '" + type + "' (supported: NFC, Sequence)");
}

// ---- pre-tokenizer -----------------------------------------------------------------------

Status ParseBehavior(const json& obj, SplitBehavior* out) {
  const json* v = Field(obj, "behavior");
  if (v == nullptr || !v->is_string()) return InvalidArgument("Split.behavior must be a string");
  const std::string b = v->get<std::string>();
  if (b == "Isolated") {
    *out = SplitBehavior::kIsolated;
  } else if (b == "Removed") {
    *out = SplitBehavior::kRemoved;
  } else if (b == "MergedWithPrevious") {
    *out = SplitBehavior::kMergedWithPrevious;
  } else if (b == "MergedWithNext") {
    *out = SplitBehavior::kMergedWithNext;
  } else if (b == "Contiguous") {
    *out = SplitBehavior::kContiguous;
  } else {
    return InvalidArgument("unknown Split.behavior '" + b + "'");
  }
  return Status::Ok();
}

Status ParsePreTokenizer(const json& p, std::vector<PreTokenizerStep>* steps) {
  if (!p.is_object()) return InvalidArgument("pre_tokenizer must be an object");
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    const json* list = Field(p, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("pre_tokenizer Sequence needs a 'pretokenizers' array");
    }
    for (const json& item : *list) KTRY(ParsePreTokenizer(item, steps));
    return Status::Ok();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    const json* pattern = Field(p, "pattern");
    if (pattern == nullptr || !pattern->is_object()) {
      return InvalidArgument("Split.pattern must be an object {\"Regex\": ...} or {\"String\": ...}");
    }
    const json* regex = Field(*pattern, "Regex");
    const json* literal = Field(*pattern, "String");
    if (regex != nullptr && regex->is_string()) {
      auto matcher = tok::MakeRegexMatcher(regex->get<std::string>());
      if (!matcher.ok()) return matcher.status();
      step.matcher = std::move(matcher).value();
    } else if (literal != nullptr && literal->is_string()) {
      step.matcher = tok::MakeLiteralMatcher(literal->get<std::string>());
    } else {
      return InvalidArgument("Split.pattern must hold a 'Regex' or 'String' string");
    }
    KTRY(ParseBehavior(p, &step.behavior));
    KTRY(GetBool(p, "invert", false, "Split", &step.invert));
    step.kind = PreTokenizerStep::Kind::kSplit;
    steps->push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    bool use_regex = true;
    KTRY(GetBool(p, "add_prefix_space", true, "ByteLevel", &step.add_prefix_space));
    KTRY(GetBool(p, "use_regex", true, "ByteLevel", &use_regex));
    if (use_regex) {
      auto matcher = tok::MakeRegexMatcher(tok::kGpt2Pattern);
      if (!matcher.ok()) return matcher.status();
      step.matcher = std::move(matcher).value();
    }
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    steps->push_back(std::move(step));
    return Status::Ok();
  }
  return Unsupported("unsupported pre_tokenizer type '" + type +
                     "' (supported: Sequence, Split, ByteLevel)");
}

// ---- model -------------------------------------------------------------------------------

// The model vocabulary, indexed for lookups by token string.
struct ModelVocab {
  tok::StringIdMap by_bytes;        // byte-level strings, decoded to raw bytes -> id
  tok::StringIdMap non_byte_level;  // strings with characters outside the alphabet -> id
  size_t n_entries = 0;             // distinct strings (HF's vocab size)
  int32_t max_id = -1;
  std::vector<std::string> id_strings;  // (max_id + 1,) empty for unused ids
  std::vector<uint8_t> present;         // (max_id + 1,)

  int32_t Find(std::string_view token, std::string* scratch) const {
    if (tok::GetByteLevelAlphabet().Decode(token, scratch)) return by_bytes.Find(*scratch);
    return non_byte_level.Find(token);
  }
};

bool IsPlaceholder(const json* v, bool object) {
  return v != nullptr && (object ? v->is_object() : v->is_array()) && v->empty();
}

Status ParseModel(const json& m, tok::TokenizerJson* file, Tokenizer::Impl* impl,
                  ModelVocab* vocab) {
  if (!m.is_object()) return InvalidArgument("'model' must be an object");
  const std::string type = TypeOf(m);
  if (!type.empty() && type != "BPE") {
    return Unsupported("unsupported model type '" + type + "' (supported: BPE)");
  }
  // The streaming parser took the entries out and left empty placeholders.
  if (!IsPlaceholder(Field(m, "vocab"), /*object=*/true)) {
    return InvalidArgument("model.vocab must be an object");
  }
  if (!IsPlaceholder(Field(m, "merges"), /*object=*/false)) {
    return InvalidArgument("model.merges must be an array");
  }
  bool byte_fallback = false;
  KTRY(GetBool(m, "byte_fallback", false, "model", &byte_fallback));
  if (byte_fallback) {
    return Unsupported(
        "model.byte_fallback=true (SentencePiece-style BPE) is not supported; only byte-level "
        "BPE is");
  }
  const json* dropout = Field(m, "dropout");
  if (!IsNull(dropout) && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Unsupported("model.dropout is not supported (non-deterministic BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = Field(m, key);
    if (!IsNull(v) && !(v->is_string() && v->get<std::string>().empty())) {
      return Unsupported(std::string("model.") + key + " is not supported");
    }
  }
  tok::BpeModel::Options options;
  KTRY(GetBool(m, "ignore_merges", false, "model", &options.ignore_merges));
  KTRY(GetBool(m, "fuse_unk", false, "model", &options.fuse_unk));

  vocab->by_bytes.Reserve(file->vocab.size());
  std::string bytes;
  for (const auto& [token, id64] : file->vocab) {
    if (id64 < 0 || id64 >= (int64_t{1} << 30)) {
      return InvalidArgument("model.vocab['" + token + "'] must be a non-negative integer id");
    }
    if (!tok::IsValidUtf8(token)) return InvalidArgument("model.vocab key is not UTF-8");
    const auto id = static_cast<int32_t>(id64);
    tok::StringIdMap& map = tok::GetByteLevelAlphabet().Decode(token, &bytes)
                                ? vocab->by_bytes
                                : vocab->non_byte_level;
    const std::string_view key = &map == &vocab->by_bytes ? std::string_view(bytes) : token;
    if (map.Find(key) < 0) ++vocab->n_entries;
    map.Set(key, id);
    vocab->max_id = std::max(vocab->max_id, id);
  }
  vocab->id_strings.assign(static_cast<size_t>(vocab->max_id + 1), std::string());
  vocab->present.assign(static_cast<size_t>(vocab->max_id + 1), 0);
  for (auto& [token, id64] : file->vocab) {
    // A string repeated with another id keeps the last id (HF builds a map from the JSON).
    if (vocab->Find(token, &bytes) != id64) continue;
    vocab->id_strings[id64] = std::move(token);
    vocab->present[id64] = 1;
  }
  file->vocab.clear();
  file->vocab.shrink_to_fit();

  const json* unk = Field(m, "unk_token");
  if (!IsNull(unk)) {
    if (!unk->is_string()) return InvalidArgument("model.unk_token must be a string or null");
    // HF only fails when an unknown character actually needs the unk token; byte-level
    // vocabularies cover every byte, so an unk token missing from the vocab is left unused.
    const int32_t unk_id = vocab->Find(unk->get<std::string>(), &bytes);
    if (unk_id >= 0) options.unk_id = unk_id;
  }

  uint32_t rank = 0;
  std::string merged;
  impl->bpe.ReserveMerges(file->merges.size());
  for (const auto& [a, b] : file->merges) {
    const int32_t a_id = vocab->Find(a, &bytes);
    const int32_t b_id = vocab->Find(b, &bytes);
    merged = a;
    merged += b;
    const int32_t merged_id = vocab->Find(merged, &bytes);
    if (a_id < 0 || b_id < 0 || merged_id < 0) {
      const std::string& missing = a_id < 0 ? a : (b_id < 0 ? b : merged);
      return InvalidArgument("merge #" + std::to_string(rank + 1) + ": token '" + missing +
                             "' is not in the vocabulary");
    }
    impl->bpe.AddMerge(a_id, b_id, rank, merged_id);
    ++rank;
  }
  file->merges.clear();
  file->merges.shrink_to_fit();
  impl->non_byte_level_vocab = vocab->non_byte_level;
  impl->bpe.SetVocab(std::move(vocab->by_bytes), options);
  return Status::Ok();
}

// ---- added tokens ------------------------------------------------------------------------

Status ParseAddedTokens(const json* list, std::vector<AddedToken>* out) {
  if (IsNull(list)) return Status::Ok();
  if (!list->is_array()) return InvalidArgument("added_tokens must be an array");
  for (const json& t : *list) {
    if (!t.is_object()) return InvalidArgument("added_tokens entries must be objects");
    AddedToken token;
    KTRY(GetString(t, "content", "added_tokens[]", &token.content));
    if (!tok::IsValidUtf8(token.content)) {
      return InvalidArgument("added token content is not UTF-8");
    }
    const json* id = Field(t, "id");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= (int64_t{1} << 30)) {
      return InvalidArgument("added token '" + token.content + "' needs a non-negative id");
    }
    token.id = static_cast<int32_t>(id->get<int64_t>());
    KTRY(GetBool(t, "special", false, "added_tokens[]", &token.special));
    KTRY(GetBool(t, "lstrip", false, "added_tokens[]", &token.lstrip));
    KTRY(GetBool(t, "rstrip", false, "added_tokens[]", &token.rstrip));
    KTRY(GetBool(t, "single_word", false, "added_tokens[]", &token.single_word));
    KTRY(GetBool(t, "normalized", !token.special, "added_tokens[]", &token.normalized));
    out->push_back(std::move(token));
  }
  return Status::Ok();
}

// ---- decoder / post-processor ------------------------------------------------------------

Status CheckDecoder(const json* d) {
  if (IsNull(d)) {
    return Unsupported("decoder is null; only the ByteLevel decoder is supported");
  }
  const std::string type = TypeOf(*d);
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    const json* list = Field(*d, "decoders");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("decoder Sequence needs a 'decoders' array");
    }
    bool has_byte_level = false;
    for (const json& item : *list) {
      KTRY(CheckDecoder(&item));
      has_byte_level = true;
    }
    if (!has_byte_level) return Unsupported("empty decoder Sequence is not supported");
    return Status::Ok();
  }
  return Unsupported("unsupported decoder type '" + type + "' (supported: ByteLevel)");
}

Status ParsePostProcessor(const json* p, Tokenizer::Impl* impl) {
  if (IsNull(p)) return Status::Ok();
  const std::string type = TypeOf(*p);
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "Sequence") {
    const json* list = Field(*p, "processors");
    if (list == nullptr || !list->is_array()) {
      return InvalidArgument("post_processor Sequence needs a 'processors' array");
    }
    for (const json& item : *list) KTRY(ParsePostProcessor(&item, impl));
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    const json* single = Field(*p, "single");
    const json* specials = Field(*p, "special_tokens");
    if (single == nullptr || !single->is_array()) {
      return InvalidArgument("TemplateProcessing.single must be an array");
    }
    bool seen_sequence = false;
    for (const json& piece : *single) {
      if (const json* seq = Field(piece, "Sequence")) {
        const json* id = Field(*seq, "id");
        if (id == nullptr || !id->is_string() || id->get<std::string>() != "A") {
          return InvalidArgument("TemplateProcessing.single may only use sequence 'A'");
        }
        if (seen_sequence) return InvalidArgument("TemplateProcessing.single repeats 'A'");
        seen_sequence = true;
        continue;
      }
      const json* special = Field(piece, "SpecialToken");
      std::string name;
      if (special == nullptr) return InvalidArgument("TemplateProcessing piece not understood");
      KTRY(GetString(*special, "id", "TemplateProcessing.SpecialToken", &name));
      const json* entry = specials ? Field(*specials, name.c_str()) : nullptr;
      const json* ids = entry ? Field(*entry, "ids") : nullptr;
      if (ids == nullptr || !ids->is_array()) {
        return InvalidArgument("TemplateProcessing special token '" + name + "' has no ids");
      }
      for (const json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= (int64_t{1} << 30)) {
          return InvalidArgument("TemplateProcessing ids must be non-negative integers");
        }
        (seen_sequence ? impl->suffix_ids : impl->prefix_ids)
            .push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    if (!seen_sequence) return InvalidArgument("TemplateProcessing.single lacks sequence 'A'");
    return Status::Ok();
  }
  return Unsupported("unsupported post_processor type '" + type +
                     "' (supported: ByteLevel, TemplateProcessing, Sequence)");
}

// ---- id tables ---------------------------------------------------------------------------

// Mirrors HF AddedVocabulary::add_tokens: an added token takes the id its content already has
// (an earlier added token or the model vocabulary), else the next id after the model vocab.
Status RegisterAddedTokens(std::vector<AddedToken> tokens, ModelVocab* vocab,
                           Tokenizer::Impl* impl) {
  auto next_id = static_cast<int32_t>(vocab->n_entries);
  std::vector<AddedToken> final_tokens;  // one per id, the last properties win
  std::unordered_map<int32_t, size_t> index_of_id;
  std::string scratch;
  for (AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    int32_t id = impl->added_by_content.Find(t.content);
    if (id < 0) {
      id = tok::GetByteLevelAlphabet().Decode(t.content, &scratch)
               ? impl->bpe.FindBytes(scratch)
               : vocab->non_byte_level.Find(t.content);
    }
    if (id < 0) id = next_id++;
    t.id = id;
    impl->added_by_content.Set(t.content, id);
    auto [it, inserted] = index_of_id.emplace(id, final_tokens.size());
    if (inserted) {
      final_tokens.push_back(t);
    } else {
      final_tokens[it->second] = t;
    }
  }
  int32_t max_id = vocab->max_id;
  for (const AddedToken& t : final_tokens) max_id = std::max(max_id, t.id);
  if (max_id < 0) return InvalidArgument("the vocabulary is empty");
  impl->vocab_size = max_id + 1;
  std::vector<std::string>& id_strings = vocab->id_strings;
  id_strings.resize(static_cast<size_t>(impl->vocab_size));
  impl->present = std::move(vocab->present);
  impl->present.resize(static_cast<size_t>(impl->vocab_size), 0);
  tok::StringIdMap special_contents;  // HF compares token strings with special contents
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (const AddedToken& t : final_tokens) {
    std::string pattern = t.content;
    if (t.normalized && impl->nfc) {
      std::string nfc;
      if (tok::NfcNormalize(t.content, &nfc)) pattern = nfc;
    }
    // HF decodes a normalized token through its normalized form.
    id_strings[t.id] = pattern;
    impl->present[t.id] = 1;
    if (t.special) special_contents.Set(t.content, t.id);
    if (t.normalized) {
      normalized.push_back(t);
      normalized_patterns.push_back(std::move(pattern));
    } else {
      raw.push_back(t);
      raw_patterns.push_back(t.content);
    }
  }
  impl->raw_added.Build(std::move(raw), std::move(raw_patterns));
  impl->normalized_added.Build(std::move(normalized), std::move(normalized_patterns));
  impl->special.assign(impl->vocab_size, 0);
  if (special_contents.size() > 0) {
    for (int32_t id = 0; id < impl->vocab_size; ++id) {
      if (impl->present[id] && special_contents.Find(id_strings[id]) >= 0) {
        impl->special[id] = 1;
      }
    }
  }
  return Status::Ok();
}

void BuildIdTables(const std::vector<std::string>& id_strings, Tokenizer::Impl* impl) {
  const tok::ByteLevelAlphabet& alphabet = tok::GetByteLevelAlphabet();
  impl->string_offsets.assign(1, 0);
  impl->bytes_offsets.assign(1, 0);
  std::string bytes;
  for (const std::string& s : id_strings) {
    impl->string_arena += s;
    // The ByteLevel decoder maps each character back to its byte; a token with a character
    // outside the alphabet is passed through as its UTF-8 bytes (HF decode_chain).
    if (alphabet.Decode(s, &bytes)) {
      impl->bytes_arena += bytes;
    } else {
      impl->bytes_arena += s;
    }
    impl->string_offsets.push_back(static_cast<uint32_t>(impl->string_arena.size()));
    impl->bytes_offsets.push_back(static_cast<uint32_t>(impl->bytes_arena.size()));
  }
}

}  // namespace

Status LoadTokenizerJson(std::string_view json_text, const std::string& path,
                         Tokenizer::Impl* impl) {
  const std::string where = path + ": ";
  auto parsed = tok::ParseTokenizerJson(json_text);
  if (!parsed.ok()) return parsed.status().With(where);
  tok::TokenizerJson& file = parsed.value();
  const json& root = file.root;
  if (!root.is_object()) return InvalidArgument(where + "top level must be a JSON object");
  impl->path = path;
  if (const json* version = Field(root, "version"); !IsNull(version)) {
    if (!version->is_string() || version->get<std::string>() != "1.0") {
      return Unsupported(where + "unknown tokenizer.json version (expected \"1.0\")");
    }
  }
  // truncation/padding are ignored, as transformers does for tokenizer.json files.
  const json* normalizer = Field(root, "normalizer");
  if (!IsNull(normalizer)) KTRY(ParseNormalizer(*normalizer, impl).With(where));

  const json* pre = Field(root, "pre_tokenizer");
  if (IsNull(pre)) {
    return Unsupported(where + "pre_tokenizer is null; a ByteLevel pre-tokenizer is required");
  }
  KTRY(ParsePreTokenizer(*pre, &impl->steps).With(where));
  const auto n_byte_level =
      std::count_if(impl->steps.begin(), impl->steps.end(), [](const PreTokenizerStep& s) {
        return s.kind == PreTokenizerStep::Kind::kByteLevel;
      });
  if (n_byte_level != 1 || impl->steps.back().kind != PreTokenizerStep::Kind::kByteLevel) {
    return Unsupported(where +
                       "pre_tokenizer must end with exactly one ByteLevel step (byte-level BPE)");
  }

  const json* model = Field(root, "model");
  if (model == nullptr) return InvalidArgument(where + "missing 'model'");
  ModelVocab vocab;
  KTRY(ParseModel(*model, &file, impl, &vocab).With(where));

  KTRY(CheckDecoder(Field(root, "decoder")).With(where));

  std::vector<AddedToken> added;
  KTRY(ParseAddedTokens(Field(root, "added_tokens"), &added).With(where));
  KTRY(RegisterAddedTokens(std::move(added), &vocab, impl).With(where));
  BuildIdTables(vocab.id_strings, impl);

  KTRY(ParsePostProcessor(Field(root, "post_processor"), impl).With(where));
  for (const int32_t id : impl->prefix_ids) {
    if (!impl->Valid(id)) return InvalidArgument(where + "post_processor id out of range");
  }
  for (const int32_t id : impl->suffix_ids) {
    if (!impl->Valid(id)) return InvalidArgument(where + "post_processor id out of range");
  }
  return Status::Ok();
}

namespace {

// bos_token / eos_token: a string, null, or an AddedToken object {"content": ...}.
Status ConfigToken(const json& root, const char* key, const std::string& where,
                   std::string* out) {
  out->clear();
  const json* v = Field(root, key);
  if (IsNull(v)) return Status::Ok();
  if (v->is_string()) {
    *out = v->get<std::string>();
    return Status::Ok();
  }
  if (v->is_object()) return GetString(*v, "content", where + key, out);
  return InvalidArgument(where + key + " must be a string, null or {\"content\": ...}");
}

}  // namespace

Status LoadTokenizerConfig(std::string_view json_text, const std::string& path,
                           Tokenizer::Impl* impl) {
  const std::string where = path + ": ";
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(where + "not valid JSON");
  if (!root.is_object()) return InvalidArgument(where + "top level must be a JSON object");
  KTRY(ConfigToken(root, "bos_token", where, &impl->bos_token));
  KTRY(ConfigToken(root, "eos_token", where, &impl->eos_token));
  KTRY(GetBool(root, "add_bos_token", false, "tokenizer_config", &impl->add_bos_token)
           .With(where));
  return Status::Ok();
}

}  // namespace kestrel
