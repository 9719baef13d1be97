#include "engine/sequence.h"

#include "core/check.h"

namespace kestrel {

Sequence::Sequence(int64_t id, std::span<const int32_t> prompt_ids, int32_t max_new_tokens)
    : id_(id),
      n_prompt_tokens_(static_cast<int32_t>(prompt_ids.size())),
      max_new_tokens_(max_new_tokens) {
  KCHECK(!prompt_ids.empty() && max_new_tokens >= 1);
  tokens_.reserve(prompt_ids.size() + static_cast<size_t>(max_new_tokens));
  tokens_.assign(prompt_ids.begin(), prompt_ids.end());
}

void Sequence::AppendToken(int32_t token) {
  KCHECK(!last_token_pending_);
  KCHECK(n_generated_tokens() < max_new_tokens_);
  tokens_.push_back(token);
}

void Sequence::AppendPendingToken() {
  AppendToken(0);  // a valid id, never read before ResolvePendingToken replaces it
  last_token_pending_ = true;
}

void Sequence::ResolvePendingToken(int32_t token) {
  KCHECK(last_token_pending_);
  tokens_.back() = token;
  last_token_pending_ = false;
}

}  // namespace kestrel
