// The gated delta rule in chunked form for prefill (GatedDeltaRuleChunked, see deltanet.h): the
// recurrence of GatedDeltaRule, kChunk (32) rows per sequential step, in two passes.
//
// Math. Within a chunk of rows 0..31 starting from state S0 [dk, dv], with the cumulative
// log-decay G_t = g_0 + ... + g_t (every g <= 0, so every exponent below is <= 0 and nothing
// overflows), unrolling S_t = exp(g_t) S_{t-1} + k_t delta_t^T gives
//   delta_t = beta_t (v_t - exp(G_t) S0^T k_t) - sum_{s<t} A_ts delta_s,
//             A_ts = beta_t exp(G_t - G_s) (k_t . k_s),
// that is (I + A) delta = diag(beta) u with u_t = v_t - exp(G_t) S0^T k_t, so delta = W u with
// W = (I + A)^-1 diag(beta) (lower triangular), and
//   o_t   = exp(G_t) S0^T q_t + sum_{s<=t} QK_ts delta_s,  QK_ts = exp(G_t - G_s) (q_t . k_s)
//   S_r   = exp(G_r) S0 + sum_{s<=r} exp(G_r - G_s) k_s delta_s^T   (the state after row r)
//   S_end = S_31 = exp(G_31) S0 + sum_s exp(G_31 - G_s) k_s delta_s^T.
// W, QK and the gates do not depend on the state, so:
//
// Pass 1 (DeltaChunkPrepKernel), fully parallel: block (chunk slot, key head), kThreads threads.
// The k.k and q.k products of the chunk's rows are formed once for the key head (36 4x4 tiles of
// the lower triangle, each by two lanes over the two halves of the key dim), then warp w takes
// the value heads w, w + 4, ... of the key head: the gate scan, QK, A, and W by forward
// substitution (one column per lane). Each (chunk, value head) gets a piece of the workspace,
// kPieceFloats floats (4,608 bytes):
//   [W (lower triangle with diagonal, row t at t(t+1)/2) | QK (same) | G | exp(G) | exp(G_31 - G)]
// Chunks sit on a fixed grid from each sequence's first row (rows 32c..32c+31, the last one
// clipped at the sequence's end, rows past it zero: k, q, v, g, beta, so their A, QK, W, u and
// delta are zero and every loop runs over all 32 rows). Chunk c of sequence s is slot
// seq_starts[s] / 32 + s + c: the slots of consecutive sequences never overlap, and there are at
// most n_tokens / 32 + n_seqs of them.
//
// Pass 2 (DeltaRuleStateKernel), sequential: block (32 value columns, value head, sequence),
// kThreads threads, walks the sequence's chunks with its columns of S in shared memory,
// transposed (St[j][d] = S[d][col0 + j]): the value columns are independent, and warp w owns 8 of
// them, so after one block barrier per chunk (the double-buffered inputs: the chunk's k, q rows,
// its v columns and its pass-1 piece, copied with cp.async one chunk ahead) a warp needs only
// __syncwarp: lane (rg, cp) computes rows 8m + rg (m = 0..3) of columns 2cp, 2cp + 1 of its warp
//   1. S0^T k and S0^T q for them (the bulk: 2 x 32 x dk products per column), u -> shared (over
//      the chunk's v), exp(G) S0^T q kept;
//   2. delta = W u from the warp's u (-> shared, with exp(G_31 - G) delta for 4);
//   3. o = exp(G) S0^T q + QK delta -> out;
//   4. S_end = exp(G_31) S0 + K^T (exp(G_31 - G) delta): lane owns 4 key rows x 8 / 4 / 2 / 1
//      columns (by key dim) and keeps S^T in place. A row r before the chunk's last naming a
//      snapshot slot gets S_r from the same S0 and delta (delta of rows <= r does not depend on
//      later rows), so chunks never split at snapshots; the last row's is S_end (rows past a
//      sequence's end change nothing).
// Every lane does the same work in every product. The key dim is padded with zeros to kDk (16,
// 32, 64, 128 or 256): zero terms leave every sum exactly as it is. Shared memory (floats): S^T
// [32][kDk + 4], k and q [2][32][kDk + 4] each, v/u [2][32][36], pieces [2][1152], delta and
// exp(G_31 - G) delta [4 warps][32][8] each: 108.5 KiB at kDk = 128 (two blocks per SM), 188 KiB
// at 256; row strides of kDk + 4 and 36 floats put the 8 rows a warp reads at once in distinct
// banks.
//
// Every sum runs in a fixed order in one thread (no atomics): results do not depend on the batch
// composition, and equal GatedDeltaRule's up to f32 rounding.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/deltanet.h"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kChunk = 32;  // rows per sequential step: a row per lane in the gate scan
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 32;                  // value columns per pass-2 block
constexpr int kWarpCols = kCols / kWarps;  // value columns per warp
constexpr int kValueStride = kCols + 4;    // v/u rows
constexpr int kGramStride = kChunk + 1;    // pass-1 k.k, q.k and A rows
constexpr int kTilePairs = 36;             // 4x4 tiles (a, b), b <= a, of a 32 x 32 triangle
constexpr int kTri = kChunk * (kChunk + 1) / 2;
static_assert(kWarpCols == 8 && kChunk == 32);
static_assert(kTilePairs % kWarps == 0 && 2 * kTilePairs / kWarps <= 32);

// The pass-1 piece of one (chunk, value head), offsets in floats.
constexpr int kPieceW = 0;                   // W = (I + A)^-1 diag(beta), packed lower triangle
constexpr int kPieceQK = kPieceW + kTri;     // QK, packed lower triangle
constexpr int kPieceG = kPieceQK + kTri;     // G
constexpr int kPieceEG = kPieceG + kChunk;   // exp(G)
constexpr int kPieceED = kPieceEG + kChunk;  // exp(G_31 - G)
constexpr int kPieceFloats = kPieceED + kChunk;
static_assert(kPieceFloats * sizeof(float) % 256 == 0 && kPieceFloats % 128 == 0);

// Row t of a packed lower triangle.
__host__ __device__ constexpr int Tri(int t) {
  return t * (t + 1) / 2;
}
// Steps 2 and 3 of pass 2 read a packed row up to 7 entries past its end: inside the triangle.
static_assert(Tri(kChunk - 2) + (kChunk - 2) + 7 < kTri);

// The first workspace slot of sequence `seq`, whose first row is `begin`.
__device__ __forceinline__ int64_t FirstSlot(int begin, int seq) {
  return int64_t{begin / kChunk} + seq;
}

__device__ __forceinline__ float Dot4(float4 a, float4 b, float acc) {
  acc += a.x * b.x;
  acc += a.y * b.y;
  acc += a.z * b.z;
  acc += a.w * b.w;
  return acc;
}

__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ void Store4(float* p, float4 x) {
  *reinterpret_cast<float4*>(p) = x;
}

__device__ __forceinline__ float2 Load2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}

// kN consecutive floats from shared memory (p aligned to their size when kN >= 2).
template <int kN>
__device__ __forceinline__ void LoadRow(const float* p, float (&x)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 4) {
      const float4 y = Load4(p + i);
      x[i] = y.x;
      x[i + 1] = y.y;
      x[i + 2] = y.z;
      x[i + 3] = y.w;
    }
  } else if constexpr (kN == 2) {
    const float2 y = Load2(p);
    x[0] = y.x;
    x[1] = y.y;
  } else {
    static_assert(kN == 1);
    x[0] = p[0];
  }
}

// cp.async: global -> shared without a trip through registers, so the next chunk's inputs land
// while this one computes. A copy that is not live reads nothing and writes zeros.
__device__ __forceinline__ void CopyAsync16(float* dst, const float* src, bool live) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(live ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CopyAsync4(float* dst, const float* src, bool live) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src),
               "r"(live ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void CopyAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void CopyAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// A [kRows, kTileCols] tile of a row-major global matrix (row stride src_stride floats) into
// shared memory (row stride dst_stride), zeros from row live_rows and column live_cols on, by all
// kThreads threads. 16-byte copies when vec (src, src_stride and live_cols multiples of 4 floats),
// a thread taking one column quad of every kThreads / (kTileCols / 4)-th row; else 4-byte ones.
template <int kRows, int kTileCols>
__device__ __forceinline__ void CopyTile(float* dst, int dst_stride, const float* src,
                                         int64_t src_stride, int live_rows, int live_cols, bool vec,
                                         int tid) {
  constexpr int kQuads = kTileCols / 4;
  static_assert(kTileCols % 4 == 0 && kThreads % kQuads == 0);
  if (vec) {
    const int c = 4 * (tid % kQuads);
    const bool col_live = c < live_cols;
#pragma unroll
    for (int r = tid / kQuads; r < kRows; r += kThreads / kQuads) {
      const bool live = col_live && r < live_rows;
      CopyAsync16(dst + r * dst_stride + c, live ? src + r * src_stride + c : src, live);
    }
  } else {
    for (int i = tid; i < kRows * kTileCols; i += kThreads) {
      const int r = i / kTileCols, c = i % kTileCols;
      const bool live = r < live_rows && c < live_cols;
      CopyAsync4(dst + r * dst_stride + c, live ? src + r * src_stride + c : src, live);
    }
  }
}

// Pass-1 shared memory (floats) for key dim kDk.
template <int kDk>
struct PrepLayout {
  static constexpr int kRowStride = kDk + 4;
  static constexpr int kKeys = 0;
  static constexpr int kQueries = kChunk * kRowStride;
  static constexpr int kA = 0;  // per warp [kChunk][kGramStride], over k and q once they are dead
  static constexpr int kAFloats = kWarps * kChunk * kGramStride;
  static constexpr int kKK = std::max(2 * kChunk * kRowStride, kAFloats);
  static constexpr int kQK = kKK + kChunk * kGramStride;
  static constexpr int kFloats = kQK + kChunk * kGramStride;
  static constexpr size_t kBytes = size_t{kFloats} * sizeof(float);
};

// Pass 1: block (chunk slot, key head); see the top of the file.
template <int kDk>
__global__ void __launch_bounds__(kThreads)
    DeltaChunkPrepKernel(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ g, const float* __restrict__ beta, int nk,
                         int dk, int nv, DeltaBatchView b, float* __restrict__ workspace,
                         bool kq_vec) {
  using L = PrepLayout<kDk>;
  constexpr int kRS = L::kRowStride;
  extern __shared__ float4 prep_smem[];
  float* smem = reinterpret_cast<float*>(prep_smem);
  float* Ks = smem + L::kKeys;
  float* Qs = smem + L::kQueries;
  float* KK = smem + L::kKK;
  float* QK = smem + L::kQK;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int slot = blockIdx.x, kh = blockIdx.y;
  // The sequence owning the slot: the last one whose first slot is <= slot (first slots
  // increase strictly with the sequence).
  int seq = 0;
  for (int hi = b.n_seqs - 1; seq < hi;) {
    const int mid = (seq + hi + 1) / 2;
    if (FirstSlot(b.seq_starts[mid], mid) <= slot) {
      seq = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  const int start = begin + static_cast<int>(slot - FirstSlot(begin, seq)) * kChunk;
  if (start >= end) return;
  const int len = end - start < kChunk ? end - start : kChunk;

  const int64_t row0 = int64_t{start} * nk + kh;
  CopyTile<kChunk, kDk>(Ks, kRS, k + row0 * dk, int64_t{nk} * dk, len, dk, kq_vec, tid);
  CopyTile<kChunk, kDk>(Qs, kRS, q + row0 * dk, int64_t{nk} * dk, len, dk, kq_vec, tid);
  CopyAsyncCommit();
  CopyAsyncWaitAll();
  __syncthreads();

  // k.k and q.k of tile pair (a, b): rows 4a.. of k and q against rows 4b.. of k. Lanes 2i and
  // 2i + 1 of warp w take pair w + 4i over the two halves of the key dim; lanes past them idle.
  {
    const int pair = warp + kWarps * (lane / 2), half = lane % 2;
    const bool gram = lane < 2 * (kTilePairs / kWarps);
    int ta = 0;
    while (Tri(ta + 1) <= pair) ++ta;
    const int tb = pair - Tri(ta);
    float kk[4][4] = {}, qk[4][4] = {};
    if (gram) {
      const float* xk = Ks + 4 * ta * kRS;
      const float* xq = Qs + 4 * ta * kRS;
      const float* z = Ks + 4 * tb * kRS;
#pragma unroll 2
      for (int d = half * (kDk / 2); d < (half + 1) * (kDk / 2); d += 4) {
        float4 xk4[4], xq4[4], z4[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          xk4[r] = Load4(xk + r * kRS + d);
          xq4[r] = Load4(xq + r * kRS + d);
          z4[r] = Load4(z + r * kRS + d);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            kk[r][c] = Dot4(xk4[r], z4[c], kk[r][c]);
            qk[r][c] = Dot4(xq4[r], z4[c], qk[r][c]);
          }
        }
      }
    }
    // The even lane keeps k.k, the odd one q.k: each adds its partner's half (a + b = b + a, so
    // both orders give the same bits).
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float got = __shfl_xor_sync(0xffffffffu, half ? kk[r][c] : qk[r][c], 1);
        const float sum = (half ? qk[r][c] : kk[r][c]) + got;
        if (gram) (half ? QK : KK)[(4 * ta + r) * kGramStride + 4 * tb + c] = sum;
      }
    }
  }
  __syncthreads();

  // Per value head of this key head, one warp each: gates, QK, A, then W column by column.
  const int group = nv / nk;
  float* A = smem + L::kA + warp * kChunk * kGramStride;
  for (int hl = warp; hl < group; hl += kWarps) {
    const int h = kh * group + hl;
    const int64_t gate = (int64_t{start} + lane) * nv + h;
    float gc = lane < len ? g[gate] : 0.0f;  // becomes G of row `lane`
    const float bt = lane < len ? beta[gate] : 0.0f;
#pragma unroll
    for (int off = 1; off < kChunk; off *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, gc, off);
      if (lane >= off) gc += up;
    }
    const float g_last = __shfl_sync(0xffffffffu, gc, kChunk - 1);
    float* piece = workspace + (int64_t{slot} * nv + h) * kPieceFloats;
    piece[kPieceG + lane] = gc;
    piece[kPieceEG + lane] = expf(gc);
    piece[kPieceED + lane] = expf(g_last - gc);
    // Row t: lane s <= t forms exp(G_t - G_s) and scales its q.k (into the piece) and k.k (A).
    for (int t = 0; t < kChunk; ++t) {
      const float g_t = __shfl_sync(0xffffffffu, gc, t);
      const float b_t = __shfl_sync(0xffffffffu, bt, t);
      if (lane <= t) {
        const float decay = expf(g_t - gc);
        piece[kPieceQK + Tri(t) + lane] = decay * QK[t * kGramStride + lane];
        if (lane < t) A[t * kGramStride + lane] = b_t * decay * KK[t * kGramStride + lane];
      }
    }
    __syncwarp();
    // Column `lane` of W: (I + A) x = beta_lane e_lane by forward substitution; x_t = 0 for
    // t < lane, so those terms add exact zeros.
    float x[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      float acc = t == lane ? bt : 0.0f;
#pragma unroll
      for (int s = 0; s < t; ++s) acc -= A[t * kGramStride + s] * x[s];
      x[t] = acc;
    }
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (lane <= t) piece[kPieceW + Tri(t) + lane] = x[t];
    }
    __syncwarp();  // A is rewritten for the warp's next value head
  }
}

// Pass-2 shared memory (floats) for key dim kDk.
template <int kDk>
struct StateLayout {
  static constexpr int kRowStride = kDk + 4;  // k, q and S^T rows
  static constexpr int kKeyFloats = kChunk * kRowStride;
  static constexpr int kValueFloats = kChunk * kValueStride;
  static constexpr int kDeltaFloats = kChunk * kWarpCols;    // one warp's
  static constexpr int kState = 0;                           // S^T [kCols][kRowStride]
  static constexpr int kKeys = kState + kCols * kRowStride;  // [2][kChunk][kRowStride]
  static constexpr int kQueries = kKeys + 2 * kKeyFloats;
  static constexpr int kValues = kQueries + 2 * kKeyFloats;        // v, then u: [2][kChunk][36]
  static constexpr int kPieces = kValues + 2 * kValueFloats;       // [2][kPieceFloats]
  static constexpr int kDelta = kPieces + 2 * kPieceFloats;        // [kWarps][kChunk][kWarpCols]
  static constexpr int kDeltaEd = kDelta + kWarps * kDeltaFloats;  // exp(G_31 - G) delta
  static constexpr int kFloats = kDeltaEd + kWarps * kDeltaFloats;
  static constexpr size_t kBytes = size_t{kFloats} * sizeof(float);
  static_assert(kRowStride % 4 == 0 && kKeys % 4 == 0 && kValues % 4 == 0 && kPieces % 4 == 0 &&
                kDelta % 4 == 0 && kDeltaEd % 4 == 0);
};

// Writes a lane's tile of a state (key rows d0..d0+3, columns col..col+kN-1; acc[c] holds column
// col + c) to dst [dk, dv].
template <int kN>
__device__ __forceinline__ void StoreStateTile(float* dst, const float4 (&acc)[kN], int d0, int col,
                                               int dk, int dv) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (d0 + i >= dk) break;
#pragma unroll
    for (int c = 0; c < kN; ++c) {
      const float4 a = acc[c];
      const float val = i == 0 ? a.x : i == 1 ? a.y : i == 2 ? a.z : a.w;
      if (col + c < dv) dst[int64_t{d0 + i} * dv + col + c] = val;
    }
  }
}

// Pass 2: block (column group of 32, value head, sequence); see the top of the file.
template <int kDk>
__global__ void __launch_bounds__(kThreads, 2)
    DeltaRuleStateKernel(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, int64_t v_stride,
                         const float* __restrict__ workspace, int nk, int dk, int nv, int dv,
                         DeltaBatchView b, DeltaStateView st, float* __restrict__ out, bool kq_vec,
                         bool v_vec) {
  using L = StateLayout<kDk>;
  constexpr int kRS = L::kRowStride;
  // Step 4's lanes: kGroupLanes groups of 4 key rows (kGroupsPerLane each) x kColSets sets of
  // kSCols columns, so that every lane has work for every key dim.
  constexpr int kDGroups = kDk / 4;
  constexpr int kGroupLanes = kDGroups < 32 ? kDGroups : 32;
  constexpr int kGroupsPerLane = kDGroups / kGroupLanes;
  constexpr int kSCols = kWarpCols * kGroupLanes / 32;
  extern __shared__ float4 state_smem[];
  float* smem = reinterpret_cast<float*>(state_smem);
  float* St = smem + L::kState;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int col0 = blockIdx.x * kCols, h = blockIdx.y, seq = blockIdx.z;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;
  const int kh = h / (nv / nk);
  const int n_chunks = (end - begin + kChunk - 1) / kChunk;
  const float* pieces = workspace + (FirstSlot(begin, seq) * nv + h) * kPieceFloats;
  const int64_t head_offset = st.layer_offset + st.conv_floats + int64_t{h} * dk * dv;
  float* home = st.state + b.state_slots[seq] * st.slot_floats + head_offset;

  // Chunk i's inputs into buffer i % 2: k and q rows, this block's v columns, its piece.
  auto fetch = [&](int i) {
    const int start = begin + i * kChunk, len = min(end - start, kChunk), buf = i % 2;
    const int64_t row0 = int64_t{start} * nk + kh;
    CopyTile<kChunk, kDk>(smem + L::kKeys + buf * L::kKeyFloats, kRS, k + row0 * dk,
                          int64_t{nk} * dk, len, dk, kq_vec, tid);
    CopyTile<kChunk, kDk>(smem + L::kQueries + buf * L::kKeyFloats, kRS, q + row0 * dk,
                          int64_t{nk} * dk, len, dk, kq_vec, tid);
    CopyTile<kChunk, kCols>(smem + L::kValues + buf * L::kValueFloats, kValueStride,
                            v + int64_t{start} * v_stride + int64_t{h} * dv + col0, v_stride, len,
                            dv - col0, v_vec, tid);
    constexpr int kPieceRows = kPieceFloats / 128;  // the piece as [9][128]
    CopyTile<kPieceRows, 128>(smem + L::kPieces + buf * kPieceFloats, 128,
                              pieces + int64_t{i} * nv * kPieceFloats, 128, kPieceRows, 128, true,
                              tid);
    CopyAsyncCommit();
  };
  fetch(0);
  // Snapshot slots of the chunk's rows, lane t for row t (-1 past the end), a chunk ahead too.
  int snap = lane < end - begin ? b.snapshot_slot[begin + lane] : -1;

  const bool fresh = b.positions[begin] == 0;
  for (int i = tid; i < kCols * kDk; i += kThreads) {
    const int j = i % kCols, d = i / kCols;
    const bool live = !fresh && d < dk && col0 + j < dv;
    St[j * kRS + d] = live ? home[int64_t{d} * dv + col0 + j] : 0.0f;
  }

  // Steps 1-3: rows 8m + rg, columns wcol, wcol + 1 of the block.
  const int cp = lane % 4, rg = lane / 4;
  const int wcol = kWarpCols * warp + 2 * cp;
  // Step 4: key rows 4 * (gl + kGroupLanes * gi).., columns scol.. of the block.
  const int gl = lane % kGroupLanes, scol = kWarpCols * warp + (lane / kGroupLanes) * kSCols;
  float* Dw = smem + L::kDelta + warp * L::kDeltaFloats;
  float* DEw = smem + L::kDeltaEd + warp * L::kDeltaFloats;

  for (int i = 0; i < n_chunks; ++i) {
    const int start = begin + i * kChunk, len = min(end - start, kChunk), buf = i % 2;
    CopyAsyncWaitAll();
    // Chunk i's inputs (and S^T) are visible to every warp, and every warp is done with chunk
    // i - 1, whose buffers now take chunk i + 1.
    __syncthreads();
    int next_snap = -1;
    if (i + 1 < n_chunks) {
      fetch(i + 1);
      if (start + kChunk + lane < end) next_snap = b.snapshot_slot[start + kChunk + lane];
    }
    const float* Kc = smem + L::kKeys + buf * L::kKeyFloats;
    const float* Qc = smem + L::kQueries + buf * L::kKeyFloats;
    float* Vc = smem + L::kValues + buf * L::kValueFloats;
    const float* Pc = smem + L::kPieces + buf * kPieceFloats;
    const float* EG = Pc + kPieceEG;

    // 1. S0^T k and S0^T q; u = v - exp(G) S0^T k over v; o starts as exp(G) S0^T q.
    float2 o[4];
    {
      float kacc[4][2] = {}, qacc[4][2] = {};
      const float* krow = Kc + rg * kRS;
      const float* qrow = Qc + rg * kRS;
      const float* srow = St + wcol * kRS;
#pragma unroll 2
      for (int d = 0; d < kDk; d += 4) {
        float4 kx[4], qx[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          kx[m] = Load4(krow + 8 * m * kRS + d);
          qx[m] = Load4(qrow + 8 * m * kRS + d);
        }
        const float4 s0 = Load4(srow + d), s1 = Load4(srow + kRS + d);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          kacc[m][0] = Dot4(kx[m], s0, kacc[m][0]);
          kacc[m][1] = Dot4(kx[m], s1, kacc[m][1]);
          qacc[m][0] = Dot4(qx[m], s0, qacc[m][0]);
          qacc[m][1] = Dot4(qx[m], s1, qacc[m][1]);
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int t = 8 * m + rg;
        const float e = EG[t];
        float* vp = Vc + t * kValueStride + wcol;
        const float2 vv = Load2(vp);
        *reinterpret_cast<float2*>(vp) = make_float2(vv.x - e * kacc[m][0], vv.y - e * kacc[m][1]);
        o[m] = make_float2(e * qacc[m][0], e * qacc[m][1]);
      }
    }
    __syncwarp();

    // 2. delta = W u. Row t = 8m + rg needs s <= t: a term is skipped where that holds for no
    // lane, and taken as zero where it fails for some (without a branch: the read, at most 7
    // past row t's end, stays in the packed triangle).
    {
      const float* W = Pc + kPieceW;
      const float* ED = Pc + kPieceED;
      float2 acc[4] = {};
#pragma unroll
      for (int s = 0; s < kChunk; ++s) {
        const float2 u = Load2(Vc + s * kValueStride + wcol);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int t = 8 * m + rg;
          if (s > 8 * m + 7) continue;
          const float w_ts = W[Tri(t) + s];
          const float w = s <= 8 * m || s <= t ? w_ts : 0.0f;
          acc[m].x += w * u.x;
          acc[m].y += w * u.y;
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int t = 8 * m + rg;
        const float e = ED[t];
        *reinterpret_cast<float2*>(Dw + t * kWarpCols + 2 * cp) = acc[m];
        *reinterpret_cast<float2*>(DEw + t * kWarpCols + 2 * cp) =
            make_float2(e * acc[m].x, e * acc[m].y);
      }
    }
    __syncwarp();

    // 3. o += QK delta -> out.
    {
      const float* QK = Pc + kPieceQK;
#pragma unroll
      for (int s = 0; s < kChunk; ++s) {
        const float2 dl = Load2(Dw + s * kWarpCols + 2 * cp);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int t = 8 * m + rg;
          if (s > 8 * m + 7) continue;
          const float qk_ts = QK[Tri(t) + s];
          const float w = s <= 8 * m || s <= t ? qk_ts : 0.0f;
          o[m].x += w * dl.x;
          o[m].y += w * dl.y;
        }
      }
      const int col = col0 + wcol;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int t = 8 * m + rg;
        if (t >= len) break;
        float* dst = out + (int64_t{start + t} * nv + h) * dv + col;
        if (col < dv) dst[0] = o[m].x;
        if (col + 1 < dv) dst[1] = o[m].y;
      }
    }

    // 4. Snapshots inside the chunk, then S_end (also the snapshot of the chunk's last row, and
    // after the last chunk the sequence's state).
    {
      const unsigned snaps = __ballot_sync(0xffffffffu, snap >= 0);
      const unsigned inner = snaps & ((1u << (len - 1)) - 1);
      const int end_snap = __shfl_sync(0xffffffffu, snap, len - 1);
      const bool last_chunk = i + 1 == n_chunks;
      const float* G = Pc + kPieceG;
      const float e_last = EG[kChunk - 1];
#pragma unroll 1
      for (int gi = 0; gi < kGroupsPerLane; ++gi) {
        const int d0 = 4 * (gl + kGroupLanes * gi);
        float4 s0[kSCols];
#pragma unroll
        for (int c = 0; c < kSCols; ++c) s0[c] = Load4(St + (scol + c) * kRS + d0);
        for (unsigned rest = inner; rest != 0; rest &= rest - 1) {
          const int r = __ffs(rest) - 1;
          const int slot = __shfl_sync(0xffffffffu, snap, r);
          const float e_r = EG[r], g_r = G[r];
          float4 acc[kSCols];
#pragma unroll
          for (int c = 0; c < kSCols; ++c) {
            acc[c] = make_float4(e_r * s0[c].x, e_r * s0[c].y, e_r * s0[c].z, e_r * s0[c].w);
          }
          for (int s = 0; s <= r; ++s) {
            const float e = expf(g_r - G[s]);
            const float4 ks = Load4(Kc + s * kRS + d0);
            const float4 kd = make_float4(e * ks.x, e * ks.y, e * ks.z, e * ks.w);
            float dl[kSCols];
            LoadRow(Dw + s * kWarpCols + scol % kWarpCols, dl);
#pragma unroll
            for (int c = 0; c < kSCols; ++c) {
              acc[c].x += kd.x * dl[c];
              acc[c].y += kd.y * dl[c];
              acc[c].z += kd.z * dl[c];
              acc[c].w += kd.w * dl[c];
            }
          }
          StoreStateTile(st.state + slot * st.slot_floats + head_offset, acc, d0, col0 + scol, dk,
                         dv);
        }
        float4 acc[kSCols];
#pragma unroll
        for (int c = 0; c < kSCols; ++c) {
          acc[c] =
              make_float4(e_last * s0[c].x, e_last * s0[c].y, e_last * s0[c].z, e_last * s0[c].w);
        }
#pragma unroll 4
        for (int s = 0; s < kChunk; ++s) {
          const float4 ks = Load4(Kc + s * kRS + d0);
          float de[kSCols];
          LoadRow(DEw + s * kWarpCols + scol % kWarpCols, de);
#pragma unroll
          for (int c = 0; c < kSCols; ++c) {
            acc[c].x += ks.x * de[c];
            acc[c].y += ks.y * de[c];
            acc[c].z += ks.z * de[c];
            acc[c].w += ks.w * de[c];
          }
        }
#pragma unroll
        for (int c = 0; c < kSCols; ++c) Store4(St + (scol + c) * kRS + d0, acc[c]);
        if (end_snap >= 0) {
          StoreStateTile(st.state + end_snap * st.slot_floats + head_offset, acc, d0, col0 + scol,
                         dk, dv);
        }
        if (last_chunk) StoreStateTile(home, acc, d0, col0 + scol, dk, dv);
      }
    }
    snap = next_snap;
  }
}

// Opts kernel into smem bytes of dynamic shared memory, once per instance (a host call, not a
// stream operation: fine under graph capture); false where the device's limit is lower.
template <class Kernel>
bool OptIn(Kernel kernel, size_t smem) {
  int device = 0, limit = 0;
  KCUDA_CHECK(cudaGetDevice(&device));
  KCUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem > static_cast<size_t>(limit)) return false;
  KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem)));
  return true;
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <int kDk>
void LaunchChunked(const float* q, const float* k, const float* v, int64_t v_stride, const float* g,
                   const float* beta, int32_t nk, int32_t dk, int32_t nv, int32_t dv,
                   const DeltaBatchView& b, const DeltaStateView& s, float* out, float* workspace,
                   cudaStream_t stream) {
  constexpr size_t kPrepBytes = PrepLayout<kDk>::kBytes, kStateBytes = StateLayout<kDk>::kBytes;
  // A device whose limit is below the pass-2 layout (not Hopper, whose limit is 227 KiB) takes
  // the recurrent kernel instead.
  static const bool fits =
      OptIn(DeltaChunkPrepKernel<kDk>, kPrepBytes) && OptIn(DeltaRuleStateKernel<kDk>, kStateBytes);
  if (!fits) {
    GatedDeltaRule(q, k, v, v_stride, g, beta, nk, dk, nv, dv, b, s, out, stream);
    return;
  }
  const bool kq_vec = dk % 4 == 0 && Aligned16(q) && Aligned16(k);
  const bool v_vec = dv % 4 == 0 && v_stride % 4 == 0 && Aligned16(v);
  const int64_t slots = int64_t{b.n_tokens} / kChunk + b.n_seqs;
  const dim3 prep_grid(static_cast<unsigned>(slots), static_cast<unsigned>(nk));
  DeltaChunkPrepKernel<kDk><<<prep_grid, kThreads, kPrepBytes, stream>>>(q, k, g, beta, nk, dk, nv,
                                                                         b, workspace, kq_vec);
  KCUDA_CHECK_LAUNCH();
  const dim3 state_grid(static_cast<unsigned>((dv + kCols - 1) / kCols), static_cast<unsigned>(nv),
                        static_cast<unsigned>(b.n_seqs));
  DeltaRuleStateKernel<kDk><<<state_grid, kThreads, kStateBytes, stream>>>(
      q, k, v, v_stride, workspace, nk, dk, nv, dv, b, s, out, kq_vec, v_vec);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace

size_t GatedDeltaRuleChunkedWorkspaceBytes(int32_t n_tokens, int32_t n_seqs, int32_t nv) {
  return (static_cast<size_t>(n_tokens) / kChunk + static_cast<size_t>(n_seqs)) *
         static_cast<size_t>(nv) * kPieceFloats * sizeof(float);
}

void GatedDeltaRuleChunked(const float* q, const float* k, const float* v, int64_t v_stride,
                           const float* g, const float* beta, int32_t nk, int32_t dk, int32_t nv,
                           int32_t dv, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                           float* workspace, cudaStream_t stream) {
  KCHECK(dk > 0 && dk <= 256 && dv > 0 && dv <= 256 && nk > 0 && nv % nk == 0);
  KCHECK(nv <= 65535 && nk <= 65535 && b.n_seqs <= 65535);
  KCHECK(workspace != nullptr && Aligned16(workspace));
  if (b.n_seqs == 0) return;
  // The key dim padded with zeros to the next instance.
  auto* launch = dk <= 16    ? &LaunchChunked<16>
                 : dk <= 32  ? &LaunchChunked<32>
                 : dk <= 64  ? &LaunchChunked<64>
                 : dk <= 128 ? &LaunchChunked<128>
                             : &LaunchChunked<256>;
  launch(q, k, v, v_stride, g, beta, nk, dk, nv, dv, b, s, out, workspace, stream);
}

}  // namespace kestrel::cuda
