// The gated delta rule in chunked form for prefill (GatedDeltaRuleChunked, see deltanet.h): the
// recurrence of GatedDeltaRule, kChunk (32) rows per sequential step instead of one.
//
// Math. Within a chunk of C <= kChunk rows starting from state S0 [dk, dv], with the cumulative
// log-decay G_t = g_0 + ... + g_t (rows of the chunk; every g <= 0, so every exponent below is
// <= 0 and nothing overflows), unrolling S_t = exp(g_t) S_{t-1} + k_t delta_t^T gives
//   r_t     = beta_t * (v_t - exp(G_t) * S0^T k_t)
//   delta_t = r_t - sum_{s<t} A_ts delta_s,      A_ts = beta_t * exp(G_t - G_s) * (k_t . k_s)
//   o_t     = exp(G_t) * S0^T q_t + sum_{s<=t} QK_ts delta_s,  QK_ts = exp(G_t - G_s) * (q_t . k_s)
//   S_end   = exp(G_last) * S0 + sum_s exp(G_last - G_s) * k_s delta_s^T
// The forward substitution for delta is blocked by kSub (8) rows: the inverses (I + A_bb)^-1 of
// the four kSub x kSub diagonal blocks are formed column by column, then block b takes
//   delta_b = (I + A_bb)^-1 (r_b - sum_{b' < b} A_bb' delta_b').
//
// Layout. The value columns of S are independent (column j needs only k, q, g, beta and v[:, j]),
// so a block owns 32 columns of one value head of one sequence, grid (column groups, value heads,
// sequences), kThreads (128) threads, and walks the sequence's chunks in order with its columns of S in
// shared memory, transposed (St[j][d] = S[d][col0 + j]). A, QK and the chunk's k and q rows are
// shared by all columns and recomputed by each block (about 40% of its arithmetic at dk = 128).
// The key dim is padded with zeros to kDk (16, 32, 64, 128 or 256): zero terms leave every sum
// exactly as it is. Rows past the chunk's end are zero too (k, q, v, g and beta), which makes
// their A, QK, r and delta zero and lets every loop run over all kChunk rows.
// Shared memory per block (floats): k and q rows [kChunk, kDk] each, S^T [32, kDk] (rows padded to
// kDk + 4, 4-row tiles by 4 more, so that the float4 reads of a warp's different tiles fall in
// different banks), A and QK [kChunk, kChunk + 1], r and o [kChunk, 36], gates [4, kChunk]; delta
// [kChunk, 36] and the inverses [4, kSub, kSub + 1] reuse the q rows, dead once A, QK and S0^T q
// are formed. 68 KiB for kDk = 128 (three blocks per SM), 118 KiB for 256.
//
// A chunk ends after kChunk rows, at the sequence's end, or after the first row that names a snapshot
// slot, so a snapshot is S_end of its chunk. Each thread writes the state values it computes to
// the snapshot slot and, after the last chunk, to the sequence's slot (S starts at zero when the
// sequence's first position is 0). Every sum runs in a fixed order in one thread: results do not
// depend on the batch composition, and equal GatedDeltaRule's up to f32 rounding.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/deltanet.h"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

// 32 rows per sequential step keeps a block's shared memory at 68 KiB (key dim 128), so three
// blocks share an SM: at 64 rows (135 KiB, one block per SM) Qwen3.5-27B's 192 blocks of a
// sequence took two waves on the H200's 132 SMs.
constexpr int kChunk = 32;  // rows per sequential step (<= 64: ChunkLength, the gate scan)
constexpr int kCols = 32;   // value columns per block
constexpr int kSub = 8;     // rows per forward-substitution block
constexpr int kThreads = 128;
constexpr int kBlocksPerSm = 3;
constexpr int kColStride = kCols + 4;                 // r, o, delta rows (float4-aligned)
constexpr int kGramStride = kChunk + 1;               // A, QK rows
constexpr int kInvStride = kSub + 1;                  // rows of one inverse block
constexpr int kTiles = kChunk / 4;                    // 4-row tiles of a chunk
constexpr int kGramJobs = kTiles * (kTiles - 1) / 2;  // tiles (a, b), b < a, of A and QK
constexpr int kProductJobs = kTiles * (kCols / 4);    // tiles of S0^T k and S0^T q
static_assert(kGramJobs + kProductJobs <= kThreads);
static_assert(kTiles * 16 == kThreads);  // one thread per dot of the diagonal tiles
static_assert(kSub * (kCols / 2) == kThreads && kChunk == 4 * kSub);
static_assert(kTiles * (kCols / 2) == kThreads);

// Offsets (floats) into the dynamic shared memory for key dim kDk.
template <int kDk>
struct ChunkLayout {
  static constexpr int kRowStride = kDk + 4;
  // Row r of a [rows, kDk] operand. Tile a (rows 4a..4a+3) starts at bank 20a mod 32: distinct
  // for 8 consecutive tiles.
  static __host__ __device__ constexpr int Row(int r) { return r * kRowStride + (r / 4) * 4; }
  static constexpr int kDelta = kChunk * kColStride;
  static constexpr int kInv = 4 * kSub * kInvStride;
  static constexpr int kKeys = 0;
  static constexpr int kQueries = kKeys + Row(kChunk);  // later delta, then the inverses
  static constexpr int kState = kQueries + std::max(Row(kChunk), kDelta + kInv);
  static constexpr int kR = kState + Row(kCols);
  static constexpr int kO = kR + kChunk * kColStride;
  static constexpr int kA = kO + kChunk * kColStride;
  static constexpr int kQK = kA + kChunk * kGramStride;
  static constexpr int kGates = kQK + kChunk * kGramStride;  // G, exp(G), exp(G_last - G), beta
  static constexpr int kFloats = kGates + 4 * kChunk;
  static constexpr size_t kBytes = size_t{kFloats} * sizeof(float);
  static_assert(kRowStride % 4 == 0 && kQueries % 4 == 0 && kState % 4 == 0 && kR % 4 == 0 &&
                kO % 4 == 0);
};

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

// Rows in the chunk starting at `start`: up to kChunk, to the sequence's end, or through the first
// row naming a snapshot slot. Called by every lane of a warp.
__device__ __forceinline__ int ChunkLength(const int32_t* __restrict__ snapshot_slot, int start,
                                           int end, int lane) {
  const int limit = end - start < kChunk ? end - start : kChunk;
  const unsigned lo = __ballot_sync(0xffffffffu, lane < limit && snapshot_slot[start + lane] >= 0);
  const unsigned hi =
      __ballot_sync(0xffffffffu, lane + 32 < limit && snapshot_slot[start + lane + 32] >= 0);
  if (lo != 0) return __ffs(lo);
  if (hi != 0) return 32 + __ffs(hi);
  return limit;
}

// Block (column group of 32, value head, sequence), kThreads threads; see the top of the file.
template <int kDk>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    DeltaRuleChunkedKernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, int64_t v_stride,
                           const float* __restrict__ g, const float* __restrict__ beta, int nk,
                           int dk, int nv, int dv, DeltaBatchView b, DeltaStateView st,
                           float* __restrict__ out) {
  using L = ChunkLayout<kDk>;
  constexpr int kRS = L::kRowStride;
  extern __shared__ float4 chunk_smem[];
  float* smem = reinterpret_cast<float*>(chunk_smem);
  float* Ks = smem + L::kKeys;
  float* Qs = smem + L::kQueries;
  float* D = smem + L::kQueries;                // delta [kChunk, kColStride], once Qs is dead
  float* Inv = smem + L::kQueries + L::kDelta;  // (I + A_bb)^-1 [4, kSub, kInvStride]
  float* St = smem + L::kState;
  float* R = smem + L::kR;
  float* O = smem + L::kO;
  float* A = smem + L::kA;
  float* QK = smem + L::kQK;
  float* G = smem + L::kGates;
  float* EG = G + kChunk;   // exp(G_t)
  float* ED = EG + kChunk;  // exp(G_last - G_t)
  float* Beta = ED + kChunk;

  const int tid = threadIdx.x, lane = tid % 32;
  const int col0 = blockIdx.x * kCols, h = blockIdx.y, seq = blockIdx.z;
  const int begin = b.seq_starts[seq], end = b.seq_starts[seq + 1];
  if (begin == end) return;
  const int kh = h / (nv / nk);
  const int64_t head_offset = st.layer_offset + st.conv_floats + int64_t{h} * dk * dv;
  float* home = st.state + b.state_slots[seq] * st.slot_floats + head_offset;
  const bool fresh = b.positions[begin] == 0;
  for (int i = tid; i < kCols * kDk; i += kThreads) {
    const int j = i % kCols, d = i / kCols;
    const bool live = !fresh && d < dk && col0 + j < dv;
    St[L::Row(j) + d] = live ? home[int64_t{d} * dv + col0 + j] : 0.0f;
  }

  // This thread's tile of the Gram/product phase (the same for every chunk): rows 4 * x_tile..
  // of k and q against 4 rows of z, k rows (A, QK; z_tile < x_tile) or S^T rows (S0^T k, S0^T q).
  int x_tile = 0, z_tile = 0;
  const bool gram_job = tid < kGramJobs, product_job = !gram_job && tid < kGramJobs + kProductJobs;
  if (gram_job) {
    x_tile = 1;
    while (x_tile * (x_tile + 1) / 2 <= tid) ++x_tile;
    z_tile = tid - x_tile * (x_tile - 1) / 2;
  } else if (product_job) {
    x_tile = (tid - kGramJobs) / (kCols / 4);
    z_tile = (tid - kGramJobs) % (kCols / 4);
  }
  const float* z_rows = (gram_job ? Ks : St) + L::Row(4 * z_tile);
  // This thread's dot of a diagonal 4 x 4 tile: 6 of A (s < t), then 10 of QK (s <= t).
  const int diag_tile = tid / 16, diag_pair = tid % 16;
  const bool diag_qk = diag_pair >= 6;
  int diag_i, diag_c;
  if (!diag_qk) {
    diag_i = diag_pair < 1 ? 1 : diag_pair < 3 ? 2 : 3;
    diag_c = diag_pair - diag_i * (diag_i - 1) / 2;
  } else {
    const int p = diag_pair - 6;
    diag_i = p < 1 ? 0 : p < 3 ? 1 : p < 6 ? 2 : 3;
    diag_c = p - diag_i * (diag_i + 1) / 2;
  }

  for (int start = begin; start < end;) {
    const int len = ChunkLength(b.snapshot_slot, start, end, lane);

    // Load the chunk's k, q rows and v columns, zero past its end; warp 0 scans the gates.
    for (int i = tid; i < kChunk * kDk; i += kThreads) {
      const int t = i / kDk, d = i % kDk;
      const bool live = t < len && d < dk;
      const int64_t at = ((int64_t{start} + t) * nk + kh) * dk + d;
      Ks[L::Row(t) + d] = live ? k[at] : 0.0f;
      Qs[L::Row(t) + d] = live ? q[at] : 0.0f;
    }
    for (int i = tid; i < kChunk * kCols; i += kThreads) {
      const int t = i / kCols, j = i % kCols;
      const bool live = t < len && col0 + j < dv;
      R[t * kColStride + j] =
          live ? v[(int64_t{start} + t) * v_stride + int64_t{h} * dv + col0 + j] : 0.0f;
    }
    if (tid < 32) {
      // Inclusive scan of g over each 32-row half (Kogge-Stone), then the halves joined.
      const int64_t row = (int64_t{start} + lane) * nv + h;
      float lo = lane < len ? g[row] : 0.0f;
      float hi = lane + 32 < len ? g[row + 32 * nv] : 0.0f;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float lo_up = __shfl_up_sync(0xffffffffu, lo, off);
        const float hi_up = __shfl_up_sync(0xffffffffu, hi, off);
        if (lane >= off) {
          lo += lo_up;
          hi += hi_up;
        }
      }
      hi += __shfl_sync(0xffffffffu, lo, 31);
      const float last = __shfl_sync(0xffffffffu, hi, 31);
      G[lane] = lo;
      EG[lane] = expf(lo);
      ED[lane] = expf(last - lo);
      Beta[lane] = lane < len ? beta[row] : 0.0f;
      if constexpr (kChunk > 32) {
        G[lane + 32] = hi;
        EG[lane + 32] = expf(hi);
        ED[lane + 32] = expf(last - hi);
        Beta[lane + 32] = lane + 32 < len ? beta[row + 32 * nv] : 0.0f;
      }
    }
    __syncthreads();

    // A, QK off the diagonal tiles; r = beta (v - exp(G) S0^T k); o = exp(G) S0^T q.
    if (gram_job || product_job) {
      const float* xk = Ks + L::Row(4 * x_tile);
      const float* xq = Qs + L::Row(4 * x_tile);
      float kz[4][4] = {}, qz[4][4] = {};
#pragma unroll 2
      for (int d = 0; d < kDk; d += 4) {
        float4 xk4[4], xq4[4], z4[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          xk4[r] = Load4(xk + r * kRS + d);
          xq4[r] = Load4(xq + r * kRS + d);
          z4[r] = Load4(z_rows + r * kRS + d);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            kz[r][c] = Dot4(xk4[r], z4[c], kz[r][c]);
            qz[r][c] = Dot4(xq4[r], z4[c], qz[r][c]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = 4 * x_tile + r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (gram_job) {
            const int s = 4 * z_tile + c;
            const float decay = expf(G[t] - G[s]);
            A[t * kGramStride + s] = Beta[t] * decay * kz[r][c];
            QK[t * kGramStride + s] = decay * qz[r][c];
          } else {
            const int j = 4 * z_tile + c;
            R[t * kColStride + j] = Beta[t] * (R[t * kColStride + j] - EG[t] * kz[r][c]);
            O[t * kColStride + j] = EG[t] * qz[r][c];
          }
        }
      }
    }
    {
      const int t = 4 * diag_tile + diag_i, s = 4 * diag_tile + diag_c;
      const float* x = (diag_qk ? Qs : Ks) + L::Row(t);
      const float* z = Ks + L::Row(s);
      float dot = 0.0f;
#pragma unroll 4
      for (int d = 0; d < kDk; d += 4) dot = Dot4(Load4(x + d), Load4(z + d), dot);
      const float decay = expf(G[t] - G[s]);
      if (diag_qk) {
        QK[t * kGramStride + s] = decay * dot;
      } else {
        A[t * kGramStride + s] = Beta[t] * decay * dot;
      }
    }
    __syncthreads();

    // (I + A_bb)^-1 of the four diagonal blocks, a column per thread: x = e_c - A_bb x, by rows.
    if (tid < 4 * kSub) {
      const int blk = tid / kSub, c = tid % kSub;
      const float* a = A + kSub * blk * (kGramStride + 1);
      float x[kSub];
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        float acc = i == c ? 1.0f : 0.0f;
#pragma unroll
        for (int s = 0; s < i; ++s) acc -= a[i * kGramStride + s] * x[s];
        x[i] = acc;
      }
#pragma unroll
      for (int i = 0; i < kSub; ++i) Inv[(blk * kSub + i) * kInvStride + c] = x[i];
    }
    __syncthreads();

    // delta by blocks of 16 rows, two columns per thread.
    {
      const int row = tid / (kCols / 2), j = 2 * (tid % (kCols / 2));
#pragma unroll 1
      for (int blk = 0; blk < kChunk / kSub; ++blk) {
        const int t = kSub * blk + row;
        if (blk > 0) {
          float2 x = *reinterpret_cast<const float2*>(R + t * kColStride + j);
          for (int s = 0; s < kSub * blk; ++s) {
            const float a = A[t * kGramStride + s];
            const float2 ds = *reinterpret_cast<const float2*>(D + s * kColStride + j);
            x.x -= a * ds.x;
            x.y -= a * ds.y;
          }
          *reinterpret_cast<float2*>(R + t * kColStride + j) = x;
          __syncthreads();
        }
        const float* inv = Inv + (blk * kSub + row) * kInvStride;
        float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int s = 0; s < kSub; ++s) {
          const float w = inv[s];
          const float2 x = *reinterpret_cast<const float2*>(R + (kSub * blk + s) * kColStride + j);
          acc.x += w * x.x;
          acc.y += w * x.y;
        }
        *reinterpret_cast<float2*>(D + t * kColStride + j) = acc;
        __syncthreads();
      }
    }

    // Outputs: o_t += sum_{s<=t} QK_ts delta_s; rows 4 * tile.., two columns per thread.
    {
      const int tile = tid / (kCols / 2), j = 2 * (tid % (kCols / 2));
      float2 acc[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[r] = *reinterpret_cast<const float2*>(O + (4 * tile + r) * kColStride + j);
      }
      const float* qk = QK + 4 * tile * kGramStride;
#pragma unroll 4
      for (int s = 0; s < 4 * tile; ++s) {
        const float2 ds = *reinterpret_cast<const float2*>(D + s * kColStride + j);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float w = qk[r * kGramStride + s];
          acc[r].x += w * ds.x;
          acc[r].y += w * ds.y;
        }
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int s = 4 * tile + c;
        const float2 ds = *reinterpret_cast<const float2*>(D + s * kColStride + j);
#pragma unroll
        for (int r = c; r < 4; ++r) {
          const float w = qk[r * kGramStride + s];
          acc[r].x += w * ds.x;
          acc[r].y += w * ds.y;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = 4 * tile + r;
        if (t >= len) break;
        float* o = out + ((int64_t{start} + t) * nv + h) * dv + col0 + j;
        if (col0 + j < dv) o[0] = acc[r].x;
        if (col0 + j + 1 < dv) o[1] = acc[r].y;
      }
    }

    // S_end = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s delta_s^T, a 4 x 4 tile (rows d,
    // columns j) per job; written to the snapshot slot and, after the last chunk, home.
    {
      const int snap = b.snapshot_slot[start + len - 1];
      const bool last_chunk = start + len == end;
      float* snap_dst = snap >= 0 ? st.state + snap * st.slot_floats + head_offset : nullptr;
      const float e_last = EG[kChunk - 1];
      for (int job = tid; job < (kDk / 4) * (kCols / 4); job += kThreads) {
        const int j0 = 4 * (job % (kCols / 4)), d0 = 4 * (job / (kCols / 4));
        float4 acc[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float4 s0 = Load4(St + L::Row(j0 + c) + d0);
          acc[c] = make_float4(e_last * s0.x, e_last * s0.y, e_last * s0.z, e_last * s0.w);
        }
#pragma unroll 4
        for (int s = 0; s < kChunk; ++s) {
          const float e = ED[s];
          const float4 ks = Load4(Ks + L::Row(s) + d0);
          const float4 kd = make_float4(e * ks.x, e * ks.y, e * ks.z, e * ks.w);
          const float4 ds = Load4(D + s * kColStride + j0);
          const float dc[4] = {ds.x, ds.y, ds.z, ds.w};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[c].x += kd.x * dc[c];
            acc[c].y += kd.y * dc[c];
            acc[c].z += kd.z * dc[c];
            acc[c].w += kd.w * dc[c];
          }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          *reinterpret_cast<float4*>(St + L::Row(j0 + c) + d0) = acc[c];
          const int col = col0 + j0 + c;
          if (col >= dv || (snap_dst == nullptr && !last_chunk)) continue;
          const float vals[4] = {acc[c].x, acc[c].y, acc[c].z, acc[c].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int d = d0 + i;
            if (d >= dk) break;
            if (snap_dst != nullptr) snap_dst[int64_t{d} * dv + col] = vals[i];
            if (last_chunk) home[int64_t{d} * dv + col] = vals[i];
          }
        }
      }
    }
    __syncthreads();  // the next chunk overwrites k, q (delta), r and the gates
    start += len;
  }
}

template <int kDk>
void LaunchChunked(const float* q, const float* k, const float* v, int64_t v_stride, const float* g,
                   const float* beta, int32_t nk, int32_t dk, int32_t nv, int32_t dv,
                   const DeltaBatchView& b, const DeltaStateView& s, float* out,
                   cudaStream_t stream) {
  constexpr size_t kSmemBytes = ChunkLayout<kDk>::kBytes;
  // The layout needs more than 48 KiB, so the kernel opts in, once per instance (a host call,
  // not a stream operation: fine under graph capture). A device whose limit is below it (not
  // Hopper, whose limit is 227 KiB) takes the recurrent kernel instead.
  static const bool fits = [] {
    int device = 0, limit = 0;
    KCUDA_CHECK(cudaGetDevice(&device));
    KCUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (kSmemBytes > static_cast<size_t>(limit)) return false;
    KCUDA_CHECK(cudaFuncSetAttribute(DeltaRuleChunkedKernel<kDk>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmemBytes)));
    return true;
  }();
  if (!fits) {
    GatedDeltaRule(q, k, v, v_stride, g, beta, nk, dk, nv, dv, b, s, out, stream);
    return;
  }
  const dim3 grid(static_cast<unsigned>((dv + kCols - 1) / kCols), static_cast<unsigned>(nv),
                  static_cast<unsigned>(b.n_seqs));
  DeltaRuleChunkedKernel<kDk><<<grid, kThreads, kSmemBytes, stream>>>(q, k, v, v_stride, g, beta,
                                                                      nk, dk, nv, dv, b, s, out);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace

void GatedDeltaRuleChunked(const float* q, const float* k, const float* v, int64_t v_stride,
                           const float* g, const float* beta, int32_t nk, int32_t dk, int32_t nv,
                           int32_t dv, const DeltaBatchView& b, const DeltaStateView& s, float* out,
                           cudaStream_t stream) {
  KCHECK(dk > 0 && dk <= 256 && dv > 0 && dv <= 256 && nk > 0 && nv % nk == 0);
  KCHECK(nv <= 65535 && b.n_seqs <= 65535);
  if (b.n_seqs == 0) return;
  // The key dim padded with zeros to the next instance.
  auto* launch = dk <= 16    ? &LaunchChunked<16>
                 : dk <= 32  ? &LaunchChunked<32>
                 : dk <= 64  ? &LaunchChunked<64>
                 : dk <= 128 ? &LaunchChunked<128>
                             : &LaunchChunked<256>;
  launch(q, k, v, v_stride, g, beta, nk, dk, nv, dv, b, s, out, stream);
}

}  // namespace kestrel::cuda
