// AVX2 integer dot products of block-quantized weights (GGUF K and legacy formats, IQ4) against
// int8-quantized activations, the default for those formats (core/quant_blocks.h defines every
// format's integers and float steps; these kernels compute the same ones, so the reference and
// AVX2 kernel sets give the same bits). Row kernels for the file's rows, and packed kernels for
// rows interleaved by 8 at load (cpu::PackRows, ops.h): 8 rows per pass over an activation block,
// up to 4 token rows per pass in prefill. LinearGroup (linear_avx2.cpp) quantizes the activations
// and calls IntDotRange per chunk of output rows.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd_avx2.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu::avx2 {
namespace {

inline int HsumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// One activation block: amax, then q = nearbyint(x * id), as the scalar definition.
inline float QuantizeActBlock(const float* x, int n, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float amax = _mm_cvtss_f32(m);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  for (int i = 0; i < n; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vid),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // i32 -> i16 -> i8 packs interleave 128-bit lanes; the permute restores element order.
    const __m256i p01 = _mm256_packs_epi32(v[0], v[1]);
    const __m256i p23 = _mm256_packs_epi32(v[2], v[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  return d;
}

// How far ahead the integer kernels ask for weights: at least the next tile's rows and at least
// 16 KB (rows are often 1-4 KB; the data of a range of rows is contiguous, so this is simply the
// bytes the thread reads a few microseconds later).
inline int64_t PrefetchAhead(int r, int64_t row_bytes) {
  const int64_t rows = (16 << 10) / row_bytes + 1;
  return (rows > r ? rows : r) * row_bytes;
}

// out[r] = the dot products of rows w + r * row_bytes (r < R) with x: R weight streams at once,
// each also asking for the same offset PrefetchAhead bytes further. Q8_0, and Q4_0 / Q5_0 as
// Q8_0 blocks of fewer bits: each block's codes unpacked to the int8 q - 8 or q - 16 (the fifth
// bits from qh spread to bytes), then the same integer and float steps.
template <int R, DType T>
[[gnu::optimize("fp-contract=off")]] void DotQ8_0Blocks(const uint8_t* w, int64_t row_bytes,
                                                        ActsView x, int64_t k, float* out) {
  constexpr bool kQ8 = T == DType::kQ8_0, kNl = T == DType::kIQ4_NL;
  // IQ4_NL: Q4_0's layout, each nibble through the codebook instead of minus 8.
  constexpr quant::LegacyBlock l = kQ8   ? quant::LegacyBlock{quant::kQ8_0Bytes, 2, -1, false, 0}
                                   : kNl ? quant::LegacyLayout(DType::kQ4_0)
                                         : quant::LegacyLayout(T);
  const __m256i codebook = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values)));
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(l.offset));
  const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i fifth = _mm256_set1_epi8(0x10);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m256i xq = Load32(x.q + 32 * b);
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * l.bytes;
      _mm_prefetch(reinterpret_cast<const char*>(blk + ahead), _MM_HINT_T0);
      __m256i wq;
      if constexpr (kQ8) {
        wq = Load32(blk + l.nibbles_at);
      } else {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + l.nibbles_at));
        __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        if constexpr (l.qh_at >= 0) {
          uint32_t qh;
          std::memcpy(&qh, blk + l.qh_at, 4);
          const __m256i bytes = _mm256_and_si256(
              _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), spread), bit);
          q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(bytes, bit), fifth));
        }
        wq = kNl ? _mm256_shuffle_epi8(codebook, q) : _mm256_sub_epi8(q, offset);
      }
      // |wq| <= 127: the pair sums of maddubs stay within int16.
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
      const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(blk) * x.d[b]), sums, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

// Q4_K (kFifthBit false) and Q5_K: 8 groups of 32 with 6-bit scales and mins; Q5_K gives each
// nibble its fifth bit from qh: bit g of qh[l] for element l of group g. Q4_K's float steps
// take the block's integer as one sum, Q5_K's as eight lanes (quant_blocks.h).
template <int R, bool kFifthBit>
[[gnu::optimize("fp-contract=off")]] void DotQ45_K(const uint8_t* w_base, int64_t row_bytes,
                                                   ActsView x, int64_t k, float* out) {
  constexpr int kBlockBytes = kFifthBit ? 176 : 144;
  constexpr int kQsOffset = kFifthBit ? 48 : 16;
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  // Byte shuffles that broadcast 16-bit scale g of a register of eight to every lane.
  __m256i pick[8];
  for (int g = 0; g < 8; ++g)
    pick[g] = _mm256_set1_epi16(static_cast<int16_t>((2 * g) | ((2 * g + 1) << 8)));
  for (int r = 0; r < R; ++r) {
    const uint8_t* w = w_base + r * row_bytes;
    __m256 acc = _mm256_setzero_ps();
    float acc_one = 0.0f;  // Q4_K
    float acc_m = 0.0f;
    for (int64_t b = 0; b < k / 256; ++b) {
      for (int line = 0; line < kBlockBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * kBlockBytes + line),
                     _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * kBlockBytes;
      // The 12 bytes of 6-bit scales and mins as two words each (ggml's packing).
      uint32_t u[3];
      std::memcpy(u, blk + 4, 12);
      const uint32_t sw[2] = {u[0] & 0x3f3f3f3fu,
                              (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)};
      const uint32_t mw[2] = {u[1] & 0x3f3f3f3fu,
                              ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)};
      const __m256i scales = _mm256_broadcastsi128_si256(
          _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sw))));
      const int8_t* qx = x.q + 256 * b;
      __m256i isum = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = Load32(blk + kQsOffset + 32 * c);
        __m256i lo = _mm256_and_si256(v, low);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (kFifthBit) {
          // Bit 2c (2c + 1) of each qh byte to bit 4: a 16-bit shift moves no bit across bytes
          // into bit 0 of a byte, the only one kept. q < 32, |q_x| <= 127: the pair sums of
          // maddubs stay within int16.
          const __m256i qh = Load32(blk + 16);
          lo = _mm256_or_si256(
              lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi = _mm256_or_si256(
              hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        const __m256i plo = _mm256_maddubs_epi16(lo, Load32(qx + 64 * c));
        const __m256i phi = _mm256_maddubs_epi16(hi, Load32(qx + 64 * c + 32));
        isum = _mm256_add_epi32(isum,
                                _mm256_madd_epi16(plo, _mm256_shuffle_epi8(scales, pick[2 * c])));
        isum = _mm256_add_epi32(
            isum, _mm256_madd_epi16(phi, _mm256_shuffle_epi8(scales, pick[2 * c + 1])));
      }
      if constexpr (kFifthBit) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d[b] * HalfToFloat(blk)), _mm256_cvtepi32_ps(isum),
                              acc);
      } else {
        acc_one = std::fma(x.d[b] * HalfToFloat(blk), static_cast<float>(HsumI32(isum)), acc_one);
      }
      // summ = sum_g m_g * (bsum[2g] + bsum[2g + 1])
      const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsum + 16 * b));
      const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsum + 16 * b + 8));
      const __m128i pair = _mm_hadd_epi16(bs_lo, bs_hi);
      const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mw)));
      __m128i mm4 = _mm_madd_epi16(mins, pair);
      mm4 = _mm_add_epi32(mm4, _mm_shuffle_epi32(mm4, _MM_SHUFFLE(1, 0, 3, 2)));
      mm4 = _mm_add_epi32(mm4, _mm_shuffle_epi32(mm4, _MM_SHUFFLE(2, 3, 0, 1)));
      const float mm = (x.d[b] * HalfToFloat(blk + 2)) * static_cast<float>(_mm_cvtsi128_si32(mm4));
      acc_m = acc_m + mm;
    }
    out[r] = (kFifthBit ? HorizontalSum(acc) : acc_one) - acc_m;
  }
}

// Lane j of a packed Q8_0 / Q4_0 / Q5_0 / IQ4_NL block of 8 rows (cpu::PackRows) as int8 codes
// (q, q - 8, q - 16 or the codebook's value of q): Q4_0 / Q5_0 / IQ4_NL's 4-byte nibble run i
// gives lanes i (low nibbles) and i + 4 (high), Q5_0's fifth bits spread from each row's qh (4
// bits per lane into its 4 bytes by a byte shuffle and compare).
template <DType T>
struct PackedLanes {
  static constexpr bool kFive = T == DType::kQ5_0, kNl = T == DType::kIQ4_NL;
  const __m256i low = _mm256_set1_epi8(0x0F), offset = _mm256_set1_epi8(kFive ? 16 : 8);
  const __m256i codebook = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values)));
  // Q5_0: the low byte of each lane (a row's qh shifted to the lane group's 4 bits) copied to its
  // 4 bytes, byte k then tested for bit k.
  const __m256i bcast = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,  //
                                         0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  const __m256i bit_k = _mm256_set1_epi32(0x08040201), fifth = _mm256_set1_epi8(0x10);

  // qh: Load32(blk + 128) for Q5_0 (unused otherwise).
  __m256i Lane(const uint8_t* blk, __m256i qh, int j) const {
    if constexpr (T == DType::kQ8_0) {
      return Load32(blk + 32 * j);
    } else {
      const __m256i raw = Load32(blk + 32 * (j & 3));
      __m256i q = _mm256_and_si256(j < 4 ? raw : _mm256_srli_epi16(raw, 4), low);
      if constexpr (kFive) {
        const __m256i bits =
            _mm256_and_si256(_mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * j), bcast), bit_k);
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(bits, bit_k), fifth));
      }
      if constexpr (kNl) return _mm256_shuffle_epi8(codebook, q);
      return _mm256_sub_epi8(q, offset);
    }
  }
};

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): a row's eight lanes added as HorizontalSum
// adds them.
inline __m256 SumLanes(const __m256 (&l)[8]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                       _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
}

// Q8_0, Q4_0, Q5_0 and IQ4_NL rows packed in groups of 8 (cpu::PackRows): out[r] for the 8 rows of
// `group` (n_blocks packed blocks) and the activation row x. Vector j holds lane j of the row
// kernel's eight (DotQ8_0Blocks: elements 4j..4j+3 of each block) for the 8 rows: the same
// integers, the same fused multiply-adds in the same order and the same final lane sum per row,
// so the same bits, with the block's 4-byte activation groups broadcast and its scales converted
// once for the 8 rows (lanes unpacked by PackedLanes).
template <DType T>
[[gnu::optimize("fp-contract=off")]] void DotQ8_0Packed8(const uint8_t* group, int64_t n_blocks,
                                                         ActsView x, float* out) {
  constexpr bool kFive = T == DType::kQ5_0;
  constexpr int64_t kBytes = PackedBlockBytes(T);
  constexpr int64_t kScaleAt = kBytes - 16;  // the 8 rows' f16 d close every packed block
  // Prefetch distance: 16 packed blocks (4.3 KB for Q8_0; the Q4_K kernel's best was 4-6 KB).
  constexpr int64_t kAhead = 16 * kBytes;
  const __m256i ones = _mm256_set1_epi16(1);
  const PackedLanes<T> lanes;
  __m256 lane[8];
  for (int j = 0; j < 8; ++j) lane[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    const __m256 scale = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScaleAt))),
        _mm256_set1_ps(x.d[b]));
    const __m256i qh = kFive ? Load32(blk + 128) : _mm256_setzero_si256();
    const int8_t* qx = x.q + 32 * b;
    for (int j = 0; j < 8; ++j) {
      const __m256i wq = lanes.Lane(blk, qh, j);
      int32_t x4;
      std::memcpy(&x4, qx + 4 * j, 4);
      const __m256i xq = _mm256_set1_epi32(x4);
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
      lane[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), lane[j]);
    }
  }
  _mm256_storeu_ps(out, SumLanes(lane));
}

// DotQ8_0Packed8 for NT token rows at once (prefill): out[t][r] for the 8 rows of `group` and
// the activation rows x[0..NT). The blocks go by in chunks of kChunk (4.3 KB of Q8_0, in L1), each
// chunk once per lane j: lane j's codes are unpacked (and made |w|) once for the NT token rows,
// whose accumulators stay in registers. Every row and token row gets the single-row kernel's
// integers, scale products and fused multiply-adds in the same order, and the same final sum:
// the same bits whatever the tiling (so a prefix computed in a batch equals one computed alone).
template <DType T, int NT>
[[gnu::optimize("fp-contract=off")]] void DotQ8_0PackedTokens(const uint8_t* group,
                                                              int64_t n_blocks, const ActsView* x,
                                                              float (*out)[8]) {
  constexpr bool kFive = T == DType::kQ5_0;
  constexpr int64_t kBytes = PackedBlockBytes(T);
  constexpr int64_t kScaleAt = kBytes - 16;
  constexpr int64_t kChunk = 16;
  const __m256i ones = _mm256_set1_epi16(1);
  const PackedLanes<T> lanes;
  __m256 lane[NT][8];
  for (int t = 0; t < NT; ++t) {
    for (int j = 0; j < 8; ++j) lane[t][j] = _mm256_setzero_ps();
  }
  alignas(32) float scale[kChunk][NT][8];  // the single-row kernel's per-block scale products
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunk) {
    const int64_t nb = std::min(kChunk, n_blocks - b0);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = group + (b0 + b) * kBytes;
      for (int64_t line = 0; line < kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(blk + kChunk * kBytes + line), _MM_HINT_T0);
      }
      const __m256 d =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScaleAt)));
      for (int t = 0; t < NT; ++t) {
        _mm256_store_ps(scale[b][t], _mm256_mul_ps(d, _mm256_set1_ps(x[t].d[b0 + b])));
      }
    }
    for (int j = 0; j < 8; ++j) {
      __m256 acc[NT];
      for (int t = 0; t < NT; ++t) acc[t] = lane[t][j];
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = group + (b0 + b) * kBytes;
        const __m256i qh = kFive ? Load32(blk + 128) : _mm256_setzero_si256();
        const __m256i wq = lanes.Lane(blk, qh, j);
        const __m256i aw = _mm256_sign_epi8(wq, wq);
        for (int t = 0; t < NT; ++t) {
          int32_t x4;
          std::memcpy(&x4, x[t].q + 32 * (b0 + b) + 4 * j, 4);
          const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(x4), wq));
          acc[t] = _mm256_fmadd_ps(_mm256_load_ps(scale[b][t]),
                                   _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[t]);
        }
      }
      for (int t = 0; t < NT; ++t) lane[t][j] = acc[t];
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out[t], SumLanes(lane[t]));
}

// Helpers of the packed K-format kernels, whose vector lanes are 8 rows.
// The 8 int8 values at p (one per row), each in both 16-bit halves of its lane (for madd).
inline __m256i RowScales16(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

// isum[t] += each row's sc * (its signed codes w . x[t] at elements at .. at + 3) for t < T, by
// the sign trick (|w| <= 127: maddubs' pair sums stay within int16).
template <int T>
inline void AddSignedRun(__m256i w, __m256i sc, const ActsView* x, int64_t at, __m256i* isum) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  for (int t = 0; t < T; ++t) {
    int32_t xq;
    std::memcpy(&xq, x[t].q + at, 4);
    const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(xq), w));
    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, sc));
  }
}

// acc[t] += (x[t].d[b] * d) * float(isum[t]) lane by lane, d the rows' f16 scales at d_at: the
// float step of Q3_K, Q6_K and IQ4_XS (AddBlockTerm's).
template <int T>
[[gnu::optimize("fp-contract=off")]] inline void AddPackedBlockTerms(const uint8_t* d_at,
                                                                     const ActsView* x, int64_t b,
                                                                     const __m256i* isum,
                                                                     __m256* acc) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d_at)));
  for (int t = 0; t < T; ++t) {
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x[t].d[b]), d);
    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum[t])));
  }
}

// isum[t] += each row's sc * (its codes q (unsigned) . x[t] at elements at .. at + 3) for t < T
// (q < 64, |x| <= 127: maddubs' pair sums stay within int16).
template <int T>
inline void AddUnsignedRun(__m256i q, __m256i sc, const ActsView* x, int64_t at, __m256i* isum) {
  for (int t = 0; t < T; ++t) {
    int32_t xq;
    std::memcpy(&xq, x[t].q + at, 4);
    isum[t] = _mm256_add_epi32(
        isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_set1_epi32(xq)), sc));
  }
}

// The mins step of the packed Q4_K and Q5_K kernels (DotQ45_K's): acc_m + (dx * dmin) *
// float(each row's sum over g of m_g * (bsum[2g] + bsum[2g + 1])), mins[g] the rows' m_g.
[[gnu::optimize("fp-contract=off")]] inline __m256 AddKMins(__m256 acc_m, const __m256i* mins,
                                                            __m256 dmin, const ActsView& x,
                                                            int64_t b) {
  const int16_t* bsum = x.bsum + 16 * b;
  const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum));
  const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum + 8));
  const __m256i pairs = _mm256_cvtepi16_epi32(_mm_hadd_epi16(bs_lo, bs_hi));
  __m256i mm = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g) {
    const __m256i m = _mm256_load_si256(mins + g);
    mm = _mm256_add_epi32(
        mm, _mm256_mullo_epi32(m, _mm256_permutevar8x32_epi32(pairs, _mm256_set1_epi32(g))));
  }
  const __m256 dx = _mm256_set1_ps(x.d[b]);
  return _mm256_add_ps(acc_m, _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mm)));
}

// Q4_K rows packed in groups of 8 (cpu::PackRows): out[t][r] for the 8 rows of `group`
// (n_blocks packed blocks) and the T token rows x[0..T). The lanes of every vector are the 8
// rows. A group's products are added in int16 (at most 8 x 2 x 15 x 127 per lane) and scaled
// once, so each row's block integer is quant_blocks.h's one sum, and its float steps are the
// reference's: the same bits. The nibbles of a block are unpacked once for the T token rows.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotQ4_KPacked8(const uint8_t* group, int64_t n_blocks,
                                                         const ActsView* x, float (*out)[8]) {
  // Prefetch distance: 4 packed blocks (measured on the 2-core Zen 3 VM, decode of a Q4_K
  // Qwen3-1.7B shape: 36-38 tok/s at 4-6 KB against 24 without and 28-30 at 16 KB).
  constexpr int64_t kAhead = 4 * kQ4_KPackedBlockBytes;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[T];
  __m256 acc_m[T];
  for (int t = 0; t < T; ++t) acc[t] = acc_m[t] = _mm256_setzero_ps();
  alignas(32) int32_t scales[8][8];  // [g][row]: the scale in both 16-bit halves (for madd)
  alignas(32) int32_t mins[8][8];    // [g][row]
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kQ4_KPackedBlockBytes;
    for (int64_t line = 0; line < kQ4_KPackedBlockBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    for (int g = 0; g < 8; ++g) {
      const __m256i v = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 1056 + 8 * g)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(scales[g]),
                         _mm256_or_si256(v, _mm256_slli_epi32(v, 16)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(mins[g]),
                         _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                             reinterpret_cast<const __m128i*>(blk + 1120 + 8 * g))));
    }
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // groups 2c (low nibbles) and 2c + 1 (high)
      __m256i sum_lo[T], sum_hi[T];
      for (int t = 0; t < T; ++t) sum_lo[t] = sum_hi[t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i v = Load32(blk + (c * 8 + j) * 32);
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int t = 0; t < T; ++t) {
          const int8_t* qx = x[t].q + 256 * b + 64 * c + 4 * j;
          int32_t xl, xh;
          std::memcpy(&xl, qx, 4);
          std::memcpy(&xh, qx + 32, 4);
          sum_lo[t] = _mm256_add_epi16(sum_lo[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
          sum_hi[t] = _mm256_add_epi16(sum_hi[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
        }
      }
      const __m256i sc_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(scales[2 * c]));
      const __m256i sc_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(scales[2 * c + 1]));
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(sum_lo[t], sc_lo));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(sum_hi[t], sc_hi));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1024)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1040)));
    for (int t = 0; t < T; ++t) {
      const __m256 dx = _mm256_set1_ps(x[t].d[b]);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
      acc_m[t] = AddKMins(acc_m[t], reinterpret_cast<const __m256i*>(mins), dmin, x[t], b);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], _mm256_sub_ps(acc[t], acc_m[t]));
}

// Q5_K rows packed in groups of 8 (cpu::PackRows): out[t][r] for the 8 rows of `group` and the
// T token rows x[0..T), the lanes of every vector being the rows. Q5_K's float steps keep the row
// kernel's eight lanes (elements 4j..4j+3 of every group): lane j of a row is its integer
// sum_c sc_2c (lo codes . q_x) + sc_2c+1 (hi codes . q_x) over the 4-byte runs (c, j), then the
// same fused multiply-add, the same lane sum and the same mins step as DotQ45_K: the same bits.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotQ5_KPacked8(const uint8_t* group, int64_t n_blocks,
                                                         const ActsView* x, float (*out)[8]) {
  constexpr int64_t kBytes = kQ5_KPackedBlockBytes, kAhead = 4 * kBytes, kTail = 1280;
  const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 lane[T][8];
  __m256 acc_m[T];
  for (int t = 0; t < T; ++t) {
    acc_m[t] = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) lane[t][j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    __m256i scales[8];  // [g]: each row's scale in both 16-bit halves of its lane (for madd)
    __m256i mins[8];
    for (int g = 0; g < 8; ++g) {
      const __m256i v = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + kTail + 32 + 8 * g)));
      scales[g] = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
      mins[g] = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + kTail + 96 + 8 * g)));
    }
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kTail)));
    __m256 scale[T];
    for (int t = 0; t < T; ++t) scale[t] = _mm256_mul_ps(_mm256_set1_ps(x[t].d[b]), d);
    for (int j = 0; j < 8; ++j) {
      const __m256i qh = Load32(blk + 1024 + 32 * j);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {  // groups 2c (low nibbles) and 2c + 1 (high)
        const __m256i v = Load32(blk + (c * 8 + j) * 32);
        const __m256i lo = _mm256_or_si256(
            _mm256_and_si256(v, low),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        const __m256i hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(v, 4), low),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        const int64_t at = 256 * b + 64 * c + 4 * j;
        AddUnsignedRun<T>(lo, scales[2 * c], x, at, isum);
        AddUnsignedRun<T>(hi, scales[2 * c + 1], x, at + 32, isum);
      }
      for (int t = 0; t < T; ++t) {
        lane[t][j] = _mm256_fmadd_ps(scale[t], _mm256_cvtepi32_ps(isum[t]), lane[t][j]);
      }
    }
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kTail + 16)));
    for (int t = 0; t < T; ++t) {
      acc_m[t] = AddKMins(acc_m[t], mins, dmin, x[t], b);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], _mm256_sub_ps(SumLanes(lane[t]), acc_m[t]));
}

// IQ4_XS rows packed in groups of 8 (cpu::PackRows): out[t][r] for the 8 rows of `group` and
// the T token rows x[0..T), the lanes of every vector being the rows. Each 4-byte run of a group
// is looked up in the codebook once for the T tokens; a row's block integer is
// sum_ib (ls_ib - 32) * (its codebook values . q_x), exactly the row kernel's, and its float step
// the same (AddBlockTerm's, lane by lane): the same bits.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotIq4XsPacked8(const uint8_t* group, int64_t n_blocks,
                                                          const ActsView* x, float (*out)[8]) {
  constexpr int64_t kBytes = kIq4XsPackedBlockBytes, kAhead = 4 * kBytes;
  const __m256i codebook = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values)));
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const __m256i lsv = RowScales16(blk + 1040 + 8 * ib);  // each row's ls - 32
      for (int i = 0; i < 4; ++i) {
        const __m256i v = Load32(blk + (ib * 4 + i) * 32);
        const __m256i wl = _mm256_shuffle_epi8(codebook, _mm256_and_si256(v, low));
        const __m256i wh =
            _mm256_shuffle_epi8(codebook, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        const int64_t at = 256 * b + 32 * ib + 4 * i;
        AddSignedRun<T>(wl, lsv, x, at, isum);
        AddSignedRun<T>(wh, lsv, x, at + 16, isum);
      }
    }
    AddPackedBlockTerms<T>(blk + 1024, x, b, isum, acc);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], acc[t]);
}

// Q3_K rows packed in groups of 8 (cpu::PackRows), as DotIq4XsPacked8: each 4-byte run's codes
// q - 4 (low bits | third bit << 2, minus 4) made once for the T token rows and multiplied by
// the sign trick, the rows' sc - 32 applied per group of 16 by madd. Each row's integer is the
// row kernel's sum_g (sc_g - 32) sum (q - 4) q_x, its float step the same: the same bits.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotQ3_KPacked8(const uint8_t* group, int64_t n_blocks,
                                                         const ActsView* x, float (*out)[8]) {
  constexpr int64_t kBytes = kQ3_KPackedBlockBytes, kAhead = 4 * kBytes;
  const __m256i two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    __m256i scv[16];  // each row's sc_g - 32
    for (int g = 0; g < 16; ++g) scv[g] = RowScales16(blk + 784 + 8 * g);
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      const __m256i hm = Load32(blk + 512 + 32 * i);
      for (int n = 0; n < 2; ++n) {
        const __m256i v = Load32(blk + (n * 8 + i) * 32);
        for (int j = 0; j < 4; ++j) {
          const __m256i low = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), two);
          const __m256i third = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * n + j), one);
          const __m256i w =
              _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(third, 2)), four);
          const int e = 128 * n + 32 * j + 4 * i;  // elements e .. e + 3 of every row
          AddSignedRun<T>(w, scv[e / 16], x, 256 * b + e, isum);
        }
      }
    }
    AddPackedBlockTerms<T>(blk + 768, x, b, isum, acc);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], acc[t]);
}

// Q6_K rows packed in groups of 8 (cpu::PackRows), as DotQ3_KPacked8: each 4-byte run's codes
// q - 32 (low nibble | high pair << 4, minus 32) made once for the T token rows and multiplied by
// the sign trick, the rows' sc applied per group of 16 by madd. Each row's integer is the row
// kernel's sum_g sc_g sum (q - 32) q_x, its float step the same: the same bits.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotQ6_KPacked8(const uint8_t* group, int64_t n_blocks,
                                                         const ActsView* x, float (*out)[8]) {
  constexpr int64_t kBytes = kQ6_KPackedBlockBytes, kAhead = 4 * kBytes;
  const __m256i nibble = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  const __m256i bias = _mm256_set1_epi8(32);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    __m256i scv[16];  // each row's sc_g
    for (int g = 0; g < 16; ++g) scv[g] = RowScales16(blk + 1552 + 8 * g);
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      for (int i = 0; i < 8; ++i) {
        const __m256i qh = Load32(blk + 1024 + (n * 8 + i) * 32);
        for (int h = 0; h < 2; ++h) {
          const __m256i ql = Load32(blk + ((n * 2 + h) * 8 + i) * 32);
          for (int nib = 0; nib < 2; ++nib) {
            const int j = h + 2 * nib;
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * nib), nibble);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), two);
            const __m256i w = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), bias);
            const int e = 128 * n + 32 * j + 4 * i;  // elements e .. e + 3 of every row
            AddSignedRun<T>(w, scv[e / 16], x, 256 * b + e, isum);
          }
        }
      }
    }
    AddPackedBlockTerms<T>(blk + 1536, x, b, isum, acc);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], acc[t]);
}

// Q2_K rows packed in groups of 8 (cpu::PackRows), as DotQ3_KPacked8 for the codes (0..3,
// unsigned against the activations) and DotQ4_KPacked8 for the float steps: each row's integers
// are the row kernel's sum_g sc_g sum q q_x and sum_g m_g bsum_g (the mins by madd on pairs of
// groups), its float steps the same: the same bits.
template <int T>
[[gnu::optimize("fp-contract=off")]] void DotQ2_KPacked8(const uint8_t* group, int64_t n_blocks,
                                                         const ActsView* x, float (*out)[8]) {
  constexpr int64_t kBytes = kQ2_KPackedBlockBytes, kAhead = 6 * kBytes;
  const __m256i two = _mm256_set1_epi8(3), nibble = _mm256_set1_epi32(0x0F);
  __m256 acc[T], acc_m[T];
  for (int t = 0; t < T; ++t) acc[t] = acc_m[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = group + b * kBytes;
    for (int64_t line = 0; line < kBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + line), _MM_HINT_T0);
    }
    __m256i scv[16];  // each row's sc_g in both 16-bit halves of its lane
    __m256i mins[8];  // each row's m_2k (low 16 bits) and m_2k+1 (high)
    for (int g = 0; g < 16; ++g) {
      const __m256i v = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 544 + 8 * g)));
      const __m256i sc = _mm256_and_si256(v, nibble), m = _mm256_srli_epi32(v, 4);
      scv[g] = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
      mins[g / 2] = g % 2 == 0 ? m : _mm256_or_si256(mins[g / 2], _mm256_slli_epi32(m, 16));
    }
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      for (int i = 0; i < 8; ++i) {
        const __m256i v = Load32(blk + (n * 8 + i) * 32);
        for (int j = 0; j < 4; ++j) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), two);
          const int e = 128 * n + 32 * j + 4 * i;  // elements e .. e + 3 of every row
          AddUnsignedRun<T>(q, scv[e / 16], x, 256 * b + e, isum);
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 512)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 528)));
    for (int t = 0; t < T; ++t) {
      const __m256 dx = _mm256_set1_ps(x[t].d[b]);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
      const int16_t* bsum = x[t].bsum + 16 * b;
      __m256i mm = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        int32_t pair;  // bsum_2k (low 16 bits), bsum_2k+1 (high)
        std::memcpy(&pair, bsum + 2 * k, 4);
        mm = _mm256_add_epi32(mm, _mm256_madd_epi16(mins[k], _mm256_set1_epi32(pair)));
      }
      acc_m[t] =
          _mm256_add_ps(acc_m[t], _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mm)));
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], _mm256_sub_ps(acc[t], acc_m[t]));
}

// The 16-bit scales of groups g (bytes 0-15 of a 32-byte step) and g + 1 (bytes 16-31).
inline __m256i ScalePair(int16_t g0, int16_t g1) {
  return _mm256_setr_m128i(_mm_set1_epi16(g0), _mm_set1_epi16(g1));
}

// sum_g sc16[g] * bsum[g] over a 256-block's 16 groups of 16.
inline int ScaledBsums(__m256i sc16, const int16_t* bsum) {
  return HsumI32(
      _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsum))));
}

// acc + (dx * d) * float(sumi), two roundings and an addition (Q6_K's, Q3_K's and IQ4_XS's float
// step, quant_blocks.h).
[[gnu::optimize("fp-contract=off")]] inline float AddBlockTerm(float acc, float dx, float d,
                                                               int sumi) {
  const float scale = dx * d;
  const float term = scale * static_cast<float>(sumi);
  return acc + term;
}

template <int R>
[[gnu::optimize("fp-contract=off")]] void DotQ6_K(const uint8_t* w_base, int64_t row_bytes,
                                                  ActsView x, int64_t k, float* out) {
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  float acc[R] = {};
  for (int64_t b = 0; b < k / 256; ++b) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = w_base + r * row_bytes;
      for (int line = 0; line < 210; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * 210 + line), _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * 210;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const int8_t* qx = x.q + 256 * b;
      __m256i isum = _mm256_setzero_si256();
      for (int n = 0; n < 2; ++n) {
        const __m256i qh = Load32(blk + 128 + 32 * n);
        const __m256i ql0 = Load32(blk + 64 * n), ql1 = Load32(blk + 64 * n + 32);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low),
                               _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
        q[1] =
            _mm256_or_si256(_mm256_and_si256(ql1, low),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
        q[2] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
        q[3] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
        for (int i = 0; i < 4; ++i) {
          const __m256i p = _mm256_maddubs_epi16(q[i], Load32(qx + 128 * n + 32 * i));
          const __m256i scales = ScalePair(sc[8 * n + 2 * i], sc[8 * n + 2 * i + 1]);
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales));
        }
      }
      // bias = sum_j sc_j * bsum_j over the 16 groups
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
      const int sumi = HsumI32(isum) - 32 * ScaledBsums(sc16, x.bsum + 16 * b);
      acc[r] = AddBlockTerm(acc[r], x.d[b], HalfToFloat(blk + 208), sumi);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Q3_K: per 32 bytes of qs (n) and bit pair j, the 3-bit codes q of elements 128 n + 32 j + i
// (low bits | hmask bit 4 n + j << 2), unsigned against the activations; the - 4 of every code
// comes back as 4 sum_g (sc_g - 32) bsum_g, as Q6_K's - 32 does.
template <int R>
[[gnu::optimize("fp-contract=off")]] void DotQ3_K(const uint8_t* w_base, int64_t row_bytes,
                                                  ActsView x, int64_t k, float* out) {
  constexpr int kBytes = quant::kQ3_KBytes;
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  float acc[R] = {};
  for (int64_t b = 0; b < k / 256; ++b) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = w_base + r * row_bytes;
      for (int line = 0; line < kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * kBytes + line), _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * kBytes;
      const int8_t* qx = x.q + 256 * b;
      int16_t sc[16];
      for (int g = 0; g < 16; ++g) sc[g] = static_cast<int16_t>(quant::Q3KScale(blk + 96, g) - 32);
      const __m256i hm = Load32(blk);
      __m256i isum = _mm256_setzero_si256();
      for (int n = 0; n < 2; ++n) {
        const __m256i qs = Load32(blk + 32 + 32 * n);
        for (int j = 0; j < 4; ++j) {
          const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), two);
          const __m256i third = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * n + j), one);
          const __m256i q = _mm256_or_si256(low, _mm256_slli_epi16(third, 2));
          const __m256i p = _mm256_maddubs_epi16(q, Load32(qx + 128 * n + 32 * j));
          const int g = 8 * n + 2 * j;
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ScalePair(sc[g], sc[g + 1])));
        }
      }
      const __m256i sc16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc));
      const int sumi = HsumI32(isum) - 4 * ScaledBsums(sc16, x.bsum + 16 * b);
      acc[r] = AddBlockTerm(acc[r], x.d[b], HalfToFloat(blk + 108), sumi);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Q2_K: Q4_K's float steps over 16 groups of 16 (codes 0..3 at bits 2j of qs[32 n + i]).
template <int R>
[[gnu::optimize("fp-contract=off")]] void DotQ2_K(const uint8_t* w_base, int64_t row_bytes,
                                                  ActsView x, int64_t k, float* out) {
  constexpr int kBytes = quant::kQ2_KBytes;
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i two = _mm256_set1_epi8(3);
  for (int r = 0; r < R; ++r) {
    const uint8_t* w = w_base + r * row_bytes;
    float acc = 0.0f, acc_m = 0.0f;
    for (int64_t b = 0; b < k / 256; ++b) {
      for (int line = 0; line < kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * kBytes + line), _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * kBytes;
      const int8_t* qx = x.q + 256 * b;
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
      alignas(32) int16_t sc[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(sc),
                         _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F))));
      __m256i isum = _mm256_setzero_si256();
      for (int n = 0; n < 2; ++n) {
        const __m256i qs = Load32(blk + 16 + 32 * n);
        for (int j = 0; j < 4; ++j) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), two);
          const __m256i p = _mm256_maddubs_epi16(q, Load32(qx + 128 * n + 32 * j));
          const int g = 8 * n + 2 * j;
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ScalePair(sc[g], sc[g + 1])));
        }
      }
      const __m256i mins =
          _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
      const int summ = ScaledBsums(mins, x.bsum + 16 * b);
      acc = std::fma(x.d[b] * HalfToFloat(blk + 80), static_cast<float>(HsumI32(isum)), acc);
      const float m = (x.d[b] * HalfToFloat(blk + 82)) * static_cast<float>(summ);
      acc_m = acc_m + m;
    }
    out[r] = acc - acc_m;
  }
}

// IQ4_XS: per group of 32, the codebook values (signed) against the activations by the sign
// trick, times the group's ls - 32.
template <int R>
[[gnu::optimize("fp-contract=off")]] void DotIq4Xs(const uint8_t* w_base, int64_t row_bytes,
                                                   ActsView x, int64_t k, float* out) {
  constexpr int kBytes = quant::kIQ4_XSBytes;
  const int64_t ahead = PrefetchAhead(R, row_bytes);
  const __m256i codebook = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values)));
  const __m256i low = _mm256_set1_epi8(0x0F);
  float acc[R] = {};
  for (int64_t b = 0; b < k / 256; ++b) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = w_base + r * row_bytes;
      for (int line = 0; line < kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * kBytes + line), _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * kBytes;
      const int8_t* qx = x.q + 256 * b;
      __m256i isum = _mm256_setzero_si256();
      for (int ib = 0; ib < 8; ++ib) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * ib));
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        const __m256i wq = _mm256_shuffle_epi8(codebook, q);
        const __m256i xq = Load32(qx + 32 * ib);
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
        const __m256i ls = _mm256_set1_epi16(static_cast<int16_t>(quant::Iq4XsScale(blk, ib) - 32));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ls));
      }
      acc[r] = AddBlockTerm(acc[r], x.d[b], HalfToFloat(blk), HsumI32(isum));
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// y[t, n] for rows [n_begin, n_end) and every token row t, 4 rows at a time; the weight rows of
// the range stay in L1/L2 across token rows. packed: rows interleaved by 8 (TensorView::cpu_packed;
// n_begin and n_end are then multiples of 8), or null.
template <DType T>
void IntDotRangeOf(const void* w, const void* packed, int64_t k_in, int64_t n_out, int64_t n_begin,
                   int64_t n_end, const ActsView* acts, int64_t m_rows, float* y) {
  const int64_t row_bytes = DTypeRowBytes(T, k_in);
  const uint8_t* base = static_cast<const uint8_t*>(w);
  if constexpr (T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kIQ4_XS ||
                T == DType::kQ3_K || T == DType::kQ6_K || T == DType::kQ2_K) {
    if (packed != nullptr) {
      // 4 token rows per pass over a group's blocks (prefill), then one at a time; all groups of
      // the range for one tile of token rows, then the next tile (measured faster than all tiles
      // for one group: 95 against 86 tok/s, prefill of 128 tokens on the 2-core VM).
      const int64_t n_blocks = k_in / 256;
      auto tile = [&]<int kTokens>(int64_t t) {
        for (int64_t n = n_begin; n < n_end; n += 8) {
          float out[kTokens][8];
          const uint8_t* rows8 =
              static_cast<const uint8_t*>(packed) + n / 8 * n_blocks * PackedBlockBytes(T);
          if constexpr (T == DType::kQ4_K) {
            DotQ4_KPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          } else if constexpr (T == DType::kQ5_K) {
            DotQ5_KPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          } else if constexpr (T == DType::kQ3_K) {
            DotQ3_KPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          } else if constexpr (T == DType::kQ6_K) {
            DotQ6_KPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          } else if constexpr (T == DType::kQ2_K) {
            DotQ2_KPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          } else {
            DotIq4XsPacked8<kTokens>(rows8, n_blocks, acts + t, out);
          }
          for (int i = 0; i < kTokens; ++i) {
            for (int r = 0; r < 8; ++r) y[(t + i) * n_out + n + r] = out[i][r];
          }
        }
      };
      int64_t t = 0;
      for (; t + 4 <= m_rows; t += 4) tile.template operator()<4>(t);
      for (; t < m_rows; ++t) tile.template operator()<1>(t);
      return;
    }
  }
  if constexpr (TakesQ8_0Activations(T)) {  // packable (CanPackRows)
    if (packed != nullptr) {
      const int64_t n_blocks = k_in / 32;
      constexpr int64_t bytes = PackedBlockBytes(T);
      const uint8_t* groups = static_cast<const uint8_t*>(packed);
      // Tiles of kTile token rows (prefill), every group of the range for one tile, then the
      // rest one row at a time (decode's kernel; the same bits either way).
      constexpr int kTile = 4;
      int64_t t = 0;
      for (; t + kTile <= m_rows; t += kTile) {
        for (int64_t n = n_begin; n < n_end; n += 8) {
          float out[kTile][8];
          DotQ8_0PackedTokens<T, kTile>(groups + n / 8 * n_blocks * bytes, n_blocks, acts + t, out);
          for (int i = 0; i < kTile; ++i) {
            for (int r = 0; r < 8; ++r) y[(t + i) * n_out + n + r] = out[i][r];
          }
        }
      }
      for (; t < m_rows; ++t) {
        for (int64_t n = n_begin; n < n_end; n += 8) {
          DotQ8_0Packed8<T>(groups + n / 8 * n_blocks * bytes, n_blocks, acts[t],
                            y + t * n_out + n);
        }
      }
      return;
    }
  }
  auto rows = [&]<int R>(int64_t n, int64_t t) {
    float out[R];
    const uint8_t* row = base + n * row_bytes;
    if constexpr (TakesQ8_0Activations(T)) {
      DotQ8_0Blocks<R, T>(row, row_bytes, acts[t], k_in, out);
    } else if constexpr (T == DType::kQ4_K)
      DotQ45_K<R, false>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ5_K)
      DotQ45_K<R, true>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ2_K)
      DotQ2_K<R>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ3_K)
      DotQ3_K<R>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kIQ4_XS)
      DotIq4Xs<R>(row, row_bytes, acts[t], k_in, out);
    else
      DotQ6_K<R>(row, row_bytes, acts[t], k_in, out);
    for (int r = 0; r < R; ++r) y[t * n_out + n + r] = out[r];
  };
  for (int64_t t = 0; t < m_rows; ++t) {
    int64_t n = n_begin;
    if constexpr (TakesQ8_0Activations(T)) {
      for (; n + 4 <= n_end; n += 4) rows.template operator()<4>(n, t);
    }
    for (; n < n_end; ++n) rows.template operator()<1>(n, t);
  }
}

}  // namespace

void QuantizeActsQ8_0(const float* x, int64_t k, int8_t* q, float* d) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float db = QuantizeActBlock(x + b * 32, 32, q + b * 32);
    d[b] = _cvtsh_ss(_cvtss_sh(db, _MM_FROUND_TO_NEAREST_INT));
  }
}

void QuantizeActsQ8_K(const float* x, int64_t k, int8_t* q, float* d, int16_t* bsum) {
  for (int64_t b = 0; b < k / 256; ++b) d[b] = QuantizeActBlock(x + b * 256, 256, q + b * 256);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < k / 32; ++g) {  // two 16-element sums per 32 bytes
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * g));
    const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
    bsum[2 * g] = static_cast<int16_t>(HsumI32(_mm256_madd_epi16(lo, ones)));
    bsum[2 * g + 1] = static_cast<int16_t>(HsumI32(_mm256_madd_epi16(hi, ones)));
  }
}

void IntDotRange(DType t, const void* w, const void* packed, int64_t k_in, int64_t n_out,
                 int64_t n_begin, int64_t n_end, const ActsView* acts, int64_t m_rows, float* y) {
  auto run = [&]<DType T>() {
    IntDotRangeOf<T>(w, packed, k_in, n_out, n_begin, n_end, acts, m_rows, y);
  };
  switch (t) {
    case DType::kQ8_0:
      return run.template operator()<DType::kQ8_0>();
    case DType::kQ4_0:
      return run.template operator()<DType::kQ4_0>();
    case DType::kQ5_0:
      return run.template operator()<DType::kQ5_0>();
    case DType::kIQ4_NL:
      return run.template operator()<DType::kIQ4_NL>();
    case DType::kQ4_K:
      return run.template operator()<DType::kQ4_K>();
    case DType::kQ5_K:
      return run.template operator()<DType::kQ5_K>();
    case DType::kQ6_K:
      return run.template operator()<DType::kQ6_K>();
    case DType::kQ2_K:
      return run.template operator()<DType::kQ2_K>();
    case DType::kQ3_K:
      return run.template operator()<DType::kQ3_K>();
    case DType::kIQ4_XS:
      return run.template operator()<DType::kIQ4_XS>();
    default:
      KCHECK_MSG(false, "IntDotRange: no integer kernel for this dtype (HasIntDot)");
  }
}

}  // namespace kestrel::cpu::avx2
