// The attention input stage on the GPU, fused: QKV bias, per-head q/k RMSNorm (Qwen3), RoPE, and
// the write of K and V into the paged bf16 KV cache. One pass over the fused QKV projection.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

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
// slot_mapping[t]; v_cache gets bf16(v + bias) at the same row. A negative slot (a padding token)
// writes no K/V. Slots of one call must be distinct.
// Alignment: qkv 16 bytes; q_out, k_cache, v_cache 8 bytes (cudaMalloc'd buffers always are).
void QkvRope(const float* qkv /*[n, (n_heads + 2*n_kv_heads) * head_dim]*/,
             const __nv_bfloat16* qkv_bias /*[(n_heads + 2*n_kv_heads) * head_dim] or nullptr*/,
             const __nv_bfloat16* q_norm /*[head_dim] or nullptr*/,
             const __nv_bfloat16* k_norm /*[head_dim] or nullptr*/,
             const int32_t* positions /*[n] device*/,
             const float* inv_freq /*[rotary_half] device*/,
             const int32_t* slot_mapping /*[n] device*/, int64_t n, const QkvRopeShape& shape,
             __nv_bfloat16* q_out /*[n, n_heads, head_dim]*/,
             __nv_bfloat16* k_cache /*[n_blocks, n_kv_heads, bs, head_dim]*/,
             __nv_bfloat16* v_cache /*[n_blocks, n_kv_heads, bs, head_dim]*/, cudaStream_t stream);

}  // namespace kestrel::cuda
