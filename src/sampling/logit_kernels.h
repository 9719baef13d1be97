// Vocabulary-wide float loops of the CPU sampler, written so that GCC/Clang turn them into SIMD at
// -O3 with the baseline x86-64 flags: selects are bit masks on integers, not branches on float
// compares (which -ftrapping-math keeps from being if-converted).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kestrel::sampling {

// exp(x) for x <= 0 (weights relative to the most probable token). Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2/2, and a degree-7 Taylor polynomial for e^r: relative error < 3e-7.
// ExpNonPositive(0) == 1 exactly; returns exactly 0 below -87 (and for -inf). NaN: unspecified.
inline float ExpNonPositive(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  constexpr uint32_t kMinus87 = 0xC2AE0000u;  // bits of -87.0f; larger bits = more negative
  const uint32_t under = bits > kMinus87 ? 0xFFFFFFFFu : 0u;
  const float xc = std::bit_cast<float>((under & kMinus87) | (~under & bits));
  const float t = xc * 1.44269504088896341f;        // x / ln2
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest via 1.5 * 2^23
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;  // ln2 hi + lo
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);  // in [-126, 0]: 2^n is a normal float
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(ni + 127) << 23);
  return std::bit_cast<float>(~under & std::bit_cast<uint32_t>(p * scale));
}

// NaN -> -inf and +inf -> the largest float, in place; returns the largest value.
float SanitizeAndMax(std::span<float> z);

// Index of the first element equal to value, or z.size().
size_t FirstIndexOf(std::span<const float> z, float value);

// w[i] = ExpNonPositive((z[i] - z_max) * inv_t); requires z[i] <= z_max, inv_t finite > 0.
void ComputeWeights(std::span<const float> z, float z_max, float inv_t, std::span<float> w);

// Sum in double with a fixed order: eight lanes (lane = index mod 8), each summed in index
// order, combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
double LaneSum(std::span<const float> w);

// Fixed-point weights for the draw: round(w * 2^43) (to nearest, ties to even) for w in [0, 1].
// Sums of up to 2^20 of them fit in 63 bits and are exact, so totals and running sums never
// depend on summation order. Weights below 2^-44 (about 6e-14 of the most probable token's)
// count as 0. Computed as the low bits of the double w * 2^43 + 2^52, which vectorises.
constexpr int kFixedWeightBits = 43;
constexpr int64_t kMaxFixedWeightTokens = int64_t{1} << 20;
inline uint64_t FixedWeight(float w) {
  const double shifted = static_cast<double>(w) * 0x1p43 + 0x1p52;  // ulp 1 at 2^52: rounds
  return std::bit_cast<uint64_t>(shifted) - std::bit_cast<uint64_t>(0x1p52);
}
uint64_t FixedWeightSum(std::span<const float> w);
// ceil(p * total), exactly, for p in (0, 1].
uint64_t CeilScaled(float p, uint64_t total);
// floor(r53 * total / 2^53) for r53 < 2^53: a target in [0, total) for a 53-bit uniform.
uint64_t DrawTarget(uint64_t r53, uint64_t total);

}  // namespace kestrel::sampling
