// Prefill / mixed path of PagedAttention (max_query_len > 1): FlashAttention-2 on tensor cores
// (mma.sync m16n8k16 bf16 -> f32, ldmatrix from shared memory), online softmax in f32.
//
// Grid (head, query tile). A block of 4 warps owns 64 query rows of one sequence and one head;
// each warp owns 16 rows and keeps S (16 x 64 keys) and O (16 x D) in registers. K/V tiles of
// 64 positions are gathered through the block table with cp.async (double buffered).
//
// Query tiles never cross a sequence: sequence s owns tiles [U(s), U(s + 1)) with
// U(s) = seq_starts[s] / 64 + s. U is strictly increasing and U(s + 1) - U(s) >=
// floor(len_s / 64) + 1 >= ceil(len_s / 64), so every token is covered; a block finds its
// sequence by binary search over U and exits when its tile starts past the sequence's end.
// Grid size n_tokens / 64 + n_seqs (= U(n_seqs)), known on the host.
//
// Masking is by absolute position per row (keys k with first(p) <= k <= p), so arbitrary
// position layouts (prefix-cached chunks, single decode tokens in a mixed batch) are right.
// Tiles entirely inside every row's window skip the mask. K/V rows past the tile's last query
// position are zero-filled, never read: they may be unwritten (NaN) cache memory, and a masked
// p = 0 times a NaN V row would still poison the P.V product.
//
// A quantized cache (kv_cache.h): the codes are loaded with plain 8-byte loads (not cp.async),
// widened to bf16 (exact) into the same shared tiles, and the rows' scales go to shared memory
// beside them; S = Q.codes^T is multiplied by each key's K scale in f32, and P by each key's V
// scale before P is rounded to bf16 for the P.V product (the row sums l use the unscaled P).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "backends/cuda/attention.h"
#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_internal.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_cache.cuh"
#include "core/check.h"

namespace kestrel::cuda::detail {
namespace {

constexpr int kTileM = 64;  // query rows per block
constexpr int kTileN = 64;  // keys per K/V tile
constexpr int kWarps = 4;   // 16 query rows each
constexpr int kThreads = 32 * kWarps;
static_assert(kTileM == 16 * kWarps);

// Shared memory of one block: Q tile, K and V tiles in two stages, rows padded by 16 bytes so
// the 8 row addresses of an ldmatrix fall in distinct banks (a row of D bf16 is a multiple of
// 128 bytes for D >= 64, which would put them all in the same banks).
template <int D>
struct PrefillSmem {
  static constexpr int kStride = D + 8;  // elements per smem row
  static constexpr int kTileElems = kTileM * kStride;
  static_assert(kTileM == kTileN);
  static constexpr int kQ = 0;               // [kTileM, kStride]
  static constexpr int kK = kTileElems;      // [2][kTileN, kStride]
  static constexpr int kV = 3 * kTileElems;  // [2][kTileN, kStride]
  static constexpr size_t kBytes = 5 * static_cast<size_t>(kTileElems) * sizeof(__nv_bfloat16);
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

template <int D, KvCacheType KV>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(const PagedAttentionParams p, float scale_log2) {
  constexpr bool kQuantized = KV != KvCacheType::kBf16;
  using Smem = PrefillSmem<D>;
  constexpr int kStride = Smem::kStride;
  constexpr int kDimTiles = D / 8;       // n-tiles of O
  constexpr int kDimSteps = D / 16;      // k-steps of Q.K^T
  constexpr int kKeyTiles = kTileN / 8;  // n-tiles of S
  // Q fragments stay in registers for D <= 128 (D/4 registers); at 256 they would push O (128
  // registers) + S into spills, so they are re-read from shared memory each k-step.
  constexpr bool kQInRegisters = D <= 128;
  constexpr int kRowChunks = D / 8;  // 16-byte chunks per row

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* s_q = smem + Smem::kQ;
  __shared__ int32_t s_pos[kTileM];
  // Quantized cache: the K and V row scales of each stage's keys (0 for keys not loaded).
  __shared__ float s_kscale[kQuantized ? 2 : 1][kTileN];
  __shared__ float s_vscale[kQuantized ? 2 : 1][kTileN];

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

  // Q tile (rows past the sequence zero-filled) and the rows' positions.
  for (int i = tid; i < kTileM * kRowChunks; i += kThreads) {
    const int r = i / kRowChunks;
    const int c = i % kRowChunks;
    const bool valid = r < n_rows;
    const __nv_bfloat16* src =
        valid ? p.q + (int64_t{row0 + r} * p.n_heads + head) * D + c * 8 : p.q;
    CpAsync16(s_q + r * kStride + c * 8, src, valid);
  }
  CpAsyncCommit();
  if (tid < kTileM) s_pos[tid] = tid < n_rows ? p.positions[row0 + tid] : 0;
  __syncthreads();  // s_pos

  int q_min = s_pos[0], q_max = s_pos[0];
  for (int r = 1; r < n_rows; ++r) {
    q_min = min(q_min, s_pos[r]);
    q_max = max(q_max, s_pos[r]);
  }
  // This thread's two rows (lane / 4 and lane / 4 + 8 of its warp); rows past the sequence take
  // q_max so they stay finite (their output is not written).
  int row_pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + lane / 4 + 8 * h;
    row_pos[h] = r < n_rows ? s_pos[r] : q_max;
  }
  const int window = p.sliding_window;
  const int key_first = window > 0 ? max(0, q_min - window + 1) : 0;
  const int key_last = q_max;
  const int tile_first = key_first / kTileN;
  const int tile_last = key_last / kTileN;
  const int32_t* table = p.block_tables + int64_t{seq} * p.max_blocks_per_seq;

  // K/V tile `kt` into stage `stage`: row r is position kt * 64 + r. A 16-row chunk lies in one
  // physical block (block_size % 16 == 0) but each row is looked up on its own: simpler, and
  // the table entry is an L1 hit for the other rows.
  auto load_kv = [&](int kt, int stage) {
    __nv_bfloat16* s_k = smem + Smem::kK + stage * Smem::kTileElems;
    __nv_bfloat16* s_v = smem + Smem::kV + stage * Smem::kTileElems;
    if constexpr (kQuantized) {
      const uint8_t* k_codes = static_cast<const uint8_t*>(p.k_cache);
      const uint8_t* v_codes = static_cast<const uint8_t*>(p.v_cache);
      for (int i = tid; i < kTileN * kRowChunks; i += kThreads) {
        const int r = i / kRowChunks;
        const int c = i % kRowChunks;
        const int key_pos = kt * kTileN + r;
        uint4 k8 = make_uint4(0, 0, 0, 0), v8 = make_uint4(0, 0, 0, 0);
        if (key_pos <= key_last) {
          const int32_t block = table[key_pos / p.block_size];
          const int64_t row =
              (int64_t{block} * p.n_kv_heads + kv_head) * p.block_size + key_pos % p.block_size;
          const uint2 kc = __ldg(reinterpret_cast<const uint2*>(k_codes + row * D + c * 8));
          const uint2 vc = __ldg(reinterpret_cast<const uint2*>(v_codes + row * D + c * 8));
          float f[8];
          DecodeKv8<KV>(kc, f);
          k8 = make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                          PackBf16x2(f[6], f[7]));
          DecodeKv8<KV>(vc, f);
          v8 = make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                          PackBf16x2(f[6], f[7]));
          if (c == 0) {
            s_kscale[stage][r] = __ldg(p.k_scale + row);
            s_vscale[stage][r] = __ldg(p.v_scale + row);
          }
        } else if (c == 0) {
          s_kscale[stage][r] = 0.0f;
          s_vscale[stage][r] = 0.0f;
        }
        *reinterpret_cast<uint4*>(s_k + r * kStride + c * 8) = k8;
        *reinterpret_cast<uint4*>(s_v + r * kStride + c * 8) = v8;
      }
      return;
    }
    const __nv_bfloat16* k_cache = static_cast<const __nv_bfloat16*>(p.k_cache);
    const __nv_bfloat16* v_cache = static_cast<const __nv_bfloat16*>(p.v_cache);
    for (int i = tid; i < kTileN * kRowChunks; i += kThreads) {
      const int r = i / kRowChunks;
      const int c = i % kRowChunks;
      const int key_pos = kt * kTileN + r;
      const bool valid = key_pos <= key_last;
      int64_t offset = 0;
      if (valid) {
        const int32_t block = table[key_pos / p.block_size];
        offset =
            ((int64_t{block} * p.n_kv_heads + kv_head) * p.block_size + key_pos % p.block_size) *
                D +
            c * 8;
      }
      CpAsync16(s_k + r * kStride + c * 8, k_cache + offset, valid);
      CpAsync16(s_v + r * kStride + c * 8, v_cache + offset, valid);
    }
  };

  load_kv(tile_first, 0);
  CpAsyncCommit();

  float o_acc[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[n][e] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};  // this thread's partial row sums (quad-reduced at the end)
  uint32_t q_frag[kQInRegisters ? kDimSteps : 1][4];

  // ldmatrix lane addressing shared by Q, K and V: row lane % 16, column (lane / 16) * 8 of a
  // 16 x 16 block gives matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
  const int ld_row = lane % 16;
  const int ld_col = (lane / 16) * 8;

  for (int kt = tile_first; kt <= tile_last; ++kt) {
    const int stage = (kt - tile_first) & 1;
    if (kt < tile_last) {
      load_kv(kt + 1, stage ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();  // everything but the tile just issued
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* s_k = smem + Smem::kK + stage * Smem::kTileElems;
    const __nv_bfloat16* s_v = smem + Smem::kV + stage * Smem::kTileElems;

    if constexpr (kQInRegisters) {
      if (kt == tile_first) {
#pragma unroll
        for (int ks = 0; ks < kDimSteps; ++ks) {
          LdMatrixX4(q_frag[ks], s_q + (warp * 16 + ld_row) * kStride + ks * 16 + ld_col);
        }
      }
    }

    // S = Q K^T: 16 rows x 64 keys per warp. K rows are keys, so a plain ldmatrix of a
    // (16 keys x 16 dims) block gives b0/b1 of two 8-key n-tiles: r0 = b0 (keys 0-7),
    // r1 = b0 (keys 8-15), r2 = b1 (keys 0-7), r3 = b1 (keys 8-15).
    float s_acc[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[n][e] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      uint32_t a[4];
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = q_frag[ks][e];
      } else {
        LdMatrixX4(a, s_q + (warp * 16 + ld_row) * kStride + ks * 16 + ld_col);
      }
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t b[4];
        LdMatrixX4(b, s_k + (np * 16 + ld_row) * kStride + ks * 16 + ld_col);
        MmaBf16(s_acc[2 * np], a, b[0], b[2]);
        MmaBf16(s_acc[2 * np + 1], a, b[1], b[3]);
      }
    }

    // Scale to log2 units and mask. Element e of n-tile n: row lane / 4 + 8 * (e / 2), key
    // n * 8 + (lane % 4) * 2 + e % 2.
    const int key0 = kt * kTileN;
    const bool full_tile = key0 + kTileN - 1 <= q_min && (window == 0 || key0 > q_max - window);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = s_acc[n][e];
        if constexpr (kQuantized) s *= s_kscale[stage][n * 8 + (lane % 4) * 2 + e % 2];
        s *= scale_log2;
        if (!full_tile) {
          const int key_pos = key0 + n * 8 + (lane % 4) * 2 + e % 2;
          const int qp = row_pos[e / 2];
          const bool visible = key_pos <= qp && (window == 0 || key_pos > qp - window);
          s = visible ? s : -INFINITY;
        }
        s_acc[n][e] = s;
      }
    }

    // Online softmax per row; a row's 64 scores sit in the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) OnlineSoftmaxRow(h, s_acc, m_run[h], l_run[h], o_acc);

    // O += P V. The S accumulators of n-tiles 2kk and 2kk+1 are exactly the A fragment of
    // key step kk. V rows are keys, so ldmatrix.trans of a (16 keys x 16 dims) block gives
    // r0 = b0 (dims 0-7), r1 = b1 (dims 0-7), r2 = b0 (dims 8-15), r3 = b1 (dims 8-15).
    if constexpr (kQuantized) {
      // P times each key's V scale (keys n * 8 + (lane % 4) * 2 + e % 2, as for S).
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        const float v0 = s_vscale[stage][n * 8 + (lane % 4) * 2];
        const float v1 = s_vscale[stage][n * 8 + (lane % 4) * 2 + 1];
        s_acc[n][0] *= v0;
        s_acc[n][1] *= v1;
        s_acc[n][2] *= v0;
        s_acc[n][3] *= v1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kTileN / 16; ++kk) {
      uint32_t a[4];
      a[0] = PackBf16x2(s_acc[2 * kk][0], s_acc[2 * kk][1]);
      a[1] = PackBf16x2(s_acc[2 * kk][2], s_acc[2 * kk][3]);
      a[2] = PackBf16x2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]);
      a[3] = PackBf16x2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, s_v + (kk * 16 + ld_row) * kStride + dp * 16 + ld_col);
        MmaBf16(o_acc[2 * dp], a, b[0], b[1]);
        MmaBf16(o_acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is overwritten by the next iteration's load
  }

  // Normalise and store. A valid row has l >= 1 (its own position is never masked).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = warp * 16 + lane / 4 + 8 * h;
    if (r >= n_rows) continue;
    const float inv_l = 1.0f / l;
    __nv_bfloat16* dst = p.out + (int64_t{row0 + r} * p.n_heads + head) * D + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
          __floats2bfloat162_rn(o_acc[n][2 * h] * inv_l, o_acc[n][2 * h + 1] * inv_l);
    }
  }
}

template <int D, KvCacheType KV>
void LaunchPrefill(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t kSmemBytes = PrefillSmem<D>::kBytes;
  // Above 48 KB a kernel must opt in; a host call, once per instance (the engine uses one
  // device), fine during graph capture as it is not a stream operation.
  static std::once_flag once;
  std::call_once(once, [] {
    KCUDA_CHECK(cudaFuncSetAttribute(PrefillKernel<D, KV>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmemBytes)));
  });
  const int64_t n_tiles = int64_t{p.n_tokens} / kTileM + p.n_seqs;  // U(n_seqs), see top
  KCHECK(n_tiles <= 65535);
  const dim3 grid(p.n_heads, static_cast<unsigned>(n_tiles));
  PrefillKernel<D, KV><<<grid, kThreads, kSmemBytes, stream>>>(p, p.scale * kLog2e);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace

void LaunchPrefillAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  DispatchHeadDim(p.head_dim, [&]<int D>() {
    switch (p.kv_type) {
      case KvCacheType::kFp8:
        LaunchPrefill<D, KvCacheType::kFp8>(p, stream);
        break;
      case KvCacheType::kInt8:
        LaunchPrefill<D, KvCacheType::kInt8>(p, stream);
        break;
      default:
        LaunchPrefill<D, KvCacheType::kBf16>(p, stream);
        break;
    }
  });
}

}  // namespace kestrel::cuda::detail
