// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) and the gated attention of the hybrid
// models on the GPU, over a flattened multi-sequence batch. Same math and order of operations as
// the CPU ops (backends/cpu/deltanet.h), in f32:
//   conv:   out[t, c] = silu(sum_j w[c, j] * in[t - (K-1) + j, c]), earlier inputs from the
//           sequence's conv window (zeros when its first token here is at position 0)
//   prep:   q, k = l2norm per key head (q also * 1/sqrt(dk)); beta = sigmoid(b);
//           g = neg_exp_a[h] * softplus(a + dt_bias[h])   (neg_exp_a = -exp(A_log), host-made)
//   rule:   per value head, state S [dk, dv]: S *= exp(g); delta = (v - S^T k) * beta;
//           S += k delta^T; o = S^T q  (the recurrent form, token by token)
//   norm:   y = bf16(w * (o * inv_rms(o)) * silu(z)) per value head
// State lives in slots (models/cache_spec.h): slot s, recurrent layer l at
//   state + s * slot_floats + l * layer_floats: conv window [(K-1), conv_dim] then S [nv, dk, dv].
// Each batch row may name a snapshot slot (snapshot_slot[t] >= 0): the conv window and S after
// that row are copied there (a prefix-cache snapshot inside a chunk).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kv_cache.h"

namespace kestrel::cuda {

struct DeltaStateView {
  float* state = nullptr;    // slot 0, recurrent layer 0
  int64_t slot_floats = 0;   // floats per slot (all recurrent layers)
  int64_t layer_offset = 0;  // floats from a slot's start to this layer's conv window
  int64_t conv_floats = 0;   // (K-1) * conv_dim; S follows
};

struct DeltaBatchView {
  const int32_t* seq_starts = nullptr;     // [n_seqs + 1]
  const int32_t* positions = nullptr;      // [n_tokens]
  const int32_t* state_slots = nullptr;    // [n_seqs]
  const int32_t* snapshot_slot = nullptr;  // [n_tokens], -1 where none
  int32_t n_seqs = 0;
  int32_t n_tokens = 0;
};

// x: [n_tokens, conv_dim] at row stride x_stride (a slice of the fused projection output);
// w: [conv_dim, K] f32; out: [n_tokens, conv_dim]. K <= 8. Updates each sequence's window.
// Prefill batches (more than 4 rows per sequence) compute every row in parallel and write the
// snapshots in parallel: the snapshot slots of a batch must differ from each other and from the
// batch's state slots (the engine takes each from its own pool entry).
void CausalConv1dSilu(const float* x, int64_t x_stride, int32_t conv_dim, int32_t kernel,
                      const float* w, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                      cudaStream_t stream);

// conv_out rows [q (nk*dk) | k (nk*dk) | v (nv*dv)] -> q, k [n, nk, dk] normalised (q scaled);
// ba: b at ba + t * ba_stride + h, a at ba + t * ba_stride + nv + h -> beta, g [n, nv].
void DeltaPrep(const float* conv_out, int32_t n_tokens, int32_t nk, int32_t dk, int32_t nv,
               int32_t dv, const float* ba, int64_t ba_stride, const float* neg_exp_a,
               const float* dt_bias, float* q, float* k, float* beta, float* g,
               cudaStream_t stream);

// CausalConv1dSilu (x of conv_dim = 2*nk*dk + nv*dv channels) then DeltaPrep, bit for bit the
// same outputs and state. Decode batches (at most 4 rows per sequence on average, as
// CausalConv1dSilu's own per-sequence form) run as one launch: a block per (key head,
// sequence) convolves the head's q, k and v channels with their windows in shared memory,
// normalises q and k per row (NormQk's sums) and computes the heads' gates. Others take the two
// calls.
void CausalConv1dSiluDeltaPrep(const float* x, int64_t x_stride, int32_t kernel, const float* w,
                               const DeltaBatchView& b, const DeltaStateView& s, float* conv_out,
                               int32_t nk, int32_t dk, int32_t nv, int32_t dv, const float* ba,
                               int64_t ba_stride, const float* neg_exp_a, const float* dt_bias,
                               float* q, float* k, float* beta, float* g, cudaStream_t stream);

// How GatedDeltaRule splits a state column at key dim 128 (deltanet.cu): 0, over four warps (the
// default); 2 or 4, over as many neighbouring lanes (the earlier kernels, kept for comparison;
// 4 gives the default's bits). Process-wide; first read: KESTREL_DELTA_SPLIT ("2" or "4"). Not
// to be changed while a stream is being captured.
int DeltaRuleLaneSplit();
void SetDeltaRuleLaneSplit(int lanes);

// The recurrent gated delta rule over every sequence's tokens; v at conv_out + 2*nk*dk with row
// stride v_stride. out: [n, nv, dv]. dv <= 256, dk <= 256.
void GatedDeltaRule(const float* q, const float* k, const float* v, int64_t v_stride,
                    const float* g, const float* beta, int32_t nk, int32_t dk, int32_t nv,
                    int32_t dv, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                    cudaStream_t stream);

// The same contract as GatedDeltaRule, in the chunked form for prefill (deltanet_chunked.cu),
// equal to it up to f32 rounding. Pass 1, parallel over 32-row chunks (on a fixed grid from each
// sequence's first row) and value heads, writes what does not depend on the state to workspace:
// the chunk's cumulative decays and the inverse of its delta rule's triangular system (the WY
// form) with the decayed q.k products; pass 2 walks each sequence's chunks with the state. A
// snapshot row inside a chunk gets the state after that row, without splitting the chunk.
// workspace: GatedDeltaRuleChunkedWorkspaceBytes(b.n_tokens, b.n_seqs, nv) bytes, 16-byte
// aligned, contents ignored (overwritten); b.n_tokens must be the batch's row count. No
// allocation or synchronisation (capturable).
void GatedDeltaRuleChunked(const float* q, const float* k, const float* v, int64_t v_stride,
                           const float* g, const float* beta, int32_t nk, int32_t dk, int32_t nv,
                           int32_t dv, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                           float* workspace, cudaStream_t stream);

// Bytes of GatedDeltaRuleChunked's workspace for a batch of n_tokens rows in n_seqs sequences:
// (n_tokens / 32 + n_seqs) chunk slots x nv value heads x 4,608 bytes (an upper bound on the
// chunks; 6,912 bytes per token at nv = 48).
size_t GatedDeltaRuleChunkedWorkspaceBytes(int32_t n_tokens, int32_t n_seqs, int32_t nv);

// y[r, :] = bf16(w * (x * inv_rms) * silu(z)) for rows of d; z at z + (r / rows_per_token) *
// z_stride + (r % rows_per_token) * d (a slice of the fused projection output).
void GatedRmsNormSilu(const float* x, const float* z, int64_t z_stride, int32_t rows_per_token,
                      int64_t n_rows, int32_t d, const float* w, float eps, __nv_bfloat16* y,
                      cudaStream_t stream);

// Copies whole state slots (prefix-cache restores): dst[i] <- src[i].
void CopyStateSlots(float* state, int64_t slot_floats, const int32_t* src /*[n] device*/,
                    const int32_t* dst /*[n] device*/, int32_t n, cudaStream_t stream);

// The attention input of the gated attention layers (Qwen3.5 / Qwen3-Next): qkv row t =
// [per head: query (hd) | gate (hd)] [k (nkv*hd)] [v (nkv*hd)]. Per q/k head: RMSNorm with
// (norm_offset + w) weights, partial RoPE on the first rotary_dim dims (pairs (i, i + rot/2)),
// the rest unchanged; q -> q_out bf16, gate -> gate_out f32, K/V into the paged cache at
// slot_mapping[t] (< 0: none), as bf16 or codes plus a row scale (kv_cache.h, as QkvRope).
struct GatedQkvShape {
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0, block_size = 16;
  float eps = 1e-6f, norm_offset = 0.0f, attention_scaling = 1.0f;
};
void GatedQkvRope(const float* qkv, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm,
                  const int32_t* positions, const float* inv_freq, const int32_t* slot_mapping,
                  int64_t n, const GatedQkvShape& shape, __nv_bfloat16* q_out, float* gate_out,
                  const KvCacheOut& kv, cudaStream_t stream);

// x[i] = bf16(f32(x[i]) * sigmoid(gate[i])).
void SigmoidGate(__nv_bfloat16* x, const float* gate, int64_t n, cudaStream_t stream);

}  // namespace kestrel::cuda
