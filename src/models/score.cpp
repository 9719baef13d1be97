#include "models/score.h"

#include <algorithm>
#include <numeric>

namespace kestrel {

Result<std::vector<float>> ScorePrompt(Model& model, std::span<const int32_t> ids,
                                       int32_t chunk_tokens) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = model.config().vocab_size;
  if (n == 0) return InvalidArgument("no token ids");
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return InvalidArgument("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
    }
  }
  const int32_t block = model.block_size_tokens();
  const int64_t capacity = int64_t{model.n_kv_blocks()} * block;
  if (n > capacity) {
    return InvalidArgument(std::to_string(n) + " tokens exceed the KV cache capacity of " +
                           std::to_string(capacity) + " tokens");
  }
  chunk_tokens = std::max(chunk_tokens, 1);
  const bool stateful = model.cache_spec().has_recurrent_state();
  const int32_t n_blocks = static_cast<int32_t>((n + block - 1) / block);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  std::vector<int32_t> positions, slots, rows;
  const int32_t state_slot = 0;
  for (int64_t begin = 0; begin < n; begin += chunk_tokens) {
    const int64_t end = std::min(n, begin + chunk_tokens);
    positions.resize(static_cast<size_t>(end - begin));
    std::iota(positions.begin(), positions.end(), static_cast<int32_t>(begin));
    slots = positions;  // blocks 0, 1, ... in order: the slot is the position
    rows.resize(positions.size());
    std::iota(rows.begin(), rows.end(), 0);
    const int32_t seq_starts[2] = {0, static_cast<int32_t>(end - begin)};
    const int32_t context = static_cast<int32_t>(end);
    Batch b;
    b.token_ids = ids.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    b.positions = positions;
    b.slot_mapping = slots;
    b.seq_starts = seq_starts;
    b.context_lens = std::span<const int32_t>(&context, 1);
    b.block_tables = table;
    b.max_blocks_per_seq = n_blocks;
    b.logits_indices = rows;
    if (stateful) b.state_slots = std::span<const int32_t>(&state_slot, 1);
    model.Forward(b, logits.data() + begin * vocab);
  }
  return logits;
}

}  // namespace kestrel
