// The consistency checks every runner applies to a Batch before running it. A failure is a bug
// in the scheduler (KCHECK), never bad input: requests are validated long before.
#pragma once

#include <cstdint>

#include "models/batch.h"

namespace kestrel {

struct BatchLimits {
  int64_t vocab_size = 0;
  int64_t n_kv_slots = 0;  // block * block_size + offset must stay below
  int32_t n_kv_blocks = 0;
  int32_t block_size = 16;
  int32_t n_sampled_rows = 0;  // rows of the model's last LaunchSampling (Batch::sampled_rows)
  int32_t n_state_slots = 0;   // recurrent-state models: slots; 0 = the model keeps no state
};

// Spans sized as batch.h documents, positions inside each context, slots and blocks inside the
// pool, sampled_rows below n_sampled_rows; for recurrent-state models one distinct live slot per
// sequence, copies and snapshots inside the slot range, snapshots sorted by row and never
// written into a slot a sequence of the batch runs in.
void CheckBatch(const Batch& b, const BatchLimits& limits);

}  // namespace kestrel
