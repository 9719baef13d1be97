// RoPE tables computed the way transformers (>= 5, modeling_rope_utils.py) computes them, so the
// engine's rotations match the float32 reference bit for bit where float32 allows.
//
// How transformers applies them (Llama/Mistral/Qwen2/Qwen3, "rotate_half" layout):
//   freqs[p, i] = float(p) * inv_freq[i]                    (float32, i < rotary_dim / 2)
//   cos[p, i] = cos[p, i + rotary_dim/2] = cos(freqs[p, i]) * attention_scale
//   sin[p, i] = sin[p, i + rotary_dim/2] = sin(freqs[p, i]) * attention_scale
//   q'[i] = q[i] * cos[i] - q[i + half] * sin[i];  q'[i + half] = q[i + half] * cos[i] + q[i] *
//   sin[i]
// i.e. dimension i is paired with i + rotary_dim/2 (not with i + 1).
#pragma once

#include <cstdint>
#include <vector>

#include "models/config.h"

namespace kestrel {

// Dimensions of each head that are rotated (head_dim: partial rotary is refused at parse time).
int64_t RopeRotaryDim(const ModelConfig& c);

// inv_freq [rotary_dim / 2] for every supported rope type (default, linear, llama3, yarn),
// following transformers' float32 arithmetic step by step (powf of the base, f32 reciprocals,
// f32 comparisons for the llama3 bands and the yarn ramp).
std::vector<float> RopeInvFreq(const RopeConfig& rope, int64_t rotary_dim);
std::vector<float> RopeInvFreq(const ModelConfig& c);

// The factor transformers multiplies cos and sin by: yarn's attention_factor, 1 for the rest.
float RopeAttentionScale(const RopeConfig& rope);
float RopeAttentionScale(const ModelConfig& c);

}  // namespace kestrel
