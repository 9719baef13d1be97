// Tokenizer encode/decode (HF `tokenizers` semantics); loading lives in tokenizer_load.cpp.
//
// Encode pipeline, as TokenizerImpl::encode_single_sequence runs it:
//   1. added tokens with normalized=false are cut out of the raw text;
//   2. each remaining piece is normalized (NFC) and normalized=true added tokens are cut out;
//   3. the pre-tokenizer steps (Split regexes, ByteLevel) cut pieces into words;
//   4. each word's bytes go through BPE.
#include "tokenizer/tokenizer.h"

#include "core/mapped_file.h"
#include "core/gguf.h"
#include "tokenizer/tokenizer_gguf.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace kestrel {

namespace tok {

ByteLevelAlphabet::ByteLevelAlphabet() {
  for (int16_t& b : char_to_byte) b = -1;
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_char[b] = printable ? b : next_extra++;
    char_to_byte[byte_to_char[b]] = static_cast<int16_t>(b);
  }
}

bool ByteLevelAlphabet::Decode(std::string_view token, std::string* bytes) const {
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    int len;
    const uint32_t cp = DecodeUtf8(token.data() + i, &len);
    if (cp >= 324 || char_to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(char_to_byte[cp]));
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string ByteLevelAlphabet::Encode(std::string_view bytes) const {
  std::string out;
  for (const char c : bytes) AppendUtf8(byte_to_char[static_cast<uint8_t>(c)], &out);
  return out;
}

const ByteLevelAlphabet& GetByteLevelAlphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

namespace {

// Per-thread scratch buffers so that encoding allocates only its result.
struct EncodeScratch {
  std::vector<std::vector<Span>> matches;  // per pre-tokenizer step
  std::vector<std::vector<Span>> pieces;   // per pre-tokenizer step
  std::vector<AddedTokenMatcher::Piece> raw_pieces;
  std::vector<AddedTokenMatcher::Piece> normalized_pieces;
  std::string normalized;

  void Prepare(size_t n_steps) {
    if (matches.size() < n_steps) {
      matches.resize(n_steps);
      pieces.resize(n_steps);
    }
  }
};

thread_local EncodeScratch t_scratch;

}  // namespace

}  // namespace tok

void Tokenizer::Impl::RunPreTokenizers(size_t k, std::string_view piece,
                                       std::vector<int32_t>* ids) const {
  if (k == steps.size()) {
    bpe.EncodeWord(piece, ids);
    return;
  }
  const tok::PreTokenizerStep& step = steps[k];
  std::string prefixed;
  if (step.kind == tok::PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (step.matcher == nullptr) {
      RunPreTokenizers(k + 1, piece, ids);
      return;
    }
  }
  std::vector<tok::Span>& matches = tok::t_scratch.matches[k];
  step.matcher->FindMatches(piece, &matches);
  if (step.behavior == tok::SplitBehavior::kIsolated && !step.invert) {
    // Matches and the gaps between them, in order, each a piece.
    uint32_t prev = 0;
    for (const tok::Span& m : matches) {
      if (prev < m.begin) RunPreTokenizers(k + 1, piece.substr(prev, m.begin - prev), ids);
      if (m.begin < m.end) RunPreTokenizers(k + 1, piece.substr(m.begin, m.end - m.begin), ids);
      prev = m.end;
    }
    if (prev < piece.size()) RunPreTokenizers(k + 1, piece.substr(prev), ids);
    return;
  }
  std::vector<tok::Span>& pieces = tok::t_scratch.pieces[k];
  tok::SplitByMatches(piece, matches, step.behavior, step.invert, &pieces);
  for (const tok::Span& p : pieces) {
    RunPreTokenizers(k + 1, piece.substr(p.begin, p.end - p.begin), ids);
  }
}

void Tokenizer::Impl::EncodeNormalizedPiece(std::string_view piece,
                                            std::vector<int32_t>* ids) const {
  tok::EncodeScratch& scratch = tok::t_scratch;
  if (nfc && tok::NfcNormalize(piece, &scratch.normalized)) piece = scratch.normalized;
  if (normalized_added.empty()) {
    RunPreTokenizers(0, piece, ids);
    return;
  }
  normalized_added.Split(piece, &scratch.normalized_pieces);
  for (const auto& p : scratch.normalized_pieces) {
    if (p.id >= 0) {
      ids->push_back(p.id);
    } else {
      RunPreTokenizers(0, piece.substr(p.begin, p.end - p.begin), ids);
    }
  }
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Result<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json, const std::string& path) {
  Tokenizer tokenizer;
  KTRY(LoadTokenizerJson(tokenizer_json, path, tokenizer.impl_.get()));
  return tokenizer;
}

Result<Tokenizer> Tokenizer::FromDirectory(const std::string& dir) {
  if (IsGgufFile(dir)) {
    KASSIGN(GgufFile g, GgufFile::Open(dir));
    KASSIGN(tok::GgufTokenizerFiles files, tok::TokenizerFilesFromGguf(g));
    const std::string text =
        files.tokenizer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    KASSIGN(Tokenizer tokenizer, FromJson(text, dir + " (GGUF tokenizer)"));
    KTRY(LoadTokenizerConfig(files.tokenizer_config.dump(-1, ' ', false,
                                                         nlohmann::json::error_handler_t::replace),
                             dir + " (GGUF tokenizer)", tokenizer.impl_.get()));
    return tokenizer;
  }
  const std::string json_path = dir + "/tokenizer.json";
  if (!FileExists(json_path)) return NotFound(json_path + ": file not found");
  KASSIGN(std::string text, ReadFileToString(json_path));
  KASSIGN(Tokenizer tokenizer, FromJson(text, json_path));
  const std::string config_path = dir + "/tokenizer_config.json";
  if (FileExists(config_path)) {
    KASSIGN(std::string config, ReadFileToString(config_path));
    KTRY(LoadTokenizerConfig(config, config_path, tokenizer.impl_.get()));
  }
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  // HF takes a Rust &str, so its input is always valid UTF-8; invalid input is repaired the way
  // String::from_utf8_lossy does (each maximal invalid subpart becomes U+FFFD).
  std::string repaired;
  if (!tok::IsValidUtf8(text)) {
    repaired = tok::Utf8Lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = im.prefix_ids;
  tok::EncodeScratch& scratch = tok::t_scratch;
  scratch.Prepare(im.steps.size());
  if (im.raw_added.empty()) {
    if (!text.empty()) im.EncodeNormalizedPiece(text, &ids);
  } else {
    im.raw_added.Split(text, &scratch.raw_pieces);
    // EncodeNormalizedPiece does not touch raw_pieces, so iterating it here is safe.
    for (const auto& p : scratch.raw_pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        im.EncodeNormalizedPiece(text.substr(p.begin, p.end - p.begin), &ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), im.suffix_ids.begin(), im.suffix_ids.end());
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    // HF drops ids it does not know.
    if (!im.Valid(id)) continue;
    if (skip_special && im.special[id]) continue;
    bytes.append(im.Bytes(id));
  }
  if (tok::IsValidUtf8(bytes)) return bytes;
  return tok::Utf8Lossy(bytes);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (!impl_->Valid(id)) return std::string();
  return std::string(impl_->Bytes(id));
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  const Impl& im = *impl_;
  int32_t id = im.added_by_content.Find(token);
  if (id >= 0) return id;
  std::string bytes;
  if (tok::IsValidUtf8(token) && tok::GetByteLevelAlphabet().Decode(token, &bytes)) {
    id = im.bpe.FindBytes(bytes);
    if (id >= 0) return id;
  }
  id = im.non_byte_level_vocab.Find(token);
  if (id >= 0) return id;
  return std::nullopt;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (!impl_->Valid(id)) return std::string();
  return std::string(impl_->TokenString(id));
}

bool Tokenizer::IsSpecial(int32_t id) const { return impl_->Valid(id) && impl_->special[id]; }

const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }

std::string StreamingDetokenizer::Push(int32_t id) {
  if (tokenizer_ == nullptr) return std::string();
  if (skip_special_ && tokenizer_->IsSpecial(id)) return std::string();
  pending_ += tokenizer_->TokenBytes(id);
  const size_t n_ready = tok::Utf8EmittablePrefix(pending_);
  if (n_ready == 0) return std::string();
  std::string out;
  tok::AppendUtf8Lossy(std::string_view(pending_).substr(0, n_ready), &out);
  pending_.erase(0, n_ready);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out = tok::Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace kestrel
