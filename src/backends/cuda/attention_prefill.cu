// Prefill / mixed path of PagedAttention (max_query_len > 1): FlashAttention-2 on tensor cores
// (mma.sync m16n8k16 bf16 -> f32, ldmatrix from shared memory), online softmax in f32.
//
// Grid (head, query tile). A block of W warps owns M = 16 * T * W query rows of one sequence and
// one head; each warp owns T m-tiles of 16 rows and keeps S (16 T x 64 keys) and O (16 T x D) in
// registers. Tile shapes (W x T): 4 x 1 (64 rows), 4 x 2 (128 rows: each K/V fragment read from
// shared memory feeds two m-tiles, as FlashAttention-2 does) and 8 x 1 (128 rows). K/V tiles of
// 64 positions are gathered through the block table with cp.async (double buffered) and serve
// all M rows. Every shape computes a row with the same operations in the same order (the same
// mma k order, the same online softmax over the same key tiles; a key tile that masks all of a
// warp's rows is skipped, which leaves its state exactly as computing it would), so the shape
// changes no bit and may follow the batch (PrefillAttentionTile).
//
// Query tiles never cross a sequence: sequence s owns tiles [U(s), U(s + 1)) with
// U(s) = seq_starts[s] / M + s. U is strictly increasing and U(s + 1) - U(s) >=
// floor(len_s / M) + 1 >= ceil(len_s / M), so every token is covered; a block finds its
// sequence by binary search over U and exits when its tile starts past the sequence's end.
// Grid size n_tokens / M + n_seqs (= U(n_seqs)), known on the host.
//
// Scores stay in raw units through the masking; the softmax scale (in log2 units) is folded into
// the exponent, exp2(s * scale - m * scale), one fma per score.
//
// Masking is by absolute position per row (keys k with first(p) <= k <= p), so arbitrary
// position layouts (prefix-cached chunks, single decode tokens in a mixed batch) are right.
// Tiles entirely inside every row's window skip the mask. K/V rows past the tile's last query
// position are zero-filled, never read: they may be unwritten (NaN) cache memory, and a masked
// p = 0 times a NaN V row would still poison the P.V product.
//
// A quantized cache (kv_cache.h): the codes and the rows' scales are copied by cp.async into
// double-buffered raw tiles; after its wait each thread widens the codes it copied to bf16 (exact)
// into one K/V tile and the scales into shared rows. S = Q.codes^T is multiplied by each key's K
// scale in f32, and P by each key's V scale before P is rounded to bf16 for the P.V product (the
// row sums l use the unscaled P).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "backends/cuda/attention.h"
#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_internal.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/env_setting.h"
#include "backends/cuda/kv_cache.cuh"
#include "core/check.h"

namespace kestrel::cuda::detail {
namespace {

constexpr int kTileN = 64;  // keys per K/V tile

// W warps of T 16-row m-tiles each.
template <int kWarpsT, int kMTilesT>
struct PrefillTile {
  static constexpr int kWarps = kWarpsT;
  static constexpr int kMTiles = kMTilesT;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kMTiles * kWarps;  // query rows per block
};
using Tile4x1 = PrefillTile<4, 1>;
using Tile4x2 = PrefillTile<4, 2>;
using Tile8x1 = PrefillTile<8, 1>;

// Shared memory of one block: Q tile, K and V tiles, rows padded by 16 bytes so the 8 row
// addresses of an ldmatrix fall in distinct banks (a row of D bf16 is a multiple of 128 bytes for
// D >= 64, which would put them all in the same banks). A bf16 cache double-buffers the K/V
// tiles (cp.async straight into them); a quantized cache double-buffers its raw tiles instead
// (codes and row scales, copied by cp.async) and widens each into one bf16 K/V tile.
template <int D, int kRows, bool kQuant>
struct PrefillSmem {
  static constexpr int kStride = D + 8;  // elements per smem row
  static constexpr int kKvTileElems = kTileN * kStride;
  static constexpr int kKvStages = kQuant ? 1 : 2;
  static constexpr int kQ = 0;                              // [kRows, kStride]
  static constexpr int kK = kRows * kStride;                // [kKvStages][kTileN, kStride]
  static constexpr int kV = kK + kKvStages * kKvTileElems;  // [kKvStages][kTileN, kStride]
  static constexpr size_t kBf16Bytes =
      static_cast<size_t>(kV + kKvStages * kKvTileElems) * sizeof(__nv_bfloat16);
  // Raw stage (quantized): K codes [kTileN, D], V codes [kTileN, D], K scales [kTileN], V
  // scales [kTileN] (f32); two stages from byte kRaw (a multiple of 16).
  static constexpr size_t kRawCodes = static_cast<size_t>(kTileN) * D;
  static constexpr size_t kRawStageBytes = 2 * kRawCodes + 2 * kTileN * sizeof(float);
  static constexpr size_t kRaw = kBf16Bytes;
  static constexpr size_t kBytes = kBf16Bytes + (kQuant ? 2 * kRawStageBytes : 0);
  static_assert(kBf16Bytes % 16 == 0 && kRawStageBytes % 16 == 0);
};

// Four 8x8 b16 matrices; lane i gives the row address of matrix i / 8, row i % 8.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

// c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int D, KvCacheType KV, typename Tile>
__global__ void __launch_bounds__(Tile::kThreads)
    PrefillKernel(const PagedAttentionParams p, float scale_log2, int block_shift) {
  constexpr bool kQuantized = KV != KvCacheType::kBf16;
  constexpr int kMTiles = Tile::kMTiles;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kTileM = Tile::kRows;
  using Smem = PrefillSmem<D, kTileM, kQuantized>;
  constexpr int kStride = Smem::kStride;
  constexpr int kDimTiles = D / 8;       // n-tiles of O
  constexpr int kDimSteps = D / 16;      // k-steps of Q.K^T
  constexpr int kKeyTiles = kTileN / 8;  // n-tiles of S
  // Q fragments stay in registers for one m-tile at D <= 128 (D/4 registers); otherwise they
  // would push O + S into spills, so they are re-read from shared memory each k-step.
  constexpr bool kQInRegisters = D <= 128 && kMTiles == 1;
  // Copies: thread t moves 16-byte chunk t % kRowChunks of rows t / kRowChunks + i * kRowsPerPass.
  constexpr int kRowChunks = D / 8;
  static_assert(kThreads % kRowChunks == 0);
  constexpr int kRowsPerPass = kThreads / kRowChunks;
  // (At head_dim 16 with 256 threads a pass covers 128 rows: the K/V copies leave half idle.)
  static_assert(kTileM % kRowsPerPass == 0 &&
                (kTileN % kRowsPerPass == 0 || kRowsPerPass % kTileN == 0));
  constexpr int kKvPasses = (kTileN + kRowsPerPass - 1) / kRowsPerPass;
  constexpr bool kKvIdleThreads = kRowsPerPass > kTileN;
  constexpr int kQPasses = kTileM / kRowsPerPass;
  constexpr int kWarpRows = 16 * kMTiles;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* s_q = smem + Smem::kQ;
  __shared__ int32_t s_pos[kTileM];
  // Quantized cache: the K and V row scales of the tile's keys (0 for keys not loaded).
  __shared__ float s_kscale[kQuantized ? kTileN : 1];
  __shared__ float s_vscale[kQuantized ? kTileN : 1];

  const int head = blockIdx.x;
  const int kv_head = head / (p.n_heads / p.n_kv_heads);
  // Last tiles first: the tiles at the end of long sequences have the most keys.
  const int tile = static_cast<int>(gridDim.y - 1 - blockIdx.y);

  // Sequence of this tile: the largest s with U(s) = seq_starts[s] / kTileM + s <= tile.
  int seq_lo = 0, seq_hi = p.n_seqs - 1;
  while (seq_lo < seq_hi) {
    const int mid = (seq_lo + seq_hi + 1) / 2;
    if (p.seq_starts[mid] / kTileM + mid <= tile) {
      seq_lo = mid;
    } else {
      seq_hi = mid - 1;
    }
  }
  const int seq = seq_lo;
  const int seq_begin = p.seq_starts[seq];
  const int seq_end = p.seq_starts[seq + 1];
  const int local_tile = tile - (seq_begin / kTileM + seq);
  const int row0 = seq_begin + local_tile * kTileM;  // first token of this tile
  if (local_tile < 0 || row0 >= seq_end) return;     // an idle tile (U over-counts)
  if (p.decode_rows_apart && seq_end - seq_begin == 1) return;  // the decode path's row
  const int n_rows = min(kTileM, seq_end - row0);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int chunk = tid % kRowChunks;     // this thread's 16-byte column of every copy
  const int copy_row = tid / kRowChunks;  // its first row

  // Q tile (rows past the sequence zero-filled) and the rows' positions.
#pragma unroll
  for (int i = 0; i < kQPasses; ++i) {
    const int r = copy_row + i * kRowsPerPass;
    const bool valid = r < n_rows;
    const __nv_bfloat16* src =
        valid ? p.q + (int64_t{row0 + r} * p.n_heads + head) * D + chunk * 8 : p.q;
    CpAsync16(s_q + r * kStride + chunk * 8, src, valid);
  }
  CpAsyncCommit();
  for (int r = tid; r < kTileM; r += kThreads) s_pos[r] = r < n_rows ? p.positions[row0 + r] : 0;
  __syncthreads();  // s_pos

  // The block's position range (for the key tiles to visit), reduced by every warp.
  int q_min = INT_MAX, q_max = INT_MIN;
  for (int r = lane; r < n_rows; r += 32) {
    q_min = min(q_min, s_pos[r]);
    q_max = max(q_max, s_pos[r]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    q_min = min(q_min, __shfl_xor_sync(0xffffffffu, q_min, off));
    q_max = max(q_max, __shfl_xor_sync(0xffffffffu, q_max, off));
  }
  // This thread's rows (lane / 4 + 8 h of each m-tile); rows past the sequence take q_max so
  // they stay finite (their output is not written). Their range over the warp decides which key
  // tiles the warp computes and which need the mask.
  int row_pos[kMTiles][2];
  int warp_min = INT_MAX, warp_max = INT_MIN;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * kWarpRows + mt * 16 + lane / 4 + 8 * h;
      row_pos[mt][h] = r < n_rows ? s_pos[r] : q_max;
      warp_min = min(warp_min, row_pos[mt][h]);
      warp_max = max(warp_max, row_pos[mt][h]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, off));
    warp_max = max(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, off));
  }
  const int window = p.sliding_window;
  const int key_first = window > 0 ? max(0, q_min - window + 1) : 0;
  const int key_last = q_max;
  const int tile_first = key_first / kTileN;
  const int tile_last = key_last / kTileN;
  const int32_t* table = p.block_tables + int64_t{seq} * p.max_blocks_per_seq;

  // Row of the cache ([n_blocks, n_kv_heads, block_size] rows) holding key `key_pos`.
  auto cache_row = [&](int key_pos) -> int64_t {
    int block_index, in_block;
    if (block_shift >= 0) {
      block_index = key_pos >> block_shift;
      in_block = key_pos & (p.block_size - 1);
    } else {
      block_index = key_pos / p.block_size;
      in_block = key_pos - block_index * p.block_size;
    }
    return (int64_t{table[block_index]} * p.n_kv_heads + kv_head) * p.block_size + in_block;
  };

  // K/V tile `kt` into stage `stage` (bf16 cache): row r is position kt * 64 + r.
  auto load_kv = [&](int kt, int stage) {
    if (kKvIdleThreads && copy_row >= kTileN) return;
    __nv_bfloat16* s_k = smem + Smem::kK + stage * Smem::kKvTileElems;
    __nv_bfloat16* s_v = smem + Smem::kV + stage * Smem::kKvTileElems;
    const __nv_bfloat16* k_cache = static_cast<const __nv_bfloat16*>(p.k_cache);
    const __nv_bfloat16* v_cache = static_cast<const __nv_bfloat16*>(p.v_cache);
#pragma unroll
    for (int i = 0; i < kKvPasses; ++i) {
      const int r = copy_row + i * kRowsPerPass;
      const int key_pos = kt * kTileN + r;
      const bool valid = key_pos <= key_last;
      const int64_t offset = valid ? cache_row(key_pos) * D + chunk * 8 : 0;
      CpAsync16(s_k + r * kStride + chunk * 8, k_cache + offset, valid);
      CpAsync16(s_v + r * kStride + chunk * 8, v_cache + offset, valid);
    }
  };

  // Quantized cache: thread t copies 16-code chunk t % kRawChunks of rows t / kRawChunks + i *
  // kRawRowsPerPass of K and V into raw stage `stage` (rows past key_last zero-filled), and the
  // first 2 * kTileN / 4 threads 4 rows of K or V scales each; later the same thread widens what
  // it copied (its own copies, visible to it after its wait: no barrier between).
  constexpr int kRawChunks = D / 16;
  constexpr int kRawRowsPerPass = kThreads / kRawChunks;
  static_assert(kRawChunks >= 1 && kThreads % kRawChunks == 0);
  constexpr int kRawPasses = (kTileN + kRawRowsPerPass - 1) / kRawRowsPerPass;
  static_assert(kTileN % kRawRowsPerPass == 0 || kRawRowsPerPass % kTileN == 0);
  static_assert(2 * kTileN / 4 <= kThreads);
  const int raw_chunk = tid % kRawChunks;
  const int raw_row = tid / kRawChunks;  // past kTileN only at head_dim 16 (one pass): idle
  unsigned char* raw_base = smem_raw + Smem::kRaw;
  auto issue_raw = [&](int kt, int stage) {
    unsigned char* st = raw_base + stage * Smem::kRawStageBytes;
    const uint8_t* k_codes = static_cast<const uint8_t*>(p.k_cache);
    const uint8_t* v_codes = static_cast<const uint8_t*>(p.v_cache);
    if (raw_row < kTileN) {
#pragma unroll
      for (int i = 0; i < kRawPasses; ++i) {
        const int r = raw_row + i * kRawRowsPerPass;
        const int key_pos = kt * kTileN + r;
        const bool valid = key_pos <= key_last;
        const int64_t offset = valid ? cache_row(key_pos) * D + raw_chunk * 16 : 0;
        CpAsync16(st + r * D + raw_chunk * 16, k_codes + offset, valid);
        CpAsync16(st + Smem::kRawCodes + r * D + raw_chunk * 16, v_codes + offset, valid);
      }
    }
    if (tid < 2 * kTileN / 4) {
      const int r = (tid % (kTileN / 4)) * 4;  // rows r..r+3: one physical block
      const int key_pos = kt * kTileN + r;
      const bool valid = key_pos <= key_last;
      const float* scales = tid < kTileN / 4 ? p.k_scale : p.v_scale;
      const int64_t row = valid ? cache_row(key_pos) : 0;
      CpAsync16(st + 2 * Smem::kRawCodes + (tid / (kTileN / 4)) * kTileN * 4 + r * 4, scales + row,
                valid);
    }
  };
  // Raw stage `stage` (tile kt) widened to bf16 into the K/V tile and the scale rows; rows past
  // key_last get zero scales (their codes were zero-filled; a partly valid 4-row scale copy
  // brought whatever follows the last key).
  auto widen_raw = [&](int kt, int stage) {
    if constexpr (kQuantized) {
      const unsigned char* st = raw_base + stage * Smem::kRawStageBytes;
      __nv_bfloat16* s_k = smem + Smem::kK;
      __nv_bfloat16* s_v = smem + Smem::kV;
      if (raw_row < kTileN) {
#pragma unroll
        for (int i = 0; i < kRawPasses; ++i) {
          const int r = raw_row + i * kRawRowsPerPass;
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint4 codes =
                *reinterpret_cast<const uint4*>(st + t * Smem::kRawCodes + r * D + raw_chunk * 16);
            __nv_bfloat16* dst = (t == 0 ? s_k : s_v) + r * kStride + raw_chunk * 16;
            float f[8];
            DecodeKv8<KV>(make_uint2(codes.x, codes.y), f);
            *reinterpret_cast<uint4*>(dst) =
                make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                           PackBf16x2(f[6], f[7]));
            DecodeKv8<KV>(make_uint2(codes.z, codes.w), f);
            *reinterpret_cast<uint4*>(dst + 8) =
                make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                           PackBf16x2(f[6], f[7]));
          }
        }
      }
      if (tid < 2 * kTileN / 4) {
        const int r = (tid % (kTileN / 4)) * 4;
        const int which = tid / (kTileN / 4);  // 0: K, 1: V
        const float4 v =
            *reinterpret_cast<const float4*>(st + 2 * Smem::kRawCodes + which * kTileN * 4 + r * 4);
        const float in[4] = {v.x, v.y, v.z, v.w};
        float* dst = which == 0 ? s_kscale : s_vscale;
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[r + j] = kt * kTileN + r + j <= key_last ? in[j] : 0.0f;
      }
    }
  };

  if constexpr (kQuantized) {
    issue_raw(tile_first, 0);
  } else {
    load_kv(tile_first, 0);
  }
  CpAsyncCommit();

  float o_acc[kMTiles][kDimTiles][4];
  float m_run[kMTiles][2], l_run[kMTiles][2];  // l: this thread's partial row sums
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][n][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[mt][h] = -INFINITY;
      l_run[mt][h] = 0.0f;
    }
  }
  uint32_t q_frag[kQInRegisters ? kDimSteps : 1][4];

  // ldmatrix lane addressing shared by Q, K and V: row lane % 16, column (lane / 16) * 8 of a
  // 16 x 16 block gives matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
  const int ld_row = lane % 16;
  const int ld_col = (lane / 16) * 8;
  const __nv_bfloat16* s_q_warp = s_q + (warp * kWarpRows + ld_row) * kStride + ld_col;

  for (int kt = tile_first; kt <= tile_last; ++kt) {
    const int stage = (kt - tile_first) & 1;
    if (kt < tile_last) {
      if constexpr (kQuantized) {
        issue_raw(kt + 1, stage ^ 1);
      } else {
        load_kv(kt + 1, stage ^ 1);
      }
      CpAsyncCommit();
      CpAsyncWait<1>();  // everything but the tile just issued
    } else {
      CpAsyncWait<0>();
    }
    if constexpr (kQuantized) widen_raw(kt, stage);
    __syncthreads();
    const int kv_stage = kQuantized ? 0 : stage;
    const __nv_bfloat16* s_k = smem + Smem::kK + kv_stage * Smem::kKvTileElems;
    const __nv_bfloat16* s_v = smem + Smem::kV + kv_stage * Smem::kKvTileElems;

    if constexpr (kQInRegisters) {
      if (kt == tile_first) {
#pragma unroll
        for (int ks = 0; ks < kDimSteps; ++ks) LdMatrixX4(q_frag[ks], s_q_warp + ks * 16);
      }
    }

    // Keys of this tile that no row of this warp sees (past its last position, or before the
    // window of its first): the tile would leave the warp's state exactly as it is.
    const int key0 = kt * kTileN;
    const bool warp_skips =
        key0 > warp_max || (window > 0 && key0 + kTileN - 1 <= warp_min - window);
    if (!warp_skips) {
      // S = Q K^T: 16 T rows x 64 keys per warp. K rows are keys, so a plain ldmatrix of a
      // (16 keys x 16 dims) block gives b0/b1 of two 8-key n-tiles: r0 = b0 (keys 0-7),
      // r1 = b0 (keys 8-15), r2 = b1 (keys 0-7), r3 = b1 (keys 8-15).
      float s_acc[kMTiles][kKeyTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s_acc[mt][n][e] = 0.0f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kDimSteps; ++ks) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if constexpr (kQInRegisters) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[ks][e];
          } else {
            LdMatrixX4(a[mt], s_q_warp + mt * 16 * kStride + ks * 16);
          }
        }
#pragma unroll
        for (int np = 0; np < kKeyTiles / 2; ++np) {
          uint32_t b[4];
          LdMatrixX4(b, s_k + (np * 16 + ld_row) * kStride + ks * 16 + ld_col);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            MmaBf16(s_acc[mt][2 * np], a[mt], b[0], b[2]);
            MmaBf16(s_acc[mt][2 * np + 1], a[mt], b[1], b[3]);
          }
        }
      }

      // K scales and the mask. Element e of n-tile n: row lane / 4 + 8 * (e / 2), key
      // n * 8 + (lane % 4) * 2 + e % 2.
      const bool full_tile =
          key0 + kTileN - 1 <= warp_min && (window == 0 || key0 > warp_max - window);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float s = s_acc[mt][n][e];
            if constexpr (kQuantized) s *= s_kscale[n * 8 + (lane % 4) * 2 + e % 2];
            if (!full_tile) {
              const int key_pos = key0 + n * 8 + (lane % 4) * 2 + e % 2;
              const int qp = row_pos[mt][e / 2];
              const bool visible = key_pos <= qp && (window == 0 || key_pos > qp - window);
              s = visible ? s : -INFINITY;
            }
            s_acc[mt][n][e] = s;
          }
        }
        // Online softmax per row; a row's 64 scores sit in the 4 lanes of a quad.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          OnlineSoftmaxRow<true>(h, s_acc[mt], m_run[mt][h], l_run[mt][h], o_acc[mt], 1.0f,
                                 scale_log2);
        }
        if constexpr (kQuantized) {
          // P times each key's V scale (keys n * 8 + (lane % 4) * 2 + e % 2, as for S).
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
            const float v0 = s_vscale[n * 8 + (lane % 4) * 2];
            const float v1 = s_vscale[n * 8 + (lane % 4) * 2 + 1];
            s_acc[mt][n][0] *= v0;
            s_acc[mt][n][1] *= v1;
            s_acc[mt][n][2] *= v0;
            s_acc[mt][n][3] *= v1;
          }
        }
      }

      // P in bf16: the S accumulators of n-tiles 2kk and 2kk+1 are exactly the A fragment of
      // key step kk (packed here, so the f32 scores die before the P V products).
      uint32_t p_frag[kMTiles][kTileN / 16][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int kk = 0; kk < kTileN / 16; ++kk) {
          p_frag[mt][kk][0] = PackBf16x2(s_acc[mt][2 * kk][0], s_acc[mt][2 * kk][1]);
          p_frag[mt][kk][1] = PackBf16x2(s_acc[mt][2 * kk][2], s_acc[mt][2 * kk][3]);
          p_frag[mt][kk][2] = PackBf16x2(s_acc[mt][2 * kk + 1][0], s_acc[mt][2 * kk + 1][1]);
          p_frag[mt][kk][3] = PackBf16x2(s_acc[mt][2 * kk + 1][2], s_acc[mt][2 * kk + 1][3]);
        }
      }
      // O += P V. V rows are keys, so ldmatrix.trans of a (16 keys x 16 dims) block gives
      // r0 = b0 (dims 0-7), r1 = b1 (dims 0-7), r2 = b0 (dims 8-15), r3 = b1 (dims 8-15).
#pragma unroll
      for (int kk = 0; kk < kTileN / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, s_v + (kk * 16 + ld_row) * kStride + dp * 16 + ld_col);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            MmaBf16(o_acc[mt][2 * dp], p_frag[mt][kk], b[0], b[1]);
            MmaBf16(o_acc[mt][2 * dp + 1], p_frag[mt][kk], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage (quantized: the one K/V tile) is overwritten next
  }

  // Normalise and store. A valid row has l >= 1 (its own position is never masked).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = warp * kWarpRows + mt * 16 + lane / 4 + 8 * h;
      if (r >= n_rows) continue;
      const float inv_l = 1.0f / l;
      __nv_bfloat16* dst = p.out + (int64_t{row0 + r} * p.n_heads + head) * D + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) = __floats2bfloat162_rn(
            o_acc[mt][n][2 * h] * inv_l, o_acc[mt][n][2 * h + 1] * inv_l);
      }
    }
  }
}

EnvSetting g_prefill_tile{"KESTREL_PREFILL_ATTENTION_TILE", [](const char* env) {
  const std::string_view e(env != nullptr ? env : "");
  if (e == "4x1") return static_cast<int>(kPrefillTile4x1);
  if (e == "4x2") return static_cast<int>(kPrefillTile4x2);
  if (e == "8x1") return static_cast<int>(kPrefillTile8x1);
  return static_cast<int>(kPrefillTileAuto);
}};

template <int D, KvCacheType KV, typename Tile>
void LaunchPrefill(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmemBytes = PrefillSmem<D, Tile::kRows, KV != KvCacheType::kBf16>::kBytes;
  // Above 48 KB a kernel must opt in; a host call, once per instance (the engine uses one
  // device), fine during graph capture as it is not a stream operation.
  static std::once_flag once;
  std::call_once(once, [] {
    KCUDA_CHECK(cudaFuncSetAttribute(PrefillKernel<D, KV, Tile>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmemBytes)));
  });
  const int64_t n_tiles = int64_t{p.n_tokens} / Tile::kRows + p.n_seqs;  // U(n_seqs), see top
  KCHECK(n_tiles <= 65535);
  const int block_shift =
      (p.block_size & (p.block_size - 1)) == 0 ? std::countr_zero(static_cast<uint32_t>(p.block_size)) : -1;
  const dim3 grid(p.n_heads, static_cast<unsigned>(n_tiles));
  PrefillKernel<D, KV, Tile><<<grid, Tile::kThreads, kSmemBytes, stream>>>(p, p.scale * kLog2e,
                                                                            block_shift);
  KCUDA_CHECK_LAUNCH();
}

// The tile shape of a call: the setting, or 128-row tiles where they still make at least two
// blocks per SM (4 x 2 at head_dim <= 128, 8 x 1 at 256), 64-row tiles for smaller grids.
// Measured on the H200 (bench_cuda_kernels --only attention_prefill, one causal sequence, bf16
// cache, µs for 4 x 1 / 4 x 2 / 8 x 1): 32 heads x 128, 512 tokens 28.4 / 47.0 / 29.2, 2k 199.7
// / 193.9 / 194.1, 8k 2,773 / 2,546 / 2,595; 24 heads x 256, 512 tokens 39.1 / - / 46.5, 2k
// 387.2 / - / 265.6, 8k 5,533 / - / 3,455.
PrefillAttentionTileShape ChooseTile(const PagedAttentionParams& p) {
  const int forced = PrefillAttentionTile();
  if (forced != kPrefillTileAuto) return static_cast<PrefillAttentionTileShape>(forced);
  const int64_t big_tiles = int64_t{p.n_tokens} / 128 * p.n_heads;
  if (p.max_query_len < 128 || big_tiles < 2 * int64_t{CurrentDeviceSmCount()}) {
    return kPrefillTile4x1;
  }
  return p.head_dim <= 128 ? kPrefillTile4x2 : kPrefillTile8x1;
}

template <int D, KvCacheType KV>
void LaunchPrefillShape(const PagedAttentionParams& p, cudaStream_t stream) {
  PrefillAttentionTileShape shape = ChooseTile(p);
  if (shape == kPrefillTile4x2 && D > 128) shape = kPrefillTile8x1;  // O would not fit registers
  switch (shape) {
    case kPrefillTile4x2:
      if constexpr (D <= 128) LaunchPrefill<D, KV, Tile4x2>(p, stream);
      break;
    case kPrefillTile8x1:
      LaunchPrefill<D, KV, Tile8x1>(p, stream);
      break;
    default:
      LaunchPrefill<D, KV, Tile4x1>(p, stream);
      break;
  }
}

}  // namespace

void LaunchPrefillAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  DispatchHeadDim(p.head_dim, [&]<int D>() {
    switch (p.kv_type) {
      case KvCacheType::kFp8:
        LaunchPrefillShape<D, KvCacheType::kFp8>(p, stream);
        break;
      case KvCacheType::kInt8:
        LaunchPrefillShape<D, KvCacheType::kInt8>(p, stream);
        break;
      default:
        LaunchPrefillShape<D, KvCacheType::kBf16>(p, stream);
        break;
    }
  });
}

}  // namespace kestrel::cuda::detail

namespace kestrel::cuda {

void SetPrefillAttentionTile(int shape) {
  KCHECK(shape >= kPrefillTileAuto && shape <= kPrefillTile8x1);
  detail::g_prefill_tile.Set(shape);
}

int PrefillAttentionTile() {
  return detail::g_prefill_tile.Get();
}

const char* PrefillAttentionTileName(int shape) {
  switch (shape) {
    case kPrefillTile4x1:
      return "4x1";
    case kPrefillTile4x2:
      return "4x2";
    case kPrefillTile8x1:
      return "8x1";
    default:
      return "auto";
  }
}

}  // namespace kestrel::cuda
