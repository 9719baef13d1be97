// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Llama 3, Qwen 2/2.5/3/3.5).
// Encode/decode are identical to HF tokenizers: normalizer (none / NFC), pre-tokenizer
// (Split regex + ByteLevel), BPE merges by rank, added tokens matched before BPE, ByteLevel decoder.
//
// Supported tokenizer.json components (anything else is a Status naming the file and component):
//   normalizer      null, NFC, Sequence of those
//   pre_tokenizer   Sequence / Split (Regex or String pattern, every behavior, invert) ending in
//                   exactly one ByteLevel (use_regex => GPT-2 regex, add_prefix_space)
//   model           BPE: vocab, merges ("a b" or ["a","b"]), ignore_merges, unk_token/fuse_unk;
//                   byte_fallback, dropout and subword prefixes/suffixes are refused
//   decoder         ByteLevel (or a Sequence of it)
//   post_processor  null, ByteLevel, TemplateProcessing (single sequence), Sequence of those
//   truncation/padding are ignored (transformers ignores them too).
// Exactness notes (verified against tokenizers 0.23 code point by code point; see unicode.h):
// Oniguruma's Unicode 16 classes for \s \p{L} \p{N} and HF's pre-Unicode-10 NFC tables are
// reproduced. Thread safety: a loaded Tokenizer is immutable; Encode/Decode may run concurrently
// (the BPE word cache is per thread).
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
  // HF only accepts valid UTF-8 (a Rust &str); invalid input is first repaired the way Rust's
  // String::from_utf8_lossy does (each maximal invalid subpart becomes U+FFFD), never a crash.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;
  // Text for ids; special tokens kept unless skip_special. Unknown ids are dropped and invalid
  // UTF-8 becomes U+FFFD (String::from_utf8_lossy), as in HF decode.
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

  // Opaque state, defined in tokenizer_impl.h (named here so the loader can fill it).
  struct Impl;

 private:
  Tokenizer();
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
