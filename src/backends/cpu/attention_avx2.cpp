// AVX2/FMA paged attention. Work item = (kv head, tile of up to kTokenTile (32) consecutive tokens
// of one sequence): the `group` query heads that share a kv head and the tile's tokens are
// processed together, so each K and V chunk is brought into L1 once for all of them (prefill: the
// tokens of a tile share almost all their keys; one token per item read every key from L2/L3 again,
// twice the FLOP time at 2k; tiles of 16 tokens were 4-14 % slower than 32 with the AVX-512
// products, 64 gained 1-6 % more at half as many work items). Items are ordered kv-head-major, so
// the contiguous chunks ParallelFor hands out cover whole heads (balanced under causal masking).
// Each output element is computed by one thread in a fixed order that does not depend on the
// tiling: dot products with one 8-lane accumulator and a fixed horizontal sum, softmax with max
// subtraction (vectorised exp, within 2 ulp of expf), then a sequential FMA chain over positions
// for every output element. Keys are taken in chunks of 64 positions (their row pointers gathered
// through the block table once), so that the V chunk stays in L1 while 16 dims x up to 4 heads
// accumulate in registers. bf16 and int8 rows become floats in registers as the two passes load
// them (the values the reference computes: bf16 bits in the upper half, an int8 code times its
// row's scale), with no copy in between. On CPUs with AVX-512 (`avx512`) the products take 512-bit
// registers in functions built for it (KESTREL_AVX512; the rest of this file is AVX2 code): the
// scores hold two query heads' 8-lane accumulators in one register, so every lane runs the AVX2
// chain and the lane sums are the same HorizontalSum8, and the weighted sum's per-element chains do
// not depend on the vector width. Both give the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd_avx2.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps() (`__m512 __Y = __Y;`), which
// -Wmaybe-uninitialized reports in every caller.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kestrel::cpu::avx2 {
namespace {


constexpr int kKeyChunk = 64;  // keys per chunk: 64 K or V rows of head_dim 128 = 32 KB (L1)
constexpr int kMaxSubGroup = 4;  // query heads per register tile
constexpr int kTokenTile = 32;   // tokens of one sequence per work item, at most
// Score rows per thread: at most this many bytes of them (the tile shrinks at long contexts).
constexpr int64_t kScoreBytesPerThread = 8 << 20;

// rows[i] = the cache row of kv head `kvh` at position p0 + i of a sequence, read through its
// block table (pool layout [n_blocks, n_kv_heads, block_size, head_dim], see KvLayout); with
// `scale` (int8 rows), scales[i] = that row's scale.
template <class T>
inline void GatherRows(const T* cache, const AttentionShape& shape, int64_t kvh,
                       const int32_t* table, int64_t p0, int n, const T** rows,
                       const float* scale = nullptr, float* scales = nullptr) {
  const int64_t bs = shape.block_size_tokens;
  int64_t block = p0 / bs;
  int64_t offset = p0 % bs;
  auto first_row = [&](int64_t b) {  // the pool row of the block's first position
    const int64_t physical = table[b];
    KCHECK(physical >= 0 && physical < shape.n_blocks);
    return (physical * shape.n_kv_heads + kvh) * bs;
  };
  int64_t row0 = first_row(block);
  for (int i = 0; i < n; ++i) {
    rows[i] = cache + (row0 + offset) * shape.head_dim;
    if (scale != nullptr) scales[i] = scale[row0 + offset];
    if (++offset == bs && i + 1 < n) {
      offset = 0;
      row0 = first_row(++block);
    }
  }
}

// Asks for the cache lines of the next chunk's rows while the current chunk is computed: the
// rows come a few KB at a time from blocks far apart, too short for the hardware prefetchers.
template <class T>
inline void PrefetchRows(const T* const* rows, int n, int64_t head_dim) {
  for (int i = 0; i < n; ++i) {
    const char* r = reinterpret_cast<const char*>(rows[i]);
    for (int64_t b = 0; b < head_dim * static_cast<int64_t>(sizeof(T)); b += 64) {
      _mm_prefetch(r + b, _MM_HINT_T0);
    }
  }
}

// A chunk's rows of one cache dtype as the kernels below read them: Load8(i, d) = row i's floats
// d .. d + 7, Load1(i, d) = its float d, At(r) = the view from row r on; with AVX-512,
// Load16(i, d) = its floats d .. d + 15 and Load8x2(i, d) = floats d .. d + 7 in both halves.
struct F32Chunk {
  const float* const* rows;
  F32Chunk At(int64_t r) const { return {rows + r}; }
  __m256 Load8(int i, int64_t d) const { return _mm256_loadu_ps(rows[i] + d); }
  float Load1(int i, int64_t d) const { return rows[i][d]; }
  KESTREL_AVX512 __m512 Load16(int i, int64_t d) const { return _mm512_loadu_ps(rows[i] + d); }
  KESTREL_AVX512 __m512 Load8x2(int i, int64_t d) const {
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(rows[i] + d));
  }
};
// bf16 rows: the bits in the upper half of each float (exact).
struct Bf16Chunk {
  const uint16_t* const* rows;
  Bf16Chunk At(int64_t r) const { return {rows + r}; }
  __m256 Load8(int i, int64_t d) const {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + d));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  float Load1(int i, int64_t d) const { return Bf16ToF32(rows[i][d]); }
  KESTREL_AVX512 __m512 Load16(int i, int64_t d) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  KESTREL_AVX512 __m512 Load8x2(int i, int64_t d) const {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + d));
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_broadcastsi128_si256(h)), 16));
  }
};
// int8 rows: each code times its row's scale (the reference's q * scale in f32).
struct Int8Chunk {
  const int8_t* const* rows;
  const float* scales;
  Int8Chunk At(int64_t r) const { return {rows + r, scales + r}; }
  __m256 Load8(int i, int64_t d) const {
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[i] + d));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), _mm256_set1_ps(scales[i]));
  }
  float Load1(int i, int64_t d) const { return static_cast<float>(rows[i][d]) * scales[i]; }
  KESTREL_AVX512 __m512 Load16(int i, int64_t d) const {
    const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + d));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)), _mm512_set1_ps(scales[i]));
  }
  KESTREL_AVX512 __m512 Load8x2(int i, int64_t d) const {
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[i] + d));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(q8, q8))),
                         _mm512_set1_ps(scales[i]));
  }
};

// dst[i * head_dim + d] = row i's float d for i < n (a chunk view's values, written out once for a
// tile of several tokens, which all read them).
template <class Rows>
void WidenChunk(const Rows& rows, int n, int64_t head_dim, float* dst) {
  const int64_t d8 = head_dim & ~int64_t{7};
  for (int i = 0; i < n; ++i) {
    float* o = dst + i * head_dim;
    for (int64_t d = 0; d < d8; d += 8) _mm256_storeu_ps(o + d, rows.Load8(i, d));
    for (int64_t d = d8; d < head_dim; ++d) o[d] = rows.Load1(i, d);
  }
}

// s[j] = exp(s[j] - max) / sum over j < n, in place: lane-wise max and sum (fixed order).
inline void SoftmaxInPlace(float* s, int64_t n) {
  const int64_t n8 = n & ~int64_t{7};
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float max_score = _mm_cvtss_f32(m4);
  for (int64_t j = n8; j < n; ++j) max_score = s[j] > max_score ? s[j] : max_score;
  const __m256 max_v = _mm256_set1_ps(max_score);
  __m256 sum_v = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), max_v));
    _mm256_storeu_ps(s + j, e);
    sum_v = _mm256_add_ps(sum_v, e);
  }
  float sum = HorizontalSum(sum_v);
  for (int64_t j = n8; j < n; ++j) {
    s[j] = __builtin_expf(s[j] - max_score);
    sum += s[j];
  }
  const float inv_sum = 1.0f / sum;
  const __m256 inv_v = _mm256_set1_ps(inv_sum);
  for (int64_t j = 0; j < n8; j += 8) {
    _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv_v));
  }
  for (int64_t j = n8; j < n; ++j) s[j] *= inv_sum;
}

// Lane sums of 8 vectors at once: r[i] = sum of the lanes of a[i], each in the fixed order
// ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
inline __m256 HorizontalSum8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // lanes: a0..a3 low halves | a0..a3 high halves
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// scores[g * stride + i] = scale * dot(q_g, k_i) for g < GS, i < n. Every dot: one 8-lane FMA
// accumulator over head_dim (a multiple of 8 here), then the fixed lane sum of HorizontalSum8.
// 8 / GS keys and GS heads are in flight at once: 8 independent chains, one batched lane sum.
//   q [GS, head_dim];  rows: k_i [head_dim] (a chunk view above)
template <int GS, class Rows>
void ScoresChunk(const float* q, int64_t head_dim, const Rows& rows, int n, float scale,
                 float* scores, int64_t stride) {
  constexpr int kKeys = 8 / GS;  // GS in {1, 2, 4}
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int i0 = 0; i0 < n; i0 += kKeys) {
    const int nk = n - i0 < kKeys ? n - i0 : kKeys;
    int k[kKeys];
    for (int j = 0; j < kKeys; ++j) k[j] = i0 + (j < nk ? j : 0);
    __m256 acc[8];
    for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 8) {
      __m256 kv[kKeys];
      for (int j = 0; j < kKeys; ++j) kv[j] = rows.Load8(k[j], d);
      for (int g = 0; g < GS; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + g * head_dim + d);
        for (int j = 0; j < kKeys; ++j) {
          acc[g * kKeys + j] = _mm256_fmadd_ps(qv, kv[j], acc[g * kKeys + j]);
        }
      }
    }
    alignas(32) float dots[8];
    _mm256_store_ps(dots, _mm256_mul_ps(HorizontalSum8(acc), scale_v));
    for (int g = 0; g < GS; ++g) {
      for (int j = 0; j < nk; ++j) scores[g * stride + i0 + j] = dots[g * kKeys + j];
    }
  }
}

// ScoresChunk's contract for GS = 2 NP heads, with AVX-512: register (p, j) holds heads 2p and
// 2p + 1's 8-lane accumulators for key j (lanes 0-7 and 8-15), each lane the chain of
// ScoresChunk's, and the lane sums add the same pairs in the same order as HorizontalSum8: the
// same bits. 8 keys in flight (8 or 16 registers of accumulators).
template <int NP, class Rows>
KESTREL_AVX512 void ScoresPairs(const float* q, int64_t head_dim, const Rows& rows, int n,
                                float scale, float* scores, int64_t stride) {
  constexpr int kKeys = 8;  // NP in {1, 2}
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int i0 = 0; i0 < n; i0 += kKeys) {
    const int nk = n - i0 < kKeys ? n - i0 : kKeys;
    int k[kKeys];
    for (int j = 0; j < kKeys; ++j) k[j] = i0 + (j < nk ? j : 0);
    __m512 acc[NP][kKeys];
    for (int p = 0; p < NP; ++p) {
      for (int j = 0; j < kKeys; ++j) acc[p][j] = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < head_dim; d += 8) {
      __m512 qp[NP];
      for (int p = 0; p < NP; ++p) {
        const __m256 lo = _mm256_loadu_ps(q + 2 * p * head_dim + d);
        const __m256 hi = _mm256_loadu_ps(q + (2 * p + 1) * head_dim + d);
        qp[p] = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
      }
      for (int j = 0; j < kKeys; ++j) {
        const __m512 kb = rows.Load8x2(k[j], d);
        for (int p = 0; p < NP; ++p) acc[p][j] = _mm512_fmadd_ps(qp[p], kb, acc[p][j]);
      }
    }
    for (int p = 0; p < NP; ++p) {
      // Lane sums of 8 keys' registers in HorizontalSum8's order, on both halves at once:
      // pairs (l0+l1, l2+l3, l4+l5, l6+l7), then ((l0+l1)+(l2+l3)) in 128-bit lanes 0 / 2 and
      // ((l4+l5)+(l6+l7)) in lanes 1 / 3, then low + high.
      const __m512* a = acc[p];
      __m512 t[4], u[2];
      for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xDD));
      }
      for (int i = 0; i < 2; ++i) {
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xDD));
      }
      // u[i]: keys 4i .. 4i + 3; lanes 0 / 1: head 2p's low / high sums, 2 / 3: head 2p + 1's.
      const __m512 w = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                                   _mm512_shuffle_f32x4(u[0], u[1], 0xDD)),
                                     scale_v);
      // w: head 2p keys 0-3, head 2p + 1 keys 0-3, head 2p keys 4-7, head 2p + 1 keys 4-7.
      const __m512 by_head = _mm512_shuffle_f32x4(w, w, 0xD8);
      const __mmask8 keep = static_cast<__mmask8>((1u << nk) - 1);
      _mm256_mask_storeu_ps(scores + 2 * p * stride + i0, keep, _mm512_castps512_ps256(by_head));
      _mm256_mask_storeu_ps(scores + (2 * p + 1) * stride + i0, keep,
                            _mm512_extractf32x8_ps(by_head, 1));
    }
  }
}

// Same contract for any head_dim and GS = 1 (the generic path): 8-lane accumulator, lane sum as
// in HorizontalSum8, scalar FMA tail for head_dim % 8.
template <class Rows>
void ScoresGeneric(const float* q, int64_t head_dim, const Rows& rows, int n, float scale,
                   float* scores) {
  const int64_t d8 = head_dim & ~int64_t{7};
  for (int i = 0; i < n; ++i) {
    __m256 acc[8];
    acc[0] = _mm256_setzero_ps();
    for (int64_t d = 0; d < d8; d += 8) {
      acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), rows.Load8(i, d), acc[0]);
    }
    for (int a = 1; a < 8; ++a) acc[a] = acc[0];
    alignas(32) float sums[8];
    _mm256_store_ps(sums, HorizontalSum8(acc));
    float s = sums[0];
    for (int64_t d = d8; d < head_dim; ++d) s = __builtin_fmaf(q[d], rows.Load1(i, d), s);
    scores[i] = s * scale;
  }
}

// out[g, d0 + d] for d < 8 * kVecs, g < GS: fma(p[g * stride + i], v_i[d0 + d], out) for
// i = 0..n-1 in order, GS * kVecs chains held in registers while the chunk's V rows stream from L1.
template <int GS, int kVecs, class Rows>
inline void AccumulateVPass(const float* p, int64_t stride, const Rows& rows, int n,
                            int64_t head_dim, int64_t d0, float* out) {
  __m256 acc[GS][kVecs];
  for (int g = 0; g < GS; ++g) {
    for (int w = 0; w < kVecs; ++w) acc[g][w] = _mm256_loadu_ps(out + g * head_dim + d0 + 8 * w);
  }
  for (int i = 0; i < n; ++i) {
    __m256 v[kVecs];
    for (int w = 0; w < kVecs; ++w) v[w] = rows.Load8(i, d0 + 8 * w);
    for (int g = 0; g < GS; ++g) {
      const __m256 pb = _mm256_broadcast_ss(p + g * stride + i);
      for (int w = 0; w < kVecs; ++w) acc[g][w] = _mm256_fmadd_ps(pb, v[w], acc[g][w]);
    }
  }
  for (int g = 0; g < GS; ++g) {
    for (int w = 0; w < kVecs; ++w) _mm256_storeu_ps(out + g * head_dim + d0 + 8 * w, acc[g][w]);
  }
}

// out[g, d] = fma(p[g * stride + i], v_i[d], out[g, d]) for i = 0..n-1 in order, g < GS: one
// sequential chain per element (continued from `out`). A pass holds 8 chains where the registers
// allow (64 dims for one head, 32 for two, 16 for three or four).
// Dims from d_begin on (AccumulateV512 hands over the last ones).
//   p: probabilities;  rows: v_i [head_dim] (a chunk view);  out [GS, head_dim]
template <int GS, class Rows>
void AccumulateV(const float* p, int64_t stride, const Rows& rows, int n, int64_t head_dim,
                 float* out, int64_t d_begin = 0) {
  constexpr int kWide = GS == 1 ? 8 : GS == 2 ? 4 : 2;
  int64_t d0 = d_begin;
  for (; d0 + 8 * kWide <= head_dim; d0 += 8 * kWide) {
    AccumulateVPass<GS, kWide>(p, stride, rows, n, head_dim, d0, out);
  }
  for (; d0 + 16 <= head_dim; d0 += 16)
    AccumulateVPass<GS, 2>(p, stride, rows, n, head_dim, d0, out);
  for (; d0 + 8 <= head_dim; d0 += 8) AccumulateVPass<GS, 1>(p, stride, rows, n, head_dim, d0, out);
  for (; d0 < head_dim; ++d0) {
    for (int g = 0; g < GS; ++g) {
      float o = out[g * head_dim + d0];
      for (int i = 0; i < n; ++i) o = __builtin_fmaf(p[g * stride + i], rows.Load1(i, d0), o);
      out[g * head_dim + d0] = o;
    }
  }
}

// AccumulateVPass with 16 dims per register (AVX-512): each element's chain is the same.
template <int GS, int kVecs, class Rows>
KESTREL_AVX512 void AccumulateVPass512(const float* p, int64_t stride, const Rows& rows, int n,
                                       int64_t head_dim, int64_t d0, float* out) {
  __m512 acc[GS][kVecs];
  for (int g = 0; g < GS; ++g) {
    for (int w = 0; w < kVecs; ++w) acc[g][w] = _mm512_loadu_ps(out + g * head_dim + d0 + 16 * w);
  }
  for (int i = 0; i < n; ++i) {
    __m512 v[kVecs];
    for (int w = 0; w < kVecs; ++w) v[w] = rows.Load16(i, d0 + 16 * w);
    for (int g = 0; g < GS; ++g) {
      const __m512 pb = _mm512_set1_ps(p[g * stride + i]);
      for (int w = 0; w < kVecs; ++w) acc[g][w] = _mm512_fmadd_ps(pb, v[w], acc[g][w]);
    }
  }
  for (int g = 0; g < GS; ++g) {
    for (int w = 0; w < kVecs; ++w) _mm512_storeu_ps(out + g * head_dim + d0 + 16 * w, acc[g][w]);
  }
}

// AccumulateV with AVX-512: passes of 128 dims (one or two heads) or 64, then 16, then
// AccumulateV for what is left (the same chains, so the same bits).
template <int GS, class Rows>
KESTREL_AVX512 void AccumulateV512(const float* p, int64_t stride, const Rows& rows, int n,
                                   int64_t head_dim, float* out) {
  constexpr int kWide = GS <= 2 ? 8 : 4;
  int64_t d0 = 0;
  for (; d0 + 16 * kWide <= head_dim; d0 += 16 * kWide) {
    AccumulateVPass512<GS, kWide>(p, stride, rows, n, head_dim, d0, out);
  }
  for (; d0 + 16 <= head_dim; d0 += 16) {
    AccumulateVPass512<GS, 1>(p, stride, rows, n, head_dim, d0, out);
  }
  if (d0 < head_dim) AccumulateV<GS>(p, stride, rows, n, head_dim, out, d0);
}

// Runs fn.template operator()<GS>(g0) over sub-groups of at most kMaxSubGroup heads.
template <class Fn>
inline void ForSubGroups(int64_t group, Fn&& fn) {
  for (int64_t g0 = 0; g0 < group; g0 += kMaxSubGroup) {
    switch (group - g0 < kMaxSubGroup ? group - g0 : kMaxSubGroup) {
      case 1: fn.template operator()<1>(g0); break;
      case 2: fn.template operator()<2>(g0); break;
      case 3: fn.template operator()<3>(g0); break;
      default: fn.template operator()<4>(g0); break;
    }
  }
}

// Tokens per work item for score rows of row_stride floats: kTokenTile, fewer where the tile's
// rows would take more than kScoreBytesPerThread (at least one token).
int TokenTile(int64_t group, int64_t row_stride) {
  const int64_t fit =
      kScoreBytesPerThread / (group * row_stride * static_cast<int64_t>(sizeof(float)));
  return static_cast<int>(std::clamp<int64_t>(fit, 1, kTokenTile));
}

}  // namespace

int64_t AttentionScratchPerThread(const AttentionShape& shape, int64_t max_context_tokens) {
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t row_stride = (max_context_tokens + 15) & ~int64_t{15};
  // Score rows [tile, group, max_context], each padded to a multiple of 16 floats, then one
  // chunk of bf16 or int8 rows as floats (tiles of several tokens).
  return TokenTile(group, row_stride) * group * row_stride + kKeyChunk * shape.head_dim;
}

void PagedAttention(ThreadPool* pool, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch, bool avx512) {
  const int64_t n_tokens = static_cast<int64_t>(batch.positions.size());
  const int64_t n_heads = shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t group = n_heads / shape.n_kv_heads;
  const int32_t bs = shape.block_size_tokens;
  const int32_t* positions = batch.positions.data();
  const int32_t* seq_starts = batch.seq_starts.data();
  const int64_t n_seqs = static_cast<int64_t>(batch.seq_starts.size()) - 1;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < n_tokens; ++t) max_pos = positions[t] > max_pos ? positions[t] : max_pos;
  const int64_t per_thread = AttentionScratchPerThread(shape, int64_t{max_pos} + 1);
  const int64_t row_stride = (int64_t{max_pos} + 1 + 15) & ~int64_t{15};
  const int n_threads = pool != nullptr ? pool->n_threads() : 1;
  KCHECK(static_cast<int64_t>(scratch.size()) >= per_thread * n_threads);
  // Tiles: sequence s's tokens in runs of `tile_tokens`; tile_starts[s] = its first tile. (The
  // tiling changes no bits: each output element gets the operations of a tile of one token.)
  const int tile_tokens = TokenTile(group, row_stride);
  // (Kept per thread to spare an allocation per layer; named through a local reference so that
  // the workers read the caller's.)
  thread_local std::vector<int64_t> tile_starts_of_thread;
  std::vector<int64_t>& tile_starts = tile_starts_of_thread;
  tile_starts.assign(static_cast<size_t>(n_seqs) + 1, 0);
  for (int64_t s = 0; s < n_seqs; ++s) {
    tile_starts[s + 1] =
        tile_starts[s] + (seq_starts[s + 1] - seq_starts[s] + tile_tokens - 1) / tile_tokens;
  }
  const int64_t n_tiles = tile_starts[n_seqs];

  auto run = [&](int64_t i_begin, int64_t i_end, int thread) {
    float* scores = scratch.data() + per_thread * thread;        // [tile, group, row_stride]
    float* widened = scores + tile_tokens * group * row_stride;  // [kKeyChunk, head_dim]
    int64_t seq = 0;
    for (int64_t item = i_begin; item < i_end; ++item) {
      const int64_t kvh = item / n_tiles;
      const int64_t tile = item % n_tiles;
      // The sequence of the tile (items of one kv head visit tiles in order).
      if (tile < tile_starts[seq] || tile >= tile_starts[seq + 1]) {
        seq = 0;
        while (tile_starts[seq + 1] <= tile) ++seq;
      }
      const int32_t* table = batch.block_tables.data() + seq * batch.max_blocks_per_seq;
      const int64_t t0 = seq_starts[seq] + (tile - tile_starts[seq]) * tile_tokens;
      const int nt = static_cast<int>(std::min<int64_t>(tile_tokens, seq_starts[seq + 1] - t0));
      // Token u of the tile sees the keys [first[u], first[u] + n_ctx[u]); the tile's chunks
      // cover [base, base + span).
      int64_t first[kTokenTile], n_ctx[kTokenTile];
      int64_t base = std::numeric_limits<int64_t>::max(), end = 0;
      for (int u = 0; u < nt; ++u) {
        const int64_t pos = positions[t0 + u];
        KCHECK(pos / bs < batch.max_blocks_per_seq);
        first[u] = shape.sliding_window > 0 && pos >= shape.sliding_window
                       ? pos - shape.sliding_window + 1
                       : 0;
        n_ctx[u] = pos + 1 - first[u];
        base = std::min(base, first[u]);
        end = std::max(end, pos + 1);
      }
      const int64_t span = end - base;

      const float* chunk_rows[2][kKeyChunk];
      const int8_t* int8_rows[2][kKeyChunk];
      float int8_scales[2][kKeyChunk];
      const uint16_t* bf16_rows[2][kKeyChunk];
      const float* widened_rows[kKeyChunk];
      for (int i = 0; i < kKeyChunk; ++i) widened_rows[i] = widened + i * head_dim;
      auto chunk_size = [&](int64_t j0) {
        return static_cast<int>(span - j0 < kKeyChunk ? span - j0 : kKeyChunk);
      };
      // Calls fn(j0, n, chunk) for every chunk of the cache rows of kv head kvh (positions
      // base + j0 ..), in order, with the next chunk's rows gathered and prefetched ahead; chunk
      // is the rows' view of their dtype (F32Chunk, Bf16Chunk, Int8Chunk) for one token, which
      // reads each row once, and for a tile of several tokens the floats of bf16 and int8 rows
      // written out once (WidenChunk) so that the tokens do not each convert them again.
      auto for_chunks = [&](const KvRows& cache, auto&& fn) {
        // Gathers (and with prefetch, asks for) the rows of the chunk at j0 into slot c.
        auto gather = [&](int64_t j0, int n, int c, bool prefetch) {
          if (cache.f32 != nullptr) {
            GatherRows(cache.f32, shape, kvh, table, base + j0, n, chunk_rows[c]);
            if (prefetch) PrefetchRows(chunk_rows[c], n, head_dim);
          } else if (cache.bf16 != nullptr) {
            GatherRows(cache.bf16, shape, kvh, table, base + j0, n, bf16_rows[c]);
            if (prefetch) PrefetchRows(bf16_rows[c], n, head_dim);
          } else {
            GatherRows(cache.q, shape, kvh, table, base + j0, n, int8_rows[c], cache.scale,
                       int8_scales[c]);
            if (prefetch) PrefetchRows(int8_rows[c], n, head_dim);
          }
        };
        gather(0, chunk_size(0), 0, false);
        for (int64_t j0 = 0, c = 0; j0 < span; j0 += kKeyChunk, c ^= 1) {
          if (j0 + kKeyChunk < span) {
            gather(j0 + kKeyChunk, chunk_size(j0 + kKeyChunk), static_cast<int>(c ^ 1), true);
          }
          const int n = chunk_size(j0);
          auto call = [&](const auto& chunk) {
            if (nt == 1) return fn(j0, n, chunk);
            WidenChunk(chunk, n, head_dim, widened);
            fn(j0, n, F32Chunk{widened_rows});
          };
          if (cache.f32 != nullptr) {
            fn(j0, n, F32Chunk{chunk_rows[c]});
          } else if (cache.bf16 != nullptr) {
            call(Bf16Chunk{bf16_rows[c]});
          } else {
            call(Int8Chunk{int8_rows[c], int8_scales[c]});
          }
        }
      };
      // Calls fn(u, k0, r0, n) for each token u of the tile with keys in the chunk at j0 of n
      // keys: its keys k0 .. k0 + n - 1 (relative to first[u]) are the chunk's rows r0 ...
      auto for_tokens = [&](int64_t j0, int n, auto&& fn) {
        for (int u = 0; u < nt; ++u) {
          const int64_t lo = std::max(base + j0, first[u]);
          const int64_t hi = std::min(base + j0 + n, first[u] + n_ctx[u]);
          if (lo < hi) fn(u, lo - first[u], lo - (base + j0), static_cast<int>(hi - lo));
        }
      };

      // Scores: one pass over K, chunk by chunk, for all tokens and heads of the tile.
      for_chunks(k_cache, [&](int64_t j0, int n_chunk, const auto& chunk) {
        for_tokens(j0, n_chunk, [&](int u, int64_t k0, int64_t r0, int n) {
          const float* qg = q + ((t0 + u) * n_heads + kvh * group) * head_dim;  // [group, hd]
          const auto rows = chunk.At(r0);
          float* su = scores + u * group * row_stride + k0;
          if (head_dim % 8 != 0) {
            for (int64_t g = 0; g < group; ++g) {
              ScoresGeneric(qg + g * head_dim, head_dim, rows, n, shape.scale, su + g * row_stride);
            }
            return;
          }
          for (int64_t g0 = 0; g0 < group;) {  // sub-groups of 4, 2 and 1 heads
            const int64_t left = group - g0;
            float* s0 = su + g0 * row_stride;
            if (avx512 && left >= 2) {  // pairs of heads, the same bits
              if (left >= 4) {
                ScoresPairs<2>(qg + g0 * head_dim, head_dim, rows, n, shape.scale, s0, row_stride);
                g0 += 4;
              } else {
                ScoresPairs<1>(qg + g0 * head_dim, head_dim, rows, n, shape.scale, s0, row_stride);
                g0 += 2;
              }
            } else if (left >= 4) {
              ScoresChunk<4>(qg + g0 * head_dim, head_dim, rows, n, shape.scale, s0, row_stride);
              g0 += 4;
            } else if (left >= 2) {
              ScoresChunk<2>(qg + g0 * head_dim, head_dim, rows, n, shape.scale, s0, row_stride);
              g0 += 2;
            } else {
              ScoresChunk<1>(qg + g0 * head_dim, head_dim, rows, n, shape.scale, s0, row_stride);
              g0 += 1;
            }
          }
        });
      });
      // Softmax per token and head.
      for (int u = 0; u < nt; ++u) {
        float* og = out + ((t0 + u) * n_heads + kvh * group) * head_dim;  // [group, head_dim]
        for (int64_t g = 0; g < group; ++g) {
          SoftmaxInPlace(scores + (u * group + g) * row_stride, n_ctx[u]);
          for (int64_t d = 0; d < head_dim; ++d) og[g * head_dim + d] = 0.0f;
        }
      }
      // Weighted sum of V: one pass over V, chunk by chunk, for all tokens and heads of the tile.
      for_chunks(v_cache, [&](int64_t j0, int n_chunk, const auto& chunk) {
        for_tokens(j0, n_chunk, [&](int u, int64_t k0, int64_t r0, int n) {
          float* og = out + ((t0 + u) * n_heads + kvh * group) * head_dim;
          const float* su = scores + u * group * row_stride + k0;
          ForSubGroups(group, [&]<int GS>(int64_t g0) {
            if (avx512) {
              AccumulateV512<GS>(su + g0 * row_stride, row_stride, chunk.At(r0), n, head_dim,
                                 og + g0 * head_dim);
            } else {
              AccumulateV<GS>(su + g0 * row_stride, row_stride, chunk.At(r0), n, head_dim,
                              og + g0 * head_dim);
            }
          });
        });
      });
    }
  };
  const int64_t n_items = shape.n_kv_heads * n_tiles;
  // Waking a second thread costs tens of microseconds (more inside a VM); short contexts are
  // done inline. Work ~ multiply-adds of scores and weighted sum.
  int64_t work = 0;
  for (int64_t t = 0; t < n_tokens; ++t) work += (int64_t{positions[t]} + 1) * n_heads * head_dim * 2;
  if (pool == nullptr || work < (512 << 10)) {
    run(0, n_items, 0);
  } else {
    pool->ParallelFor(n_items, 1, run);
  }
}

}  // namespace kestrel::cpu::avx2
