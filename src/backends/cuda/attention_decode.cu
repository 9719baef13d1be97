// Decode path of PagedAttention (max_query_len == 1): split-K flash-decoding on CUDA cores,
// plus the PagedAttention entry point that picks the path.
//
// Why CUDA cores: a decode token has one query row per head, so q.k is a matrix-vector product
// with G = n_heads / n_kv_heads FMAs per loaded K/V element (G heads of a GQA group share each
// row). At 4.3 TB/s that is ~2.2 G bf16 elements/s, so G <= 8 needs well under half the f32
// FMA rate; the kernel only has to keep enough 16-byte loads in flight.
//
// Kernel 1 (DecodeSplitKernel), grid (seq, kv head x head chunk, split), 4 warps:
//   each split is the fixed position range [split * 256, split * 256 + 256) intersected with
//   the token's window [first, pos]. A key is read by D/8 consecutive lanes (8 dims = 16 bytes
//   each), so a warp reads 256/D keys per load instruction; each such lane group is a "stream"
//   that keeps its own online-softmax state (max m, sum l, unnormalised acc) for the HPB heads
//   of the block, so no cross-lane max is needed per key. Streams are merged at the end (warp
//   shuffles, then shared memory across warps) and the split writes (m, l, acc) in f32.
// Variants of kernel 1 (SetDecodeAttentionVariant, same split geometry and results within
// rounding; each is deterministic and batch invariant): "cp_async_sN" (DecodeSplitPipelinedKernel)
// gathers the split's K/V rows into shared memory with cp.async, N tiles of 16 KB in flight per
// block, and computes from there; "registers" (DecodeSplitKernel) loads straight into registers;
// "registers_db" also issues the next iteration's loads before the current one's math;
// "tensor_cores" (attention_decode_mma.cu, the default where it applies) runs the GQA group's
// heads as the rows of tensor-core mma; on a quantized cache at head_dim 128 its splits span 512
// positions (DecodeSplitMmaTokens), the others' 256.
// A quantized cache (kv_cache.h) runs DecodeSplitKernel with 8-byte loads of 8 codes per lane and
// twice the keys per iteration (the same bytes in flight); a key's score is its f32 dot product
// with the codes times the K row's scale, and p times the V row's scale weights its codes.
// Kernel 2 (DecodeCombineKernel), grid (seq, head): merges the splits that intersect
//   [first, pos] in ascending order (log-sum-exp) and writes bf16. Splits outside that range
//   are never written nor read, so the result depends only on the sequence's own context.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention.h"
#include "backends/cuda/attention_internal.h"
#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_cache.cuh"
#include "backends/cuda/pdl.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
// A block_size multiple of 16 keeps every 16-position chunk inside one physical block, so one
// block-table look-up per chunk gives 16 contiguous rows.
constexpr int kChunkRows = 16;
constexpr int kChunksPerSplit = kDecodeSplitTokens / kChunkRows;
static_assert(kDecodeSplitTokens % kChunkRows == 0);
static_assert(kChunksPerSplit <= kThreads);

int32_t NumSplits(int32_t max_context_len, int32_t split_tokens = kDecodeSplitTokens) {
  return (max_context_len + split_tokens - 1) / split_tokens;
}

// Split-kernel variants (SetDecodeAttentionVariant); the combine is shared.
enum DecodeVariant : int {
  kVariantPipelined4 = 0,  // cp.async into shared memory, 4 tiles in flight per block
  kVariantPipelined8 = 1,  // 8 tiles (the whole split for head_dim 128)
  kVariantPipelined2 = 2,  // 2 tiles: less shared memory, more blocks per SM
  kVariantRegisters = 3,   // loads straight into registers (the original kernel)
  kVariantRegistersDb = 4,  // the same, next iteration's loads issued before this one's math
  kVariantTensorCores = 5,  // the GQA group's heads as mma rows (attention_decode_mma.cu)
  kVariantCount = 6,
};
constexpr const char* kVariantNames[kVariantCount] = {
    "cp_async_s4", "cp_async_s8", "cp_async_s2", "registers", "registers_db", "tensor_cores"};
// Default: "tensor_cores" where it applies (head_dim 64, 128 or 256, groups of up to 16 heads),
// else "registers" (before it, the fastest on the H200 at every batch x context of
// bench_cuda_kernels, e.g. 64 x 2048: 181 us vs 213-461 us for the cp.async variants).
std::atomic<int> g_decode_variant{kVariantTensorCores};

// 8 bf16 (one 16-byte load) to f32: a bf16 is the high half of an f32, first element low.
__device__ __forceinline__ void Bf16x8ToF32(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// A lane's 8 elements of a K or V row as loaded: 16 bytes of bf16 or 8 bytes of codes.
template <KvCacheType KV>
using KvRaw = std::conditional_t<KV == KvCacheType::kBf16, uint4, uint2>;
template <KvCacheType KV>
using KvElem = std::conditional_t<KV == KvCacheType::kBf16, __nv_bfloat16, uint8_t>;

template <KvCacheType KV>
__device__ __forceinline__ KvRaw<KV> ZeroRaw() {
  if constexpr (KV == KvCacheType::kBf16) {
    return make_uint4(0, 0, 0, 0);
  } else {
    return make_uint2(0, 0);
  }
}

template <KvCacheType KV>
__device__ __forceinline__ void KvToF32(const KvRaw<KV>& raw, float (&f)[8]) {
  if constexpr (KV == KvCacheType::kBf16) {
    Bf16x8ToF32(raw, f);
  } else {
    DecodeKv8<KV>(raw, f);
  }
}

// First position a token at `pos` attends (cpu::PagedAttention's `first`).
__device__ __forceinline__ int FirstPosition(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// Scores of kUnroll keys (K rows already in registers, 8 elements per lane) against the HPB
// heads, reduced over the key's D/8 lanes (times the row's scale k_scale[u] for a quantized
// cache); -inf for invalid keys.
template <int D, int HPB, int kUnroll, KvCacheType KV = KvCacheType::kBf16>
__device__ __forceinline__ void KeyScores(const float (&q)[HPB][8],
                                          const KvRaw<KV> (&k_raw)[kUnroll],
                                          const float (&k_scale)[kUnroll],
                                          const bool (&valid)[kUnroll],
                                          float (&score)[kUnroll][HPB]) {
  constexpr int kLanesPerKey = D / 8;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float k[8];
    KvToF32<KV>(k_raw[u], k);
#pragma unroll
    for (int g = 0; g < HPB; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s = fmaf(q[g][i], k[i], s);
      // Sum over the key's D/8 lanes (an aligned power-of-two group: xor stays inside it).
#pragma unroll
      for (int offset = kLanesPerKey / 2; offset > 0; offset /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, offset);
      }
      if constexpr (KV != KvCacheType::kBf16) s *= k_scale[u];
      score[u][g] = valid[u] ? s : -INFINITY;
    }
  }
}

// Online-softmax rescale of (m, l, acc) for a group of kUnroll scores; m_use is the max to
// subtract from them.
template <int HPB, int kUnroll>
__device__ __forceinline__ void Rescale(const float (&score)[kUnroll][HPB], float (&m)[HPB],
                                        float (&l)[HPB], float (&acc)[HPB][8],
                                        float (&m_use)[HPB]) {
#pragma unroll
  for (int g = 0; g < HPB; ++g) {
    float m_new = m[g];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, score[u][g]);
    m_use[g] = SafeMax(m_new);
    const float alpha = exp2f(m[g] - m_use[g]);
    m[g] = m_new;
    l[g] *= alpha;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
  }
}

// acc += p * v for one key (V piece in registers; zeros for an invalid key, whose p is 0); for a
// quantized cache v is the codes and p is weighted by the row's scale v_scale.
template <int HPB, KvCacheType KV = KvCacheType::kBf16>
__device__ __forceinline__ void AccumulateValue(const KvRaw<KV>& v_raw, float v_scale,
                                                const float (&score)[HPB],
                                                const float (&m_use)[HPB], float (&l)[HPB],
                                                float (&acc)[HPB][8]) {
  float v[8];
  KvToF32<KV>(v_raw, v);
#pragma unroll
  for (int g = 0; g < HPB; ++g) {
    const float pr = exp2f(score[g] - m_use[g]);
    l[g] += pr;
    float pv = pr;
    if constexpr (KV != KvCacheType::kBf16) pv *= v_scale;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pv, v[i], acc[g][i]);
  }
}

// Merges the streams of the block (warp shuffles, then s_o [kWarps][HPB][D] in shared memory
// across warps, in a fixed order) and writes the split's (m, l, acc) rows.
template <int D, int HPB>
__device__ __forceinline__ void MergeAndStore(float (&m)[HPB], float (&l)[HPB],
                                              float (&acc)[HPB][8], float* s_o,
                                              float (&s_m)[kWarps][HPB],
                                              float (&s_l)[kWarps][HPB], int64_t row_base,
                                              int32_t n_splits, float* __restrict__ part_o,
                                              float* __restrict__ part_m,
                                              float* __restrict__ part_l) {
  constexpr int kLanesPerKey = D / 8;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int dim_lane = lane % kLanesPerKey;
  // Merge the streams of this warp: lanes xor kLanesPerKey, 2 kLanesPerKey, ... hold the same
  // dims of other streams.
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < HPB; ++g) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[g], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[g], offset);
      const float m_new = fmaxf(m[g], m_other);
      const float f_self = exp2f(m[g] - SafeMax(m_new));
      const float f_other = exp2f(m_other - SafeMax(m_new));
      m[g] = m_new;
      l[g] = l[g] * f_self + l_other * f_other;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float a_other = __shfl_xor_sync(0xffffffffu, acc[g][i], offset);
        acc[g][i] = acc[g][i] * f_self + a_other * f_other;
      }
    }
  }
  if (lane < kLanesPerKey) {
#pragma unroll
    for (int g = 0; g < HPB; ++g) {
#pragma unroll
      for (int i = 0; i < 8; ++i) s_o[(warp * HPB + g) * D + dim_lane * 8 + i] = acc[g][i];
      if (dim_lane == 0) {
        s_m[warp][g] = m[g];
        s_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();

  MergeWarpPartials<kWarps, HPB, D, kThreads>(s_o, s_m, s_l, HPB, row_base, n_splits, part_o,
                                              part_m, part_l);
}

// Loads q of HPB heads (this lane's 8 dims), pre-scaled by scale * log2(e) so scores are in
// log2 units for exp2f.
template <int D, int HPB>
__device__ __forceinline__ void LoadQ(const PagedAttentionParams& p, int token, int head0,
                                      int dim_lane, float (&q)[HPB][8]) {
  const float q_scale = p.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < HPB; ++g) {
    const __nv_bfloat16* qg = p.q + (int64_t{token} * p.n_heads + head0 + g) * D + dim_lane * 8;
    Bf16x8ToF32(__ldg(reinterpret_cast<const uint4*>(qg)), q[g]);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] *= q_scale;
  }
}

// Variant "registers": one (sequence, kv head, head chunk, split): the split's partial softmax
// state for HPB heads, K/V loaded straight into registers (2 x kUnroll loads per thread).
// Variant "registers_db" (kDoubleBuffer): the same, with the next iteration's K/V loads issued
// before this iteration's math, so a thread keeps 4 x kUnroll loads in flight and the FMAs hide
// under them. Identical arithmetic in the identical order: the two give the same bits.
//   part_o [n_tokens, n_heads, n_splits, D]  sum_j exp2(s_j - m) * v_j over the split's keys
//   part_m, part_l [n_tokens, n_heads, n_splits]  m = max_j s_j (log2 units), l = sum exp2(s_j - m)
// Launched with PDL (pdl.cuh): waits before anything else.
template <int D, int HPB, bool kDoubleBuffer, KvCacheType KV>
__global__ void __launch_bounds__(kThreads)
    DecodeSplitKernel(const PagedAttentionParams p, int32_t n_splits, int32_t n_head_chunks,
                      float* __restrict__ part_o, float* __restrict__ part_m,
                      float* __restrict__ part_l) {
  PdlWait();
  PdlLaunchDependents();
  constexpr int kLanesPerKey = D / 8;
  constexpr int kKeysPerWarp = 32 / kLanesPerKey;
  constexpr int kStreams = kWarps * kKeysPerWarp;
  // Keys per stream per iteration: 2 x kUnroll independent 16-byte loads in flight per thread;
  // fewer for 8 heads, whose q and acc already take 128 registers. Twice the keys for a
  // quantized cache, whose loads are 8 bytes.
  constexpr bool kQuantized = KV != KvCacheType::kBf16;
  constexpr int kUnroll = (HPB >= 8 ? 2 : 4) * (kQuantized ? 2 : 1);
  using Raw = KvRaw<KV>;

  __shared__ int64_t s_chunk_offset[kChunksPerSplit];  // element offset of each chunk's row 0
  __shared__ float s_o[kWarps * HPB * D];
  __shared__ float s_m[kWarps][HPB];
  __shared__ float s_l[kWarps][HPB];

  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y / n_head_chunks;
  const int head0 = kv_head * (p.n_heads / p.n_kv_heads) + (blockIdx.y % n_head_chunks) * HPB;
  const int split = blockIdx.z;
  const int token = DecodeToken(p, seq);
  if (token < 0) return;
  const int pos = p.positions[token];
  const int split_begin = split * kDecodeSplitTokens;
  const int lo = max(FirstPosition(pos, p.sliding_window), split_begin);
  const int hi = min(pos, split_begin + kDecodeSplitTokens - 1);
  if (lo > hi) return;  // the combine reads only splits that intersect [first, pos]

  if (threadIdx.x < kChunksPerSplit) {
    const int chunk_begin = split_begin + static_cast<int>(threadIdx.x) * kChunkRows;
    int64_t offset = 0;
    // Only chunks holding attended keys: table entries past the context may be garbage.
    if (chunk_begin <= hi && chunk_begin + kChunkRows > lo) {
      const int32_t block =
          p.block_tables[int64_t{seq} * p.max_blocks_per_seq + chunk_begin / p.block_size];
      offset =
          ((int64_t{block} * p.n_kv_heads + kv_head) * p.block_size + chunk_begin % p.block_size) *
          D;
    }
    s_chunk_offset[threadIdx.x] = offset;
  }

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int dim_lane = lane % kLanesPerKey;  // this lane's dims: [dim_lane * 8, dim_lane * 8 + 8)
  const int stream = warp * kKeysPerWarp + lane / kLanesPerKey;

  float q[HPB][8];
  LoadQ<D, HPB>(p, token, head0, dim_lane, q);
  float m[HPB], l[HPB], acc[HPB][8];
#pragma unroll
  for (int g = 0; g < HPB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }
  __syncthreads();  // s_chunk_offset

  const int n_keys = hi - lo + 1;
  const KvElem<KV>* k_base = static_cast<const KvElem<KV>*>(p.k_cache) + dim_lane * 8;
  const KvElem<KV>* v_base = static_cast<const KvElem<KV>*>(p.v_cache) + dim_lane * 8;
  // One iteration's keys: consecutive streams read consecutive positions, so a warp's load is
  // contiguous rows. Zeros for keys past the split: p = 0 must not meet a NaN from unwritten
  // cache rows. A quantized row's scales sit at its element offset / D.
  auto load = [&](int base, Raw (&k_raw)[kUnroll], Raw (&v_raw)[kUnroll],
                  float (&k_scale)[kUnroll], float (&v_scale)[kUnroll], bool (&valid)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kStreams + stream;
      valid[u] = j < n_keys;
      k_raw[u] = ZeroRaw<KV>();
      v_raw[u] = ZeroRaw<KV>();
      k_scale[u] = 0.0f;
      v_scale[u] = 0.0f;
      if (valid[u]) {
        const int key_pos = lo + j;
        const int64_t offset =
            s_chunk_offset[(key_pos - split_begin) / kChunkRows] + (key_pos % kChunkRows) * D;
        k_raw[u] = __ldg(reinterpret_cast<const Raw*>(k_base + offset));
        v_raw[u] = __ldg(reinterpret_cast<const Raw*>(v_base + offset));
        if constexpr (kQuantized) {
          k_scale[u] = __ldg(p.k_scale + offset / D);
          v_scale[u] = __ldg(p.v_scale + offset / D);
        }
      }
    }
  };
  auto consume = [&](const Raw (&k_raw)[kUnroll], const Raw (&v_raw)[kUnroll],
                     const float (&k_scale)[kUnroll], const float (&v_scale)[kUnroll],
                     const bool (&valid)[kUnroll]) {
    float score[kUnroll][HPB];
    KeyScores<D, HPB, kUnroll, KV>(q, k_raw, k_scale, valid, score);
    float m_use[HPB];
    Rescale<HPB, kUnroll>(score, m, l, acc, m_use);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      AccumulateValue<HPB, KV>(v_raw[u], v_scale[u], score[u], m_use, l, acc);
    }
  };
  constexpr int kStep = kStreams * kUnroll;
  Raw k_raw[kUnroll], v_raw[kUnroll];
  float k_scale[kUnroll], v_scale[kUnroll];
  bool valid[kUnroll];
  if constexpr (kDoubleBuffer) {
    load(0, k_raw, v_raw, k_scale, v_scale, valid);
    for (int base = 0; base < n_keys; base += kStep) {
      Raw k_next[kUnroll], v_next[kUnroll];
      float k_scale_next[kUnroll], v_scale_next[kUnroll];
      bool valid_next[kUnroll];
      // Past n_keys: no loads, all invalid.
      load(base + kStep, k_next, v_next, k_scale_next, v_scale_next, valid_next);
      consume(k_raw, v_raw, k_scale, v_scale, valid);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        k_raw[u] = k_next[u];
        v_raw[u] = v_next[u];
        k_scale[u] = k_scale_next[u];
        v_scale[u] = v_scale_next[u];
        valid[u] = valid_next[u];
      }
    }
  } else {
    for (int base = 0; base < n_keys; base += kStep) {
      load(base, k_raw, v_raw, k_scale, v_scale, valid);
      consume(k_raw, v_raw, k_scale, v_scale, valid);
    }
  }
  const int64_t row_base = (int64_t{seq} * p.n_heads + head0) * n_splits + split;
  MergeAndStore<D, HPB>(m, l, acc, s_o, s_m, s_l, row_base, n_splits, part_o, part_m, part_l);
}

// Geometry of the pipelined kernel: a tile is kUnroll keys per stream (kWarps * 256 / D
// streams), kStagesWanted tiles in flight (capped at the split's tiles); shared memory holds
// kStages x (K tile, V tile) bf16, reused at the end for the cross-warp merge.
template <int D, int HPB, int kStagesWanted>
struct PipelinedGeometry {
  static constexpr int kLanesPerKey = D / 8;
  static constexpr int kKeysPerWarp = 32 / kLanesPerKey;
  static constexpr int kStreams = kWarps * kKeysPerWarp;
  static constexpr int kUnroll = HPB >= 8 ? 2 : 4;
  static constexpr int kTile = kStreams * kUnroll;  // keys
  static constexpr int kTilesPerSplit = kDecodeSplitTokens / kTile;
  static constexpr int kStages = kStagesWanted < kTilesPerSplit ? kStagesWanted : kTilesPerSplit;
  static constexpr int kTileElems = kTile * D;  // of K (or V)
  static constexpr int kPieces = 2 * kTileElems / 8;  // 16-byte copies per tile (K and V)
  static constexpr size_t kPipeBytes = size_t{kStages} * 2 * kTileElems * 2;
  static constexpr size_t kMergeBytes = size_t{kWarps} * HPB * D * sizeof(float);
  static constexpr size_t kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  static_assert((kTile % kChunkRows == 0 || kChunkRows % kTile == 0) &&
                kDecodeSplitTokens % kTile == 0);
  static_assert(kPieces % kThreads == 0);
};

// Variant "cp_async_sN": the same split as DecodeSplitKernel, with K/V gathered into shared
// memory by cp.async, N tiles (of 16 KB, 8 KB for 8 heads) in flight per block, so a block keeps
// up to N x 16 KB of loads outstanding without holding them in registers. The block-table
// look-ups are issued before the position is known (in parallel with seq_starts -> positions).
template <int D, int HPB, int kStagesWanted>
__global__ void __launch_bounds__(kThreads)
    DecodeSplitPipelinedKernel(const PagedAttentionParams p, int32_t n_splits,
                               int32_t n_head_chunks, float* __restrict__ part_o,
                               float* __restrict__ part_m, float* __restrict__ part_l) {
  PdlWait();  // launched with PDL (pdl.cuh)
  PdlLaunchDependents();
  using G = PipelinedGeometry<D, HPB, kStagesWanted>;
  constexpr int kLanesPerKey = G::kLanesPerKey;
  constexpr int kUnroll = G::kUnroll;
  constexpr int kTile = G::kTile;
  constexpr int kStages = G::kStages;
  constexpr int kTileElems = G::kTileElems;

  extern __shared__ uint4 s_raw[];
  __nv_bfloat16* s_kv = reinterpret_cast<__nv_bfloat16*>(s_raw);  // [kStages][2][kTile][D]
  __shared__ int64_t s_chunk_offset[kChunksPerSplit];  // of each chunk's row 0; -1: not read
  __shared__ float s_m[kWarps][HPB];
  __shared__ float s_l[kWarps][HPB];

  const int tid = threadIdx.x;
  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y / n_head_chunks;
  const int head0 = kv_head * (p.n_heads / p.n_kv_heads) + (blockIdx.y % n_head_chunks) * HPB;
  const int split = blockIdx.z;
  const int split_begin = split * kDecodeSplitTokens;
  // Speculative table look-up (in bounds; the entry is used only if the chunk is attended).
  const int chunk_begin = split_begin + tid * kChunkRows;
  int32_t block = 0;
  if (tid < kChunksPerSplit && chunk_begin / p.block_size < p.max_blocks_per_seq) {
    block = __ldg(p.block_tables + int64_t{seq} * p.max_blocks_per_seq + chunk_begin / p.block_size);
  }
  const int token = DecodeToken(p, seq);
  if (token < 0) return;
  const int pos = p.positions[token];
  const int lo = max(FirstPosition(pos, p.sliding_window), split_begin);
  const int hi = min(pos, split_begin + kDecodeSplitTokens - 1);
  if (lo > hi) return;  // the combine reads only splits that intersect [first, pos]

  if (tid < kChunksPerSplit) {
    int64_t offset = -1;
    // Only chunks holding attended keys: table entries past the context may be garbage.
    if (chunk_begin <= hi && chunk_begin + kChunkRows > lo) {
      offset =
          ((int64_t{block} * p.n_kv_heads + kv_head) * p.block_size + chunk_begin % p.block_size) *
          D;
    }
    s_chunk_offset[tid] = offset;
  }

  const int lane = tid % 32;
  const int warp = tid / 32;
  const int dim_lane = lane % kLanesPerKey;
  const int stream = warp * G::kKeysPerWarp + lane / kLanesPerKey;

  float q[HPB][8];
  LoadQ<D, HPB>(p, token, head0, dim_lane, q);
  float m[HPB], l[HPB], acc[HPB][8];
#pragma unroll
  for (int g = 0; g < HPB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }
  __syncthreads();  // s_chunk_offset

  // Tile t covers split positions [t * kTile, t * kTile + kTile) (whole 16-row chunks, or a part
  // of one): every row of an attended chunk is copied (rows outside [lo, hi] lie in allocated
  // blocks, and are masked below).
  auto issue = [&](int t, int slot) {
    __nv_bfloat16* dst = s_kv + slot * 2 * kTileElems;
#pragma unroll
    for (int it = 0; it < G::kPieces / kThreads; ++it) {
      const int i = it * kThreads + tid;
      const int kv = i / (kTileElems / 8);
      const int r = i % (kTileElems / 8);
      const int row = r / (D / 8);
      const int piece = r % (D / 8);
      const int split_row = t * kTile + row;
      const int64_t offset = s_chunk_offset[split_row / kChunkRows];
      if (offset >= 0) {
        const __nv_bfloat16* src =
            static_cast<const __nv_bfloat16*>(kv == 0 ? p.k_cache : p.v_cache) + offset +
            (split_row % kChunkRows) * D + piece * 8;
        CpAsync16(dst + kv * kTileElems + row * D + piece * 8, src);
      }
    }
  };
  const int t_lo = (lo - split_begin) / kTile;
  const int t_hi = (hi - split_begin) / kTile;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (t_lo + s <= t_hi) issue(t_lo + s, s);
    CpAsyncCommit();
  }
  for (int t = t_lo; t <= t_hi; ++t) {
    const int slot = (t - t_lo) % kStages;
    CpAsyncWait<kStages - 1>();  // tile t's group (the oldest outstanding) has landed
    __syncthreads();             // ... for every thread's copies
    const __nv_bfloat16* sk = s_kv + slot * 2 * kTileElems + dim_lane * 8;
    const __nv_bfloat16* sv = sk + kTileElems;
    uint4 k_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = u * G::kStreams + stream;
      const int key_pos = split_begin + t * kTile + j;
      valid[u] = key_pos >= lo && key_pos <= hi;
      k_raw[u] = valid[u] ? *reinterpret_cast<const uint4*>(sk + j * D) : make_uint4(0, 0, 0, 0);
    }
    float score[kUnroll][HPB];
    const float no_scale[kUnroll] = {};  // bf16 only: unused
    KeyScores<D, HPB, kUnroll>(q, k_raw, no_scale, valid, score);
    float m_use[HPB];
    Rescale<HPB, kUnroll>(score, m, l, acc, m_use);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Zeros for masked keys: p = 0 must not meet a NaN from rows outside the context.
      const int j = u * G::kStreams + stream;
      const uint4 v_raw =
          valid[u] ? *reinterpret_cast<const uint4*>(sv + j * D) : make_uint4(0, 0, 0, 0);
      AccumulateValue<HPB>(v_raw, 0.0f, score[u], m_use, l, acc);
    }
    __syncthreads();  // every thread is done with this slot before it is refilled
    if (t + kStages <= t_hi) issue(t + kStages, slot);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();  // only empty groups remain; the buffer is reused for the merge below
  const int64_t row_base = (int64_t{seq} * p.n_heads + head0) * n_splits + split;
  MergeAndStore<D, HPB>(m, l, acc, reinterpret_cast<float*>(s_raw), s_m, s_l, row_base, n_splits,
                        part_o, part_m, part_l);
}

// One (sequence, head), head_dim threads (one per output dim): merges the splits of the
// token's window in ascending order and writes bf16 out. Launched with PDL.
__global__ void DecodeCombineKernel(const PagedAttentionParams p, int32_t n_splits,
                                    int32_t split_tokens, const float* __restrict__ part_o,
                                    const float* __restrict__ part_m,
                                    const float* __restrict__ part_l) {
  PdlWait();  // launched with PDL (pdl.cuh)
  PdlLaunchDependents();
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int d = threadIdx.x;
  const int token = DecodeToken(p, seq);
  if (token < 0) return;
  const int pos = p.positions[token];
  const int split_lo = FirstPosition(pos, p.sliding_window) / split_tokens;
  const int split_hi = pos / split_tokens;
  // A position past max_context_len had no split launched for it: a caller bug, never silent.
  if (split_hi >= n_splits) __trap();
  const int64_t row0 = (int64_t{seq} * p.n_heads + head) * n_splits;
  float m_max = -INFINITY;
#pragma unroll 4
  for (int z = split_lo; z <= split_hi; ++z) m_max = fmaxf(m_max, part_m[row0 + z]);
  float o = 0.0f, l_sum = 0.0f;
#pragma unroll 4
  for (int z = split_lo; z <= split_hi; ++z) {
    const float f = exp2f(part_m[row0 + z] - m_max);
    o += part_o[(row0 + z) * p.head_dim + d] * f;
    l_sum += part_l[row0 + z] * f;
  }
  p.out[(int64_t{token} * p.n_heads + head) * p.head_dim + d] = __float2bfloat16_rn(o / l_sum);
}

void LaunchDecodeAttention(const PagedAttentionParams& p, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  KCHECK(p.max_context_len >= 1);
  KCHECK(workspace != nullptr);
  // Partials: one row per sequence (seq == token in an all-decode batch).
  const int32_t rows = p.n_seqs;
  KCHECK(workspace_bytes >=
         PagedAttentionWorkspaceBytes(rows, p.n_heads, p.head_dim, p.max_context_len));
  const int variant = DecodeAttentionVariant();
  const bool mma = variant == kVariantTensorCores && detail::DecodeSplitMmaSupported(p);
  // Positions per split: the register and cp.async kernels take kDecodeSplitTokens.
  const int32_t split_tokens = mma ? detail::DecodeSplitMmaTokens(p) : kDecodeSplitTokens;
  const int32_t n_splits = NumSplits(p.max_context_len, split_tokens);
  const int32_t group = p.n_heads / p.n_kv_heads;
  // Heads per block: the largest of 8, 4, 2, 1 dividing the group (registers cap it at 8; a
  // group of 16 runs as two chunks, each reading the group's K/V, the second mostly from L2).
  const int32_t hpb = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  const int32_t n_head_chunks = group / hpb;
  const size_t n_rows = static_cast<size_t>(rows) * p.n_heads * n_splits;
  float* part_o = static_cast<float*>(workspace);  // [rows, n_heads, n_splits, D]
  float* part_m = part_o + n_rows * p.head_dim;    // [rows, n_heads, n_splits]
  float* part_l = part_m + n_rows;                 // [rows, n_heads, n_splits]
  const dim3 grid(p.n_seqs, p.n_kv_heads * n_head_chunks, n_splits);
  KCHECK(grid.y <= 65535 && grid.z <= 65535);
  if (mma) {
    detail::LaunchDecodeSplitMma(p, n_splits, part_o, part_m, part_l, stream);
  } else {
  detail::DispatchHeadDim(p.head_dim, [&]<int D>() {
    auto launch = [&]<int HPB>() {
      auto pipelined = [&]<int S>() {
        using G = PipelinedGeometry<D, HPB, S>;
        auto* kernel = &DecodeSplitPipelinedKernel<D, HPB, S>;
        if constexpr (G::kSmemBytes > 48 * 1024) {
          // Once per instantiation (not a stream operation: fine under graph capture).
          static const bool raised = [&] {
            KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(G::kSmemBytes)));
            return true;
          }();
          (void)raised;
        }
        LaunchPdl(kernel, grid, dim3(kThreads), G::kSmemBytes, stream, p, n_splits, n_head_chunks,
                  part_o, part_m, part_l);
      };
      auto registers = [&]<bool kDb, KvCacheType KV>() {
        LaunchPdl(&DecodeSplitKernel<D, HPB, kDb, KV>, grid, dim3(kThreads), 0, stream, p,
                  n_splits, n_head_chunks, part_o, part_m, part_l);
      };
      // A quantized cache: the register kernels only (attention.h).
      if (p.kv_type != KvCacheType::kBf16) {
        const bool db = variant == kVariantRegistersDb;
        if (p.kv_type == KvCacheType::kFp8) {
          db ? registers.template operator()<true, KvCacheType::kFp8>()
             : registers.template operator()<false, KvCacheType::kFp8>();
        } else {
          db ? registers.template operator()<true, KvCacheType::kInt8>()
             : registers.template operator()<false, KvCacheType::kInt8>();
        }
        return;
      }
      switch (variant) {
        case kVariantPipelined4:
          pipelined.template operator()<4>();
          break;
        case kVariantPipelined8:
          pipelined.template operator()<8>();
          break;
        case kVariantPipelined2:
          pipelined.template operator()<2>();
          break;
        case kVariantRegistersDb:
          registers.template operator()<true, KvCacheType::kBf16>();
          break;
        default:
          registers.template operator()<false, KvCacheType::kBf16>();
          break;
      }
    };
    switch (hpb) {
      case 8:
        launch.template operator()<8>();
        break;
      case 4:
        launch.template operator()<4>();
        break;
      case 2:
        launch.template operator()<2>();
        break;
      default:
        launch.template operator()<1>();
        break;
    }
  });
  }
  KCUDA_CHECK_LAUNCH();
  LaunchPdl(&DecodeCombineKernel, dim3(p.n_seqs, p.n_heads), dim3(p.head_dim), 0, stream, p,
            n_splits, split_tokens, static_cast<const float*>(part_o),
            static_cast<const float*>(part_m),
            static_cast<const float*>(part_l));
  KCUDA_CHECK_LAUNCH();
}

bool Aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

}  // namespace

int DecodeAttentionVariantCount() {
  return kVariantCount;
}

const char* DecodeAttentionVariantName(int variant) {
  KCHECK(variant >= 0 && variant < kVariantCount);
  return kVariantNames[variant];
}

void SetDecodeAttentionVariant(int variant) {
  KCHECK(variant >= 0 && variant < kVariantCount);
  g_decode_variant.store(variant, std::memory_order_relaxed);
}

int DecodeAttentionVariant() {
  return g_decode_variant.load(std::memory_order_relaxed);
}

size_t PagedAttentionWorkspaceBytes(int32_t max_tokens, int32_t n_heads, int32_t head_dim,
                                    int32_t max_context_len) {
  KCHECK(max_tokens >= 0 && n_heads >= 0 && head_dim >= 0 && max_context_len >= 0);
  const size_t n_rows = static_cast<size_t>(max_tokens) * n_heads * NumSplits(max_context_len);
  return n_rows * (static_cast<size_t>(head_dim) + 2) * sizeof(float);
}

void PagedAttention(const PagedAttentionParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream) {
  KCHECK_MSG(detail::SupportedHeadDim(p.head_dim), "head_dim must be 16, 32, 64, 128 or 256");
  KCHECK(p.n_kv_heads > 0 && p.n_heads > 0 && p.n_heads % p.n_kv_heads == 0);
  KCHECK_MSG(p.block_size > 0 && p.block_size % 16 == 0, "block_size must be a multiple of 16");
  KCHECK(p.n_tokens >= 0 && p.n_seqs >= 0 && p.sliding_window >= 0);
  if (p.n_tokens == 0 || p.n_seqs == 0) return;
  KCHECK(p.q != nullptr && p.k_cache != nullptr && p.v_cache != nullptr && p.out != nullptr);
  KCHECK(p.positions != nullptr && p.seq_starts != nullptr && p.block_tables != nullptr);
  KCHECK(p.max_blocks_per_seq > 0 && p.max_query_len >= 1);
  // 16-byte vector loads and cp.async of whole rows (rows are head_dim * 2 >= 32 bytes; 8-byte
  // loads of quantized rows of head_dim >= 16 bytes).
  KCHECK(Aligned16(p.q) && Aligned16(p.k_cache) && Aligned16(p.v_cache) && Aligned16(p.out));
  KCHECK(!KvCacheQuantized(p.kv_type) || (p.k_scale != nullptr && p.v_scale != nullptr));
  if (p.max_query_len == 1) {
    LaunchDecodeAttention(p, workspace, workspace_bytes, stream);
  } else {
    if (p.decode_rows_apart) LaunchDecodeAttention(p, workspace, workspace_bytes, stream);
    detail::LaunchPrefillAttention(p, stream);
  }
}

}  // namespace kestrel::cuda
