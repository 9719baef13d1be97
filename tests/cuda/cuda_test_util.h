// Shared helpers of the CUDA kernel tests (label `cuda`): skip without a GPU, upload/download,
// random inputs in bf16, error norms against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/kv_cache.h"
#include "core/check.h"
#include "core/dtype.h"

// Every CUDA test starts with this: on a machine without a usable GPU the test is skipped
// (reported as skipped by ctest), never failed.
#define KESTREL_REQUIRE_CUDA()                                               \
  do {                                                                       \
    if (!::kestrel::cuda::CudaAvailable()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace kestrel::cuda::testing {

template <class T>
DeviceBuffer Upload(const std::vector<T>& host) {
  auto buf = DeviceBuffer::Allocate(host.size() * sizeof(T), "test input");
  KCHECK(buf.ok());
  DeviceBuffer b = std::move(buf).value();
  if (!host.empty()) {
    KCUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return b;
}

// A device buffer of n elements filled with a poison byte pattern (0xFF: NaN for f32/bf16), so
// an element the kernel forgot to write fails the comparison.
template <class T>
DeviceBuffer Poisoned(size_t n) {
  auto buf = DeviceBuffer::Allocate(n * sizeof(T), "test output");
  KCHECK(buf.ok());
  DeviceBuffer b = std::move(buf).value();
  KCUDA_CHECK(cudaMemset(b.get(), 0xFF, n * sizeof(T)));
  return b;
}

template <class T>
std::vector<T> Download(const DeviceBuffer& b, size_t n) {
  std::vector<T> host(n);
  KCUDA_CHECK(cudaDeviceSynchronize());
  if (n > 0) KCUDA_CHECK(cudaMemcpy(host.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

inline std::vector<float> RandomF32(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Random values already representable in bf16 (so CPU and GPU see identical inputs).
inline std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::vector<float> f = RandomF32(n, seed, lo, hi);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = F32ToBf16(f[i]);
  return v;
}

inline std::vector<float> Bf16ToF32(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = kestrel::Bf16ToF32(v[i]);
  return f;
}

// ||out - ref|| / ||ref|| in double; +inf when out has a NaN/inf (never passes).
inline double RelL2(const std::vector<float>& out, const std::vector<float>& ref) {
  KCHECK(out.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline double MaxAbsDiff(const std::vector<float>& out, const std::vector<float>& ref) {
  KCHECK(out.size() == ref.size());
  double m = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    m = std::max(m, std::fabs(static_cast<double>(out[i]) - ref[i]));
  }
  return m;
}

// Host encoders of the quantized KV cache (kv_cache.h), as the write kernels compute them.
// e4m3fn: bias 7, no infinities, 0x7F NaN.
inline float DecodeE4m3(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}
// Round to nearest, ties to the even code, saturating at 448 (the sign kept, also for zero).
inline uint8_t EncodeE4m3(float x) {
  const float y = std::min(std::fabs(x), 448.0f);
  int mag = 0;
  if (y < 0x1p-6f) {
    mag = static_cast<int>(std::nearbyint(y * 0x1p9f));  // subnormal steps of 2^-9; 8 is 2^-6
  } else {
    int e2 = 0;
    std::frexp(y, &e2);  // y = m 2^e2, m in [0.5, 1)
    int e = e2 - 1;
    int q = static_cast<int>(std::nearbyint(std::ldexp(y, 3 - e)));  // in [8, 16]
    if (q == 16) {
      q = 8;
      ++e;
    }
    mag = ((e + 7) << 3) | (q - 8);
  }
  return static_cast<uint8_t>(mag | (std::signbit(x) ? 0x80 : 0));
}
inline float KvCodeValue(uint8_t code, KvCacheType t) {
  return t == KvCacheType::kFp8 ? DecodeE4m3(code) : static_cast<float>(static_cast<int8_t>(code));
}
// One row: codes and scale as the write kernels compute them; returns the scale.
inline float QuantizeKvRow(const float* x, int64_t d, KvCacheType t, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / KvCacheCodeMax(t);
  for (int64_t i = 0; i < d; ++i) {
    if (!(scale > 0.0f)) {
      codes[i] = 0;
    } else if (t == KvCacheType::kFp8) {
      codes[i] = EncodeE4m3(x[i] / scale);
    } else {
      codes[i] = static_cast<uint8_t>(
          static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / scale), -127.0f, 127.0f)));
    }
  }
  return scale;
}

}  // namespace kestrel::cuda::testing
