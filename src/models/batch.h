// The flattened multi-sequence batch of one engine step (DESIGN.md "One engine step").
// Prefill chunks of some sequences and single decode tokens of others share one forward.
#pragma once

#include <cstdint>
#include <span>

namespace kestrel {

// Recurrent-state models: a copy of one state slot onto another, done before the batch's
// tokens run (restores a prefix-cache snapshot into a sequence's live slot).
struct StateCopy {
  int32_t src_slot = -1;
  int32_t dst_slot = -1;
};

// Recurrent-state models: after token row `row` of the batch has gone through every layer, its
// sequence's state (conv window and delta-rule state of every recurrent layer) is copied to
// `dst_slot` (a prefix-cache snapshot taken at a block boundary inside a chunk).
struct StateSnapshot {
  int32_t row = -1;
  int32_t dst_slot = -1;
};

struct Batch {
  // Per token (n_tokens = token_ids.size()).
  std::span<const int32_t> token_ids;     // [n_tokens]
  std::span<const int32_t> positions;     // [n_tokens] absolute position within its sequence
  std::span<const int32_t> slot_mapping;  // [n_tokens] block * block_size + offset for its K/V

  // Per sequence (n_seqs = seq_starts.size() - 1). Tokens of sequence s are
  // [seq_starts[s], seq_starts[s+1]); they are the last tokens of that sequence's context.
  std::span<const int32_t> seq_starts;    // [n_seqs + 1]
  std::span<const int32_t> context_lens;  // [n_seqs] tokens in the KV cache after this step
  std::span<const int32_t> block_tables;  // [n_seqs, max_blocks_per_seq] physical block ids
  int32_t max_blocks_per_seq = 0;

  // Rows (token indices) whose logits the caller wants, in output order.
  std::span<const int32_t> logits_indices;  // [n_logits]

  // Optional, [n_tokens] or empty. Where sampled_rows[i] >= 0, token i is the token that row
  // sampled_rows[i] of the model's last LaunchSampling chose, and token_ids[i] is ignored: a
  // decode step can be enqueued before the previous step's tokens have reached the host.
  std::span<const int32_t> sampled_rows;

  // Recurrent-state models (CacheSpec::has_recurrent_state), else empty.
  // state_slots[s]: the slot holding sequence s's state; a sequence whose first token in the
  // batch is at position 0 starts from a zero state (the slot's contents are ignored).
  std::span<const int32_t> state_slots;            // [n_seqs]
  std::span<const StateCopy> state_copies;         // applied first, in order
  std::span<const StateSnapshot> state_snapshots;  // sorted by row

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t n_seqs() const { return static_cast<int32_t>(seq_starts.size()) - 1; }
};

}  // namespace kestrel
