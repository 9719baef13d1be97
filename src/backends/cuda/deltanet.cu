// Gated DeltaNet and gated attention kernels (see deltanet.h). Every kernel computes each output
// element in one thread (or one block reduction) in a fixed order, so results do not depend on
// the batch composition.
//   CausalConv1dSilu  grid (channel blocks, sequences): a thread walks one channel of one
//                     sequence through its tokens, its window in registers.
//   DeltaPrep         one warp per (token, key head) row for the norms, then the gates
//                     elementwise, in one launch.
//   GatedDeltaRule    one block per (value head, sequence), dv threads; S [dk, dv] in shared
//                     memory, thread e owning column e (conflict-free), token by token.
//   GatedRmsNormSilu  one warp per row.
//   GatedQkvRope      one block per (token, head), head_dim threads.
// Every kernel here is launched with PDL (pdl.cuh) and opens with PdlWait() (before any global
// read or write) and PdlLaunchDependents(): the next kernel, typically a GEMV that streams its
// weights before its own wait, is scheduled while this one runs.
#include "backends/cuda/deltanet.h"

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/env_setting.h"
#include "backends/cuda/kv_cache.cuh"
#include "backends/cuda/pdl.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kMaxKernel = 8;

__device__ __forceinline__ float SiluF(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float SigmoidF(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float WarpSumF(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// SiLU of one row of one channel's causal conv: weights wc[0..hist) on the hist inputs before the
// row (oldest first, at(0) .. at(hist - 1)), then wc[hist] on the row's input. Every conv kernel
// sums through here, in this order, so they give the same bits.
template <typename At>
__device__ __forceinline__ float ConvRow(const float* wc, int hist, At at, float in) {
  float acc = 0.0f;
  for (int j = 0; j < hist; ++j) acc += wc[j] * at(j);
  acc += wc[hist] * in;
  return SiluF(acc);
}

__global__ void ConvKernel(const float* __restrict__ x, int64_t x_stride, int conv_dim, int kernel,
                           const float* __restrict__ w, DeltaBatchView b, DeltaStateView s,
                           float* __restrict__ out) {
  PdlWait();
  PdlLaunchDependents();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int seq = blockIdx.y;
  if (c >= conv_dim) return;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;
  const int hist = kernel - 1;
  float* window = s.state + b.state_slots[seq] * s.slot_floats + s.layer_offset;
  float win[kMaxKernel];  // win[0..hist) oldest first
  const bool fresh = b.positions[begin] == 0;
  for (int j = 0; j < hist; ++j) win[j] = fresh ? 0.0f : window[j * conv_dim + c];
  float wt[kMaxKernel];
  for (int j = 0; j < kernel; ++j) wt[j] = w[c * kernel + j];
  for (int t = begin; t < end; ++t) {
    const float in = x[t * x_stride + c];
    out[static_cast<int64_t>(t) * conv_dim + c] = ConvRow(
        wt, hist, [&](int j) { return win[j]; }, in);
    for (int j = 0; j + 1 < hist; ++j) win[j] = win[j + 1];
    if (hist > 0) win[hist - 1] = in;
    const int snap = b.snapshot_slot[t];
    if (snap >= 0) {
      float* dst = s.state + snap * s.slot_floats + s.layer_offset;
      for (int j = 0; j < hist; ++j) dst[j * conv_dim + c] = win[j];
    }
  }
  for (int j = 0; j < hist; ++j) window[j * conv_dim + c] = win[j];
}

// The same conv with one thread per (row, channel), for prefill: ConvKernel walks a sequence's
// rows in order per channel (80 blocks at Qwen3.5-27B's 10,240 channels: 5.66 ms for 8,192 rows
// on the H200), though a row needs only its own input and the hist before it. Inputs before the
// sequence's first row come from its window (zeros at position 0); a snapshot row writes the
// window after it to its slot. The sequence's own window is left to ConvWindowKernel, which runs
// after every read of it. Same sums in the same order as ConvKernel, so the same bits.
__global__ void ConvRowsKernel(const float* __restrict__ x, int64_t x_stride, int conv_dim,
                               int kernel, const float* __restrict__ w, DeltaBatchView b,
                               DeltaStateView s, float* __restrict__ out) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(b.n_tokens) * conv_dim) return;
  const int t = static_cast<int>(idx / conv_dim), c = static_cast<int>(idx % conv_dim);
  // The sequence of row t: the last one whose start is <= t (empty sequences share starts).
  int lo = 0, hi = b.n_seqs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (b.seq_starts[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int begin = b.seq_starts[lo], i = t - begin;
  const int hist = kernel - 1;
  const float* window = s.state + b.state_slots[lo] * s.slot_floats + s.layer_offset;
  const bool fresh = b.positions[begin] == 0;
  // The input at sequence offset o (o <= i).
  auto input = [&](int o) {
    if (o >= 0) return x[static_cast<int64_t>(begin + o) * x_stride + c];
    return fresh ? 0.0f : window[static_cast<int64_t>(hist + o) * conv_dim + c];
  };
  out[static_cast<int64_t>(t) * conv_dim + c] =
      ConvRow(w + c * kernel, hist, [&](int j) { return input(i - hist + j); },
              x[static_cast<int64_t>(t) * x_stride + c]);
  const int snap = b.snapshot_slot[t];
  if (snap >= 0) {
    float* dst = s.state + snap * s.slot_floats + s.layer_offset;
    for (int j = 0; j < hist; ++j) dst[j * conv_dim + c] = input(i - hist + 1 + j);
  }
}

// Each sequence's window after its last row, into its slot (after ConvRowsKernel).
__global__ void ConvWindowKernel(const float* __restrict__ x, int64_t x_stride, int conv_dim,
                                 int kernel, DeltaBatchView b, DeltaStateView s) {
  PdlWait();
  PdlLaunchDependents();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int seq = blockIdx.y;
  if (c >= conv_dim) return;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;
  const int hist = kernel - 1, len = end - begin;
  float* window = s.state + b.state_slots[seq] * s.slot_floats + s.layer_offset;
  const bool fresh = b.positions[begin] == 0;
  float win[kMaxKernel];
  for (int j = 0; j < hist; ++j) {
    const int o = len - hist + j;
    win[j] = o >= 0 ? x[static_cast<int64_t>(begin + o) * x_stride + c]
                    : (fresh ? 0.0f : window[static_cast<int64_t>(hist + o) * conv_dim + c]);
  }
  for (int j = 0; j < hist; ++j) window[j * conv_dim + c] = win[j];
}

// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) of (token t, value head h), at
// t * nv + h.
__device__ __forceinline__ void Gates(const float* __restrict__ ba, int64_t ba_stride, int nv,
                                      int64_t t, int h, const float* __restrict__ neg_exp_a,
                                      const float* __restrict__ dt_bias, float* __restrict__ beta,
                                      float* __restrict__ g) {
  const float bv = ba[t * ba_stride + h];
  const float av = ba[t * ba_stride + nv + h] + dt_bias[h];
  beta[t * nv + h] = SigmoidF(bv);
  const float softplus = av > 20.0f ? av : log1pf(expf(av));
  g[t * nv + h] = neg_exp_a[h] * softplus;
}

// One warp L2-normalises a row of dk floats (lane-strided sums, then the butterfly), times scale.
__device__ __forceinline__ void NormRowWarp(const float* src, float* dst, int dk, float scale) {
  const int lane = threadIdx.x & 31;
  float ss = 0.0f;
  for (int j = lane; j < dk; j += 32) ss += src[j] * src[j];
  ss = WarpSumF(ss);
  const float inv = 1.0f / sqrtf(ss + 1e-6f);
  for (int j = lane; j < dk; j += 32) dst[j] = src[j] * inv * scale;
}

// q and k rows L2-normalised, one warp per (token, key head, q or k) row; then, in the threads
// after those warps, the gates, one (token, value head) each. One launch for both.
__global__ void DeltaPrepKernel(const float* __restrict__ conv_out, int n_tokens, int nk, int dk,
                                int conv_dim, float q_scale, float* __restrict__ q,
                                float* __restrict__ k, const float* __restrict__ ba,
                                int64_t ba_stride, int nv, const float* __restrict__ neg_exp_a,
                                const float* __restrict__ dt_bias, float* __restrict__ beta,
                                float* __restrict__ g) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = int64_t{n_tokens} * nk * 2;
  if (idx < rows * 32) {  // whole warps: rows * 32 is a multiple of 32
    const int warp = static_cast<int>(idx >> 5);
    const int which = warp % 2;  // 0: q, 1: k
    const int th = warp / 2;     // token * nk + head
    const int t = th / nk, h = th % nk;
    NormRowWarp(conv_out + static_cast<int64_t>(t) * conv_dim + which * nk * dk + h * dk,
                (which == 0 ? q : k) + static_cast<int64_t>(th) * dk, dk,
                which == 0 ? q_scale : 1.0f);
    return;
  }
  const int64_t i = idx - rows * 32;
  if (i >= int64_t{n_tokens} * nv) return;
  Gates(ba, ba_stride, nv, i / nv, static_cast<int>(i % nv), neg_exp_a, dt_bias, beta, g);
}

// Block (key head kh, sequence) of CausalConv1dSiluDeltaPrep's decode form: its channels i are
// kh's q channels, then its k channels, then the v channels of its nv / nk value heads; thread
// x owns channels x, x + blockDim, ... (their windows in shared memory, [hist][n_ch]). Per row:
// the conv as ConvKernel computes it, then warps 0 and 1 normalise q and k as DeltaPrepKernel,
// the threads from 64 on take the heads' gates.
__global__ void ConvPrepKernel(const float* __restrict__ x, int64_t x_stride, int kernel,
                               const float* __restrict__ w, DeltaBatchView b, DeltaStateView s,
                               float* __restrict__ out, int nk, int dk, int nv, int dv,
                               float q_scale, const float* __restrict__ ba, int64_t ba_stride,
                               const float* __restrict__ neg_exp_a,
                               const float* __restrict__ dt_bias, float* __restrict__ q,
                               float* __restrict__ k, float* __restrict__ beta,
                               float* __restrict__ g) {
  extern __shared__ float smem[];
  PdlWait();
  PdlLaunchDependents();
  const int kh = blockIdx.x, seq = blockIdx.y;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;  // the whole block
  const int heads = nv / nk, conv_dim = 2 * nk * dk + nv * dv;
  const int n_ch = 2 * dk + heads * dv, hist = kernel - 1;
  float* win = smem;                // [hist][n_ch]
  float* qk = win + hist * n_ch;    // [2][dk]: the row's q and k conv outputs
  auto channel = [&](int i) {
    return i < dk       ? kh * dk + i
           : i < 2 * dk ? nk * dk + kh * dk + (i - dk)
                        : 2 * nk * dk + kh * heads * dv + (i - 2 * dk);
  };
  float* window = s.state + b.state_slots[seq] * s.slot_floats + s.layer_offset;
  const bool fresh = b.positions[begin] == 0;
  for (int i = threadIdx.x; i < n_ch; i += blockDim.x) {
    const int c = channel(i);
    for (int j = 0; j < hist; ++j) win[j * n_ch + i] = fresh ? 0.0f : window[j * conv_dim + c];
  }
  const int warp = threadIdx.x / 32;
  for (int t = begin; t < end; ++t) {
    const int snap = b.snapshot_slot[t];
    for (int i = threadIdx.x; i < n_ch; i += blockDim.x) {  // only this thread's channels
      const int c = channel(i);
      const float in = x[t * x_stride + c];
      const float o = ConvRow(w + c * kernel, hist, [&](int j) { return win[j * n_ch + i]; }, in);
      out[static_cast<int64_t>(t) * conv_dim + c] = o;
      if (i < 2 * dk) qk[i] = o;
      for (int j = 0; j + 1 < hist; ++j) win[j * n_ch + i] = win[(j + 1) * n_ch + i];
      if (hist > 0) win[(hist - 1) * n_ch + i] = in;
      if (snap >= 0) {
        float* dst = s.state + snap * s.slot_floats + s.layer_offset;
        for (int j = 0; j < hist; ++j) dst[j * conv_dim + c] = win[j * n_ch + i];
      }
    }
    __syncthreads();
    if (warp < 2) {
      NormRowWarp(qk + warp * dk, (warp == 0 ? q : k) + (static_cast<int64_t>(t) * nk + kh) * dk,
                  dk, warp == 0 ? q_scale : 1.0f);
    } else {
      for (int hh = static_cast<int>(threadIdx.x) - 64; hh < heads; hh += blockDim.x - 64) {
        const int h = kh * heads + hh;
        Gates(ba, ba_stride, nv, t, h, neg_exp_a, dt_bias, beta, g);
      }
    }
    __syncthreads();  // qk is rewritten by the next row
  }
  for (int i = threadIdx.x; i < n_ch; i += blockDim.x) {
    const int c = channel(i);
    for (int j = 0; j < hist; ++j) window[j * conv_dim + c] = win[j * n_ch + i];
  }
}

// Block (value head h, sequence), dv threads; dynamic shared memory: S [dk, dv], q_t, k_t [dk].
__global__ void DeltaRuleKernel(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, int64_t v_stride,
                                const float* __restrict__ g, const float* __restrict__ beta, int nk,
                                int dk, int nv, int dv, DeltaBatchView b, DeltaStateView st,
                                float* __restrict__ out) {
  PdlWait();
  PdlLaunchDependents();
  extern __shared__ float smem[];
  float* S = smem;          // [dk, dv]
  float* qs = S + dk * dv;  // [dk]
  float* ks = qs + dk;      // [dk]
  const int h = blockIdx.x, seq = blockIdx.y, e = threadIdx.x;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;
  const int kh = h / (nv / nk);
  const int64_t ssm_offset = st.layer_offset + st.conv_floats + static_cast<int64_t>(h) * dk * dv;
  float* home = st.state + b.state_slots[seq] * st.slot_floats + ssm_offset;
  const bool fresh = b.positions[begin] == 0;
  for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) S[i] = fresh ? 0.0f : home[i];
  __syncthreads();
  for (int t = begin; t < end; ++t) {
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qs[i] = q[(static_cast<int64_t>(t) * nk + kh) * dk + i];
      ks[i] = k[(static_cast<int64_t>(t) * nk + kh) * dk + i];
    }
    __syncthreads();
    const float decay = expf(g[t * nv + h]);
    const float bt = beta[t * nv + h];
    if (e < dv) {
      float mem = 0.0f;
      for (int d = 0; d < dk; ++d) {
        const float sv = S[d * dv + e] * decay;
        S[d * dv + e] = sv;
        mem += sv * ks[d];
      }
      const float delta = (v[t * v_stride + h * dv + e] - mem) * bt;
      float o = 0.0f;
      for (int d = 0; d < dk; ++d) {
        const float sv = S[d * dv + e] + ks[d] * delta;
        S[d * dv + e] = sv;
        o += sv * qs[d];
      }
      out[(static_cast<int64_t>(t) * nv + h) * dv + e] = o;
    }
    __syncthreads();
    const int snap = b.snapshot_slot[t];
    if (snap >= 0) {
      float* dst = st.state + snap * st.slot_floats + ssm_offset;
      for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) dst[i] = S[i];
    }
  }
  for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) home[i] = S[i];
}

// The pieces of the rule that a thread does on its own part of a state column (S: its kRows
// rows, kt and qt: the token's k and q at those rows), shared by the column kernels below.
// Where that part starts in its slot: recurrent layer, value head h, row row0, column e.
__device__ __forceinline__ int64_t ColumnPartOffset(const DeltaStateView& st, int h, int dk, int dv,
                                                    int64_t row0, int e) {
  return st.layer_offset + st.conv_floats + static_cast<int64_t>(h) * dk * dv + row0 * dv + e;
}
// S *= exp(g); returns the part's S^T k.
template <int kRows>
__device__ __forceinline__ float DecayAndRecall(float (&S)[kRows], const float* kt, float decay) {
  float mem = 0.0f;
#pragma unroll
  for (int d = 0; d < kRows; ++d) {
    S[d] *= decay;
    mem += S[d] * kt[d];
  }
  return mem;
}
// S += k delta; returns the part's S^T q.
template <int kRows>
__device__ __forceinline__ float UpdateAndRead(float (&S)[kRows], const float* kt, const float* qt,
                                               float delta) {
  float o = 0.0f;
#pragma unroll
  for (int d = 0; d < kRows; ++d) {
    S[d] += kt[d] * delta;
    o += S[d] * qt[d];
  }
  return o;
}

// The same rule by state columns: the columns of S are independent (column e needs only k, q and
// v[e]), so each column lives in the registers of kSplit neighbouring threads (kDk / kSplit rows
// each; the partial dot products are combined by a butterfly of shuffles, the same order in every
// thread) for the whole sequence. Grid (column groups, value heads, sequences), 64 threads; one
// read and one write of the state, no shared memory, no barriers. kDk: the key head dim. At
// kDk = 128, kSplit 4 holds 32 state floats per thread (kSplit 2: 64, ~200 registers, few warps
// per SM to keep the state's loads in flight).
template <int kDk, int kSplit>
__global__ void __launch_bounds__(64)
    DeltaRuleColumnsKernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, int64_t v_stride,
                           const float* __restrict__ g, const float* __restrict__ beta, int nk,
                           int nv, int dv, DeltaBatchView b, DeltaStateView st,
                           float* __restrict__ out) {
  PdlWait();
  PdlLaunchDependents();
  constexpr int kRows = kDk / kSplit;
  const int thread = blockIdx.x * blockDim.x + threadIdx.x;
  const int e = thread / kSplit, part = thread % kSplit;
  const int h = blockIdx.y, seq = blockIdx.z;
  const bool valid = e < dv;  // no early return: a column's shuffles need all its threads
  const int ec = valid ? e : 0;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  const int kh = h / (nv / nk);
  const int64_t ssm_offset =
      ColumnPartOffset(st, h, kDk, dv, static_cast<int64_t>(part) * kRows, ec);
  float* home = st.state + b.state_slots[seq] * st.slot_floats + ssm_offset;
  float S[kRows];
  const bool fresh = begin == end || b.positions[begin] == 0;
#pragma unroll
  for (int d = 0; d < kRows; ++d)
    S[d] = fresh || !valid ? 0.0f : home[static_cast<int64_t>(d) * dv];
  for (int t = begin; t < end; ++t) {
    const float* qt = q + (static_cast<int64_t>(t) * nk + kh) * kDk + part * kRows;
    const float* kt = k + (static_cast<int64_t>(t) * nk + kh) * kDk + part * kRows;
    const float decay = expf(g[t * nv + h]);
    const float bt = beta[t * nv + h];
    float mem = DecayAndRecall(S, kt, decay);
#pragma unroll
    for (int off = 1; off < kSplit; off *= 2) mem += __shfl_xor_sync(0xffffffffu, mem, off);
    const float delta = (v[t * v_stride + h * dv + ec] - mem) * bt;
    float o = UpdateAndRead(S, kt, qt, delta);
#pragma unroll
    for (int off = 1; off < kSplit; off *= 2) o += __shfl_xor_sync(0xffffffffu, o, off);
    if (valid && part == 0) out[(static_cast<int64_t>(t) * nv + h) * dv + e] = o;
    const int snap = b.snapshot_slot[t];
    if (valid && snap >= 0) {
      float* dst = st.state + snap * st.slot_floats + ssm_offset;
#pragma unroll
      for (int d = 0; d < kRows; ++d) dst[static_cast<int64_t>(d) * dv] = S[d];
    }
  }
  if (valid && begin != end) {
#pragma unroll
    for (int d = 0; d < kRows; ++d) home[static_cast<int64_t>(d) * dv] = S[d];
  }
}

// Column `lane`'s four partial sums in the order a butterfly over four neighbouring lanes adds
// them: (p0 + p1) + (p2 + p3).
__device__ __forceinline__ float TreeSum4(const float (&p)[4][32], int lane) {
  return (p[0][lane] + p[1][lane]) + (p[2][lane] + p[3][lane]);
}

// The same rule with a column's kDk rows split over four warps instead of four neighbouring
// lanes: lane l of every warp owns column e0 + l, warp p rows [p * kDk/4, (p + 1) * kDk/4). A
// warp's load or store of one row then covers 32 consecutive columns, whole 128-byte lines of the
// state (with the lanes split, a line's four 32-byte quarters came from four warps of two
// blocks). The partial dot products meet in shared memory, added in the order of the lane
// butterfly of DeltaRuleColumnsKernel<kDk, 4>, so the two kernels give the same bits
// (CudaDeltaNet.DecodeRuleShapesAgree). Each token's q and k are staged in shared memory once per
// block, which keeps the kernel at 64 registers (8 blocks, 128 KB of state loads in flight per
// SM; read from global memory by every thread, they took 127 registers and 4 blocks). Grid
// (column groups of 32, value heads, sequences), 128 threads, three barriers per token.
template <int kDk>
__global__ void __launch_bounds__(128, 8)
    DeltaRuleRowsKernel(const float* __restrict__ q, const float* __restrict__ k,
                        const float* __restrict__ v, int64_t v_stride,
                        const float* __restrict__ g, const float* __restrict__ beta, int nk,
                        int nv, int dv, DeltaBatchView b, DeltaStateView st,
                        float* __restrict__ out) {
  constexpr int kParts = 4;
  __shared__ float mem_part[kParts][32];
  __shared__ float o_part[kParts][32];
  __shared__ float qk[2][kDk];
  PdlWait();
  PdlLaunchDependents();
  constexpr int kRows = kDk / kParts;
  const int lane = threadIdx.x % 32, part = threadIdx.x / 32;
  const int e = blockIdx.x * 32 + lane;
  const int h = blockIdx.y, seq = blockIdx.z;
  const bool valid = e < dv;  // no early return: the barriers need every thread
  const int ec = valid ? e : 0;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  const int kh = h / (nv / nk);
  const int64_t ssm_offset =
      ColumnPartOffset(st, h, kDk, dv, static_cast<int64_t>(part) * kRows, ec);
  float* home = st.state + b.state_slots[seq] * st.slot_floats + ssm_offset;
  // Rows d of a column are dv floats apart: walked by one pointer (an address per row would
  // take two registers each).
  float S[kRows];
  const bool fresh = begin == end || b.positions[begin] == 0;
  {
    const float* row = home;
#pragma unroll
    for (int d = 0; d < kRows; ++d, row += dv) S[d] = fresh || !valid ? 0.0f : *row;
  }
  for (int t = begin; t < end; ++t) {
    // The token's q and k (the previous token's readers passed its last barrier before any
    // thread gets here).
    const float* qg = q + (static_cast<int64_t>(t) * nk + kh) * kDk;
    const float* kg = k + (static_cast<int64_t>(t) * nk + kh) * kDk;
    for (int i = threadIdx.x; i < kDk; i += 32 * kParts) {
      qk[0][i] = qg[i];
      qk[1][i] = kg[i];
    }
    __syncthreads();
    const float* qt = qk[0] + part * kRows;
    const float* kt = qk[1] + part * kRows;
    const float decay = expf(g[t * nv + h]);
    const float bt = beta[t * nv + h];
    float mem = DecayAndRecall(S, kt, decay);
    mem_part[part][lane] = mem;
    __syncthreads();
    mem = TreeSum4(mem_part, lane);
    const float delta = (v[t * v_stride + h * dv + ec] - mem) * bt;
    float o = UpdateAndRead(S, kt, qt, delta);
    o_part[part][lane] = o;
    __syncthreads();
    if (valid && part == 0) {
      out[(static_cast<int64_t>(t) * nv + h) * dv + e] = TreeSum4(o_part, lane);
    }
    const int snap = b.snapshot_slot[t];
    if (valid && snap >= 0) {
      float* dst = st.state + snap * st.slot_floats + ssm_offset;
#pragma unroll
      for (int d = 0; d < kRows; ++d, dst += dv) *dst = S[d];
    }
  }
  if (valid && begin != end) {
    float* row = home;
#pragma unroll
    for (int d = 0; d < kRows; ++d, row += dv) *row = S[d];
  }
}

__global__ void GatedNormKernel(const float* __restrict__ x, const float* __restrict__ z,
                                int64_t z_stride, int rows_per_token, int64_t n_rows, int d,
                                const float* __restrict__ w, float eps, __nv_bfloat16* y) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rows) return;
  const float* xr = x + r * d;
  const float* zr = z + (r / rows_per_token) * z_stride + (r % rows_per_token) * d;
  float ss = 0.0f;
  for (int j = lane; j < d; j += 32) ss += xr[j] * xr[j];
  ss = WarpSumF(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int j = lane; j < d; j += 32) {
    y[r * d + j] = __float2bfloat16(w[j] * (xr[j] * inv) * SiluF(zr[j]));
  }
}

__global__ void CopySlotsKernel(float* state, int64_t slot_floats, const int32_t* src,
                                const int32_t* dst, int n) {
  PdlWait();
  PdlLaunchDependents();
  for (int c = 0; c < n; ++c) {
    const float* from = state + src[c] * slot_floats;
    float* to = state + dst[c] * slot_floats;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < slot_floats;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      to[i] = from[i];
    }
  }
}

// Block (token, head among q, k, v heads), head_dim threads.
__global__ void GatedQkvRopeKernel(
    const float* __restrict__ qkv, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const int32_t* __restrict__ positions,
    const float* __restrict__ inv_freq, const int32_t* __restrict__ slot_mapping, GatedQkvShape sh,
    __nv_bfloat16* q_out, float* gate_out, KvCacheOut kv) {
  PdlWait();
  PdlLaunchDependents();
  __shared__ float row[256];
  __shared__ float partial[8];
  __shared__ float partial_max[8];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int hd = sh.head_dim, j = threadIdx.x;
  const bool is_q = h < sh.n_heads;
  const bool is_v = h >= sh.n_heads + sh.n_kv_heads;
  const int64_t width = static_cast<int64_t>(2 * sh.n_heads + 2 * sh.n_kv_heads) * hd;
  const float* src;
  if (is_q) {
    src = qkv + t * width + static_cast<int64_t>(h) * 2 * hd;
    gate_out[(t * sh.n_heads + h) * hd + j] = src[hd + j];
  } else {
    src = qkv + t * width + static_cast<int64_t>(2 * sh.n_heads) * hd +
          static_cast<int64_t>(h - sh.n_heads) * hd;
  }
  float x = src[j];
  const __nv_bfloat16* norm = is_q ? q_norm : is_v ? nullptr : k_norm;
  if (norm != nullptr) {
    float ss = WarpSumF(x * x);
    if ((j & 31) == 0) partial[j >> 5] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int w = 0; w < (hd + 31) / 32; ++w) ss += partial[w];
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + sh.eps);
    x = (sh.norm_offset + __bfloat162float(norm[j])) * (x * inv);
  }
  row[j] = x;
  __syncthreads();
  if (!is_v && j < sh.rotary_dim) {
    const int half = sh.rotary_dim / 2;
    const int i = j < half ? j : j - half;
    float sn, cs;
    sincosf(static_cast<float>(positions[t]) * inv_freq[i], &sn, &cs);
    cs *= sh.attention_scaling;
    sn *= sh.attention_scaling;
    x = j < half ? row[j] * cs - row[j + half] * sn : row[j] * cs + row[j - half] * sn;
  }
  if (is_q) {
    q_out[(t * sh.n_heads + h) * hd + j] = __float2bfloat16(x);
    return;
  }
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int kv_head = is_v ? h - sh.n_heads - sh.n_kv_heads : h - sh.n_heads;
  const int64_t cache_row =
      ((slot / sh.block_size) * sh.n_kv_heads + kv_head) * sh.block_size + slot % sh.block_size;
  if (kv.type == KvCacheType::kBf16) {
    static_cast<__nv_bfloat16*>(is_v ? kv.v : kv.k)[cache_row * hd + j] = __float2bfloat16(x);
    return;
  }
  // Quantized row: the block's max |x| (hd threads, whole warps), then one code per thread.
  const float warp_max = WarpMax(fabsf(x));
  if ((j & 31) == 0) partial_max[j >> 5] = warp_max;
  __syncthreads();
  float amax = 0.0f;
  for (int w = 0; w < hd / 32; ++w) amax = fmaxf(amax, partial_max[w]);
  const float scale = KvRowScale(amax, kv.type);
  if (j == 0) (is_v ? kv.v_scale : kv.k_scale)[cache_row] = scale;
  static_cast<uint8_t*>(is_v ? kv.v : kv.k)[cache_row * hd + j] = EncodeKv(x, scale, kv.type);
}

__global__ void SigmoidGateKernel(__nv_bfloat16* x, const float* gate, int64_t n) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) * SigmoidF(gate[i]));
}

unsigned Blocks(int64_t n, int per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

}  // namespace

void CausalConv1dSilu(const float* x, int64_t x_stride, int32_t conv_dim, int32_t kernel,
                      const float* w, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                      cudaStream_t stream) {
  KCHECK(kernel >= 1 && kernel <= kMaxKernel);
  if (b.n_seqs == 0) return;
  const dim3 per_channel(Blocks(conv_dim, 128), static_cast<unsigned>(b.n_seqs));
  if (b.n_tokens <= 4 * b.n_seqs) {  // decode: a few rows per sequence, one launch
    LaunchPdl(&ConvKernel, per_channel, dim3(128), 0, stream, x, x_stride, conv_dim, kernel, w, b,
              s, out);
    KCUDA_CHECK_LAUNCH();
    return;
  }
  LaunchPdl(&ConvRowsKernel, dim3(Blocks(int64_t{b.n_tokens} * conv_dim, 256)), dim3(256), 0,
            stream, x, x_stride, conv_dim, kernel, w, b, s, out);
  KCUDA_CHECK_LAUNCH();
  LaunchPdl(&ConvWindowKernel, per_channel, dim3(128), 0, stream, x, x_stride, conv_dim, kernel, b,
            s);
  KCUDA_CHECK_LAUNCH();
}

void DeltaPrep(const float* conv_out, int32_t n_tokens, int32_t nk, int32_t dk, int32_t nv,
               int32_t dv, const float* ba, int64_t ba_stride, const float* neg_exp_a,
               const float* dt_bias, float* q, float* k, float* beta, float* g,
               cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int32_t conv_dim = 2 * nk * dk + nv * dv;
  const int64_t threads = int64_t{n_tokens} * nk * 2 * 32 + int64_t{n_tokens} * nv;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  LaunchPdl(&DeltaPrepKernel, dim3(Blocks(threads, 256)), dim3(256), 0, stream, conv_out, n_tokens,
            nk, dk, conv_dim, q_scale, q, k, ba, ba_stride, nv, neg_exp_a, dt_bias, beta, g);
  KCUDA_CHECK_LAUNCH();
}

void CausalConv1dSiluDeltaPrep(const float* x, int64_t x_stride, int32_t kernel, const float* w,
                               const DeltaBatchView& b, const DeltaStateView& s, float* conv_out,
                               int32_t nk, int32_t dk, int32_t nv, int32_t dv, const float* ba,
                               int64_t ba_stride, const float* neg_exp_a, const float* dt_bias,
                               float* q, float* k, float* beta, float* g, cudaStream_t stream) {
  KCHECK(kernel >= 1 && kernel <= kMaxKernel && nk > 0 && nv % nk == 0);
  const int32_t conv_dim = 2 * nk * dk + nv * dv;
  const int32_t n_ch = 2 * dk + (nv / nk) * dv;
  const size_t smem = (size_t(kernel - 1) * n_ch + 2 * size_t(dk)) * sizeof(float);
  constexpr int kThreads = 256;
  if (b.n_seqs == 0 || b.n_tokens > 4 * b.n_seqs || smem > (48u << 10)) {
    CausalConv1dSilu(x, x_stride, conv_dim, kernel, w, b, s, conv_out, stream);
    DeltaPrep(conv_out, b.n_tokens, nk, dk, nv, dv, ba, ba_stride, neg_exp_a, dt_bias, q, k, beta,
              g, stream);
    return;
  }
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  LaunchPdl(&ConvPrepKernel, dim3(static_cast<unsigned>(nk), static_cast<unsigned>(b.n_seqs)),
            dim3(kThreads), smem, stream, x, x_stride, static_cast<int>(kernel), w, b, s, conv_out,
            static_cast<int>(nk), static_cast<int>(dk), static_cast<int>(nv), static_cast<int>(dv),
            q_scale, ba, ba_stride, neg_exp_a, dt_bias, q, k, beta, g);
  KCUDA_CHECK_LAUNCH();
}

namespace {
EnvSetting g_lane_split{"KESTREL_DELTA_SPLIT", [](const char* env) {
  if (env != nullptr && std::strcmp(env, "2") == 0) return 2;
  if (env != nullptr && std::strcmp(env, "4") == 0) return 4;
  return 0;
}};
}  // namespace

int DeltaRuleLaneSplit() {
  return g_lane_split.Get();
}

void SetDeltaRuleLaneSplit(int lanes) {
  KCHECK(lanes == 0 || lanes == 2 || lanes == 4);
  g_lane_split.Set(lanes);
}

void GatedDeltaRule(const float* q, const float* k, const float* v, int64_t v_stride,
                    const float* g, const float* beta, int32_t nk, int32_t dk, int32_t nv,
                    int32_t dv, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                    cudaStream_t stream) {
  KCHECK(dk > 0 && dk <= 256 && dv > 0 && dv <= 256 && nk > 0 && nv % nk == 0);
  if (b.n_seqs == 0) return;
  // Key head dims with a register variant (the common 128 and the fixtures' small ones).
  auto run_columns = [&](auto kernel, int split) {
    const dim3 grid(static_cast<unsigned>((dv * split + 63) / 64), static_cast<unsigned>(nv),
                    static_cast<unsigned>(b.n_seqs));
    LaunchPdl(kernel, grid, dim3(64), 0, stream, q, k, v, v_stride, g, beta, nk, nv, dv, b, s, out);
    KCUDA_CHECK_LAUNCH();
  };
  switch (dk) {
    case 16:
      return run_columns(DeltaRuleColumnsKernel<16, 1>, 1);
    case 32:
      return run_columns(DeltaRuleColumnsKernel<32, 1>, 1);
    case 64:
      return run_columns(DeltaRuleColumnsKernel<64, 1>, 1);
    case 128:
      // A column over 4 warps (DeltaRuleRowsKernel); DeltaRuleLaneSplit() 2 or 4: over 2 or 4
      // lanes. H200, decode 64 x 2k, ms per step (two alternating rounds): 27B preset at 16
      // layers 4 warps 6.914 / 6.910, 4 lanes 7.221 / 7.199; 35B-A3B preset at 20 layers 11.182 /
      // 11.145 against 11.466 / 11.421. Earlier, 27B at 32 layers: 2 lanes 14.13-14.20, 4 lanes
      // 13.74-13.75, 8 lanes (72 registers) 15.27-15.28.
      switch (DeltaRuleLaneSplit()) {
        case 2: return run_columns(DeltaRuleColumnsKernel<128, 2>, 2);
        case 4: return run_columns(DeltaRuleColumnsKernel<128, 4>, 4);
        default: break;
      }
      LaunchPdl(DeltaRuleRowsKernel<128>,
                dim3(static_cast<unsigned>((dv + 31) / 32), static_cast<unsigned>(nv),
                     static_cast<unsigned>(b.n_seqs)),
                dim3(128), 0, stream, q, k, v, v_stride, g, beta, nk, nv, dv, b, s, out);
      KCUDA_CHECK_LAUNCH();
      return;
    default:
      break;
  }
  const size_t smem = (size_t(dk) * dv + 2 * size_t(dk)) * sizeof(float);
  // Above 48 KiB the kernel must opt in, up to the device's limit (227 KiB on Hopper).
  static size_t opted_in = 48 << 10;
  if (smem > opted_in) {
    int device = 0, limit = 0;
    KCUDA_CHECK(cudaGetDevice(&device));
    KCUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    KCHECK_MSG(smem <= static_cast<size_t>(limit),
               "Gated DeltaNet state of one head does not fit in shared memory");
    KCUDA_CHECK(cudaFuncSetAttribute(DeltaRuleKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
    opted_in = smem;
  }
  const int threads = std::max(32, (dv + 31) / 32 * 32);
  LaunchPdl(&DeltaRuleKernel, dim3(static_cast<unsigned>(nv), static_cast<unsigned>(b.n_seqs)),
            dim3(static_cast<unsigned>(threads)), smem, stream, q, k, v, v_stride, g, beta, nk, dk,
            nv, dv, b, s, out);
  KCUDA_CHECK_LAUNCH();
}

void GatedRmsNormSilu(const float* x, const float* z, int64_t z_stride, int32_t rows_per_token,
                      int64_t n_rows, int32_t d, const float* w, float eps, __nv_bfloat16* y,
                      cudaStream_t stream) {
  if (n_rows == 0) return;
  LaunchPdl(&GatedNormKernel, dim3(Blocks(n_rows * 32, 256)), dim3(256), 0, stream, x, z, z_stride,
            rows_per_token, n_rows, d, w, eps, y);
  KCUDA_CHECK_LAUNCH();
}

void CopyStateSlots(float* state, int64_t slot_floats, const int32_t* src, const int32_t* dst,
                    int32_t n, cudaStream_t stream) {
  if (n == 0) return;
  LaunchPdl(&CopySlotsKernel, dim3(Blocks(slot_floats, 256 * 8)), dim3(256), 0, stream, state,
            slot_floats, src, dst, n);
  KCUDA_CHECK_LAUNCH();
}

void GatedQkvRope(const float* qkv, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm,
                  const int32_t* positions, const float* inv_freq, const int32_t* slot_mapping,
                  int64_t n, const GatedQkvShape& shape, __nv_bfloat16* q_out, float* gate_out,
                  const KvCacheOut& kv, cudaStream_t stream) {
  KCHECK(shape.head_dim > 0 && shape.head_dim <= 256 && shape.head_dim % 32 == 0);
  KCHECK(!KvCacheQuantized(kv.type) || (kv.k_scale != nullptr && kv.v_scale != nullptr));
  KCHECK(shape.rotary_dim % 2 == 0 && shape.rotary_dim <= shape.head_dim);
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>(shape.n_heads + 2 * shape.n_kv_heads));
  LaunchPdl(&GatedQkvRopeKernel, grid, dim3(static_cast<unsigned>(shape.head_dim)), 0, stream, qkv,
            q_norm, k_norm, positions, inv_freq, slot_mapping, shape, q_out, gate_out, kv);
  KCUDA_CHECK_LAUNCH();
}

void SigmoidGate(__nv_bfloat16* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  LaunchPdl(&SigmoidGateKernel, dim3(Blocks(n, 256)), dim3(256), 0, stream, x, gate, n);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
