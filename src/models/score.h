// The logits of every position of one token sequence, from cold caches: what `kestrel logits`
// prints and what the tests compare against references. Not a generation path (the Engine is
// the only one); it drives Model::Forward with one sequence whose K/V fill blocks 0, 1, ... in
// order and whose recurrent state (if any) lives in slot 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "models/model.h"

namespace kestrel {

// [ids.size(), vocab] row-major. The prompt goes through in chunks of chunk_tokens (so
// activations stay bounded). Errors: ids empty or outside the vocabulary, or more tokens than
// the KV pool holds.
Result<std::vector<float>> ScorePrompt(Model& model, std::span<const int32_t> ids,
                                       int32_t chunk_tokens = 512);

}  // namespace kestrel
