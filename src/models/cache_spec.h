// What a model keeps between steps, by layer type (DESIGN.md "Models, runner and caches per
// layer type"):
//   attention layers    K and V of every token, in paged blocks shared by all sequences;
//   recurrent layers    per sequence *slot*, a conv window ((kernel-1) x conv_dim) and the
//                       gated-delta-rule state (n_value_heads x key_head_dim x value_head_dim),
//                       both f32, whatever the sequence's length.
// KV memory exists only for attention layers; state memory only for recurrent ones. The engine
// sizes its block pool and its slots (live sequences, prefix-cache snapshots) from this.
#pragma once

#include <cstdint>

#include "models/config.h"

namespace kestrel {

struct CacheSpec {
  int64_t n_layers = 0;
  int64_t n_attention_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t kv_element_bytes = 4;  // f32 on the CPU (1 with --kv-cache-dtype int8), bf16 on CUDA
  int64_t kv_row_scale_bytes = 0;  // int8 KV: an f32 scale per (token, kv head) row

  int64_t n_recurrent_layers = 0;
  int64_t conv_state_floats = 0;  // per recurrent layer and slot
  int64_t ssm_state_floats = 0;   // per recurrent layer and slot

  int64_t kv_bytes_per_token() const {
    return 2 * n_attention_layers * n_kv_heads * (head_dim * kv_element_bytes + kv_row_scale_bytes);
  }
  int64_t state_floats_per_layer() const { return conv_state_floats + ssm_state_floats; }
  int64_t state_bytes_per_slot() const {
    return n_recurrent_layers * state_floats_per_layer() * static_cast<int64_t>(sizeof(float));
  }
  bool has_recurrent_state() const { return n_recurrent_layers > 0; }
};

inline CacheSpec MakeCacheSpec(const ModelConfig& c, int64_t kv_element_bytes) {
  CacheSpec s;
  s.n_layers = c.n_layers;
  s.n_attention_layers = c.n_layers_of(LayerType::kAttention);
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.kv_element_bytes = kv_element_bytes;
  s.n_recurrent_layers = c.n_layers_of(LayerType::kLinearAttention);
  if (s.n_recurrent_layers > 0) {
    s.conv_state_floats = c.linear.conv_state_floats();
    s.ssm_state_floats = c.linear.ssm_state_floats();
  }
  return s;
}

}  // namespace kestrel
