// CPU ops of the Gated DeltaNet layers (Qwen3-Next / Qwen3.5 linear attention), in f32, as
// transformers' torch reference computes them:
//
//   mixed = in_proj_qkv(x)                     [n, conv_dim]   conv_dim = 2*nk*dk + nv*dv
//   mixed = silu(causal depthwise conv1d(mixed))               (kernel K, window of K-1 inputs)
//   q, k, v = split(mixed)                     [n, nk, dk], [n, nk, dk], [n, nv, dv]
//   q = l2norm(q) / sqrt(dk);  k = l2norm(k)                   (x * rsqrt(sum x^2 + 1e-6))
//   beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)      [n, nv]
//   per value head h (key head h / (nv/nk)), state S [dk, dv], for each token t:
//     S = exp(g_t) * S;  S += k_t (beta_t * (v_t - S^T k_t))^T;  o_t = S^T q_t
//   o = rmsnorm(o) * w * silu(z)  per value head;  out_proj(o)
//
// The delta rule has two forms with the same result: GatedDeltaRecurrent steps token by token
// (decode), GatedDeltaChunked processes chunks of 64 tokens with the WY/UT representation
// (prefill). Both are single-sequence; the caller loops over sequences. Every value head is
// independent and computed by one thread in a fixed order (results do not depend on threads).
#pragma once

#include <cstdint>
#include <span>

#include "backends/cpu/ops.h"
#include "core/tensor.h"

namespace kestrel::cpu {

// Causal depthwise conv1d + SiLU over n consecutive tokens of one sequence:
//   out[t, c] = silu(sum_j w[c, 0, j] * in[t - (K-1) + j, c]),  in[< 0] taken from the window.
//   x      [n, channels];  w [channels, 1, K] (file dtype);  out [n, channels] (may not alias x)
//   window [K-1, channels]: the K-1 inputs before x[0] (zeros at a sequence's start); replaced by
//          the K-1 inputs before the token after x[n-1].
void CausalConv1dSilu(const float* x, int64_t n, int64_t channels, const TensorView& w,
                      float* window, float* out);

// x[r, :] *= 1 / sqrt(sum(x[r, :]^2) + eps) * scale   (l2norm of transformers' FLA port)
void L2NormRows(float* x, int64_t n_rows, int64_t d, float eps, float scale);

// beta[t, h] = sigmoid(b[t, h]);  g[t, h] = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
// (softplus(x) = x above 20, log1p(exp(x)) below, as torch).  b, a, beta, g [n, nv]
void DeltaGates(const float* b, const float* a, const TensorView& a_log, const TensorView& dt_bias,
                int64_t n, int64_t nv, float* beta, float* g);

struct DeltaShape {
  int64_t n_key_heads = 0;
  int64_t n_value_heads = 0;
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
};

// The gated delta rule over n tokens of one sequence, continuing from `state`.
//   q, k [n, nk, dk] (normalised; q scaled);  v [n, nv, dv];  g, beta [n, nv]
//   state [nv, dk, dv] f32, updated in place;  out [n, nv, dv]
void GatedDeltaRecurrent(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                         const float* v, const float* g, const float* beta, int64_t n, float* state,
                         float* out);
inline constexpr int64_t kDeltaChunk = 64;
// Same result by chunks of kDeltaChunk tokens; scratch >= DeltaChunkScratchFloats(ctx, s).
void GatedDeltaChunked(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t n, float* state,
                       float* out, std::span<float> scratch);
int64_t DeltaChunkScratchFloats(const OpContext& ctx, const DeltaShape& s);

// Gated RMSNorm per row of d: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z).  x, z, y [n_rows, d]
// (y may alias x); w [d] (plain weight).
void GatedRmsNorm(const float* x, const float* z, int64_t n_rows, int64_t d, const TensorView& w,
                  float eps, float* y);

// x[i] *= sigmoid(gate[i])   (the attention output gate)
void SigmoidGateInPlace(float* x, const float* gate, int64_t n);

}  // namespace kestrel::cpu
