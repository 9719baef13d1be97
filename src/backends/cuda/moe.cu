// Mixture-of-experts kernels (moe.h).
#include "backends/cuda/moe.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/moe_gemm.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/silu.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token.
constexpr int kRouteWarps = 8;
constexpr int kPerLane = kMoeMaxExperts / 32;  // expert e lives in lane e % 32, slot e / 32

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The shared expert's weight from its gate logit (one definition for both shared paths).
__device__ __forceinline__ float SharedGate(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// Softmax over the token's n_experts logits, then top_k picks of the largest probability (the
// lower expert id on ties). Probabilities are >= 0; a picked expert is marked -2 and a NaN
// probability counts as -0.5, so a broken row still yields k distinct valid experts.
// With shared_slot, pick top_k (of picks = top_k + 1 per token) is the shared expert n_experts,
// weighted sigmoid(its gate logit), as MoeCombineKernel weighs separate shared rows.
// One warp routes token t.
__device__ __forceinline__ void RouteToken(const float* __restrict__ logits, int64_t stride, int t,
                                           int n_experts, int top_k, bool norm_topk,
                                           bool shared_slot, int32_t* __restrict__ ids,
                                           float* __restrict__ w) {
  const int lane = threadIdx.x % 32;
  const float* row = logits + static_cast<int64_t>(t) * stride;
  const int picks = top_k + (shared_slot ? 1 : 0);
  ids += static_cast<int64_t>(t) * picks;
  w += static_cast<int64_t>(t) * picks;
  float p[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < n_experts ? row[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = WarpMax(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = i * 32 + lane;
    p[i] = e < n_experts ? expf(p[i] - mx) : 0.0f;
    sum += p[i];
  }
  sum = WarpSum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = p[i] / sum;

  float top_sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    float bv = -1.0f;
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = i * 32 + lane;
      const float v = p[i] != p[i] ? -0.5f : p[i];
      if (e < n_experts && v > bv) {  // ascending e: strict > keeps the lower id on ties
        bv = v;
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i * 32 + lane == bi) p[i] = -2.0f;
    }
    const float prob = fmaxf(bv, 0.0f);
    if (lane == 0) {
      ids[j] = bi;
      w[j] = prob;
    }
    top_sum += prob;  // the same sequence of adds as the CPU's loop over j
  }
  if (norm_topk && lane == 0) {
    for (int j = 0; j < top_k; ++j) w[j] = w[j] / top_sum;
  }
  if (shared_slot && lane == 0) {
    ids[top_k] = n_experts;
    w[top_k] = SharedGate(row[n_experts]);
  }
}

__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeTopKKernel(const float* __restrict__ logits, int64_t stride, int n, int n_experts, int top_k,
                  bool norm_topk, bool shared_slot, int32_t* __restrict__ ids,
                  float* __restrict__ w) {
  PdlWait();
  const int t = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (t >= n) return;
  RouteToken(logits, stride, t, n_experts, top_k, norm_topk, shared_slot, ids, w);
}

// Counting sort of the n*top_k (token, j) pairs by expert, in one block.
constexpr int kAlignThreads = 1024;

// The block's part: every thread of one kAlignThreads block takes part.
__device__ __forceinline__ void AlignRows(const int32_t* __restrict__ ids, int total, int top_k,
                                          int n_experts, int32_t* __restrict__ expert_begin,
                                          int32_t* __restrict__ active,
                                          int32_t* __restrict__ n_active,
                                          int32_t* __restrict__ rows, int32_t* __restrict__ pos,
                                          int32_t* __restrict__ tile_begin,
                                          int32_t* __restrict__ active_log) {
  __shared__ int32_t count[kMoeMaxExperts + 1];  // + the shared slot
  __shared__ int32_t fill[kMoeMaxExperts + 1];
  const int tid = threadIdx.x;
  for (int e = tid; e < n_experts; e += kAlignThreads) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < total; i += kAlignThreads) atomicAdd(&count[ids[i]], 1);
  __syncthreads();
  if (tid < 32) {
    // Lane l scans experts [l * per, (l + 1) * per); a warp scan joins the lanes.
    const int lane = tid;
    const int per = (n_experts + 31) / 32;
    const int e0 = min(lane * per, n_experts), e1 = min(e0 + per, n_experts);
    auto tiles = [](int rows) { return (rows + kMoeGemmTileRows - 1) / kMoeGemmTileRows; };
    int rows_here = 0, active_here = 0, tiles_here = 0;
    for (int e = e0; e < e1; ++e) {
      rows_here += count[e];
      active_here += count[e] > 0 ? 1 : 0;
      tiles_here += tiles(count[e]);
    }
    int rows_incl = rows_here, active_incl = active_here, tiles_incl = tiles_here;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int a = __shfl_up_sync(0xffffffffu, rows_incl, o);
      const int b = __shfl_up_sync(0xffffffffu, active_incl, o);
      const int c = __shfl_up_sync(0xffffffffu, tiles_incl, o);
      if (lane >= o) {
        rows_incl += a;
        active_incl += b;
        tiles_incl += c;
      }
    }
    int r = rows_incl - rows_here, a = active_incl - active_here, tl = tiles_incl - tiles_here;
    for (int e = e0; e < e1; ++e) {
      expert_begin[e] = r;
      tile_begin[e] = tl;
      fill[e] = r;
      if (count[e] > 0) active[a++] = e;
      r += count[e];
      tl += tiles(count[e]);
    }
    if (lane == 31) {
      expert_begin[n_experts] = rows_incl;
      tile_begin[n_experts] = tiles_incl;
      *n_active = active_incl;
      if (active_log != nullptr) *active_log = active_incl;
    }
  }
  __syncthreads();
  for (int i = tid; i < total; i += kAlignThreads) {
    const int p = atomicAdd(&fill[ids[i]], 1);
    rows[p] = i / top_k;
    pos[i] = p;
  }
}

__global__ void __launch_bounds__(kAlignThreads)
    MoeAlignKernel(const int32_t* __restrict__ ids, int total, int top_k, int n_experts,
                   int32_t* __restrict__ expert_begin, int32_t* __restrict__ active,
                   int32_t* __restrict__ n_active, int32_t* __restrict__ rows,
                   int32_t* __restrict__ pos, int32_t* __restrict__ tile_begin,
                   int32_t* __restrict__ active_log) {
  PdlWait();
  AlignRows(ids, total, top_k, n_experts, expert_begin, active, n_active, rows, pos, tile_begin,
            active_log);
}

// Both in one block for few tokens (decode): its 32 warps route the tokens (the same
// RouteToken, so the same bits), then group the pairs; one launch instead of two.
constexpr int kFusedRouteMaxTokens = 8;

__global__ void __launch_bounds__(kAlignThreads)
    MoeRouteFusedKernel(const float* __restrict__ logits, int64_t stride, int n, int n_experts,
                        int top_k, bool norm_topk, bool shared_slot, int32_t* __restrict__ ids,
                        float* __restrict__ w, int32_t* __restrict__ expert_begin,
                        int32_t* __restrict__ active, int32_t* __restrict__ n_active,
                        int32_t* __restrict__ rows, int32_t* __restrict__ pos,
                        int32_t* __restrict__ tile_begin, int32_t* __restrict__ active_log) {
  // The picks go to shared memory first: the grouping reads them back (global ids written in
  // this kernel could not be read through the read-only path), then to ids and w.
  __shared__ int32_t s_ids[kFusedRouteMaxTokens * (kMoeMaxTopK + 1)];
  __shared__ float s_w[kFusedRouteMaxTokens * (kMoeMaxTopK + 1)];
  PdlWait();
  for (int t = threadIdx.x / 32; t < n; t += kAlignThreads / 32) {
    RouteToken(logits, stride, t, n_experts, top_k, norm_topk, shared_slot, s_ids, s_w);
  }
  __syncthreads();
  const int picks = top_k + (shared_slot ? 1 : 0);
  for (int i = threadIdx.x; i < n * picks; i += kAlignThreads) {
    ids[i] = s_ids[i];
    w[i] = s_w[i];
  }
  AlignRows(s_ids, n * picks, picks, n_experts + (shared_slot ? 1 : 0), expert_begin, active,
            n_active, rows, pos, tile_begin, active_log);
}

// ---------------------------------------------------------------------------------------------
// Grouped skinny GEMM: the design, k permutation and batch invariance of SkinnyLinearKernel
// (linear.cu), with blockIdx.y naming a routed expert and the token rows gathered.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerBlock = 16;
constexpr int kChunksPerStep = 4;
constexpr int kVecsPerChunk = 4;
constexpr int kVecsPerStep = kChunksPerStep * kVecsPerChunk;
constexpr int kReducePad = 4;
// mma column tiles (8 token rows each) per pass over an expert's rows (MoeLinear says why one).
constexpr int kMTiles = 1;

// The two rows of routed expert e's matrix [n, k] that lane group g feeds to the mma (A rows g
// and g + 8). A row marked not ok is never loaded (zeros instead).
struct WeightRows {
  const uint4* lo;
  const uint4* hi;
  bool lo_ok, hi_ok;
};

__device__ __forceinline__ WeightRows ExpertRows(const __nv_bfloat16* w, int e, int n, int k_vecs,
                                                 int lo, bool lo_ok, int hi, bool hi_ok) {
  const uint4* we = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(e) * n * k_vecs;
  WeightRows r;
  r.lo_ok = lo_ok;
  r.hi_ok = hi_ok;
  r.lo = we + static_cast<int64_t>(lo_ok ? lo : 0) * k_vecs;
  r.hi = we + static_cast<int64_t>(hi_ok ? hi : 0) * k_vecs;
  return r;
}

// A block's (or warp's) 16 rows from `first`: rows first + g and first + g + 8 of the matrix; or,
// with kSiluMul (a gate|up matrix, n = 2 * inter), gate row first + g and up row
// inter + first + g, so that both halves of an activation meet in one thread (first counts
// activations then, 8 per 16 rows).
template <bool kSiluMul>
__device__ __forceinline__ WeightRows BlockRows(const __nv_bfloat16* w, int e, int n, int k_vecs,
                                                int first, int g) {
  if constexpr (kSiluMul) {
    const int inter = n / 2;
    const bool ok = first + g < inter;
    return ExpertRows(w, e, n, k_vecs, first + g, ok, inter + first + g, ok);
  } else {
    return ExpertRows(w, e, n, k_vecs, first + g, first + g < n, first + g + 8,
                      first + g + 8 < n);
  }
}

// Token row g of each column tile of the pass over the expert's rows [r0, r0 + m) (permuted rows
// from `first`); null past m.
__device__ __forceinline__ void PassRows(const __nv_bfloat16* x, const int32_t* x_rows, int first,
                                         int r0, int m, int g, int k_vecs,
                                         const uint4* (&x_t)[kMTiles]) {
  const uint4* xv4 = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int row = mt * 8 + g;
    const int r = first + r0 + row;
    x_t[mt] =
        row < m ? xv4 + static_cast<int64_t>(x_rows != nullptr ? x_rows[r] : r) * k_vecs : nullptr;
  }
}

// acc += the products of one 128-wide k step (linear.cu's k permutation: thread t takes physical
// k [8t, 8t + 8) of each 32-wide chunk, fed to two mma's). All of the step's W loads go first,
// so 8 are in flight before the first use. Tiles at or past m (uniform across the warp) skip.
__device__ __forceinline__ void AccumulateStep(const WeightRows& w,
                                               const uint4* const (&x_t)[kMTiles], int m, int step,
                                               int t, int k_vecs, float (&acc)[kMTiles][4]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 w_lo_v[kChunksPerStep], w_hi_v[kChunksPerStep];
#pragma unroll
  for (int c = 0; c < kChunksPerStep; ++c) {
    const int v = step * kVecsPerStep + c * kVecsPerChunk + t;
    const bool in_k = v < k_vecs;
    w_lo_v[c] = (in_k && w.lo_ok) ? LoadStreaming(w.lo + v) : zero;
    w_hi_v[c] = (in_k && w.hi_ok) ? LoadStreaming(w.hi + v) : zero;
  }
#pragma unroll
  for (int c = 0; c < kChunksPerStep; ++c) {
    const int v = step * kVecsPerStep + c * kVecsPerChunk + t;
    const bool in_k = v < k_vecs;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if (mt * 8 >= m) break;
      const uint4 xv = (in_k && x_t[mt] != nullptr) ? __ldg(x_t[mt] + v) : zero;
      MmaBf16(acc[mt], w_lo_v[c].x, w_hi_v[c].x, w_lo_v[c].y, w_hi_v[c].y, xv.x, xv.y);
      MmaBf16(acc[mt], w_lo_v[c].z, w_hi_v[c].z, w_lo_v[c].w, w_hi_v[c].w, xv.z, xv.w);
    }
  }
}

// At least three blocks per SM (at most 85 registers). Unbounded, the kSiluMul form took 89
// registers (two blocks per SM) and ran the 35B-A3B preset's decode steps of 8-64 tokens 2-7 %
// slower than the unfused kernels; bounded it takes 64 (70 without kSiluMul). A bound of four on
// this and the warps-own-rows kernel (the down projection at 59 registers) ran those steps
// 0-1 % slower than this (H200, docs/cuda.md).
constexpr int kSkinnyBlocksPerSm = 3;

// kSiluMul: the rows are a gate|up matrix's (n = 2 * inter) and the block writes
// act[r, j] = bf16(silu(gate) * up) (SiluMul's operations) instead of y: the sums are those y
// would get, so the result is bitwise MoeLinear's y through SiluMul.
template <bool kSiluMul>
__global__ void __launch_bounds__(kThreads, kSkinnyBlocksPerSm)
    MoeSkinnyKernel(const __nv_bfloat16* __restrict__ x,  // [*, k]
                    const int32_t* __restrict__ x_rows,   // [n * top_k] or null
                    int k,
                    const __nv_bfloat16* __restrict__ w,  // [n_experts, n, k]
                    int n, const int32_t* __restrict__ expert_begin,
                    const int32_t* __restrict__ active, const int32_t* __restrict__ n_active,
                    float* __restrict__ y,                // [n * top_k, n]
                    __nv_bfloat16* __restrict__ act) {    // kSiluMul: [n * top_k, n / 2]
  __shared__ float partial[kWarps][kMTiles * 8][kRowsPerBlock + kReducePad];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // First row (or activation, kSiluMul) of the block.
  const int n0 = blockIdx.x * (kSiluMul ? kRowsPerBlock / 2 : kRowsPerBlock);
  const int k_vecs = k / 8;
  PdlWait();
  if (static_cast<int>(blockIdx.y) >= *n_active) return;
  const int e = active[blockIdx.y];
  const int first = expert_begin[e];
  const int m_e = expert_begin[e + 1] - first;
  const WeightRows wr = BlockRows<kSiluMul>(w, e, n, k_vecs, n0, g);
  const int n_steps = (k_vecs + kVecsPerStep - 1) / kVecsPerStep;

  for (int r0 = 0; r0 < m_e; r0 += kMTiles * 8) {
    const int m = min(m_e - r0, kMTiles * 8);
    const uint4* x_t[kMTiles];
    PassRows(x, x_rows, first, r0, m, g, k_vecs, x_t);
    float acc[kMTiles][4] = {};
    for (int step = warp; step < n_steps; step += kWarps) {
      AccumulateStep(wr, x_t, m, step, t, k_vecs, acc);
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        partial[warp][mt * 8 + 2 * t + (q & 1)][g + 8 * (q >> 1)] = acc[mt][q];
      }
    }
    __syncthreads();
    auto sum = [&](int token, int row) {
      float s = partial[0][token][row];
#pragma unroll
      for (int wi = 1; wi < kWarps; ++wi) s += partial[wi][token][row];
      return s;
    };
    if constexpr (kSiluMul) {
      const int inter = n / 2;
      for (int i = threadIdx.x; i < kMTiles * 8 * 8; i += kThreads) {
        const int token = i / 8, j = i % 8;
        if (token < m && n0 + j < inter) {
          act[static_cast<int64_t>(first + r0 + token) * inter + n0 + j] =
              __float2bfloat16_rn(SiluTimes(sum(token, j), sum(token, j + 8)));
        }
      }
    } else {
      for (int i = threadIdx.x; i < kMTiles * 8 * kRowsPerBlock; i += kThreads) {
        const int token = i / kRowsPerBlock;
        const int col = n0 + i % kRowsPerBlock;
        if (token < m && col < n) {
          y[static_cast<int64_t>(first + r0 + token) * n + col] = sum(token, i % kRowsPerBlock);
        }
      }
    }
    __syncthreads();  // partial is rewritten by the next pass
  }
}

// The same product for short rows of W (k <= kRowsVariantMaxK): with the k split above, a block's
// 8 warps would share a few 128-wide k steps (4 at k = 512: half the warps idle) and a block
// would stream only 16 KB. Here each warp owns 16 rows of W over all of k (its own accumulator
// chain, no shared-memory reduction) and a block 128 rows. Row i of y still depends only on row
// i of x (batch invariant); the variant is chosen by k alone, so a shape always takes the same.
// (Rows for k = 2048 too, the 35B-A3B gate|up, measured faster at 32 and 64 tokens, 11.20 against
// 11.41 ms per step at 64 x 2k, but slower at 1 and 8, 2.37 against 2.16 ms; choosing by the
// token count would make a token's rows depend on its step, so the limit stays at 1024.)
constexpr int kRowsVariantMaxK = 1024;
constexpr int kRowsPerWarpBlock = kWarps * kRowsPerBlock;

template <bool kSiluMul>
__global__ void __launch_bounds__(kThreads)
    MoeSkinnyRowsKernel(const __nv_bfloat16* __restrict__ x, const int32_t* __restrict__ x_rows,
                        int k, const __nv_bfloat16* __restrict__ w, int n,
                        const int32_t* __restrict__ expert_begin,
                        const int32_t* __restrict__ active, const int32_t* __restrict__ n_active,
                        float* __restrict__ y, __nv_bfloat16* __restrict__ act) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // First row (or activation, kSiluMul) of the warp, and where the matrix ends in those units.
  constexpr int kPerWarp = kSiluMul ? kRowsPerBlock / 2 : kRowsPerBlock;
  const int n0 = (blockIdx.x * kWarps + warp) * kPerWarp;
  const int n_end = kSiluMul ? n / 2 : n;
  const int k_vecs = k / 8;
  PdlWait();
  if (static_cast<int>(blockIdx.y) >= *n_active) return;
  const int e = active[blockIdx.y];
  const int first = expert_begin[e];
  const int m_e = expert_begin[e + 1] - first;
  if (n0 >= n_end) return;  // after every block-wide read; no barriers below
  const WeightRows wr = BlockRows<kSiluMul>(w, e, n, k_vecs, n0, g);
  const int n_steps = (k_vecs + kVecsPerStep - 1) / kVecsPerStep;

  for (int r0 = 0; r0 < m_e; r0 += kMTiles * 8) {
    const int m = min(m_e - r0, kMTiles * 8);
    const uint4* x_t[kMTiles];
    PassRows(x, x_rows, first, r0, m, g, k_vecs, x_t);
    float acc[kMTiles][4] = {};
    for (int step = 0; step < n_steps; ++step) {
      AccumulateStep(wr, x_t, m, step, t, k_vecs, acc);
    }
    // Accumulator q of tile mt: W row g + 8 * (q / 2) (kSiluMul: gate, then up), token row
    // mt * 8 + 2t + q % 2.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kSiluMul) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int token = mt * 8 + 2 * t + q;
          if (token < m && n0 + g < n_end) {
            act[static_cast<int64_t>(first + r0 + token) * n_end + n0 + g] =
                __float2bfloat16_rn(SiluTimes(acc[mt][q], acc[mt][q + 2]));
          }
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int token = mt * 8 + 2 * t + (q & 1);
          const int col = n0 + g + 8 * (q >> 1);
          if (token < m && col < n)
            y[static_cast<int64_t>(first + r0 + token) * n + col] = acc[mt][q];
        }
      }
    }
  }
}

template <bool kSiluMul>
void LaunchMoeSkinny(const __nv_bfloat16* x, const int32_t* x_rows, int k, const __nv_bfloat16* w,
                     int n, const MoeRouting& r, int max_active, float* y, __nv_bfloat16* act,
                     cudaStream_t stream) {
  const bool rows = k <= kRowsVariantMaxK;
  // Rows of W a block covers; with kSiluMul half of them are gate rows, so a block covers that
  // many activations (n / 2 of them in all).
  const int per_block = rows ? kRowsPerWarpBlock : kRowsPerBlock;
  const int units = kSiluMul ? n / 2 : n;
  const int units_per_block = kSiluMul ? per_block / 2 : per_block;
  const dim3 grid(static_cast<unsigned>((units + units_per_block - 1) / units_per_block),
                  static_cast<unsigned>(max_active));
  LaunchPdl(rows ? &MoeSkinnyRowsKernel<kSiluMul> : &MoeSkinnyKernel<kSiluMul>, grid,
            dim3(kThreads), 0, stream, x, x_rows, k, w, n,
            static_cast<const int32_t*>(r.expert_begin), static_cast<const int32_t*>(r.active),
            static_cast<const int32_t*>(r.n_active), y, act);
}

// ---------------------------------------------------------------------------------------------
constexpr int kCombineThreads = 256;
constexpr int kCombineBatch = 8;  // picks whose rows are loaded before they are added

// Grid (tokens, hidden / kCombineThreads): a thread per output element, its picks' rows
// loaded kCombineBatch at a time and added in increasing expert id (the order its block's first
// thread sorts them into), so a one-token step spreads over hidden / 256 blocks.
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* __restrict__ y, const int32_t* __restrict__ ids,
                     const float* __restrict__ wts, const int32_t* __restrict__ pos, int top_k,
                     int hidden, const float* __restrict__ shared,
                     const float* __restrict__ shared_gate, int64_t gate_stride,
                     float* __restrict__ out) {
  __shared__ int32_t s_pos[kMoeMaxTopK + 1];  // + the shared slot
  __shared__ float s_w[kMoeMaxTopK + 1];
  PdlWait();
  const int t = blockIdx.x;
  const int64_t base = static_cast<int64_t>(t) * top_k;
  if (threadIdx.x == 0) {  // the token's choices by increasing expert id (insertion sort)
    int32_t order[kMoeMaxTopK + 1];
    for (int j = 0; j < top_k; ++j) {
      int i = j;
      while (i > 0 && ids[base + order[i - 1]] > ids[base + j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
    for (int jj = 0; jj < top_k; ++jj) {
      s_pos[jj] = pos[base + order[jj]];
      s_w[jj] = wts[base + order[jj]];
    }
  }
  __syncthreads();
  const int h = blockIdx.y * kCombineThreads + threadIdx.x;
  if (h >= hidden) return;
  float acc = 0.0f;
  for (int j0 = 0; j0 < top_k; j0 += kCombineBatch) {
    float v[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      v[b] = j0 + b < top_k ? y[static_cast<int64_t>(s_pos[j0 + b]) * hidden + h] : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      if (j0 + b < top_k) acc = __fadd_rn(acc, __fmul_rn(v[b], s_w[j0 + b]));
    }
  }
  if (shared != nullptr) {
    const float gate = SharedGate(shared_gate[t * gate_stride]);
    acc = __fadd_rn(acc, __fmul_rn(gate, shared[static_cast<int64_t>(t) * hidden + h]));
  }
  out[static_cast<int64_t>(t) * hidden + h] = acc;
}

}  // namespace

void MoeRoute(const float* logits, int64_t logits_stride, int32_t n, int32_t n_experts,
              int32_t top_k, bool norm_topk_prob, bool shared_slot, const MoeRouting& r,
              int32_t* active_log, cudaStream_t stream) {
  KCHECK(n >= 1 && n_experts >= 1 && n_experts <= kMoeMaxExperts);
  KCHECK(top_k >= 1 && top_k <= n_experts && top_k <= kMoeMaxTopK);
  KCHECK(logits_stride >= n_experts + (shared_slot ? 1 : 0) && r.tile_begin != nullptr);
  const int picks = top_k + (shared_slot ? 1 : 0);
  const int slots = n_experts + (shared_slot ? 1 : 0);
  if (n <= kFusedRouteMaxTokens) {
    LaunchPdl(&MoeRouteFusedKernel, dim3(1), dim3(kAlignThreads), 0, stream, logits,
              logits_stride, static_cast<int>(n), static_cast<int>(n_experts),
              static_cast<int>(top_k), norm_topk_prob, shared_slot, r.topk_ids, r.topk_w,
              r.expert_begin, r.active, r.n_active, r.rows, r.pos, r.tile_begin, active_log);
    KCUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps);
  LaunchPdl(&MoeTopKKernel, dim3(blocks), dim3(kRouteWarps * 32), 0, stream, logits, logits_stride,
            static_cast<int>(n), static_cast<int>(n_experts), static_cast<int>(top_k),
            norm_topk_prob, shared_slot, r.topk_ids, r.topk_w);
  KCUDA_CHECK_LAUNCH();
  LaunchPdl(&MoeAlignKernel, dim3(1), dim3(kAlignThreads), 0, stream,
            static_cast<const int32_t*>(r.topk_ids), static_cast<int>(n * picks), picks, slots,
            r.expert_begin, r.active, r.n_active, r.rows, r.pos, r.tile_begin, active_log);
  KCUDA_CHECK_LAUNCH();
}

void MoeLinear(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k, const __nv_bfloat16* w,
               int32_t n_out, const MoeRouting& r, int32_t max_active, float* y,
               cudaStream_t stream) {
  KCHECK(k > 0 && k % 8 == 0 && n_out > 0 && max_active >= 1);
  KCHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0);
  // One column tile (8 rows) per pass, whatever the step's token count. Sizing the tiles by the
  // most rows an expert could get (the token count, up to 64 rows per pass) held registers for
  // rows that decode steps rarely have (64 tokens give an expert about 2). H200, 35B-A3B preset
  // at 20 layers, 2k context, ms per step (mean of two runs) at batch 1 / 8 / 16 / 32 / 64:
  // tiles by the token count 2.166 / 4.063 / 6.043 / 8.936 / 12.864, one tile 2.148 / 4.039 /
  // 5.911 / 8.343 / 11.385 (the same bits either way: a row depends only on its own x).
  LaunchMoeSkinny<false>(x, x_rows, k, w, n_out, r, max_active, y, nullptr, stream);
  KCUDA_CHECK_LAUNCH();
}

void MoeLinearSiluMul(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k,
                      const __nv_bfloat16* w, int32_t inter, const MoeRouting& r,
                      int32_t max_active, __nv_bfloat16* act, cudaStream_t stream) {
  KCHECK(k > 0 && k % 8 == 0 && inter > 0 && max_active >= 1);
  KCHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0);
  LaunchMoeSkinny<true>(x, x_rows, k, w, 2 * inter, r, max_active, nullptr, act, stream);
  KCUDA_CHECK_LAUNCH();
}

void MoeCombine(const float* y, const MoeRouting& r, int32_t n, int32_t top_k, int32_t hidden,
                const float* shared, const float* shared_gate, int64_t shared_gate_stride,
                float* out, cudaStream_t stream) {
  KCHECK(n >= 1 && top_k >= 1 && top_k <= kMoeMaxTopK + 1 && hidden >= 1);
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>((hidden + kCombineThreads - 1) / kCombineThreads));
  LaunchPdl(&MoeCombineKernel, grid, dim3(kCombineThreads), 0, stream, y,
            static_cast<const int32_t*>(r.topk_ids), static_cast<const float*>(r.topk_w),
            static_cast<const int32_t*>(r.pos), static_cast<int>(top_k), static_cast<int>(hidden),
            shared, shared_gate, shared_gate_stride, out);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
