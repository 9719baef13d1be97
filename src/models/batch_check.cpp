#include "models/batch_check.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace kestrel {

void CheckBatch(const Batch& b, const BatchLimits& l) {
  const int32_t n = b.n_tokens();
  const int32_t n_seqs = b.n_seqs();
  KCHECK(n > 0 && n_seqs > 0);
  KCHECK(b.positions.size() == static_cast<size_t>(n));
  KCHECK(b.slot_mapping.size() == static_cast<size_t>(n));
  KCHECK(b.context_lens.size() == static_cast<size_t>(n_seqs));
  KCHECK(b.max_blocks_per_seq > 0);
  KCHECK(b.block_tables.size() == static_cast<size_t>(n_seqs) * b.max_blocks_per_seq);
  KCHECK(b.seq_starts[0] == 0 && b.seq_starts[n_seqs] == n);
  for (int32_t s = 0; s < n_seqs; ++s) {
    KCHECK(b.seq_starts[s] <= b.seq_starts[s + 1]);
    KCHECK(b.context_lens[s] <= static_cast<int64_t>(b.max_blocks_per_seq) * l.block_size);
    for (int32_t t = b.seq_starts[s]; t < b.seq_starts[s + 1]; ++t) {
      KCHECK(b.positions[t] >= 0 && b.positions[t] < b.context_lens[s]);
      // A sequence's tokens are consecutive positions (the recurrent layers rely on it).
      KCHECK(t == b.seq_starts[s] || b.positions[t] == b.positions[t - 1] + 1);
    }
  }
  KCHECK(b.sampled_rows.empty() || b.sampled_rows.size() == static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    if (!b.sampled_rows.empty() && b.sampled_rows[t] >= 0) {
      KCHECK_MSG(b.sampled_rows[t] < l.n_sampled_rows, "sampled row past the last sampling");
    } else {
      KCHECK(b.token_ids[t] >= 0 && b.token_ids[t] < l.vocab_size);
    }
    KCHECK(b.slot_mapping[t] >= 0 && b.slot_mapping[t] < l.n_kv_slots);
  }
  for (int32_t block : b.block_tables) KCHECK(block >= -1 && block < l.n_kv_blocks);
  for (int32_t row : b.logits_indices) KCHECK(row >= 0 && row < n);

  if (l.n_state_slots == 0) {
    KCHECK_MSG(b.state_slots.empty() && b.state_copies.empty() && b.state_snapshots.empty(),
               "state slots given to a model without recurrent layers");
    return;
  }
  KCHECK_MSG(b.state_slots.size() == static_cast<size_t>(n_seqs),
             "a recurrent-state model needs one state slot per sequence");
  std::vector<int32_t> live(b.state_slots.begin(), b.state_slots.end());
  std::sort(live.begin(), live.end());
  KCHECK_MSG(std::adjacent_find(live.begin(), live.end()) == live.end(),
             "two sequences of a batch share a state slot");
  for (int32_t s : live) KCHECK(s >= 0 && s < l.n_state_slots);
  for (const StateCopy& c : b.state_copies) {
    KCHECK(c.src_slot >= 0 && c.src_slot < l.n_state_slots);
    KCHECK(c.dst_slot >= 0 && c.dst_slot < l.n_state_slots && c.src_slot != c.dst_slot);
  }
  for (size_t i = 0; i < b.state_snapshots.size(); ++i) {
    const StateSnapshot& s = b.state_snapshots[i];
    KCHECK(s.row >= 0 && s.row < n);
    KCHECK(i == 0 || b.state_snapshots[i - 1].row < s.row);
    KCHECK(s.dst_slot >= 0 && s.dst_slot < l.n_state_slots);
    KCHECK_MSG(!std::binary_search(live.begin(), live.end(), s.dst_slot),
               "a state snapshot would overwrite a live slot of the batch");
  }
}

}  // namespace kestrel
