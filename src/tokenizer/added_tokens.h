// Added tokens (tokenizer.json "added_tokens"): found in the text before pre-tokenization, with
// HF's AddedVocabulary::find_matches semantics: leftmost-longest matching, then single_word,
// lstrip and rstrip. Tokens with normalized=false are matched on the raw text; those with
// normalized=true on the normalized pieces in between (two separate matchers, as in HF).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

class AddedTokenMatcher {
 public:
  struct Piece {
    uint32_t begin;  // byte offsets into the text
    uint32_t end;
    int32_t id;  // token id, or -1 for text between tokens
  };

  // `patterns[i]` is what token `tokens[i]` matches (its content, or its normalized content).
  void Build(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  bool empty() const { return tokens_.empty(); }

  // Splits text into pieces covering it (empty text pieces are omitted).
  void Split(std::string_view text, std::vector<Piece>* pieces) const;

 private:
  struct Node {
    int32_t token = -1;  // index into tokens_ of the pattern ending here
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  int32_t Child(int32_t node, uint8_t byte) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace kestrel::tok
