// Vector loads and stores shared by the element-wise kernels (norm.cu, rope.cu, activation.cu)
// and the GEMV kernels (linear.cu, quant_linear.cu):
// N consecutive elements per thread in one access where N allows (16-byte float4 pairs, uint4 of
// eight bf16), f32 in registers. Callers guarantee the alignment of the wider forms.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kestrel::cuda {

// The low and the high bf16 of a 32-bit word as f32 (exact).
__device__ __forceinline__ float Bf16Lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// p[0..N) as f32; N in {1, 2, 4, 8}.
template <int N>
__device__ __forceinline__ void LoadF32(const float* p, float (&v)[N]) {
  if constexpr (N == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (N == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    v[0] = a.x, v[1] = a.y;
  } else {
    static_assert(N == 1);
    v[0] = *p;
  }
}

// N in {1, 8}.
template <int N>
__device__ __forceinline__ void StoreF32(float* p, const float (&v)[N]) {
  if constexpr (N == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    static_assert(N == 1);
    p[0] = v[0];
  }
}

// bf16 -> f32 exactly: the bf16 bits are the high half of the f32 (element 2i is the low half of
// 32-bit word i, little endian). N in {1, 8}.
template <int N>
__device__ __forceinline__ void LoadBf16(const __nv_bfloat16* p, float (&v)[N]) {
  if constexpr (N == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = Bf16Lo(w[i]);
      v[2 * i + 1] = Bf16Hi(w[i]);
    }
  } else {
    static_assert(N == 1);
    v[0] = __bfloat162float(*p);
  }
}

// Two round-to-nearest bf16 in one 32-bit word, lo in the low half (the lower address).
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// v rounded to bf16 into p[0..N); N in {1, 2, 4, 8}.
template <int N>
__device__ __forceinline__ void StoreBf16(__nv_bfloat16* p, const float (&v)[N]) {
  if constexpr (N == 8) {
    *reinterpret_cast<uint4*>(p) = make_uint4(PackBf16x2(v[0], v[1]), PackBf16x2(v[2], v[3]),
                                              PackBf16x2(v[4], v[5]), PackBf16x2(v[6], v[7]));
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(PackBf16x2(v[0], v[1]), PackBf16x2(v[2], v[3]));
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint32_t*>(p) = PackBf16x2(v[0], v[1]);
  } else {
    static_assert(N == 1);
    *p = __float2bfloat16_rn(v[0]);
  }
}

}  // namespace kestrel::cuda
