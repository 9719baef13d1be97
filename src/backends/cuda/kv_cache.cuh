// Device side of the quantized KV cache (kv_cache.h): encoding a row's elements into codes and
// decoding 8 codes to f32. Included by the .cu files that write (rope.cu, deltanet.cu) and read
// (attention_decode.cu, attention_prefill.cu) the cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/kv_cache.h"

namespace kestrel::cuda {

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The scale of a row whose largest magnitude is amax (kv_cache.h).
__device__ __forceinline__ float KvRowScale(float amax, KvCacheType t) {
  return __fdiv_rn(amax, KvCacheCodeMax(t));
}

// The code of x in a row of scale `scale` (kv_cache.h; 0 for a zero scale), as a byte.
__device__ __forceinline__ uint8_t EncodeKv(float x, float scale, KvCacheType t) {
  if (!(scale > 0.0f)) return 0;
  const float y = __fdiv_rn(x, scale);
  if (t == KvCacheType::kFp8) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  }
  return static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(y), -127.0f), 127.0f)));
}

// Stores the codes of x[0..N) at dst[0..N) in one access (dst aligned to N bytes; N in 1, 2, 4).
template <int N>
__device__ __forceinline__ void StoreKvCodes(uint8_t* dst, const float (&x)[N], float scale,
                                             KvCacheType t) {
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) packed |= static_cast<uint32_t>(EncodeKv(x[i], scale, t)) << (8 * i);
  if constexpr (N == 4) {
    *reinterpret_cast<uint32_t*>(dst) = packed;
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(packed);
  } else {
    static_assert(N == 1);
    *dst = static_cast<uint8_t>(packed);
  }
}

// 8 codes (element i in byte i of the little-endian pair of words) to f32, exactly (e4m3 and int8
// values are exact in f16 and f32).
template <KvCacheType T>
__device__ __forceinline__ void DecodeKv8(const uint2& raw, float (&f)[8]) {
  static_assert(T != KvCacheType::kBf16);
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (T == KvCacheType::kFp8) {
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] & 0xffffu), __NV_E4M3);
      const __half2_raw hi =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo));
      const float2 b = __half22float2(__half2(hi));
      f[4 * i] = a.x;
      f[4 * i + 1] = a.y;
      f[4 * i + 2] = b.x;
      f[4 * i + 3] = b.y;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f[4 * i + j] = static_cast<float>(static_cast<int8_t>((w[i] >> (8 * j)) & 0xffu));
      }
    }
  }
}

}  // namespace kestrel::cuda
