// The attention input stage on the GPU, fused: QKV bias, per-head q/k RMSNorm (Qwen3), RoPE, and
// the write of K and V into the paged KV cache (bf16, or e4m3/int8 codes with a scale per row:
// kv_cache.h). One pass over the fused QKV projection.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kv_cache.h"

namespace kestrel::cuda {

struct QkvRopeShape {
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim even, <= 256
  int32_t rotary_half = 0;         // rotary_dim/2 pairs rotated; must be head_dim/2 (checked)
  int32_t block_size_tokens = 16;  // KV page size
  float qk_norm_eps = 1e-6f;
  float attention_scaling = 1.0f;  // multiplies cos and sin (yarn), see cpu::RopeTables
};

// qkv row t = [q (n_heads*head_dim) | k (n_kv_heads*head_dim) | v (n_kv_heads*head_dim)].
// Per token t and head: a = qkv (+ f32(qkv_bias)); for q and k heads, if q_norm / k_norm is given,
// a = cpu::RmsNorm of the head's row with that weight and qk_norm_eps; then RoPE as
// cpu::RopeTables + cpu::ApplyRope (HF rotate_half: pair (i, i + rotary_half);
// freq = f32(positions[t]) * inv_freq[i]; c = cosf(freq) * attention_scaling, s likewise;
// x1' = x1*c - x2*s, x2' = x2*c + x1*s, no FMA).
// Outputs: q_out[t, h, :] = bf16(q); the K row of kv head h goes to row
// ((slot / bs) * n_kv_heads + h) * bs + slot % bs of k_cache (cpu::KvLayout::RowOffset), slot =
// slot_mapping[t]; the V row (v + bias) goes to the same row of kv.v. Rows are stored as bf16, or
// for a quantized kv.type as codes of the f32 row with its scale at kv.k_scale / kv.v_scale
// [cache_row] (kv_cache.h). A negative slot (a padding token) writes no K/V. Slots of one call
// must be distinct.
// Alignment: qkv 16 bytes; q_out and the caches 8 bytes (cudaMalloc'd buffers always are).
void QkvRope(const float* qkv /*[n, (n_heads + 2*n_kv_heads) * head_dim]*/,
             const __nv_bfloat16* qkv_bias /*[(n_heads + 2*n_kv_heads) * head_dim] or nullptr*/,
             const __nv_bfloat16* q_norm /*[head_dim] or nullptr*/,
             const __nv_bfloat16* k_norm /*[head_dim] or nullptr*/,
             const int32_t* positions /*[n] device*/,
             const float* inv_freq /*[rotary_half] device*/,
             const int32_t* slot_mapping /*[n] device*/, int64_t n, const QkvRopeShape& shape,
             __nv_bfloat16* q_out /*[n, n_heads, head_dim]*/, const KvCacheOut& kv,
             cudaStream_t stream);

// The same into a bf16 cache.
inline void QkvRope(const float* qkv, const __nv_bfloat16* qkv_bias, const __nv_bfloat16* q_norm,
                    const __nv_bfloat16* k_norm, const int32_t* positions, const float* inv_freq,
                    const int32_t* slot_mapping, int64_t n, const QkvRopeShape& shape,
                    __nv_bfloat16* q_out, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                    cudaStream_t stream) {
  QkvRope(qkv, qkv_bias, q_norm, k_norm, positions, inv_freq, slot_mapping, n, shape, q_out,
          KvCacheOut{k_cache, v_cache}, stream);
}

}  // namespace kestrel::cuda
