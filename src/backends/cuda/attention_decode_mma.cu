// Decode split kernel on tensor cores (variant "tensor_cores", attention_decode.cu): the same
// split geometry and the same partial outputs (m, l, acc per split) as DecodeSplitKernel, so the
// combine, the workspace and batch invariance are shared.
//
// Why: the CUDA-core kernel spends ~2 FMAs per K/V element and head of the GQA group plus a
// shuffle tree per key, which makes it instruction-bound well below copy bandwidth once a quantized
// cache halves the bytes per element. Here the G heads of a kv head's group are the rows of an
// m16n8k16 mma (rows >= G zero): Q.K^T and P.V each cost one mma per 16 keys x 8 columns, and
// the only per-element work left is feeding registers to the mma.
//
// Block (sequence, kv head, split), 4 warps; warp w owns a quarter of the split's keys (64 of
// 256, or 128 of the 512 that the quantized caches at head_dim 128 take), in 16-key chunks (a
// chunk is 16 rows of one physical block: block_size % 16 == 0). Per chunk the warp computes
// S (16 rows x 16 keys) = Q.K^T, the online softmax of its rows, and O += P.V.
// K and V go from global memory straight into the mma fragments (quantized caches at head_dim
// 128 and the bf16 cache at head_dim 256: through shared memory, see below), thanks to two
// layout choices that a dot product permits:
//   Q.K^T  sums over dims in any order, so lane (g, t) = (lane / 4, lane % 4) takes its B
//          fragments from K row "key g" at the dims of its own 16-byte pieces (i * 4 + t) of the
//          row, and the Q (A) fragments follow the same dim order: one coalesced 16-byte load per
//          piece, no shuffling of K.
//   P.V    gives output columns in any order, so lane (g, t) loads V rows 2t, 2t+1, 2t+8, 2t+9
//          (its k rows of the B fragment) at the dims of its pieces (i * 8 + g); each B register
//          pairs two rows' elements with one byte permute. O's column c of dim tile n is dim
//          (i * 8 + c) * E + e for n = i * E + e (E elements per piece).
// bf16 caches run bf16 mma. Quantized caches (kv_cache.h) run f16 mma: e4m3 and int8 codes are
// exact in f16 (one cvt per pair / a magic-number subtraction), Q is rounded to f16 (its values
// are far inside f16's range; 3 more mantissa bits than its bf16), S is scaled by each key's K
// scale, and P by each key's V scale divided by the chunk's largest (so P.scale stays in [0, 1],
// where f16 is accurate): O is kept in units of the current chunk's largest V scale (rescaled
// with the softmax's alpha when the chunk changes) and multiplied back at the end.
// The loads in flight per SM bound this kernel (a warp computes 16 keys between its loads): for
// quantized caches at head_dim 128 a warp keeps a ring of three chunks in flight in shared memory
// (cp.async, 12 KB) and fills the same fragments from there; for the bf16 cache at head_dim 256
// (groups of up to 8 heads) one 16 KB stage per warp whose K half is refilled with the next
// chunk once the scores have read it, and its V half once P.V has (MmaGeometry::Stages). H200,
// bench_cuda_kernels --only attention_decode, µs, register-loaded -> staged: Qwen3.5-27B heads
// (24 over 4) 64 x 2k 197.2 -> 156.1, 64 x 8k 721.0 -> 564.3, 1 x 2k 21.3 -> 15.9; Qwen3.5-35B-A3B
// heads (16 over 2) 64 x 2k 107.3 -> 89.7, 64 x 8k 395.8 -> 299.8.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_internal.h"
#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/env_setting.h"
#include "backends/cuda/kv_cache.cuh"
#include "backends/cuda/pdl.cuh"
#include "core/check.h"

namespace kestrel::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 16;  // keys per mma step (one 16-row chunk of a physical block)
constexpr int kMaxGroup = 16;  // mma rows
// A block walks up to this many consecutive splits of its (sequence, kv head) (see
// SplitsPerBlock): the prologue (sequence metadata, Q fragments) is paid once, and the staged
// path keeps its copies in flight across the splits' boundaries. Splits of 512 positions
// (DecodeSplitMmaTokens) allow half as many.
constexpr int kMaxSplitsPerBlock = 8;
constexpr int kMaxBlockChunks = kMaxSplitsPerBlock * kDecodeSplitTokens / kChunk;
int MaxSplitsPerBlock(int split_tokens) {
  return kMaxSplitsPerBlock * kDecodeSplitTokens / split_tokens;
}
// Resident blocks per SM the register allocation must allow (65536 / (3 x 128) = 170 registers):
// the loads in flight per SM bound this kernel, so 3 blocks with one chunk in flight per warp beat
// 2 blocks with two (measured on the H200, 64 x 8k fp8: 26.0 vs 28.2 ms per step).
// At head_dim 256 a lane's O (32 dim tiles) and Q fragments need more: 2 blocks (255 registers),
// else they spill.
constexpr int kMinBlocksPerSm = 3;
template <int D>
constexpr int MinBlocksPerSm() {
  return D <= 128 ? kMinBlocksPerSm : 2;
}

// c (16x8 f32) += a (16x16, row) * b (16x8, col), bf16 or f16 inputs. kTop: only rows 0-7 are
// live (groups of at most 8 heads): a[1], a[3] are taken as zero and c[2], c[3] are neither
// read nor written, so their registers are never allocated.
template <bool kF16, bool kTop>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (kTop) {
    float d2, d3;
    if constexpr (kF16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
          : "=f"(c[0]), "=f"(c[1]), "=f"(d2), "=f"(d3)
          : "r"(a[0]), "r"(0u), "r"(a[2]), "r"(0u), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
            "f"(0.0f), "f"(0.0f));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
          : "=f"(c[0]), "=f"(c[1]), "=f"(d2), "=f"(d3)
          : "r"(a[0]), "r"(0u), "r"(a[2]), "r"(0u), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
            "f"(0.0f), "f"(0.0f));
    }
    (void)d2;
    (void)d3;
  } else if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 as a packed pair (lo in the low half), bf16 or f16, round to nearest.
template <bool kF16>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Two codes (the low 16 bits of x, first code low) as an f16 pair, exactly.
template <KvCacheType KV>
__device__ __forceinline__ uint32_t CodesToF16x2(uint32_t x) {
  if constexpr (KV == KvCacheType::kFp8) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  } else {
    // 0x6400 | (code ^ 0x80) is the f16 1024 + (code + 128), exact below 2048; minus 1152.
    const uint32_t y = __byte_perm(x ^ 0x8080u, 0x64646464u, 0x4140);
    const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&y), __float2half2_rn(1152.0f));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t Word(const uint2& v, int i) {
  return i == 0 ? v.x : v.y;
}
template <class Vec>
__device__ __forceinline__ Vec Zero() {
  if constexpr (std::is_same_v<Vec, uint4>) {
    return make_uint4(0, 0, 0, 0);
  } else {
    return make_uint2(0, 0);
  }
}

// Where 16-byte piece `piece` of a staged row goes (rows of 128 or 256 bytes, whole 128-byte bank
// lines): K fragments read pieces i * 4 + t of rows g (a quarter warp: rows 2p, 2p + 1, four
// pieces each), so odd rows swap the halves of each 8-piece line; V fragments read pieces
// i * 8 + g of rows 2t (+ 1, + 8, + 9) (a quarter warp: rows 0, 2, 4, 6 of a group, two pieces
// each), so row r's pieces are permuted by r & 6. Either way a quarter warp's eight 16-byte reads
// fall in distinct banks.
template <bool kV>
__device__ __forceinline__ int StagedPiece(int row, int piece) {
  return kV ? piece ^ (row & 6) : piece ^ ((row & 1) << 2);
}

template <int D, KvCacheType KV>
struct MmaGeometry {
  static constexpr bool kQuant = KV != KvCacheType::kBf16;
  static constexpr int kElemBytes = kQuant ? 1 : 2;
  static constexpr int kKE = 16 / kElemBytes;      // elements per 16-byte K piece
  static constexpr int kKPieces = D / (4 * kKE);   // per K row and lane
  static constexpr int kStepsPerPiece = kKE / 4;   // k-steps of 16 dims fed by one piece
  static constexpr int kSteps = D / 16;
  static constexpr int kVBytes = D * kElemBytes / 8 < 16 ? D * kElemBytes / 8 : 16;
  static constexpr int kVE = kVBytes / kElemBytes;  // elements per V piece
  static constexpr int kVPieces = D / (8 * kVE);    // per V row and lane
  static constexpr int kDimTiles = D / 8;
  using VVec = std::conditional_t<kVBytes == 16, uint4, uint2>;
  using Elem = std::conditional_t<kQuant, uint8_t, __nv_bfloat16>;
  // Quantized caches at head_dim 128: a warp's chunks staged in shared memory by cp.async, a
  // ring of Stages() chunks in flight that runs on across the block's splits (12 KB per warp). A
  // stage is the chunk's 16 K rows, its 16 V rows (16-byte pieces placed by StagedPiece) and
  // (quantized) its 16 K then 16 V scales. (bf16 chunks at head_dim 128, twice the bytes, would
  // need the fragments filled piece by piece to stay within 3 blocks' registers; they load
  // straight into registers.) bf16 at head_dim 256 with groups of up to 8 heads: one stage of
  // 16 KB per warp, the fragments read from it as each mma needs them, its K half refilled with
  // the next chunk once the scores have read it and its V half once P.V has, so that a chunk's
  // copy is in flight while the one before is computed (2 blocks per SM, whose 8 warps
  // otherwise keep a chunk in flight only between its load and its first use).
  static constexpr int kRowBytes = D * kElemBytes;
  static constexpr int kStageBytes = 2 * kChunk * kRowBytes + (kQuant ? 2 * kChunk * 4 : 0);
  static constexpr int Stages(bool top) {
    return D == 128 && kQuant ? 3 : D == 256 && !kQuant && top ? 1 : 0;
  }
  static constexpr size_t StagingBytes(bool top) {
    return size_t{kWarps} * Stages(top) * kStageBytes;
  }
  // Splits of 512 positions (DecodeSplitMmaTokens).
  static constexpr bool kLongSplits = D == 128 && kQuant;
  // The cross-warp merge [kWarps][rows][kMergeRowFloats] after the staging buffers (the ring is
  // still in flight while a split is merged): 8 rows for groups of up to 8 heads, else 16. 3
  // blocks per SM fit at 8 rows (68 KB each at head_dim 128).
  static constexpr int MergeRows(bool top) { return top ? 8 : kMaxGroup; }
  // The quantized head_dim-128 path's merge rows are padded (PaddedCol: conflict-free stores),
  // and so are head dim 256's (plain rows cost it a 12-way conflict on 91 % of its shared
  // stores: ncu, 64 x 2k); the bf16 path at head_dim 128 keeps plain rows, whose padded form
  // costs it registers (spills) for less to gain.
  static constexpr bool kPaddedMerge = (D == 128 && kQuant) || D == 256;
  // At head_dim 256 a lane's O (32 dim tiles) and one chunk's K and V fill the 255 registers of
  // 2 blocks per SM and spilled (64-172 bytes); the Q fragments (16 k-steps) then live in shared
  // memory, one copy per block (every warp holds the same ones), read per k-step.
  static constexpr bool kQShared = D == 256;
  static constexpr int kMergeRowFloats = kPaddedMerge ? kPaddedRowFloats<D> : D;
  static constexpr size_t SmemBytes(bool top) {
    return StagingBytes(top) + size_t{kWarps} * MergeRows(top) * kMergeRowFloats * sizeof(float);
  }
  static_assert(kKPieces >= 1 && kVPieces >= 1 && kSteps == kKPieces * kStepsPerPiece);
};

// Launched with PDL (pdl.cuh): waits before anything else.
// kTop: the group has at most 8 heads (mma rows 8-15 are never computed).
// kSplit: positions per split (DecodeSplitMmaTokens: kDecodeSplitTokens, or 512 for the
// quantized caches at head_dim 128).
template <int D, KvCacheType KV, bool kTop, int kSplit>
__global__ void __launch_bounds__(kThreads, MinBlocksPerSm<D>())
    DecodeSplitMmaKernel(const PagedAttentionParams p, int32_t n_splits, int32_t splits_per_block,
                         int32_t group, int32_t prefetch_ahead, float* __restrict__ part_o,
                         float* __restrict__ part_m, float* __restrict__ part_l) {
  PdlWait();
  PdlLaunchDependents();
  using G = MmaGeometry<D, KV>;
  constexpr bool kQuant = G::kQuant;
  using Elem = typename G::Elem;
  using VVec = typename G::VVec;
  constexpr int kRows = kTop ? 1 : 2;  // rows g (+ g + 8) of this lane
  constexpr int kMergeRows = G::MergeRows(kTop);
  constexpr int kStages = G::Stages(kTop);
  constexpr bool kStaged = kStages > 0;
  // One stage: each half refilled as soon as the chunk's math has read it (the next chunk's copy
  // in flight meanwhile); a ring of several: after the chunk (its other stages are in flight).
  constexpr bool kRefillFirst = kStages == 1;
  constexpr int kChunksPerSplit = kSplit / kChunk;
  constexpr int kChunksPerWarp = kChunksPerSplit / kWarps;
  static_assert(kSplit % (kChunk * kWarps) == 0 && kSplit % kDecodeSplitTokens == 0);

  // Element offset of each chunk's row 0, for the block's splits.
  __shared__ int64_t s_chunk_offset[kMaxBlockChunks];
  __shared__ float s_m[kWarps][kMergeRows];
  __shared__ float s_l[kWarps][kMergeRows];
  // kQShared: the Q fragments [k-step][lane], (a0, a2) when only rows 0-7 are live, else a0..a3.
  using QFrag = std::conditional_t<kTop, uint2, uint4>;
  __shared__ QFrag s_q[G::kQShared ? G::kSteps : 1][32];
  // Dynamic: the warps' staging buffers (head_dim 128), then the cross-warp merge
  // [kWarps][kMergeRows][kMergeRowFloats].
  extern __shared__ __align__(16) unsigned char smem[];
  float* s_o = reinterpret_cast<float*>(smem + G::StagingBytes(kTop));

  const int tid = threadIdx.x;
  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int head0 = kv_head * group;
  const int token = DecodeToken(p, seq);
  if (token < 0) return;
  const int pos = p.positions[token];
  const int first = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
  // The block's splits [split0, split_end), less those outside [first, pos]: the combine reads
  // only splits that intersect it. Every split is computed exactly as a block of its own would.
  const int split0 = max(static_cast<int>(blockIdx.z) * splits_per_block,
                         first / kSplit);
  const int split_end = min(min((static_cast<int>(blockIdx.z) + 1) * splits_per_block, n_splits),
                            pos / kSplit + 1);
  if (split0 >= split_end) return;
  const int n_block_splits = split_end - split0;

  // Split si of the block (0 .. n_block_splits - 1): first position and attended range.
  auto split_range = [&](int si, int& begin, int& r_lo, int& r_hi) {
    begin = (split0 + si) * kSplit;
    r_lo = max(first, begin);
    r_hi = min(pos, begin + kSplit - 1);
  };

  for (int i = tid; i < n_block_splits * kChunksPerSplit; i += kThreads) {
    int split_begin, lo, hi;
    split_range(i / kChunksPerSplit, split_begin, lo, hi);
    const int chunk_begin = split_begin + (i % kChunksPerSplit) * kChunk;
    int64_t offset = 0;
    // Only chunks holding attended keys: table entries past the context may be garbage.
    if (chunk_begin <= hi && chunk_begin + kChunk > lo) {
      const int32_t block =
          p.block_tables[int64_t{seq} * p.max_blocks_per_seq + chunk_begin / p.block_size];
      offset =
          ((int64_t{block} * p.n_kv_heads + kv_head) * p.block_size + chunk_begin % p.block_size) *
          D;
    }
    s_chunk_offset[i] = offset;
  }

  const int lane = tid % 32;
  const int warp = tid / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;

  // Q fragments of rows g and g + 8 (heads head0 + row; zero past the group), in the dim order
  // of the K pieces: step s reads dims (i * 4 + t) * kKE + sub * 4 + [0, 4).
  // (kQShared: written to s_q by warp 0, the registers then dead.)
  uint32_t q_frag[G::kSteps][4];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (G::kQShared && warp != 0) break;  // warp-uniform: only warp 0 fills s_q
    const int row = g + 8 * r;
    const __nv_bfloat16* q_row = p.q + (int64_t{token} * p.n_heads + head0 + row) * D;
#pragma unroll
    for (int s = 0; s < G::kSteps; ++s) {
      const int base = ((s / G::kStepsPerPiece) * 4 + t) * G::kKE + (s % G::kStepsPerPiece) * 4;
      uint2 w = make_uint2(0, 0);
      if (row < group) w = __ldg(reinterpret_cast<const uint2*>(q_row + base));
      if constexpr (kQuant) {
        q_frag[s][r] = Pack2<true>(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u));
        q_frag[s][r + 2] =
            Pack2<true>(__uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
      } else {
        q_frag[s][r] = w.x;
        q_frag[s][r + 2] = w.y;
      }
    }
  }
  if constexpr (G::kQShared) {
    if (warp == 0) {
#pragma unroll
      for (int s = 0; s < G::kSteps; ++s) {
        if constexpr (kTop) {
          s_q[s][lane] = make_uint2(q_frag[s][0], q_frag[s][2]);
        } else {
          s_q[s][lane] = make_uint4(q_frag[s][0], q_frag[s][1], q_frag[s][2], q_frag[s][3]);
        }
      }
    }
  }
  __syncthreads();  // s_chunk_offset, s_q


  // The running state of the current split.
  float o[G::kDimTiles][4];
  float m_run[2], l_run[2];
  // Quantized caches: O is in units of v_units, the largest V scale of the last chunk.
  float v_units;
  const Elem* k_cache = static_cast<const Elem*>(p.k_cache);
  const Elem* v_cache = static_cast<const Elem*>(p.v_cache);
  // The split being computed: its first position, attended range [lo, hi], and its chunks'
  // entries in s_chunk_offset.
  int split_begin = 0, lo = 0, hi = -1, chunk_base = 0;

  // One chunk's registers: K rows key0 + g (n-tile 0) and key0 + 8 + g (n-tile 1), this lane's
  // pieces; V rows 2t, 2t+1, 2t+8, 2t+9 (this lane's B-fragment k rows, and its S columns) with
  // the keys' scales. Keys outside [lo, hi] read zeros (their scores are masked; unwritten rows
  // may hold NaN).
  struct ChunkRegs {
    uint4 k[2][G::kKPieces];
    VVec v[4][G::kVPieces];
    bool valid[4];
    float k_scale[4], v_scale[4];
  };
  // The chunk row (key) of this lane's jj-th V row: its B-fragment k rows 2t, 2t+1, 2t+8, 2t+9,
  // which are also its S columns.
  auto key_row = [&](int jj) { return 2 * t + (jj & 1) + 8 * (jj >> 1); };
  auto load = [&](int chunk, ChunkRegs& r) {
    const int key0 = split_begin + chunk * kChunk;
    const int64_t offset = s_chunk_offset[chunk_base + chunk];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int j = n * 8 + g;
      const bool valid = key0 + j >= lo && key0 + j <= hi;
      const Elem* row = k_cache + offset + j * D;
#pragma unroll
      for (int i = 0; i < G::kKPieces; ++i) {
        r.k[n][i] = valid ? __ldg(reinterpret_cast<const uint4*>(row + (i * 4 + t) * G::kKE))
                          : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = key_row(jj);
      r.valid[jj] = key0 + j >= lo && key0 + j <= hi;
      const Elem* row = v_cache + offset + j * D;
#pragma unroll
      for (int i = 0; i < G::kVPieces; ++i) {
        r.v[jj][i] = r.valid[jj]
                         ? __ldg(reinterpret_cast<const VVec*>(row + (i * 8 + g) * G::kVE))
                         : Zero<VVec>();
      }
      r.k_scale[jj] = 1.0f;
      r.v_scale[jj] = 1.0f;
      if constexpr (kQuant) {
        const int64_t scale_row = offset / D + j;
        r.k_scale[jj] = r.valid[jj] ? __ldg(p.k_scale + scale_row) : 0.0f;
        r.v_scale[jj] = r.valid[jj] ? __ldg(p.v_scale + scale_row) : 0.0f;
      }
    }
  };
  // A chunk's scores, their online softmax, and the P fragments for O += P.V: r's validity and
  // scales, K piece i of this lane's n-tile n from k_at(n, i) (r's registers, or the stage).
  auto scores = [&](const ChunkRegs& r, uint32_t (&a)[4], auto&& k_at) {
    // S = Q.K^T (16 rows x 16 keys): element e of n-tile n is row g + 8 (e / 2), key
    // n * 8 + 2t + e % 2, i.e. this lane's jj = 2n + e % 2.
    float s_acc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[n][e] = 0.0f;
    }
#pragma unroll
    for (int s = 0; s < G::kSteps; ++s) {
      const int i = s / G::kStepsPerPiece;
      const int sub = s % G::kStepsPerPiece;
      uint32_t qs[4];  // kQShared: this step's Q fragment, read once for both n-tiles
      if constexpr (G::kQShared) {
        if constexpr (kTop) {
          const uint2 q = s_q[s][lane];
          qs[0] = q.x;
          qs[1] = 0u;
          qs[2] = q.y;
          qs[3] = 0u;
        } else {
          const uint4 q = s_q[s][lane];
          qs[0] = q.x;
          qs[1] = q.y;
          qs[2] = q.z;
          qs[3] = q.w;
        }
      }
      const uint32_t(&qa)[4] = G::kQShared ? qs : q_frag[s];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint4 kv = k_at(n, i);
        uint32_t b0, b1;
        if constexpr (kQuant) {
          const uint32_t w = Word(kv, sub);
          b0 = CodesToF16x2<KV>(w);
          b1 = CodesToF16x2<KV>(w >> 16);
        } else {
          b0 = Word(kv, 2 * sub);
          b1 = Word(kv, 2 * sub + 1);
        }
        Mma<kQuant, kTop>(s_acc[n], qa, b0, b1);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jj = 2 * n + (e & 1);
        s_acc[n][e] = r.valid[jj] ? s_acc[n][e] * (r.k_scale[jj] * scale_log2) : -INFINITY;
      }
    }
    // Quantized: this chunk's largest V scale (a quad holds all 16 keys), and the factor that
    // takes O from the last chunk's units to this one's.
    float v_weight[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    float units_change = 1.0f;
    if constexpr (kQuant) {
      float v_max = fmaxf(fmaxf(r.v_scale[0], r.v_scale[1]), fmaxf(r.v_scale[2], r.v_scale[3]));
      v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffffu, v_max, 1));
      v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffffu, v_max, 2));
      if (!(v_max > 0.0f)) v_max = 1.0f;  // every V row of the chunk zero
      const float inv = 1.0f / v_max;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) v_weight[jj] = r.v_scale[jj] * inv;
      units_change = v_units * inv;
      v_units = v_max;
    }

    // Online softmax of rows g (h = 0) and g + 8 (h = 1); a row's 16 scores sit in a quad.
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      OnlineSoftmaxRow(h, s_acc, m_run[h], l_run[h], o, units_change);
    }

    // O += P.V: the S accumulators are the A fragment (k = the chunk's 16 keys in order).
    a[0] = Pack2<kQuant>(s_acc[0][0] * v_weight[0], s_acc[0][1] * v_weight[1]);
    a[1] = Pack2<kQuant>(s_acc[0][2] * v_weight[0], s_acc[0][3] * v_weight[1]);
    a[2] = Pack2<kQuant>(s_acc[1][0] * v_weight[2], s_acc[1][1] * v_weight[3]);
    a[3] = Pack2<kQuant>(s_acc[1][2] * v_weight[2], s_acc[1][3] * v_weight[3]);
  };
  // O += P.V, V piece i of this lane's row jj from v_at(jj, i) (r's registers, or the stage).
  auto accumulate = [&](const uint32_t (&a)[4], auto&& v_at) {
#pragma unroll
    for (int i = 0; i < G::kVPieces; ++i) {
      const VVec v0 = v_at(0, i), v1 = v_at(1, i), v2 = v_at(2, i), v3 = v_at(3, i);
      if constexpr (kQuant) {
        // Bytes e, e+1 of rows (2t, 2t+1) and (2t+8, 2t+9): dim tiles i * kVE + e and + e + 1.
#pragma unroll
        for (int e = 0; e < G::kVE; e += 2) {
          const int w = e / 4;
          const uint32_t sel = e % 4 == 0 ? 0x5140u : 0x7362u;
          const uint32_t x0 = __byte_perm(Word(v0, w), Word(v1, w), sel);
          const uint32_t x1 = __byte_perm(Word(v2, w), Word(v3, w), sel);
          Mma<true, kTop>(o[i * G::kVE + e], a, CodesToF16x2<KV>(x0), CodesToF16x2<KV>(x1));
          Mma<true, kTop>(o[i * G::kVE + e + 1], a, CodesToF16x2<KV>(x0 >> 16),
                    CodesToF16x2<KV>(x1 >> 16));
        }
      } else {
#pragma unroll
        for (int e = 0; e < G::kVE; ++e) {
          const int w = e / 2;
          const uint32_t sel = e % 2 == 0 ? 0x5410u : 0x7632u;
          const uint32_t b0 = __byte_perm(Word(v0, w), Word(v1, w), sel);
          const uint32_t b1 = __byte_perm(Word(v2, w), Word(v3, w), sel);
          Mma<false, kTop>(o[i * G::kVE + e], a, b0, b1);
        }
      }
    }
  };
  auto compute = [&](const ChunkRegs& r) {
    uint32_t a[4];
    scores(r, a, [&](int n, int i) { return r.k[n][i]; });
    accumulate(a, [&](int jj, int i) { return r.v[jj][i]; });
  };

  // The warp's chunk q of the block's ring (q = si * kChunksPerWarp + c: its chunks of every
  // split in one sequence): false when it holds no attended key, else true with its first row's
  // element offset in the cache; key0 and [r_lo, r_hi] get that row's position and the split's
  // attended range.
  auto ring_chunk = [&](int q, int64_t& offset, int& key0, int& r_lo, int& r_hi) {
    const int si = q / kChunksPerWarp;
    const int chunk = warp * kChunksPerWarp + q % kChunksPerWarp;
    int begin;
    split_range(si, begin, r_lo, r_hi);
    key0 = begin + chunk * kChunk;
    if (key0 > r_hi || key0 + kChunk - 1 < r_lo) return false;
    offset = s_chunk_offset[si * kChunksPerSplit + chunk];
    return true;
  };

  // L2 prefetch of the warp's chunk q of the ring (register-loaded path): its K rows and V rows,
  // each kChunk consecutive rows of one physical block, one bulk request each.
  auto prefetch_chunk = [&](int q) {
    int64_t offset;
    int key0, r_lo, r_hi;
    if (!ring_chunk(q, offset, key0, r_lo, r_hi)) return;
    constexpr uint32_t kBytes = kChunk * D * sizeof(Elem);
    PrefetchL2Bulk(k_cache + offset, kBytes);
    PrefetchL2Bulk(v_cache + offset, kBytes);
  };

  // The staged path's ring, kStages of its chunks in flight.
  unsigned char* stages = smem + warp * kStages * G::kStageBytes;
  const int n_ring = n_block_splits * kChunksPerWarp;
  // Copies chunk q's K rows (kK; with them the quantized caches' K and V scales, which the
  // scores read) and V rows (kV) into its stage.
  auto issue_part = [&]<bool kK, bool kV>(int q) {
    if constexpr (kStaged) {
      if (q >= n_ring) return;
      int64_t offset;
      int key0, r_lo, r_hi;
      if (!ring_chunk(q, offset, key0, r_lo, r_hi)) return;
      unsigned char* st = stages + (q % kStages) * G::kStageBytes;
      const Elem* k_src = k_cache + offset;
      const Elem* v_src = v_cache + offset;
      // Copy `it` of this lane: row lane / kRowPieces + it * kRowsPerIter, piece lane %
      // kRowPieces (a fixed trip count, so the lane's offsets are constants of the unrolled loop
      // instead of being recomputed per copy).
      constexpr int kRowPieces = G::kRowBytes / 16;
      constexpr int kRowsPerIter = 32 / kRowPieces;
      static_assert(32 % kRowPieces == 0 && kChunk % kRowsPerIter == 0);
      const int row0 = lane / kRowPieces;
      const int piece = lane % kRowPieces;
#pragma unroll
      for (int it = 0; it < kChunk / kRowsPerIter; ++it) {
        const int row = row0 + it * kRowsPerIter;
        const bool valid = key0 + row >= r_lo && key0 + row <= r_hi;
        const int src = row * D + piece * (16 / G::kElemBytes);
        const int dst = row * G::kRowBytes;
        if constexpr (kK) {
          CpAsync16(st + dst + StagedPiece<false>(row, piece) * 16, k_src + src, valid);
        }
        if constexpr (kV) {
          CpAsync16(st + kChunk * G::kRowBytes + dst + StagedPiece<true>(row, piece) * 16,
                    v_src + src, valid);
        }
      }
      if constexpr (kQuant && kK) {
        if (lane < 8) {  // 4 x 16 bytes of K scales, then of V scales
          const float* src = (lane < 4 ? p.k_scale : p.v_scale) + offset / D + (lane % 4) * 4;
          CpAsync16(st + 2 * kChunk * G::kRowBytes + lane * 16, src, true);
        }
      }
    }
  };
  auto issue = [&](int q) { issue_part.template operator()<true, true>(q); };
  if constexpr (kRefillFirst) {  // chunk 0's K rows and V rows, one group each
    issue_part.template operator()<true, false>(0);
    CpAsyncCommit();
    issue_part.template operator()<false, true>(0);
    CpAsyncCommit();
  } else if constexpr (kStaged) {
#pragma unroll
    for (int q = 0; q < kStages; ++q) {
      issue(q);
      CpAsyncCommit();
    }
  }

#pragma unroll 1
  for (int si = 0; si < n_block_splits; ++si) {
    split_range(si, split_begin, lo, hi);
    chunk_base = si * kChunksPerSplit;
#pragma unroll
    for (int n = 0; n < G::kDimTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    }
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
    v_units = 1.0f;

    if constexpr (kStaged) {
      // Per chunk: wait for its group, fill the fragments from shared memory, compute, refill
      // the stage with the chunk kStages ahead in the ring (the next split's, near the end).
      // kRefillFirst (one stage, its K rows and V rows committed as two groups): wait for the K
      // rows, compute the scores reading them from the stage, refill them with the next chunk's,
      // wait for the V rows, P.V reading them from the stage, refill them.
#pragma unroll 1
      for (int c = 0; c < kChunksPerWarp; ++c) {
        const int q = si * kChunksPerWarp + c;
        // Chunk q's group (all but the newest kStages - 1); kRefillFirst: its K rows' (the
        // newest group pending is its V rows').
        CpAsyncWait<kRefillFirst ? 1 : kStages - 1>();
        __syncwarp();  // ... for every lane's copies
        const int chunk = warp * kChunksPerWarp + c;
        const int key0 = split_begin + chunk * kChunk;
        const bool attended = key0 <= hi && key0 + kChunk - 1 >= lo;  // warp-uniform
        const unsigned char* st = stages + (q % kStages) * G::kStageBytes;
        // K piece i of n-tile n and V piece i of row jj of this lane, read from the stage.
        auto k_at = [&](int n, int i) {
          const int row = n * 8 + g;
          return *reinterpret_cast<const uint4*>(st + row * G::kRowBytes +
                                                 StagedPiece<false>(row, i * 4 + t) * 16);
        };
        auto v_at = [&](int jj, int i) {
          const int j = key_row(jj);
          return *reinterpret_cast<const VVec*>(st + kChunk * G::kRowBytes + j * G::kRowBytes +
                                                StagedPiece<true>(j, i * 8 + g) * 16);
        };
        // Validity and scales of this lane's key jj (rows past the context may hold any bits).
        auto fill_meta = [&](ChunkRegs& r, int jj) {
          const float* scales = reinterpret_cast<const float*>(st + 2 * kChunk * G::kRowBytes);
          const int j = key_row(jj);
          r.valid[jj] = key0 + j >= lo && key0 + j <= hi;
          r.k_scale[jj] = 1.0f;
          r.v_scale[jj] = 1.0f;
          if constexpr (kQuant) {
            r.k_scale[jj] = r.valid[jj] ? scales[j] : 0.0f;
            r.v_scale[jj] = r.valid[jj] ? scales[kChunk + j] : 0.0f;
          }
        };
        // The chunk's K rows, then per key its V rows, validity and scales, into registers.
        auto fill_kv = [&](ChunkRegs& r) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int i = 0; i < G::kKPieces; ++i) r.k[n][i] = k_at(n, i);
          }
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
            for (int i = 0; i < G::kVPieces; ++i) r.v[jj][i] = v_at(jj, i);
            fill_meta(r, jj);
          }
        };
        if constexpr (kRefillFirst) {
          // K and V fragments read from the stage as each mma needs them (registers: O and one
          // step's fragments); each half refilled with the next chunk's rows once read.
          ChunkRegs r;
          uint32_t a[4];
          if (attended) {
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) fill_meta(r, jj);
            scores(r, a, k_at);
          }
          __syncwarp();  // every lane is done with the K rows before they are refilled
          issue_part.template operator()<true, false>(q + 1);
          CpAsyncCommit();
          CpAsyncWait<1>();  // chunk q's V rows (the next chunk's K rows may stay in flight)
          __syncwarp();
          if (attended) accumulate(a, v_at);
          __syncwarp();  // every lane is done with the V rows before they are refilled
          issue_part.template operator()<false, true>(q + 1);
          CpAsyncCommit();
        } else {
          if (attended) {
            ChunkRegs r;
            fill_kv(r);
            compute(r);
          }
          __syncwarp();  // every lane is done with the stage before it is refilled
          issue(q + kStages);
          CpAsyncCommit();
        }
      }
    } else {
#pragma unroll 1
      for (int c = 0; c < kChunksPerWarp; ++c) {
        const int chunk = warp * kChunksPerWarp + c;
        const int key0 = split_begin + chunk * kChunk;
        if (key0 > hi || key0 + kChunk - 1 < lo) continue;  // warp-uniform
        if (prefetch_ahead > 0 && lane == 0) {
          // The warp's chunk prefetch_ahead places on in the block's ring (q = si *
          // kChunksPerWarp + c, as the staged path numbers it), or at a split's start every
          // chunk up to there, asked of L2 while this one is loaded and computed.
          const int q = si * kChunksPerWarp + c;
          for (int qa = c == 0 ? q + 1 : q + prefetch_ahead;
               qa <= q + prefetch_ahead && qa < n_block_splits * kChunksPerWarp; ++qa) {
            prefetch_chunk(qa);
          }
        }
        ChunkRegs r;
        load(chunk, r);
        compute(r);
      }
    }
    if constexpr (kQuant) {
#pragma unroll
      for (int n = 0; n < G::kDimTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= v_units;
      }
    }

    // This warp's rows into shared memory (the row sums quad-reduced), then the warps merged in
    // a fixed order into the split's (m, l, acc) rows, as DecodeSplitKernel writes them. A warp
    // that saw no key has m = -inf, l = 0, acc = 0 and contributes exactly nothing. The merge
    // buffer lies beside the staging ring, whose copies for the next split stay in flight; there
    // its rows are padded (PaddedCol) so that these stores do not conflict.
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      float l = l_run[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = g + 8 * h;
      if (row >= group) continue;
      if (t == 0) {
        s_m[warp][row] = m_run[h];
        s_l[warp][row] = l;
      }
#pragma unroll
      for (int n = 0; n < G::kDimTiles; ++n) {
        const int i = n / G::kVE;
        const int e = n % G::kVE;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int col = (i * 8 + 2 * t + cc) * G::kVE + e;
          s_o[(warp * kMergeRows + row) * G::kMergeRowFloats +
              (G::kPaddedMerge ? PaddedCol(col) : col)] = o[n][2 * h + cc];
        }
      }
    }
    __syncthreads();
    const int64_t row_base = (int64_t{seq} * p.n_heads + head0) * n_splits + split0 + si;
    MergeWarpPartials<kWarps, kMergeRows, D, kThreads, G::kPaddedMerge>(
        s_o, s_m, s_l, group, row_base, n_splits, part_o, part_m, part_l);
    __syncthreads();  // the merge buffer is read before the next split writes it
  }
  if constexpr (kStaged) CpAsyncWait<0>();
}

// Splits per block: the largest of 1, 2, 4, 8 that still leaves at least 4 waves of blocks on
// the GPU with the last wave at least 90 % full (a block of S splits runs S times as long, so a
// partial last wave costs more). The value changes which block computes a split, never how:
// each split's partial is the same bits whatever it is (so it may depend on the batch).
// SetDecodeSplitsPerBlock / KESTREL_DECODE_SPLITS_PER_BLOCK (1..8) force it (tuning, tests).
EnvSetting g_splits_per_block{"KESTREL_DECODE_SPLITS_PER_BLOCK", [](const char* env) {
  const int e = env != nullptr ? std::atoi(env) : 0;
  return e >= 1 && e <= kMaxSplitsPerBlock ? e : 0;
}};

int SplitsPerBlock(int32_t n_seqs, int32_t n_kv_heads, int32_t n_splits, int max_per_block) {
  const int forced = DecodeSplitsPerBlock();
  if (forced > 0) return std::min(forced, max_per_block);
  const int64_t slots = int64_t{CurrentDeviceSmCount()} * kMinBlocksPerSm;
  const int64_t heads = int64_t{n_seqs} * n_kv_heads;
  int best = 1;
  for (int s = 2; s <= max_per_block && s <= n_splits; s *= 2) {
    const int64_t blocks = heads * ((n_splits + s - 1) / s);
    const int64_t waves = (blocks + slots - 1) / slots;
    if (blocks >= 4 * slots && blocks * 10 >= waves * slots * 9) best = s;
  }
  return best;
}

// Chunks of the register-loaded path asked of L2 ahead of their loads (prefetch_chunk; 0 = none)
// when DecodePrefetchAhead() is -1. Measured on the H200 (bench_cuda_kernels --only
// attention_decode, bf16 cache, µs for 0 / 1 / 2 chunks ahead): head_dim 128, 32 heads over 8,
// 64 x 2k 188.5 / 172.5 / 206.5, 64 x 8k 658.1 / 606.7 / 843.5, 1 x 2k 16.9 / 15.3 / 16.1;
// head_dim 256 (2 blocks per SM), 24 heads over 4, 64 x 2k 193.8 / 218.9 / 237.6, 64 x 8k
// 709.2 / 746.4 / 972.3. One chunk ahead at head_dim 128 (3 blocks per SM); none at 256, whose
// 8 warps per SM already keep 128 KB of loads in flight, and at 64 (not measured).
template <int D>
inline constexpr int kDefaultPrefetchAhead = D == 128 ? 1 : 0;
EnvSetting g_prefetch_ahead{"KESTREL_DECODE_PREFETCH_AHEAD", [](const char* env) {
  const int e = env != nullptr && *env != '\0' ? std::atoi(env) : -1;
  return e >= 0 && e <= 3 ? e : -1;
}};

template <int D>
int PrefetchAhead() {
  const int v = DecodePrefetchAhead();
  return v >= 0 ? v : kDefaultPrefetchAhead<D>;
}

template <int D, KvCacheType KV, int kSplit>
void Launch(const PagedAttentionParams& p, int32_t n_splits, int32_t group, float* part_o,
            float* part_m, float* part_l, cudaStream_t stream) {
  const int32_t per_block =
      SplitsPerBlock(p.n_seqs, p.n_kv_heads, n_splits, MaxSplitsPerBlock(kSplit));
  const dim3 grid(p.n_seqs, p.n_kv_heads, (n_splits + per_block - 1) / per_block);
  KCHECK(grid.y <= 65535 && grid.z <= 65535);
  auto go = [&]<bool kTop>() {
    constexpr size_t kSmem = MmaGeometry<D, KV>::SmemBytes(kTop);
    auto* kernel = &DecodeSplitMmaKernel<D, KV, kTop, kSplit>;
    if constexpr (kSmem > 48 * 1024) {
      // Once per instantiation (not a stream operation: fine under graph capture).
      static const bool raised = [&] {
        KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem)));
        return true;
      }();
      (void)raised;
    }
    LaunchPdl(kernel, grid, dim3(kThreads), kSmem, stream, p, n_splits, per_block, group,
              PrefetchAhead<D>(), part_o, part_m, part_l);
  };
  if (group <= 8) {
    go.template operator()<true>();
  } else {
    go.template operator()<false>();
  }
}

}  // namespace

// The quantized caches at head_dim 128 take splits of 512 positions: each split
// writes a partial of group x head_dim floats and ends in a cross-warp merge, which on a cache of
// one byte per element weigh twice what they do on bf16. Measured on the H200
// (bench_cuda_kernels --only attention_decode --kv-cache-dtype fp8, 32 heads over 8, µs for
// splits of 256 / 512 / 1024): 64 x 8k 338.6 / 310.0 / 295.3, 64 x 2k 102.8 / 93.6 / 92.3,
// 16 x 32k 359.1 / 319.4 / 299.4, 1 x 8k 19.5 / 17.7 / 21.5, 1 x 2k 12.9 / 14.8 / 20.5 (int8
// alike). 1024 would cost a batch of one 7 µs per layer at 2k (fewer blocks than SMs); 512
// costs it 2 µs there and gains at 8k. A constant of the cache type and head dim, never of the
// batch (batch invariance).
constexpr int kLongSplitTokens = 512;

int32_t DecodeSplitMmaTokens(const PagedAttentionParams& p) {
  const bool long_splits = p.head_dim == 128 && KvCacheQuantized(p.kv_type);
  return long_splits ? kLongSplitTokens : kDecodeSplitTokens;
}

bool DecodeSplitMmaSupported(const PagedAttentionParams& p) {
  const int32_t group = p.n_heads / p.n_kv_heads;
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && group <= kMaxGroup;
}

void LaunchDecodeSplitMma(const PagedAttentionParams& p, int32_t n_splits, float* part_o,
                          float* part_m, float* part_l, cudaStream_t stream) {
  KCHECK(DecodeSplitMmaSupported(p));
  const int32_t group = p.n_heads / p.n_kv_heads;
  const int32_t split_tokens = DecodeSplitMmaTokens(p);
  auto by_split = [&]<int D, KvCacheType KV>() {
    if constexpr (MmaGeometry<D, KV>::kLongSplits) {
      KCHECK(split_tokens == kLongSplitTokens);
      Launch<D, KV, kLongSplitTokens>(p, n_splits, group, part_o, part_m, part_l, stream);
    } else {
      KCHECK(split_tokens == kDecodeSplitTokens);
      Launch<D, KV, kDecodeSplitTokens>(p, n_splits, group, part_o, part_m, part_l, stream);
    }
  };
  auto by_type = [&]<int D>() {
    switch (p.kv_type) {
      case KvCacheType::kFp8:
        by_split.template operator()<D, KvCacheType::kFp8>();
        break;
      case KvCacheType::kInt8:
        by_split.template operator()<D, KvCacheType::kInt8>();
        break;
      default:
        by_split.template operator()<D, KvCacheType::kBf16>();
        break;
    }
  };
  if (p.head_dim == 64) {
    by_type.template operator()<64>();
  } else if (p.head_dim == 128) {
    by_type.template operator()<128>();
  } else {
    by_type.template operator()<256>();
  }
}

}  // namespace kestrel::cuda::detail

namespace kestrel::cuda {

void SetDecodeSplitsPerBlock(int n) {
  KCHECK(n >= 0 && n <= detail::kMaxSplitsPerBlock);
  detail::g_splits_per_block.Set(n);
}

void SetDecodePrefetchAhead(int n) {
  KCHECK(n >= -1 && n <= 3);
  detail::g_prefetch_ahead.Set(n);
}

int DecodePrefetchAhead() {
  return detail::g_prefetch_ahead.Get();
}

int DecodeSplitsPerBlock() {
  return detail::g_splits_per_block.Get();
}

}  // namespace kestrel::cuda
