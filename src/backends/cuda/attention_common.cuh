// Device helpers shared by the attention kernels (attention_decode.cu, attention_decode_mma.cu,
// attention_prefill.cu): the log2-domain online softmax over mma accumulator rows, the
// fixed-order merge of per-warp partial states into a decode split's (m, l, acc) rows, and which
// token of a sequence the decode path computes.
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/attention.h"

namespace kestrel::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// The token of sequence `seq` that the decode path computes, or -1 for none: the sequence has no
// token in this batch, or (decode_rows_apart) more than one, a prefill chunk the prefill kernel
// computes.
__device__ __forceinline__ int DecodeToken(const PagedAttentionParams& p, int seq) {
  const int token = p.seq_starts[seq];
  const int n = p.seq_starts[seq + 1] - token;
  return n <= 0 || (p.decode_rows_apart && n != 1) ? -1 : token;
}

// Running max to subtract: an all-masked state (m = -inf) uses 0 so exp2(-inf - 0) = 0 instead
// of exp2(-inf + inf) = NaN.
__device__ __forceinline__ float SafeMax(float m) {
  return m == -INFINITY ? 0.0f : m;
}

// 2^x with subnormal results flushed to zero: one MUFU instruction, where exp2f's subnormal
// handling adds a compare and two predicated multiplies. A probability below 2^-126 of the row's
// largest changes nothing a bf16 P or an f32 row sum can show.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// One online-softmax step for accumulator row h of an m16n8 fragment (row lane / 4 + 8 h, whose
// scores sit in the 4 lanes of a quad): the scores s[n][2h], s[n][2h+1] of kTiles n8 tiles (-inf
// masked) become exp2(s - m), the running max m and this lane's partial row sum l are updated,
// and the output accumulators o[.][2h], o[.][2h+1] are rescaled by exp2(m_old - m_new) times
// o_factor. The scores are in log2 units, or with kRawScores raw ones that scale_log2 takes to
// log2 units, folded into the exponent: exp2(s * scale_log2 - m * scale_log2), one fma each (m
// then in raw units, the rescale exp2((m_old - m_new) * scale_log2)). kRawScores (the prefill
// kernel) also takes Exp2Ftz, and skips the rescale of o when no lane of the warp moved its max
// (every factor exactly 1: the same bits); the warp must be converged.
template <bool kRawScores = false, int kTiles, int kDimTiles>
__device__ __forceinline__ void OnlineSoftmaxRow(int h, float (&s)[kTiles][4], float& m_run,
                                                 float& l_run, float (&o)[kDimTiles][4],
                                                 float o_factor = 1.0f, float scale_log2 = 1.0f) {
  float m_tile = -INFINITY;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) m_tile = fmaxf(m_tile, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
  m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
  m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 2));
  const float m_new = fmaxf(m_run, m_tile);
  const float m_use = SafeMax(m_new);
  const float m_scaled = m_use * scale_log2;
  auto p = [&](float x) {
    return kRawScores ? Exp2Ftz(fmaf(x, scale_log2, -m_scaled)) : exp2f(x - m_use);
  };
  const float alpha = kRawScores ? Exp2Ftz((m_run - m_use) * scale_log2) : exp2f(m_run - m_use);
  m_run = m_new;
  float l_tile = 0.0f;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    s[n][2 * h] = p(s[n][2 * h]);
    s[n][2 * h + 1] = p(s[n][2 * h + 1]);
    l_tile += s[n][2 * h] + s[n][2 * h + 1];
  }
  l_run = l_run * alpha + l_tile;
  const float factor = alpha * o_factor;
  if (kRawScores && !__any_sync(0xffffffffu, factor != 1.0f)) return;
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
    o[n][2 * h] *= factor;
    o[n][2 * h + 1] *= factor;
  }
}

// A padded merge buffer: each 32-float window of a row is followed by one float of padding, so a
// row takes D + D / 32 floats and column d sits at d + d / 32. The tensor-core decode kernel's
// lanes (g, t) store columns 32 floats apart (t) of rows g, all in one bank of a plain [row][D]
// buffer (a 16-way conflict per store); padded, lane (g, t) is 4 g + t banks away (row stride
// 132 at head_dim 128), so the stores of a warp hit distinct banks, still at a lane base plus a
// constant offset, and the merge's reads of 32 consecutive columns of a window stay distinct too.
template <int D>
inline constexpr int kPaddedRowFloats = D + D / 32;
__device__ __forceinline__ int PaddedCol(int d) {
  return d + (d >> 5);
}

// Merges the partial softmax states of kWarps warps for `rows` rows in a fixed warp order and
// writes the decode split's rows: row r's state per warp w is (s_m[w][r], s_l[w][r],
// s_o[(w * kRowStride + r) * D + d]; with kPadded, column PaddedCol(d) of rows of
// kPaddedRowFloats<D>); it goes to part_o[(row_base + r * n_splits) * D + d] and
// part_m / part_l[row_base + r * n_splits]. Every thread of the block (kThreads) takes part.
// m_max is finite (a split holds at least one key); a warp that saw no key has m = -inf, l = 0,
// acc = 0 and contributes exactly nothing.
template <int kWarps, int kRowStride, int D, int kThreads, bool kPadded = false>
__device__ __forceinline__ void MergeWarpPartials(const float* s_o,
                                                  const float (&s_m)[kWarps][kRowStride],
                                                  const float (&s_l)[kWarps][kRowStride], int rows,
                                                  int64_t row_base, int32_t n_splits,
                                                  float* __restrict__ part_o,
                                                  float* __restrict__ part_m,
                                                  float* __restrict__ part_l) {
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int r = idx / D;
    const int d = idx % D;
    float m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, s_m[w][r]);
    float acc = 0.0f, l_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(s_m[w][r] - m_max);
      const int at = kPadded ? (w * kRowStride + r) * kPaddedRowFloats<D> + PaddedCol(d)
                             : (w * kRowStride + r) * D + d;
      acc += s_o[at] * f;
      l_sum += s_l[w][r] * f;
    }
    const int64_t out_row = row_base + int64_t{r} * n_splits;
    part_o[out_row * D + d] = acc;
    if (d == 0) {
      part_m[out_row] = m_max;
      part_l[out_row] = l_sum;
    }
  }
}

}  // namespace kestrel::cuda
