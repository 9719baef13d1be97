// The serving engine end to end in `kestrel bench` (everything `kestrel serve` does per step but
// HTTP): scheduling, batch staging, the forward, sampling, stop checks, detokenising and events.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace kestrel::cli {

// Runs an Engine over `model` (which it takes): for each batch size b, b requests of a 32-token
// random prompt and `new_tokens` new tokens each (greedy, EOS ignored), submitted at once, with
// async scheduling off then on; `repeats` timed runs after one warm-up, median reported. The
// decode rate counts the tokens that reach the client (events read by one polling thread)
// after every request has its first token, over the time until the last one finishes. Returns
// one JSON row per (async, batch): tok_per_s and ms_per_step.
nlohmann::json BenchEngineDecode(std::shared_ptr<Model> model, const std::vector<int64_t>& batches,
                                 int32_t new_tokens, int repeats, uint64_t seed);

// Time to first token of a prompt of each length from cold caches, then of the same prompt plus
// one token, which hits the prefix cache up to its last full block (hybrid models: restoring the
// recurrent-state snapshot of that block); medians over `repeats` fresh random prompts. Rows:
// tokens, cold_ttft_s, hit_ttft_s, cached_tokens, speedup.
nlohmann::json BenchPrefixHit(std::shared_ptr<Model> model, const std::vector<int64_t>& lengths,
                              int repeats, uint64_t seed);

}  // namespace kestrel::cli
