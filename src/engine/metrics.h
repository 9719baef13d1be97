// Counters and latency histograms of the engine, snapshotted for /metrics (Prometheus text is
// formatted by the server layer).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kestrel {

// Fixed-bucket histogram of seconds (cumulative counts as Prometheus expects are derived).
struct Histogram {
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1.0,  2.5,   5.0,
                                                     10.0,  30.0};
  std::array<uint64_t, kBounds.size() + 1> counts{};  // last = +Inf
  double sum = 0;
  uint64_t count = 0;

  void Observe(double seconds) {
    size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    ++counts[i];
    sum += seconds;
    ++count;
  }
};

struct EngineMetrics {
  uint64_t requests_finished_stop = 0;
  uint64_t requests_finished_length = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_rejected = 0;       // queue full / shutting down
  uint64_t prompt_tokens = 0;           // admitted prompt tokens
  uint64_t prompt_tokens_cached = 0;    // of which served from the prefix cache
  uint64_t generation_tokens = 0;
  uint64_t jump_forward_tokens = 0;     // of which appended by grammar jump-forward
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  int64_t waiting = 0;                  // queue length now
  int64_t running = 0;                  // running sequences now
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;           // referenced by a running sequence
  int64_t kv_blocks_cached_free = 0;    // free but still holding a reusable prefix
  // Hybrid models: prefix-cache state snapshots (and the bytes they hold), of the slots kept
  // for them; snapshots evicted to make room.
  int64_t state_snapshots = 0;
  int64_t state_snapshot_bytes = 0;
  int64_t state_snapshot_slots = 0;
  uint64_t state_snapshot_evictions = 0;
  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram e2e_latency;
  // Wall time of each engine step, from the later of its launch and the previous step's end to
  // its end (its sampled tokens back): the device's time per step while steps queue back to
  // back. Steps where every sequence computes one token, and steps that carry prompt chunks
  // (with the tokens those computed in all).
  Histogram decode_step;
  Histogram mixed_step;
  uint64_t mixed_step_tokens = 0;
};

}  // namespace kestrel
