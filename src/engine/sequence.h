// One request's token sequence as the scheduler sees it (DESIGN.md "One engine step").
// tokens = prompt + generated; the first n_computed_tokens of them have K/V in the sequence's
// blocks. A step computes tokens [n_computed_tokens, n_computed_tokens + n_new) of a sequence;
// when that range ends at the last known token, the step's logits give the next token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace kestrel {

enum class SequenceStatus {
  kWaiting,   // queued: new, or preempted (its blocks freed, n_computed_tokens reset)
  kRunning,   // holds blocks; scheduled every step while the token budget allows
  kFinished,  // removed from the scheduler
};

class Sequence {
 public:
  // The tokens vector is reserved for prompt + max_new_tokens: appends never reallocate.
  Sequence(int64_t id, std::span<const int32_t> prompt_ids, int32_t max_new_tokens);
  virtual ~Sequence() = default;  // the engine derives its per-request state from it
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  int64_t id() const { return id_; }
  std::span<const int32_t> tokens() const { return tokens_; }
  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t n_prompt_tokens() const { return n_prompt_tokens_; }
  int32_t n_generated_tokens() const { return n_tokens() - n_prompt_tokens_; }
  int32_t max_new_tokens() const { return max_new_tokens_; }
  // K/V slots the sequence can ever need: its last token is sampled, never computed.
  int64_t max_kv_tokens() const { return int64_t{n_prompt_tokens_} + max_new_tokens_ - 1; }
  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(n_prompt_tokens_));
  }

  void AppendToken(int32_t token);  // a sampled token; at most max_new_tokens of them

  // Asynchronous steps: the next token is being sampled on the device and the host does not know
  // it yet. AppendPendingToken holds its place (counted by n_tokens and n_generated_tokens, so the
  // scheduler plans its decode); ResolvePendingToken writes it once known. While a token is
  // pending the scheduler neither admits the sequence nor schedules a decode that could only
  // compute the last token (n_generated_tokens == max_new_tokens), and nothing hashes it.
  void AppendPendingToken();
  void ResolvePendingToken(int32_t token);
  bool last_token_pending() const { return last_token_pending_; }

  // Scheduler state.
  SequenceStatus status = SequenceStatus::kWaiting;
  int32_t n_computed_tokens = 0;
  // Prompt tokens found in the prefix cache at the first admission (-1 before it).
  int32_t n_cached_prompt_tokens = -1;
  int32_t n_preemptions = 0;
  SeqBlocks kv;

 private:
  int64_t id_;
  std::vector<int32_t> tokens_;
  int32_t n_prompt_tokens_;
  int32_t max_new_tokens_;
  bool last_token_pending_ = false;
};

}  // namespace kestrel
