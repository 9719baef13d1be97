// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Llama 3, Qwen 2/2.5/3/3.5).
// Encode/decode are identical to HF tokenizers: normalizer (none / NFC), pre-tokenizer
// (Split regex + ByteLevel), BPE merges by rank, added tokens matched before BPE, ByteLevel decoder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kestrel {

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Reads tokenizer.json and, when present, tokenizer_config.json from dir.
  static Result<Tokenizer> FromDirectory(const std::string& dir);
  // `path` names the source in error messages.
  static Result<Tokenizer> FromJson(std::string_view tokenizer_json, const std::string& path);

  // Token ids for text. Added/special tokens appearing in the text are matched (as HF does).
  // add_special_tokens: apply the post-processor (e.g. Llama 3's BOS); false for `tokenize`.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;
  // Text for ids; special tokens kept unless skip_special.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes of one token after the ByteLevel decoder (may be a partial UTF-8 sequence).
  std::string TokenBytes(int32_t id) const;

  int32_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::string IdToToken(int32_t id) const;  // the vocabulary string (byte-level encoded)
  bool IsSpecial(int32_t id) const;

  // From tokenizer_config.json (empty when absent).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  bool add_bos_token() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text that never splits a UTF-8 code point.
// Bytes of an incomplete sequence are held until the next token completes it; Finish()
// flushes what remains (an invalid tail is emitted as U+FFFD, as HF decode does).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer* tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string Push(int32_t id);  // the newly completed text (may be empty)
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kestrel
