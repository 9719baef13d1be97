// Small helpers shared by the benchmark verbs (cmd_bench.cpp, cmd_bench_cuda.cpp,
// bench_engine.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "models/config.h"

namespace kestrel::cli {

// The median (the upper one for an even count); v must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> RandomIds(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(dist(rng));
  return ids;
}

// Multiply-adds per token of the linear layers, without and with the LM head.
struct FlopModel {
  double layer_macs = 0;       // all decoder layers
  double head_macs = 0;        // LM head
  double attn_dim_layers = 0;  // n_layers * n_heads * head_dim

  // Causal attention over n new tokens after `past` cached ones: QK^T and PV, 2 flops per MAC.
  double AttentionFlops(double n, double past) const {
    return 4.0 * attn_dim_layers * (n * past + n * (n + 1) / 2);
  }
};

inline FlopModel Flops(const ModelConfig& c) {
  const double hidden = static_cast<double>(c.hidden_size);
  const double q_dim = static_cast<double>(c.n_heads * c.head_dim);
  const double kv_dim = static_cast<double>(c.n_kv_heads * c.head_dim);
  const double inter = static_cast<double>(c.intermediate_size);
  const double n_attention = static_cast<double>(c.n_layers_of(LayerType::kAttention));
  const double n_recurrent = static_cast<double>(c.n_layers_of(LayerType::kLinearAttention));
  const LinearAttentionConfig& la = c.linear;
  const double q_width = (c.attention_output_gate ? 2 : 1) * q_dim;
  FlopModel f;
  // Attention: q(|gate), k, v and o projections; Gated DeltaNet: qkv|z|b|a and out projections
  // (the delta rule itself is a few MACs per state element, counted in the recurrent stage's
  // bytes instead); every layer's MLP.
  f.layer_macs =
      n_attention * (hidden * (q_width + 2 * kv_dim) + q_dim * hidden) +
      n_recurrent * hidden *
          static_cast<double>(la.conv_dim() + 2 * la.value_dim() + 2 * la.n_value_heads) +
      static_cast<double>(c.n_layers) * 3 * inter * hidden;
  // MoE layers instead: the router (+ shared-expert gate), top_k experts and the shared expert
  // per token.
  if (c.has_moe()) {
    double n_moe = 0;
    for (bool m : c.layer_moe) n_moe += m ? 1 : 0;
    const MoeConfig& m = c.moe;
    f.layer_macs +=
        n_moe *
        (-3 * inter * hidden + hidden * static_cast<double>(m.n_experts + 1) +
         3.0 * hidden *
             static_cast<double>(m.top_k * m.expert_intermediate + m.shared_expert_intermediate));
  }
  f.head_macs = static_cast<double>(c.vocab_size) * hidden;
  f.attn_dim_layers = n_attention * q_dim;
  return f;
}

}  // namespace kestrel::cli
