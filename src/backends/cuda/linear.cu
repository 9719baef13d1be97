// The skinny linear kernel: y[m, n] = x[m, k] . w[n, k]^T for m <= 64 token rows, bound by
// reading W (n*k*2 bytes) once from device memory.
//
// Design ("swap AB" on the tensor cores):
//   - mma.sync m16n8k16 with W as the A operand (16 rows of n) and x^T as the B operand (8 token
//     rows per column tile): a CUDA-core FMA loop cannot keep up with the bandwidth past ~8 rows,
//     the tensor cores are idle at m = 1 but cost nothing there either (bandwidth bound).
//   - A block owns 16 rows of W over all of k; its 8 warps split k (warp w takes the 128-wide
//     k steps w, w+8, ...), then the 8 partial sums are added through shared memory in a fixed
//     order. No atomics: results are bitwise deterministic. Keeping the split inside the block
//     (no second pass) needs no workspace, so the kernel can run with only the caller's buffers.
//   - W is read with 16-byte loads, 8 per thread in flight per step (4 k-chunks x 2 rows), that
//     bypass L1 (each W byte is used once). Each load is 8 consecutive k of one row; the dot
//     product does not care in which order k is visited as long as A and B use the same order, so
//     each thread's 8 values are fed to two mma's as if they were the k positions that the
//     fragment layout gives that thread (see the permutation below). x is loaded with the same
//     16-byte pattern through L1 (every block reads all of x; co-resident blocks share it).
//
// k permutation. In m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane/4 and
// t = lane%4, a thread holds A(row g and g+8; cols 2t, 2t+1, 2t+8, 2t+9) and B(rows 2t, 2t+1,
// 2t+8, 2t+9; col g). Thread t loads physical k [8t, 8t+8) of a 32-wide chunk; the first mma of
// the chunk maps logical cols {2t, 2t+1, 2t+8, 2t+9} to physical {8t, 8t+1, 8t+2, 8t+3}, the
// second to {8t+4 .. 8t+7}. Over t = 0..3 each mma covers 16 distinct physical k, the two mma's
// the whole chunk, and A and B use the same map, so the sum over the chunk is unchanged.
//
// Batch invariance: the value of y[i, j] depends only on x[i, :] and w[j, :]. The k split (which
// warp, which 128-wide steps, in which order) depends only on k; the mma column for token row i
// is computed from B's column i alone (the padded columns are zero and discarded); the partial
// sums are added in warp order 0..7 whatever m is. So row i is bitwise the same for any m in
// [1, 64] (the test checks it). It does not hold across the switch to cuBLASLt at
// kSkinnyMaxRows.
//
// Accuracy: the tensor cores add each mma's 16 products into the f32 accumulator, truncating
// (not rounding) the result. The accumulator chains here are k/128 mma's long (96 at k = 12288,
// against 768 for a GEMM that walks all of k in one chain), so the error stays ~1e-6 relative.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/env_setting.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/vec_io.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kWarps = 8;                 // k split inside a block; fixed for batch invariance
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerBlock = 16;         // rows of W per block = mma M
constexpr int kChunksPerStep = 4;         // 32-wide k chunks per step: 8 loads of 16 B in flight
constexpr int kVecsPerChunk = 4;          // 16-byte vectors (8 bf16) per row per chunk
constexpr int kVecsPerStep = kChunksPerStep * kVecsPerChunk;  // 128 k per step
constexpr int kReducePad = 4;             // floats; makes the partial-sum stores conflict-free

// The kernels below are launched with PDL (pdl.cuh): they wait before their first load and let
// the next kernel be scheduled after their main loop. (Asking L2 for each block's slice of W
// before the wait, so that the first wave streams weights while the previous kernels finish,
// measured slower on the H200: batch-1 Qwen3-8B decode fell from 205 to 175-180 tok/s, the
// GEMV share of a step growing by 0.8 ms; docs/cuda.md.)

// One block: rows [n0, n0 + 16) of y^T for all m token rows (kMTiles column tiles of 8).
template <int kMTiles>
__global__ void __launch_bounds__(kThreads)
    SkinnyLinearKernel(const __nv_bfloat16* __restrict__ x,  // [m, k]
                       int m, int k,
                       const __nv_bfloat16* __restrict__ w,  // [n, k]
                       int n,
                       float* __restrict__ y) {              // [m, n]
  // partial[warp][token row][W row]: each warp's sums over its share of k.
  __shared__ float partial[kWarps][kMTiles * 8][kRowsPerBlock + kReducePad];

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;  // fragment row group: W rows g and g+8, token row g of each tile
  const int t = lane % 4;  // fragment column pair: physical k [8t, 8t+8) of each chunk
  const int n0 = blockIdx.x * kRowsPerBlock;
  const int k_vecs = k / 8;  // 16-byte vectors per row of x and of w
  PdlWait();

  // Rows past n are clamped to a valid row for the address and never loaded (zeros instead).
  const bool lo_ok = n0 + g < n;
  const bool hi_ok = n0 + g + 8 < n;
  const uint4* w_lo =  // [k_vecs]
      reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(lo_ok ? n0 + g : 0) * k_vecs;
  const uint4* w_hi =  // [k_vecs]
      reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(hi_ok ? n0 + g + 8 : 0) * k_vecs;
  // Token row g of each column tile: x_g + mt * x_tile_stride is token row mt*8 + g.
  const uint4* x_g =  // [k_vecs]
      reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g) * k_vecs;
  const int64_t x_tile_stride = static_cast<int64_t>(8) * k_vecs;

  float acc[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[mt][r] = 0.0f;
  }

  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int n_steps = (k_vecs + kVecsPerStep - 1) / kVecsPerStep;
  for (int step = warp; step < n_steps; step += kWarps) {
    // All of this step's W loads first, so 8 are in flight before the first use.
    uint4 w_lo_v[kChunksPerStep], w_hi_v[kChunksPerStep];
#pragma unroll
    for (int c = 0; c < kChunksPerStep; ++c) {
      const int v = step * kVecsPerStep + c * kVecsPerChunk + t;  // this thread's vector
      const bool in_k = v < k_vecs;
      w_lo_v[c] = (in_k && lo_ok) ? LoadStreaming(w_lo + v) : zero;
      w_hi_v[c] = (in_k && hi_ok) ? LoadStreaming(w_hi + v) : zero;
    }
#pragma unroll
    for (int c = 0; c < kChunksPerStep; ++c) {
      const int v = step * kVecsPerStep + c * kVecsPerChunk + t;
      const bool in_k = v < k_vecs;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int row = mt * 8 + g;  // token row of B's column g
        const uint4 xv = (in_k && row < m) ? __ldg(x_g + mt * x_tile_stride + v) : zero;
        // First mma: physical k 8t..8t+3 (the .x and .y words), second: 8t+4..8t+7.
        MmaBf16(acc[mt], w_lo_v[c].x, w_hi_v[c].x, w_lo_v[c].y, w_hi_v[c].y, xv.x, xv.y);
        MmaBf16(acc[mt], w_lo_v[c].z, w_hi_v[c].z, w_lo_v[c].w, w_hi_v[c].w, xv.z, xv.w);
      }
    }
  }
  PdlLaunchDependents();

  // Accumulator r of tile mt: W row g + 8*(r/2), token row mt*8 + 2t + r%2. With the row pitch
  // of 20 floats a warp's 32 stores land in banks 8t + g: all distinct.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      partial[warp][mt * 8 + 2 * t + (r & 1)][g + 8 * (r >> 1)] = acc[mt][r];
    }
  }
  __syncthreads();

  // Sum the warps' partials in warp order (fixed, so deterministic and independent of m);
  // consecutive threads write consecutive columns of y.
  for (int i = threadIdx.x; i < kMTiles * 8 * kRowsPerBlock; i += kThreads) {
    const int token = i / kRowsPerBlock;
    const int col = n0 + i % kRowsPerBlock;
    if (token < m && col < n) {
      float sum = partial[0][token][i % kRowsPerBlock];
#pragma unroll
      for (int wi = 1; wi < kWarps; ++wi) sum += partial[wi][token][i % kRowsPerBlock];
      y[static_cast<int64_t>(token) * n + col] = sum;
    }
  }
}

template <int kMTiles>
void LaunchSkinny(const __nv_bfloat16* x, int m, int k, const __nv_bfloat16* w, int n, float* y,
                  cudaStream_t stream) {
  const unsigned n_blocks = static_cast<unsigned>((static_cast<int64_t>(n) + kRowsPerBlock - 1) /
                                                  kRowsPerBlock);
  LaunchPdl(&SkinnyLinearKernel<kMTiles>, dim3(n_blocks), dim3(kThreads), 0, stream, x, m, k, w, n,
            y);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void LaunchTc16(const __nv_bfloat16* x, int mi, int ki, const __nv_bfloat16* w, int ni, float* y,
                cudaStream_t stream) {
  switch ((mi + 7) / 8) {
    case 1: LaunchSkinny<1>(x, mi, ki, w, ni, y, stream); break;
    case 2: LaunchSkinny<2>(x, mi, ki, w, ni, y, stream); break;
    case 3: LaunchSkinny<3>(x, mi, ki, w, ni, y, stream); break;
    case 4: LaunchSkinny<4>(x, mi, ki, w, ni, y, stream); break;
    case 5: LaunchSkinny<5>(x, mi, ki, w, ni, y, stream); break;
    case 6: LaunchSkinny<6>(x, mi, ki, w, ni, y, stream); break;
    case 7: LaunchSkinny<7>(x, mi, ki, w, ni, y, stream); break;
    case 8: LaunchSkinny<8>(x, mi, ki, w, ni, y, stream); break;
    default: KCHECK(false);
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA-core GEMV variants ("fma_r{R}_ks{KS}_u{U}"), m <= 8.
//
// A block has 8 warps in 8/KS groups of KS warps; a group owns R consecutive rows of W, and its
// KS warps split k: k is cut into 32-vector chunks (32 lanes x 16 bytes = 256 bf16 per row), and
// warp s of the group takes chunks s, s+KS, s+2KS, ... Per loop trip a lane issues U*R 16-byte
// loads of W (U chunks x R rows) that bypass L1, then reads the M matching 16-byte vectors of x
// through L1 (__ldg: x is small and every warp of the SM reads it) and does the FMAs in f32.
// Lanes hold partial sums; they are combined by a butterfly over the lanes (offsets 16, 8, 4, 2,
// 1), done as a "halving" exchange so a lane trades half of its R*M values per step instead of
// all of them, then the KS warps' sums are added through shared memory in slice order 0..KS-1.
//
// Arithmetic per (row, token) accumulator, for a 16-byte vector: p = w0*x0, p = fma(w1, x1, p),
// ..., p = fma(w7, x7, p); acc += p (so the U vectors of a trip are independent chains).
// Deterministic: no atomics, every order above is fixed.
// Batch invariant: y[i, j] depends on x[i, :], w[j, :] and k only; the code path of one
// accumulator is the same for every M (M only sets how many accumulators exist), the butterfly
// gives bitwise the same value whatever the number of values exchanged (each level adds the same
// two partners; f32 addition is commutative), and the slice order is fixed. So row i of an m-row
// call equals the 1-row call, for m in [1, 8].
constexpr int kFmaWarps = 8;
constexpr int kFmaThreads = kFmaWarps * 32;
constexpr int kFmaMaxRows = 8;


// Sum over 8 products of one 16-byte vector of w and the 8 floats of x.
__device__ __forceinline__ float Dot8(const uint4& wv, const float (&xf)[8]) {
  float p = __fmul_rn(Bf16Lo(wv.x), xf[0]);
  p = __fmaf_rn(Bf16Hi(wv.x), xf[1], p);
  p = __fmaf_rn(Bf16Lo(wv.y), xf[2], p);
  p = __fmaf_rn(Bf16Hi(wv.y), xf[3], p);
  p = __fmaf_rn(Bf16Lo(wv.z), xf[4], p);
  p = __fmaf_rn(Bf16Hi(wv.z), xf[5], p);
  p = __fmaf_rn(Bf16Lo(wv.w), xf[6], p);
  p = __fmaf_rn(Bf16Hi(wv.w), xf[7], p);
  return p;
}

constexpr int NextPow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Butterfly sum over the 32 lanes of P values (P a power of two <= 32), halving the values held
// per lane at each level. On return v[0] of lane l is the full sum of value Index(l), the same
// bits as the levels that halved (offset 16 is the top bit of the index); lanes that differ only
// in the remaining low bits hold the same value.
template <int P, int kSize = P, int kOffset = 16>
__device__ __forceinline__ void HalvingButterfly(float (&v)[P], int lane) {
  static_assert(P >= 1 && P <= 32 && (P & (P - 1)) == 0);
  if constexpr (kOffset >= 1) {
    if constexpr (kSize > 1) {
      constexpr int kHalf = kSize / 2;
      const bool upper = (lane & kOffset) != 0;
#pragma unroll
      for (int j = 0; j < kHalf; ++j) {
        const float send = upper ? v[j] : v[j + kHalf];
        const float keep = upper ? v[j + kHalf] : v[j];
        v[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, kOffset);
      }
      HalvingButterfly<P, kHalf, kOffset / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], kOffset);
      HalvingButterfly<P, 1, kOffset / 2>(v, lane);
    }
  }
}

template <int P>
__device__ __forceinline__ int ButterflyIndex(int lane) {
  int idx = 0, size = P;
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) {
    if (size > 1) {
      size /= 2;
      if (lane & offset) idx += size;
    }
  }
  return idx;
}

// Lanes that write: the low bits left after the halving levels are zero.
template <int P>
__device__ __forceinline__ bool ButterflyWriter(int lane) {
  return (lane & (32 / P - 1)) == 0;
}

template <int R, int KS, int U, int M>
__global__ void __launch_bounds__(kFmaThreads)
    FmaGemvKernel(const __nv_bfloat16* __restrict__ x,  // [M, k]
                  int k,
                  const __nv_bfloat16* __restrict__ w,  // [n, k]
                  int n,
                  float* __restrict__ y) {              // [M, n]
  static_assert(kFmaWarps % KS == 0);
  constexpr int kGroups = kFmaWarps / KS;
  constexpr int kRowsPerBlock = kGroups * R;
  constexpr int kValues = R * M;
  constexpr int kP = NextPow2(kValues);
  static_assert(kP <= 32);

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int group = warp / KS;
  const int slice = warp % KS;
  const int row0 = blockIdx.x * kRowsPerBlock + group * R;
  const int k_vecs = k / 8;
  PdlWait();

  // One 64-bit base (row0, or row 0 for a group wholly past n) and small offsets per row; rows
  // past n are never loaded.
  const uint4* w_base =
      reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(row0 < n ? row0 : 0) * k_vecs;
  bool row_ok[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row_ok[r] = row0 + r < n;
  const uint4* xv = reinterpret_cast<const uint4*>(x);

  float acc[kP];
#pragma unroll
  for (int j = 0; j < kP; ++j) acc[j] = 0.0f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int n_chunks = (k_vecs + 31) / 32;
#pragma unroll 1
  for (int c0 = slice; c0 < n_chunks; c0 += KS * U) {
    uint4 wr[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (c0 + u * KS) * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wr[u][r] = (v < k_vecs && row_ok[r]) ? LoadStreaming(w_base + (r * k_vecs + v)) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (c0 + u * KS) * 32 + lane;
      const bool in_k = v < k_vecs;
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const uint4 xi = in_k ? __ldg(xv + static_cast<int64_t>(i) * k_vecs + v) : zero;
        const float xf[8] = {Bf16Lo(xi.x), Bf16Hi(xi.x), Bf16Lo(xi.y), Bf16Hi(xi.y),
                             Bf16Lo(xi.z), Bf16Hi(xi.z), Bf16Lo(xi.w), Bf16Hi(xi.w)};
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r * M + i] += Dot8(wr[u][r], xf);
      }
    }
  }
  PdlLaunchDependents();

  HalvingButterfly<kP>(acc, lane);
  const int idx = ButterflyIndex<kP>(lane);
  const bool writer = ButterflyWriter<kP>(lane) && idx < kValues;
  const int r = idx / M, i = idx % M;
  if constexpr (KS == 1) {
    if (writer && row0 + r < n) y[static_cast<int64_t>(i) * n + row0 + r] = acc[0];
  } else {
    __shared__ float partial[KS][kGroups][kValues];
    if (writer) partial[slice][group][idx] = acc[0];
    __syncthreads();
    for (int t = threadIdx.x; t < kGroups * kValues; t += kFmaThreads) {
      const int g = t / kValues, j = t % kValues;
      const int row = blockIdx.x * kRowsPerBlock + g * R + j / M;
      if (row < n) {
        float sum = partial[0][g][j];
#pragma unroll
        for (int s = 1; s < KS; ++s) sum += partial[s][g][j];
        y[static_cast<int64_t>(j % M) * n + row] = sum;
      }
    }
  }
}

template <int R, int KS, int U, int M>
void LaunchFmaM(const __nv_bfloat16* x, int k, const __nv_bfloat16* w, int n, float* y,
                cudaStream_t stream) {
  constexpr int kRowsPerBlock = (kFmaWarps / KS) * R;
  const unsigned n_blocks =
      static_cast<unsigned>((static_cast<int64_t>(n) + kRowsPerBlock - 1) / kRowsPerBlock);
  LaunchPdl(&FmaGemvKernel<R, KS, U, M>, dim3(n_blocks), dim3(kFmaThreads), 0, stream, x, k, w, n,
            y);
}

template <int R, int KS, int U>
void LaunchFma(const __nv_bfloat16* x, int mi, int ki, const __nv_bfloat16* w, int ni, float* y,
               cudaStream_t stream) {
  switch (mi) {
    case 1: LaunchFmaM<R, KS, U, 1>(x, ki, w, ni, y, stream); break;
    case 2: LaunchFmaM<R, KS, U, 2>(x, ki, w, ni, y, stream); break;
    case 3: LaunchFmaM<R, KS, U, 3>(x, ki, w, ni, y, stream); break;
    case 4: LaunchFmaM<R, KS, U, 4>(x, ki, w, ni, y, stream); break;
    case 5: LaunchFmaM<R, KS, U, 5>(x, ki, w, ni, y, stream); break;
    case 6: LaunchFmaM<R, KS, U, 6>(x, ki, w, ni, y, stream); break;
    case 7: LaunchFmaM<R, KS, U, 7>(x, ki, w, ni, y, stream); break;
    case 8: LaunchFmaM<R, KS, U, 8>(x, ki, w, ni, y, stream); break;
    default: KCHECK(false);
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming GEMV ("stream", and "auto" above 35 MB), one token row: y[j] = x . w[j].
//
// The kernels above read W with per-thread vector loads from many short blocks (at one token the
// 27B's gate|up is 17,408 blocks of 2 rows), so each block's start, first round trip and exit
// recur thousands of times per product, and the grid's last wave drains unevenly. Here the grid
// is one block per SM and block b owns the rows [n b / B, n (b + 1) / B): since W is row-major
// that range is one contiguous stretch of memory, streamed through a ring of shared-memory stages
// by bulk copies (the TMA engine, no per-thread loads), R whole rows per stage (1 to 8, about
// kStreamStageTarget bytes).
//
// Warp 0 produces: its lane 0 issues the first ring-full before the PDL wait (W is immutable, so
// it lands while the previous kernel finishes); then, for each stage in turn, it waits until
// every consumer thread has read the stage and left its partial sums (the `done` barrier), adds
// the partial sums of each row in warp order, writes y, and refills the slot with the stage a
// ring ahead (every producer lane arrives on the slot's `full` barrier with that copy, so its
// reads of the slot's partial sums come before the consumers' next writes). The 16 consumer
// warps wait for a stage (the `full` barrier), take their share of it and go on to the next
// without waiting for each other, so consumption, reduction and copies overlap across stages.
// Consumer thread t takes the 16-byte vectors t, t + 512, ... of every row of a stage (its x
// vectors held in registers), each vector's eight products chained as in Dot8, the vectors added
// in order; a warp's R partial sums then go through HalvingButterfly.
// Deterministic (fixed split and order); one token row only. k up to kStreamMaxK (x in
// registers); a larger k runs fma_r1_ks4_u4.
//
// Stages of about 32 KB in a 128 KB ring. H200, bench_cuda_linear --m 1: within 1-6 % of a 192 KB
// ring (32 or 48 KB stages) on every product of Qwen3-8B, the 27B and the 35B-A3B; the 48 KB form
// ran the 27B's and the MoE's decode steps 1.5-3 % slower, the 8B's 1 % faster (docs/cuda.md).
constexpr int kStreamConsumers = 16;  // consumer warps
constexpr int kStreamLanes = kStreamConsumers * 32;  // consumer threads
constexpr int kStreamThreads = kStreamLanes + 32;
constexpr int kStreamMaxRows = 8;     // rows per stage
constexpr int kStreamMaxSlots = 8;    // stages in the ring
constexpr int kStreamMaxXVecs = 8;    // x vectors per consumer thread
constexpr int64_t kStreamStageTarget = 32 << 10;
constexpr int64_t kStreamRingBytes = 128 << 10;
constexpr int64_t kStreamMaxK = int64_t{kStreamMaxXVecs} * kStreamLanes * 8;  // 32,768
// The ring at kStreamMaxK: two stages of one row (a row over kStreamStageTarget is a stage alone).
constexpr int kStreamMaxSmem = static_cast<int>(std::max(kStreamRingBytes, 2 * kStreamMaxK * 2));

// Dot8 of a 16-byte vector of w and one of x.
__device__ __forceinline__ float Dot8Bf16(const uint4& wv, const uint4& xv) {
  const float xf[8] = {Bf16Lo(xv.x), Bf16Hi(xv.x), Bf16Lo(xv.y), Bf16Hi(xv.y),
                       Bf16Lo(xv.z), Bf16Hi(xv.z), Bf16Lo(xv.w), Bf16Hi(xv.w)};
  return Dot8(wv, xf);
}

template <int kXV>
__global__ void __launch_bounds__(kStreamThreads, 1)
    StreamGemvKernel(const __nv_bfloat16* __restrict__ x,  // [k]
                     int k,
                     const __nv_bfloat16* __restrict__ w,  // [n, k]
                     int n,
                     float* __restrict__ y,  // [n]
                     int rows_per_stage, int slots) {
  extern __shared__ __align__(128) unsigned char ring[];  // [slots][rows_per_stage * k] bf16
  __shared__ uint64_t full[kStreamMaxSlots], done[kStreamMaxSlots];
  __shared__ float partial[kStreamMaxSlots][kStreamConsumers][kStreamMaxRows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kv = k / 8;
  const int64_t row_begin = static_cast<int64_t>(n) * blockIdx.x / gridDim.x;
  const int rows = static_cast<int>(static_cast<int64_t>(n) * (blockIdx.x + 1) / gridDim.x -
                                    row_begin);
  const int n_stages = (rows + rows_per_stage - 1) / rows_per_stage;
  const int64_t row_bytes = static_cast<int64_t>(k) * 2;
  const int64_t stage_bytes = row_bytes * rows_per_stage;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      MbarrierInit(&full[s], 32);
      MbarrierInit(&done[s], kStreamLanes);
    }
    MbarrierInitFence();
  }
  __syncthreads();

  if (warp == 0) {  // producer and reducer
    const unsigned char* src = reinterpret_cast<const unsigned char*>(w) + row_begin * row_bytes;
    auto issue = [&](int i) {  // by every lane: lane 0 copies, the others arrive
      if (lane != 0) {
        MbarrierArrive(&full[i % slots]);
        return;
      }
      const int r0 = i * rows_per_stage;
      const int nr = min(rows_per_stage, rows - r0);
      BulkCopyToShared(ring + (i % slots) * stage_bytes, src + r0 * row_bytes,
                       static_cast<uint32_t>(nr * row_bytes), &full[i % slots]);
    };
    for (int i = 0; i < min(slots, n_stages); ++i) issue(i);
    PdlWait();
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      const int nr = min(rows_per_stage, rows - i * rows_per_stage);
      MbarrierWait(&done[slot], static_cast<uint32_t>(i / slots) & 1u);
      if (lane < nr) {
        float sum = partial[slot][0][lane];
#pragma unroll
        for (int c = 1; c < kStreamConsumers; ++c) sum += partial[slot][c][lane];
        y[row_begin + i * rows_per_stage + lane] = sum;
      }
      if (i + slots < n_stages) issue(i + slots);
    }
  } else {  // consumers
    PdlWait();
    const int c = warp - 1;
    const int t = c * 32 + lane;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4 xr[kXV];
#pragma unroll
    for (int j = 0; j < kXV; ++j) {
      const int v = t + j * kStreamLanes;
      xr[j] = v < kv ? __ldg(xv + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll 1
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      const int nr = min(rows_per_stage, rows - i * rows_per_stage);
      MbarrierWait(&full[slot], static_cast<uint32_t>(i / slots) & 1u);
      const uint4* st = reinterpret_cast<const uint4*>(ring + slot * stage_bytes);
      float acc[kStreamMaxRows];
#pragma unroll
      for (int r = 0; r < kStreamMaxRows; ++r) {
        acc[r] = 0.0f;
        if (r < nr) {
#pragma unroll
          for (int j = 0; j < kXV; ++j) {
            const int v = t + j * kStreamLanes;
            if (v < kv) acc[r] += Dot8Bf16(st[r * kv + v], xr[j]);
          }
        }
      }
      HalvingButterfly<kStreamMaxRows>(acc, lane);
      if (ButterflyWriter<kStreamMaxRows>(lane)) {
        partial[slot][c][ButterflyIndex<kStreamMaxRows>(lane)] = acc[0];
      }
      MbarrierArrive(&done[slot]);  // this thread has read the stage and written its sums
    }
  }
  PdlLaunchDependents();
}

template <int kXV>
void LaunchStreamX(const __nv_bfloat16* x, int k, const __nv_bfloat16* w, int n, float* y,
                   int grid, int rows_per_stage, int slots, size_t smem, cudaStream_t stream) {
  auto* kernel = &StreamGemvKernel<kXV>;
  static const bool sized = [kernel] {  // once per instantiation, before its first launch
    KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kStreamMaxSmem));
    return true;
  }();
  (void)sized;
  LaunchPdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(kStreamThreads), smem, stream, x, k,
            w, n, y, rows_per_stage, slots);
}

void LaunchStream(const __nv_bfloat16* x, int m, int k, const __nv_bfloat16* w, int n, float* y,
                  cudaStream_t stream) {
  KCHECK(m == 1);
  if (k > kStreamMaxK) {
    LaunchFma<1, 4, 4>(x, m, k, w, n, y, stream);
    return;
  }
  const int64_t row_bytes = int64_t{k} * 2;
  const int rows_per_stage =
      static_cast<int>(std::clamp<int64_t>(kStreamStageTarget / row_bytes, 1, kStreamMaxRows));
  const int64_t stage_bytes = rows_per_stage * row_bytes;
  const int slots =
      static_cast<int>(std::clamp<int64_t>(kStreamRingBytes / stage_bytes, 2, kStreamMaxSlots));
  const size_t smem = static_cast<size_t>(slots * stage_bytes);
  KCHECK(smem <= static_cast<size_t>(kStreamMaxSmem));
  const int grid =
      static_cast<int>(std::min<int64_t>(n, static_cast<int64_t>(CurrentDeviceSmCount())));
  const int xvecs = (k / 8 + kStreamLanes - 1) / kStreamLanes;
  auto go = [&](auto launch) { launch(x, k, w, n, y, grid, rows_per_stage, slots, smem, stream); };
  if (xvecs <= 1) go(&LaunchStreamX<1>);
  else if (xvecs <= 2) go(&LaunchStreamX<2>);
  else if (xvecs <= 4) go(&LaunchStreamX<4>);
  else go(&LaunchStreamX<8>);
}

// The one-row default ("auto"): the streaming kernel for matrices of at least kStreamMinBytes,
// fma_r1_ks4_u4 below, where a block per SM has too few stages to fill its ring. H200, one call
// at a time with the weights rotated past L2 (bench_cuda_linear --m 1; copy bandwidth 4,200
// GB/s), us, fma_r1_ks4_u4 against "stream": 1.1 MB 5.8 / 6.1, 16.8 MB 9.3 / 10.4, 33.6 MB
// 13.7 / 14.1, 37.7 MB 18.1 / 15.3, 50.3 MB 18.0 / 17.7, 62.9 MB 22.9 / 21.2, 169 MB 50.9 /
// 44.0, 357 MB 99.7 / 84.8, 1.02 GB 342 / 232, 2.54 GB 668 / 557 (docs/cuda.md). The choice
// depends on the shape only, so a product always takes the same kernel.
constexpr int64_t kStreamMinBytes = 35 << 20;

void LaunchAuto(const __nv_bfloat16* x, int m, int k, const __nv_bfloat16* w, int n, float* y,
                cudaStream_t stream) {
  if (int64_t{n} * k * 2 >= kStreamMinBytes) {
    LaunchStream(x, m, k, w, n, y, stream);
  } else {
    LaunchFma<1, 4, 4>(x, m, k, w, n, y, stream);
  }
}

using LaunchFn = void (*)(const __nv_bfloat16*, int, int, const __nv_bfloat16*, int, float*,
                          cudaStream_t);

struct Variant {
  const char* name;
  int64_t max_rows;
  bool batch_invariant;
  LaunchFn launch;
};

// Index 0 is the original tensor-core kernel (the fallback for m past a variant's max rows).
constexpr Variant kVariants[] = {
    {"tc16", kSkinnyKernelMaxRows, true, &LaunchTc16},
    {"fma_r1_ks1_u8", kFmaMaxRows, true, &LaunchFma<1, 1, 8>},
    {"fma_r2_ks2_u4", kFmaMaxRows, true, &LaunchFma<2, 2, 4>},
    {"fma_r4_ks4_u2", kFmaMaxRows, true, &LaunchFma<4, 4, 2>},
    {"fma_r1_ks4_u4", kFmaMaxRows, true, &LaunchFma<1, 4, 4>},
    {"fma_r2_ks8_u4", kFmaMaxRows, true, &LaunchFma<2, 8, 4>},
    {"stream", 1, true, &LaunchStream},
    {"auto", 1, true, &LaunchAuto},
};
constexpr int kVariantCount = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

// Measured on the H200 (bench_cuda_linear, weights rotated past L2): at m = 1 "fma_r1_ks4_u4"
// (one row per group of 4 warps splitting k) is the fastest of the per-thread-load variants on
// every Qwen3-8B shape: 13.8 us for 4096x4096 (cuBLASLt 15.7), 29.4 us for 4096x12288 (31.9),
// 296 us for the LM head (299); "auto" keeps it for small matrices and streams the others
// (LaunchAuto). At m = 8 every CUDA-core variant loses to cuBLASLt.
constexpr int kInitialDefaultVariant = 7;
static_assert(kVariants[kInitialDefaultVariant].launch == &LaunchAuto);

int FindVariant(const char* name) {
  for (int v = 0; v < kVariantCount; ++v) {
    if (std::strcmp(kVariants[v].name, name) == 0) return v;
  }
  return -1;
}

// The process-wide default: KESTREL_SKINNY_VARIANT (a name or an index) if set and valid, else
// the built-in.
EnvSetting g_default_variant{"KESTREL_SKINNY_VARIANT", [](const char* env) {
  if (env == nullptr || *env == '\0') return kInitialDefaultVariant;
  const int by_name = FindVariant(env);
  if (by_name >= 0) return by_name;
  char* end = nullptr;
  const long idx = std::strtol(env, &end, 10);
  if (end != env && *end == '\0' && idx >= 0 && idx < kVariantCount) return static_cast<int>(idx);
  return kInitialDefaultVariant;
}};

void CheckArgs(int64_t m, int64_t k, const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t n,
               float* y) {
  KCHECK(m >= 1);
  KCHECK_MSG(k > 0 && k % 8 == 0 && k <= INT_MAX, "k must be a positive multiple of 8");
  KCHECK(n > 0 && n <= INT_MAX - 64);
  KCHECK(x != nullptr && w != nullptr && y != nullptr);
  KCHECK_MSG(Aligned16(x) && Aligned16(w), "x and w must be 16-byte aligned");
}

}  // namespace

int SkinnyVariantCount() { return kVariantCount; }

const char* SkinnyVariantName(int v) {
  KCHECK(v >= 0 && v < kVariantCount);
  return kVariants[v].name;
}

int64_t SkinnyVariantMaxRows(int v) {
  KCHECK(v >= 0 && v < kVariantCount);
  return kVariants[v].max_rows;
}

bool SkinnyVariantBatchInvariant(int v) {
  KCHECK(v >= 0 && v < kVariantCount);
  return kVariants[v].batch_invariant;
}

int FindSkinnyVariant(const char* name) { return name == nullptr ? -1 : FindVariant(name); }

void SkinnyLinearVariant(int v, const __nv_bfloat16* x, int64_t m, int64_t k,
                         const __nv_bfloat16* w, int64_t n, float* y, cudaStream_t stream) {
  KCHECK(v >= 0 && v < kVariantCount);
  CheckArgs(m, k, x, w, n, y);
  KCHECK(m <= kVariants[v].max_rows);
  kVariants[v].launch(x, static_cast<int>(m), static_cast<int>(k), w, static_cast<int>(n), y,
                      stream);
  KCUDA_CHECK_LAUNCH();
}

void SetDefaultSkinnyVariant(int v) {
  KCHECK(v >= 0 && v < kVariantCount);
  g_default_variant.Set(v);
}

int DefaultSkinnyVariant() {
  return g_default_variant.Get();
}

void SkinnyLinear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n,
                  float* y, cudaStream_t stream) {
  KCHECK(m >= 1 && m <= kSkinnyKernelMaxRows);
  const int v = DefaultSkinnyVariant();
  SkinnyLinearVariant(m <= kVariants[v].max_rows ? v : 0, x, m, k, w, n, y, stream);
}

}  // namespace kestrel::cuda
