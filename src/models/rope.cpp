#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace kestrel {
namespace {

// base ** (arange(0, dim, 2) / dim) in float32, as torch evaluates it (the base is a Python
// float wrapped to the tensor's dtype, the exponent an f32 division).
std::vector<float> PosFreqs(double base, int64_t dim) {
  std::vector<float> out(static_cast<size_t>(dim / 2));
  const float base_f = static_cast<float>(base);
  const float dim_f = static_cast<float>(dim);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim_f;
    out[static_cast<size_t>(i)] = std::pow(base_f, exponent);
  }
  return out;
}

std::vector<float> DefaultInvFreq(double base, int64_t dim) {
  std::vector<float> inv = PosFreqs(base, dim);
  for (float& x : inv) x = 1.0f / x;
  return inv;
}

// _compute_llama3_parameters: long wavelengths divided by factor, short ones kept, a smooth
// blend in between.
std::vector<float> Llama3InvFreq(const RopeConfig& r, int64_t dim) {
  std::vector<float> inv = DefaultInvFreq(r.theta, dim);
  const double old_context = static_cast<double>(r.original_max_position);
  const float low_wavelen = static_cast<float>(old_context / r.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_context / r.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float factor = static_cast<float>(r.factor);
  const float low = static_cast<float>(r.low_freq_factor);
  const float band = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  const float old_context_f = static_cast<float>(old_context);
  for (float& x : inv) {
    // torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar.
    const float wavelen = (1.0f / x) * two_pi;
    const float scaled = wavelen > low_wavelen ? x / factor : x;
    const float smooth = ((1.0f / wavelen) * old_context_f - low) / band;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    x = medium ? smoothed : scaled;
  }
  return inv;
}

// _compute_yarn_parameters (transformers >= 5: the correction range is found against
// original_max_position_embeddings; `truncate` floors/ceils it).
std::vector<float> YarnInvFreq(const RopeConfig& r, int64_t dim) {
  const std::vector<float> pos = PosFreqs(r.theta, dim);
  const double base = r.theta;
  const double orig = static_cast<double>(r.original_max_position);
  auto correction_dim = [&](double n_rotations) {
    return (static_cast<double>(dim) * std::log(orig / (n_rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  const float low_f = static_cast<float>(low);
  const float span_f = static_cast<float>(high - low);
  const float factor = static_cast<float>(r.factor);

  std::vector<float> inv(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    const float extrapolation = 1.0f / pos[i];
    const float interpolation = 1.0f / (factor * pos[i]);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return inv;
}

}  // namespace

int64_t RopeRotaryDim(const ModelConfig& c) {
  return static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
}

std::vector<float> RopeInvFreq(const RopeConfig& rope, int64_t rotary_dim) {
  KCHECK(rotary_dim > 0 && rotary_dim % 2 == 0);
  if (!rope.freq_factors.empty()) {
    KCHECK(static_cast<int64_t>(rope.freq_factors.size()) == rotary_dim / 2);
    std::vector<float> inv = DefaultInvFreq(rope.theta, rotary_dim);
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= rope.freq_factors[i];
    return inv;
  }
  switch (rope.type) {
    case RopeType::kDefault:
      return DefaultInvFreq(rope.theta, rotary_dim);
    case RopeType::kLinear: {
      std::vector<float> inv = DefaultInvFreq(rope.theta, rotary_dim);
      const float factor = static_cast<float>(rope.factor);
      for (float& x : inv) x /= factor;
      return inv;
    }
    case RopeType::kLlama3:
      return Llama3InvFreq(rope, rotary_dim);
    case RopeType::kYarn:
      return YarnInvFreq(rope, rotary_dim);
  }
  KCHECK_MSG(false, "unknown RopeType");
  return {};
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  return RopeInvFreq(c.rope, RopeRotaryDim(c));
}

float RopeAttentionScale(const RopeConfig& rope) {
  if (rope.type != RopeType::kYarn) return 1.0f;
  return static_cast<float>(rope.attention_factor.value_or(1.0));
}

float RopeAttentionScale(const ModelConfig& c) {
  return RopeAttentionScale(c.rope);
}

}  // namespace kestrel
