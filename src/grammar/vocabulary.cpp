// Vocabulary: token bytes from the tokenizer and the preorder byte trie.
#include "grammar/vocabulary.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::grammar {

std::shared_ptr<const Vocabulary> Vocabulary::FromTokenizer(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<int32_t> special;
  for (int32_t id = 0; id < n; ++id) {
    bytes[id] = tokenizer.TokenBytes(id);
    if (tokenizer.IsSpecial(id)) special.push_back(id);
  }
  return FromTokens(std::move(bytes), special);
}

std::shared_ptr<const Vocabulary> Vocabulary::FromTokens(std::vector<std::string> token_bytes,
                                                         std::span<const int32_t> special_ids) {
  auto v = std::shared_ptr<Vocabulary>(new Vocabulary());
  v->token_bytes_ = std::move(token_bytes);
  const int32_t n = v->vocab_size();
  std::vector<uint8_t> is_special(n, 0);
  for (int32_t id : special_ids) {
    if (id >= 0 && id < n) is_special[id] = 1;
  }
  v->position_of_token_.assign(n, -1);
  v->text_mask_.assign(v->bitmask_words(), 0);
  for (int32_t id = 0; id < n; ++id) {
    if (is_special[id] || v->token_bytes_[id].empty()) continue;
    v->token_at_position_.push_back(id);
    v->max_token_bytes_ =
        std::max(v->max_token_bytes_, static_cast<int32_t>(v->token_bytes_[id].size()));
  }
  KCHECK(v->max_token_bytes_ < 65536);
  std::sort(v->token_at_position_.begin(), v->token_at_position_.end(), [&](int32_t a, int32_t b) {
    const int c = v->token_bytes_[a].compare(v->token_bytes_[b]);
    return c != 0 ? c < 0 : a < b;
  });
  for (int32_t p = 0; p < v->n_text_tokens(); ++p) {
    const int32_t id = v->token_at_position_[p];
    v->position_of_token_[id] = p;
    v->text_mask_[id >> 5] |= uint32_t{1} << (id & 31);
  }
  v->BuildTrie();
  return v;
}

void Vocabulary::BuildTrie() {
  node_byte_ = {0};
  node_depth_ = {0};
  node_parent_ = {-1};
  subtree_end_ = {0};
  token_begin_ = {0};
  node_at_position_.assign(token_at_position_.size(), -1);
  std::vector<int32_t> path = {0};  // path[d] = node at depth d on the current branch
  auto pop_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      subtree_end_[path.back()] = n_nodes();
      path.pop_back();
    }
  };
  const std::string* prev = nullptr;
  for (int32_t p = 0; p < n_text_tokens(); ++p) {
    const std::string& bytes = token_bytes_[token_at_position_[p]];
    if (prev != nullptr && *prev == bytes) {  // same bytes as the previous token: same node
      node_at_position_[p] = node_at_position_[p - 1];
      continue;
    }
    size_t lcp = 0;
    if (prev != nullptr) {
      while (lcp < prev->size() && lcp < bytes.size() && (*prev)[lcp] == bytes[lcp]) ++lcp;
    }
    pop_to(lcp);
    for (size_t d = lcp; d < bytes.size(); ++d) {
      const int32_t node = n_nodes();
      node_byte_.push_back(static_cast<uint8_t>(bytes[d]));
      node_depth_.push_back(static_cast<uint16_t>(d + 1));
      node_parent_.push_back(path.back());
      subtree_end_.push_back(-1);
      token_begin_.push_back(p);  // the node's tokens start here (none when it is interior)
      path.push_back(node);
    }
    node_at_position_[p] = path.back();
    prev = &bytes;
  }
  pop_to(0);
  subtree_end_[0] = n_nodes();
  // Node i was created with the position of the first token that spells it or passes through it;
  // interior nodes share that begin with their child, so their runs are empty.
  token_begin_.push_back(n_text_tokens());
}

}  // namespace kestrel::grammar
