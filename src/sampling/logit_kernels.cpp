#include "sampling/logit_kernels.h"

#include <cmath>

namespace kestrel::sampling {
namespace {

// Maps float bits to an int32 whose signed order is the float order (for non-NaN values).
// The map is its own inverse.
inline int32_t OrderKey(int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

}  // namespace

float SanitizeAndMax(std::span<float> z) {
  constexpr int32_t kNegInfBits = static_cast<int32_t>(0xFF800000u);
  constexpr int32_t kPosInfBits = 0x7F800000;
  constexpr int32_t kMaxFloatBits = 0x7F7FFFFF;
  int32_t max_key = OrderKey(kNegInfBits);
  for (float& v : z) {
    int32_t b = std::bit_cast<int32_t>(v);
    const int32_t is_nan = (b & 0x7FFFFFFF) > kPosInfBits ? -1 : 0;
    b = (is_nan & kNegInfBits) | (~is_nan & b);
    const int32_t is_pos_inf = b == kPosInfBits ? -1 : 0;
    b = (is_pos_inf & kMaxFloatBits) | (~is_pos_inf & b);
    v = std::bit_cast<float>(b);
    const int32_t key = OrderKey(b);
    max_key = key > max_key ? key : max_key;
  }
  return std::bit_cast<float>(OrderKey(max_key));
}

size_t FirstIndexOf(std::span<const float> z, float value) {
  for (size_t i = 0; i < z.size(); ++i) {
    if (z[i] == value) return i;
  }
  return z.size();
}

void ComputeWeights(std::span<const float> z, float z_max, float inv_t, std::span<float> w) {
  const float* __restrict in = z.data();
  float* __restrict out = w.data();
  const size_t n = z.size();
  for (size_t i = 0; i < n; ++i) out[i] = ExpNonPositive((in[i] - z_max) * inv_t);
}

double LaneSum(std::span<const float> w) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n = w.size();
  size_t i = 0;
  // Eight named accumulators so that the compiler keeps the per-lane order and still vectorises.
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
    a4 += w[i + 4];
    a5 += w[i + 5];
    a6 += w[i + 6];
    a7 += w[i + 7];
  }
  lanes[0] = a0, lanes[1] = a1, lanes[2] = a2, lanes[3] = a3;
  lanes[4] = a4, lanes[5] = a5, lanes[6] = a6, lanes[7] = a7;
  for (; i < n; ++i) lanes[i % 8] += w[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

uint64_t FixedWeightSum(std::span<const float> w) {
  uint64_t total = 0;
  for (float v : w) total += FixedWeight(v);
  return total;
}

uint64_t CeilScaled(float p, uint64_t total) {
  // p = m * 2^(e - 24) with m a 24-bit integer, so p * total = m * total / 2^(24 - e).
  int e = 0;
  const float mantissa = std::frexp(p, &e);
  const auto m = static_cast<uint64_t>(std::ldexp(mantissa, 24));
  const unsigned __int128 product = static_cast<unsigned __int128>(m) * total;
  const int shift = 24 - e;
  if (shift <= 0) return static_cast<uint64_t>(product << -shift);
  if (shift >= 127) return product == 0 ? 0 : 1;
  const unsigned __int128 one = 1;
  return static_cast<uint64_t>((product + (one << shift) - 1) >> shift);
}

uint64_t DrawTarget(uint64_t r53, uint64_t total) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r53) * total) >> 53);
}

}  // namespace kestrel::sampling
