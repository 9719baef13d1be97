// Helpers for the kernel tests: random data, weights in any file dtype at any byte alignment,
// and error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kestrel::testing {

inline std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight tensor in `dtype` whose data starts `byte_offset` bytes past a 64-byte boundary, like
// a tensor inside a safetensors file (whose data offsets need not be aligned).
struct OwnedWeights {
  std::vector<uint8_t> bytes;
  TensorView view;
  std::vector<float> values;  // the exact f32 value of every element (after rounding to dtype)
};

inline OwnedWeights MakeWeights(std::mt19937& rng, DType dtype, std::vector<int64_t> shape,
                                size_t byte_offset, float scale = 1.0f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OwnedWeights w;
  std::vector<float> src = RandomFloats(rng, n, scale);
  const size_t elem = DTypeSize(dtype);
  w.bytes.resize(64 + byte_offset + static_cast<size_t>(n) * elem);
  const size_t align_pad =
      (64 - reinterpret_cast<uintptr_t>(w.bytes.data()) % 64) % 64;
  uint8_t* base = w.bytes.data() + align_pad + byte_offset;
  KCHECK(align_pad + byte_offset + static_cast<size_t>(n) * elem <= w.bytes.size());
  w.values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v = src[static_cast<size_t>(i)];
    if (dtype == DType::kF32) {
      std::memcpy(base + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
      std::memcpy(base + 2 * i, &h, 2);
      v = dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
    }
    w.values[static_cast<size_t>(i)] = v;
  }
  w.view.data = base;
  w.view.dtype = dtype;
  w.view.n_dims = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) w.view.shape[i] = shape[i];
  return w;
}

// ||a - b|| / ||b||  (0 when both are zero)
inline double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline const char* DTypeLabel(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16";
}

}  // namespace kestrel::testing
