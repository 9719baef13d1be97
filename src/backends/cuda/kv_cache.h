// The element types of the CUDA paged KV cache (--kv-cache-dtype), shared by the kernels that
// write K/V (QkvRope, GatedQkvRope) and the one that reads them (PagedAttention).
//
//   kBf16  rows of head_dim bf16 (the default).
//   kFp8   rows of head_dim e4m3 codes plus an f32 scale per (token, kv head) row:
//          element = f32(code) * scale, scale = max|row| / 448, code = e4m3(x / scale) rounded to
//          nearest even and saturated (all zero for an all-zero row, scale 0).
//   kInt8  the same with int8 codes: scale = max|row| / 127, code = round-to-even(x / scale)
//          clamped to [-127, 127] -- cpu::WriteKv's int8 cache, operation for operation.
// Rows are quantized from the f32 K/V the attention input stage computes (never from bf16), and
// the scale of the row at element offset o is scale[o / head_dim]: the scale arrays have the data
// layout with head_dim collapsed ([n_blocks, n_kv_heads, block_size]).
//
// Includable from plain host code (g++).
#pragma once

#include <cstdint>

namespace kestrel::cuda {

enum class KvCacheType : int32_t { kBf16 = 0, kFp8 = 1, kInt8 = 2 };

inline constexpr bool KvCacheQuantized(KvCacheType t) {
  return t != KvCacheType::kBf16;
}
inline constexpr int64_t KvCacheElementBytes(KvCacheType t) {
  return t == KvCacheType::kBf16 ? 2 : 1;
}
// Largest code magnitude: the scale is max|row| divided by it.
inline constexpr float KvCacheCodeMax(KvCacheType t) {
  return t == KvCacheType::kFp8 ? 448.0f : 127.0f;
}
inline constexpr const char* KvCacheTypeName(KvCacheType t) {
  return t == KvCacheType::kBf16 ? "bf16" : t == KvCacheType::kFp8 ? "fp8" : "int8";
}

// Where a layer's K and V rows go: data in `type`, and for the quantized types the per-row
// scales (null for bf16).
struct KvCacheOut {
  void* k = nullptr;  // [n_blocks, n_kv_heads, block_size, head_dim] elements of `type`
  void* v = nullptr;
  float* k_scale = nullptr;  // [n_blocks, n_kv_heads, block_size]
  float* v_scale = nullptr;
  KvCacheType type = KvCacheType::kBf16;
};

}  // namespace kestrel::cuda
