// Internal state of kestrel::Tokenizer, shared by tokenizer.cpp (encode/decode) and
// tokenizer_load.cpp (tokenizer.json parsing). Not part of the public interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {

namespace tok {

// One step of the pre-tokenizer sequence. ByteLevel, when present, is the last step.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::unique_ptr<RegexMatcher> matcher;  // Split pattern, or the GPT-2 regex for ByteLevel
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only
};

// The ByteLevel alphabet: byte <-> printable code point (GPT-2's bytes_to_unicode).
struct ByteLevelAlphabet {
  uint32_t byte_to_char[256];
  int16_t char_to_byte[324];  // -1 where the code point is not in the alphabet
  ByteLevelAlphabet();
  // Decodes a byte-level token string into bytes; false if a character is outside the alphabet.
  bool Decode(std::string_view token, std::string* bytes) const;
  std::string Encode(std::string_view bytes) const;
};
const ByteLevelAlphabet& GetByteLevelAlphabet();

}  // namespace tok

struct Tokenizer::Impl {
  std::string path;  // for messages

  // Model.
  tok::BpeModel bpe;
  int32_t vocab_size = 0;  // highest id + 1, added tokens included
  // Per id: the token string HF hands to the decoder, its bytes after the ByteLevel decoder,
  // and whether it is special. Offsets index the arenas; (n_ids + 1,) each.
  std::vector<uint32_t> string_offsets;
  std::string string_arena;
  std::vector<uint32_t> bytes_offsets;
  std::string bytes_arena;
  std::vector<uint8_t> special;        // (vocab_size,)
  std::vector<uint8_t> present;        // (vocab_size,) 0 for holes in the id space
  tok::StringIdMap added_by_content;   // added token content -> id
  tok::StringIdMap non_byte_level_vocab;  // vocab strings outside the ByteLevel alphabet

  // Pipeline.
  bool nfc = false;
  tok::AddedTokenMatcher raw_added;         // normalized=false tokens, matched on raw text
  tok::AddedTokenMatcher normalized_added;  // normalized=true tokens, on normalized pieces
  std::vector<tok::PreTokenizerStep> steps;
  // Post-processor for add_special_tokens: ids before and after the sequence.
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;

  // tokenizer_config.json.
  std::string bos_token;
  std::string eos_token;
  bool add_bos_token = false;

  std::string_view TokenString(int32_t id) const {
    return std::string_view(string_arena.data() + string_offsets[id],
                            string_offsets[id + 1] - string_offsets[id]);
  }
  std::string_view Bytes(int32_t id) const {
    return std::string_view(bytes_arena.data() + bytes_offsets[id],
                            bytes_offsets[id + 1] - bytes_offsets[id]);
  }
  bool Valid(int32_t id) const { return id >= 0 && id < vocab_size && present[id]; }

  void EncodeNormalizedPiece(std::string_view piece, std::vector<int32_t>* ids) const;
  void RunPreTokenizers(size_t step, std::string_view piece, std::vector<int32_t>* ids) const;
};

// Parses tokenizer.json into impl (tokenizer_load.cpp).
Status LoadTokenizerJson(std::string_view json_text, const std::string& path,
                         Tokenizer::Impl* impl);
// Parses tokenizer_config.json (bos/eos/add_bos_token).
Status LoadTokenizerConfig(std::string_view json_text, const std::string& path,
                           Tokenizer::Impl* impl);

}  // namespace kestrel
