// The token vocabulary as the grammar sees it: each token's raw bytes, and a byte trie over the
// tokens that can appear as text, laid out in preorder so a depth-first walk is a linear scan.
//
// Text tokens are all tokens with non-empty bytes that the tokenizer does not mark special (a
// non-special added token such as Qwen3's <think> is text: its bytes are what it means). Special
// tokens never match grammar text; a matcher allows the stop tokens it is given when the grammar
// may end. Built once per tokenizer and shared by every grammar compiled for it.
//
// Trie layout: node 0 is the root (no byte). For node i >= 1: byte, depth (bytes from the root),
// parent, and subtree_end (one past its last descendant). The text tokens sorted by their bytes
// get "positions" 0..n-1; the tokens spelled by node i hold positions
// [token_begin[i], token_begin[i + 1]), so any subtree owns one contiguous run of positions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kestrel {
class Tokenizer;
}

namespace kestrel::grammar {

class Vocabulary {
 public:
  static std::shared_ptr<const Vocabulary> FromTokenizer(const Tokenizer& tokenizer);
  // token_bytes[id] are the bytes of token id; ids in special_ids are never text.
  static std::shared_ptr<const Vocabulary> FromTokens(std::vector<std::string> token_bytes,
                                                      std::span<const int32_t> special_ids = {});

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // uint32 words of a token bitmask (bit id % 32 of word id / 32).
  size_t bitmask_words() const { return (token_bytes_.size() + 31) / 32; }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[id]; }
  bool is_text(int32_t id) const { return position_of_token_[id] >= 0; }
  // Bitmask of the text tokens ([bitmask_words()]).
  const std::vector<uint32_t>& text_mask() const { return text_mask_; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

  // ---- trie ----
  int32_t n_nodes() const { return static_cast<int32_t>(node_byte_.size()); }
  uint8_t node_byte(int32_t i) const { return node_byte_[i]; }
  int32_t node_depth(int32_t i) const { return node_depth_[i]; }
  int32_t node_parent(int32_t i) const { return node_parent_[i]; }
  int32_t subtree_end(int32_t i) const { return subtree_end_[i]; }
  // Positions of the tokens ending at node i are [token_begin(i), token_begin(i + 1)).
  int32_t token_begin(int32_t i) const { return token_begin_[i]; }

  // ---- positions (text tokens in byte order) ----
  int32_t n_text_tokens() const { return static_cast<int32_t>(token_at_position_.size()); }
  int32_t token_at(int32_t position) const { return token_at_position_[position]; }
  int32_t node_at(int32_t position) const { return node_at_position_[position]; }

 private:
  void BuildTrie();

  std::vector<std::string> token_bytes_;    // [vocab_size]
  std::vector<int32_t> position_of_token_;  // [vocab_size] -1 for non-text tokens
  std::vector<uint32_t> text_mask_;         // [bitmask_words]
  int32_t max_token_bytes_ = 0;

  std::vector<uint8_t> node_byte_;          // [n_nodes]
  std::vector<uint16_t> node_depth_;        // [n_nodes]
  std::vector<int32_t> node_parent_;        // [n_nodes]
  std::vector<int32_t> subtree_end_;        // [n_nodes]
  std::vector<int32_t> token_begin_;        // [n_nodes + 1]
  std::vector<int32_t> token_at_position_;  // [n_text_tokens]
  std::vector<int32_t> node_at_position_;   // [n_text_tokens]
};

}  // namespace kestrel::grammar
