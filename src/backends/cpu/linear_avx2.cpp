// AVX2/FMA/F16C Linear (y = x W^T + b) with weights converted to f32 on the fly.
//
// Two kernels. Output rows are cut into fixed chunks that the threads take from a shared counter
// (LinearGroup); each y element is computed by one thread, in an order that depends neither on
// the thread count nor on how rows are grouped into tiles:
//
//  * Streaming ("direct") kernel for up to kDirectMaxRows token rows (decode): W is read straight
//    from the mmap, R weight rows at a time (R = 8 for one token row: eight concurrent streams),
//    each 8-wide load converted once and used for every token row; each tile software-prefetches
//    the rows the thread reads next. Per element: one 8-lane accumulator over k in steps of 8, a
//    fixed-order horizontal sum, then a scalar FMA tail for k % 8. Every (R, MT) tile instance
//    computes exactly that, so a row gives the same bits whichever tile shape or thread covers it.
//
//  * Packed kernel for more token rows (prefill): per k block of 256, a block of up to 96 token
//    rows of x is packed into 6-row tiles (L2), then each 16-row panel of W is converted and
//    transposed into a [256][16] f32 block (16 KB, L1) and a 6x16 register tile (12 ymm
//    accumulators, broadcast x, two W loads, 12 FMAs per k) sweeps the x block. Per element: one
//    sequential FMA chain over k (continued through y between k blocks), independent of the tile.
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd_avx2.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu::avx2 {
namespace {

// ---- loads (local copies: no shared inline helpers in this AVX2 translation unit) ----------

template <DType T>
inline __m256 Load8(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (T == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16: the 16 bits are the high half of an f32
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType T>
inline float Load1(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) {
    float f;
    std::memcpy(&f, static_cast<const float*>(base) + i, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, 2);
    if constexpr (T == DType::kF16) {
      return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    } else {
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  }
}

// ---- block-quantized weights (core/quant_blocks.h defines the formats; local copies here) ----

template <DType T>
constexpr bool kLegacy = T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                         T == DType::kQ5_1;
// Rows read 32 elements at a time through Dequant32.
// Q2_K / Q3_K (16-element groups with 2-bit codes, Q3_K's third bit in hmask) and the
// non-linear IQ4_NL / IQ4_XS.
template <DType T>
constexpr bool kLowBitK = T == DType::kQ2_K || T == DType::kQ3_K;
template <DType T>
constexpr bool kIq4 = T == DType::kIQ4_NL || T == DType::kIQ4_XS;
template <DType T>
constexpr bool kBlock = T == DType::kQ8_0 || T == DType::kQ4_K || T == DType::kQ5_K ||
                        T == DType::kQ6_K || T == DType::kF8E4M3 || T == DType::kMlxQ4 ||
                        T == DType::kMlxQ8 || kLegacy<T> || kLowBitK<T> || kIq4<T>;
// The integer kernels with int8 activations (HasIntDot).
template <DType T>
constexpr bool kIntDot = HasIntDot(T);

// The FP8 / MLX weight the calling thread is reading (its side scales), set by LinearGroup's
// chunk runner before the kernels run on it.
thread_local const TensorView* tl_scaled = nullptr;

// Bytes of one row of k_in elements.
template <DType T>
constexpr int64_t RowBytes(int64_t k_in) {
  if constexpr (T == DType::kF32) return 4 * k_in;
  else if constexpr (T == DType::kF16 || T == DType::kBF16) return 2 * k_in;
  else if constexpr (T == DType::kQ8_0) return k_in / 32 * 34;
  else if constexpr (T == DType::kQ4_K) return k_in / 256 * 144;
  else if constexpr (T == DType::kQ5_K) return k_in / 256 * 176;
  else if constexpr (T == DType::kF8E4M3 || T == DType::kMlxQ8) return k_in;
  else if constexpr (T == DType::kMlxQ4) return k_in / 2;
  else if constexpr (kLegacy<T>) return k_in / 32 * quant::LegacyLayout(T).bytes;
  else if constexpr (T == DType::kQ2_K)
    return k_in / 256 * quant::kQ2_KBytes;
  else if constexpr (T == DType::kQ3_K)
    return k_in / 256 * quant::kQ3_KBytes;
  else if constexpr (T == DType::kIQ4_NL)
    return k_in / 32 * quant::kIQ4_NLBytes;
  else if constexpr (T == DType::kIQ4_XS)
    return k_in / 256 * quant::kIQ4_XSBytes;
  else return k_in / 256 * 210;
}

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i Bytes8ToI32(const uint8_t* p) {  // 8 unsigned bytes -> 8 x i32
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// out[0..4) = elements [k, k + 32) of the row starting at `row` (k a multiple of 32), each the
// exact value of the format's definition; out[j] holds elements k + 8j .. k + 8j + 7.
template <DType T>
inline void Dequant32(const uint8_t* row, int64_t k, __m256 out[4]) {
  if constexpr (T == DType::kQ8_0) {
    const uint8_t* b = row + k / 32 * 34;
    const __m256 d = _mm256_set1_ps(HalfToFloat(b));
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * j)));
      out[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
    }
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    // Q5_K: Q4_K's nibbles (at byte 48, after qh) with the fifth bit g of qh[l] for element l of
    // group g.
    constexpr bool kFifthBit = T == DType::kQ5_K;
    const uint8_t* b = row + k / 256 * (kFifthBit ? 176 : 144);
    const int g = static_cast<int>(k % 256) >> 5, c = g >> 1, hi = g & 1;
    const uint8_t* sc = b + 4;
    int s, m;
    if (g < 4) {
      s = sc[g] & 63;
      m = sc[g + 4] & 63;
    } else {
      s = (sc[g + 4] & 0xF) | ((sc[g - 4] >> 6) << 4);
      m = (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4);
    }
    const __m256 d1 = _mm256_set1_ps(HalfToFloat(b) * static_cast<float>(s));
    const __m256 m1 = _mm256_set1_ps(HalfToFloat(b + 2) * static_cast<float>(m));
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + (kFifthBit ? 48 : 16) + 32 * c;
    const __m256i low = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    const __m128i qh_shift = _mm_cvtsi32_si128(g);
    for (int j = 0; j < 4; ++j) {
      __m256i v = Bytes8ToI32(q + 8 * j);
      v = hi ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, low);
      if constexpr (kFifthBit) {
        const __m256i h = _mm256_and_si256(_mm256_srl_epi32(Bytes8ToI32(qh + 8 * j), qh_shift), one);
        v = _mm256_or_si256(v, _mm256_slli_epi32(h, 4));
      }
      // d1 * q is exact (an f16 times 6 bits times 4 or 5 bits), so the fused form rounds as the
      // definition's d1 * q - m1 does.
      out[j] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(v), d1, m1);
    }
  } else if constexpr (kLegacy<T>) {
    // Q4_0 / Q4_1 / Q5_0 / Q5_1: vectors 0, 1 from the low nibbles of bytes 0-15, 2, 3 from the
    // high ones; the fifth bit of element 8j + i is bit 8j + i of qh.
    constexpr quant::LegacyBlock l = quant::LegacyLayout(T);
    const uint8_t* b = row + k / 32 * l.bytes;
    const __m256 d = _mm256_set1_ps(HalfToFloat(b));
    const __m256 m = _mm256_set1_ps(l.has_min ? HalfToFloat(b + 2) : 0.0f);
    const __m256i low = _mm256_set1_epi32(0xF), one = _mm256_set1_epi32(1);
    const __m256i offset = _mm256_set1_epi32(l.offset);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint32_t qh = 0;
    if constexpr (l.qh_at >= 0) std::memcpy(&qh, b + l.qh_at, 4);
    for (int j = 0; j < 4; ++j) {
      __m256i v = Bytes8ToI32(b + l.nibbles_at + 8 * (j & 1));
      v = j < 2 ? _mm256_and_si256(v, low) : _mm256_srli_epi32(v, 4);
      if constexpr (l.qh_at >= 0) {
        const __m256i h = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> (8 * j))), lanes), one);
        v = _mm256_or_si256(v, _mm256_slli_epi32(h, 4));
      }
      if constexpr (l.has_min) {
        out[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m);  // q * d exact: one rounding
      } else {
        out[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, offset)), d);
      }
    }
  } else if constexpr (kLowBitK<T>) {
    // Elements k .. k + 31 are (n, j) = ((k % 256) / 128, (k % 128) / 32) of the block: halves
    // h = 0, 1 (groups g0, g0 + 1), low bits at bits 2j of qs[32 n + 16 h + l].
    constexpr bool kQ3 = T == DType::kQ3_K;
    const uint8_t* b = row + k / 256 * (kQ3 ? quant::kQ3_KBytes : quant::kQ2_KBytes);
    const int e0 = static_cast<int>(k % 256), n = e0 >> 7, j = (e0 >> 5) & 3, g0 = e0 >> 4;
    const uint8_t* qs = b + (kQ3 ? 32 : 16) + 32 * n;
    const __m128i low_shift = _mm_cvtsi32_si128(2 * j), high_shift = _mm_cvtsi32_si128(4 * n + j);
    const __m256i two = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
    const float d = HalfToFloat(b + (kQ3 ? 108 : 80));
    for (int jj = 0; jj < 4; ++jj) {
      const int h = jj >> 1, l0 = (jj & 1) * 8, g = g0 + h;
      __m256i v = _mm256_and_si256(_mm256_srl_epi32(Bytes8ToI32(qs + 16 * h + l0), low_shift), two);
      if constexpr (kQ3) {
        const __m256i third =
            _mm256_and_si256(_mm256_srl_epi32(Bytes8ToI32(b + 16 * h + l0), high_shift), one);
        v = _mm256_sub_epi32(_mm256_or_si256(v, _mm256_slli_epi32(third, 2)), _mm256_set1_epi32(4));
        const __m256 dl = _mm256_set1_ps(d * static_cast<float>(quant::Q3KScale(b + 96, g) - 32));
        out[jj] = _mm256_mul_ps(dl, _mm256_cvtepi32_ps(v));  // exact
      } else {
        const __m256 dl = _mm256_set1_ps(d * static_cast<float>(b[g] & 0xF));
        const __m256 ml = _mm256_set1_ps(HalfToFloat(b + 82) * static_cast<float>(b[g] >> 4));
        out[jj] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(v), dl, ml);  // dl * q exact: one rounding
      }
    }
  } else if constexpr (kIq4<T>) {
    // The 16 nibbles of a 32-group (elements l and l + 16 in byte l) through the codebook.
    const uint8_t* b;
    float scale;
    if constexpr (T == DType::kIQ4_NL) {
      b = row + k / 32 * quant::kIQ4_NLBytes;
      scale = HalfToFloat(b);
      b += 2;
    } else {
      const uint8_t* blk = row + k / 256 * quant::kIQ4_XSBytes;
      const int ib = static_cast<int>(k % 256) >> 5;
      scale = HalfToFloat(blk) * static_cast<float>(quant::Iq4XsScale(blk, ib) - 32);
      b = blk + 8 + 16 * ib;
    }
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4Values));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i v[2] = {_mm_shuffle_epi8(table, _mm_and_si128(raw, mask)),
                          _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(raw, 4), mask))};
    const __m256 s = _mm256_set1_ps(scale);
    for (int jj = 0; jj < 4; ++jj) {
      const __m128i part = (jj & 1) ? _mm_srli_si128(v[jj >> 1], 8) : v[jj >> 1];
      out[jj] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)));  // exact
    }
  } else if constexpr (T == DType::kF8E4M3) {
    // e4m3 -> f16 bits (exponent rebias by 2^8 done in f32, exactly), times the block's scale.
    const TensorView& v = *tl_scaled;
    const int64_t n = (row - static_cast<const uint8_t*>(v.data)) / v.shape[1];
    const int64_t scale_cols = (v.shape[1] + v.block_cols - 1) / v.block_cols;
    const __m256 s = _mm256_set1_ps(v.block_scale[n / v.block_rows * scale_cols + k / v.block_cols]);
    const __m256 rebias = _mm256_set1_ps(256.0f);
    const __m128i mag = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
    for (int j = 0; j < 4; ++j) {
      const __m128i b8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k + 8 * j)));
      const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b8, mag), 7),
                                     _mm_slli_epi16(_mm_and_si128(b8, sign), 8));
      out[j] = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), rebias), s);
    }
  } else if constexpr (T == DType::kMlxQ4 || T == DType::kMlxQ8) {
    const TensorView& v = *tl_scaled;
    const int64_t row_bytes = RowBytes<T>(v.shape[1]);
    const int64_t n = (row - static_cast<const uint8_t*>(v.data)) / row_bytes;
    const int64_t g = n * (v.shape[1] / v.block_cols) + k / v.block_cols;
    const __m256 s = _mm256_set1_ps(v.block_scale[g]), bias = _mm256_set1_ps(v.group_bias[g]);
    __m128i q8[2];  // the 32 elements as bytes
    if constexpr (T == DType::kMlxQ4) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
      const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
      q8[0] = _mm_unpacklo_epi8(lo, hi);  // element 2i in the low nibble of byte i
      q8[1] = _mm_unpackhi_epi8(lo, hi);
    } else {
      q8[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
      q8[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16));
    }
    for (int j = 0; j < 4; ++j) {
      const __m128i part = (j & 1) ? _mm_srli_si128(q8[j >> 1], 8) : q8[j >> 1];
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
      // scale * q is exact (a bf16/f16 scale times at most 8 bits), so the fused form rounds as
      // scale * q + bias does.
      out[j] = _mm256_fmadd_ps(q, s, bias);
    }
  } else {  // Q6_K
    const uint8_t* b = row + k / 256 * 210;
    const int j256 = static_cast<int>(k % 256);
    const int n = j256 >> 7, g = (j256 & 127) >> 5;
    const uint8_t* ql = b + 64 * n + (g & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n + 2 * g;
    const float d = HalfToFloat(b + 208);
    const __m128i ql_shift = _mm_cvtsi32_si128((g >> 1) * 4);
    const __m128i qh_shift = _mm_cvtsi32_si128(2 * g);
    const __m256i low = _mm256_set1_epi32(0xF), two = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    for (int j = 0; j < 4; ++j) {
      const __m256i lo4 = _mm256_and_si256(_mm256_srl_epi32(Bytes8ToI32(ql + 8 * j), ql_shift), low);
      const __m256i hi2 = _mm256_and_si256(_mm256_srl_epi32(Bytes8ToI32(qh + 8 * j), qh_shift), two);
      const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo4, _mm256_slli_epi32(hi2, 4)), bias);
      const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc[j >> 1]));
      out[j] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q));
    }
  }
}

// ---- integer dot products against int8 activations (core/quant_blocks.h defines them) -------

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
  for (int i = 0; i < n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
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

struct ActsView {  // one row's activation blocks (Q8_0: d per 32; Q8_K: d per 256 and bsums)
  const int8_t* q;
  const float* d;
  const int16_t* bsum;
};

inline __m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

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
  for (int g = 0; g < 8; ++g) pick[g] = _mm256_set1_epi16(static_cast<int16_t>((2 * g) | ((2 * g + 1) << 8)));
  for (int r = 0; r < R; ++r) {
    const uint8_t* w = w_base + r * row_bytes;
    __m256 acc = _mm256_setzero_ps();
    float acc_one = 0.0f;  // Q4_K
    float acc_m = 0.0f;
    for (int64_t b = 0; b < k / 256; ++b) {
      for (int line = 0; line < kBlockBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + ahead + b * kBlockBytes + line), _MM_HINT_T0);
      }
      const uint8_t* blk = w + b * kBlockBytes;
      // The 12 bytes of 6-bit scales and mins as two words each (ggml's packing).
      uint32_t u[3];
      std::memcpy(u, blk + 4, 12);
      const uint32_t sw[2] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)};
      const uint32_t mw[2] = {u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)};
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
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        const __m256i plo = _mm256_maddubs_epi16(lo, Load32(qx + 64 * c));
        const __m256i phi = _mm256_maddubs_epi16(hi, Load32(qx + 64 * c + 32));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, _mm256_shuffle_epi8(scales, pick[2 * c])));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, _mm256_shuffle_epi8(scales, pick[2 * c + 1])));
      }
      if constexpr (kFifthBit) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d[b] * HalfToFloat(blk)),
                              _mm256_cvtepi32_ps(isum), acc);
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
        const __m256i bits = _mm256_and_si256(
            _mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * j), bcast), bit_k);
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
      // Each row's sum over g of m_g * (bsum[2g] + bsum[2g + 1]).
      const int16_t* bsum = x[t].bsum + 16 * b;
      const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum));
      const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum + 8));
      const __m256i pairs = _mm256_cvtepi16_epi32(_mm_hadd_epi16(bs_lo, bs_hi));
      __m256i mm = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(mins[g]));
        mm = _mm256_add_epi32(
            mm, _mm256_mullo_epi32(m, _mm256_permutevar8x32_epi32(pairs, _mm256_set1_epi32(g))));
      }
      acc_m[t] =
          _mm256_add_ps(acc_m[t], _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mm)));
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
        for (int t = 0; t < T; ++t) {
          const int8_t* qx = x[t].q + 256 * b + 64 * c + 4 * j;
          int32_t xl, xh;
          std::memcpy(&xl, qx, 4);
          std::memcpy(&xh, qx + 32, 4);
          isum[t] = _mm256_add_epi32(
              isum[t],
              _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)), scales[2 * c]));
          isum[t] = _mm256_add_epi32(
              isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)),
                                         scales[2 * c + 1]));
        }
      }
      for (int t = 0; t < T; ++t) {
        lane[t][j] = _mm256_fmadd_ps(scale[t], _mm256_cvtepi32_ps(isum[t]), lane[t][j]);
      }
    }
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kTail + 16)));
    for (int t = 0; t < T; ++t) {
      // Each row's sum over g of m_g * (bsum[2g] + bsum[2g + 1]).
      const int16_t* bsum = x[t].bsum + 16 * b;
      const __m128i bs_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum));
      const __m128i bs_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum + 8));
      const __m256i pairs = _mm256_cvtepi16_epi32(_mm_hadd_epi16(bs_lo, bs_hi));
      __m256i mm = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        mm = _mm256_add_epi32(mm, _mm256_mullo_epi32(mins[g], _mm256_permutevar8x32_epi32(
                                                                  pairs, _mm256_set1_epi32(g))));
      }
      const __m256 dx = _mm256_set1_ps(x[t].d[b]);
      acc_m[t] =
          _mm256_add_ps(acc_m[t], _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mm)));
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t], _mm256_sub_ps(SumLanes(lane[t]), acc_m[t]));
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
          const __m256i& sc = scv[e / 16];
          for (int t = 0; t < T; ++t) {
            int32_t xq;
            std::memcpy(&xq, x[t].q + 256 * b + e, 4);
            const __m256i p = _mm256_maddubs_epi16(q, _mm256_set1_epi32(xq));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, sc));
          }
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
[[gnu::optimize("fp-contract=off")]] void DotQ6_K(const uint8_t* w_base, int64_t row_bytes, ActsView x,
                                                 int64_t k, float* out) {
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
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
      for (int i = 0; i < 4; ++i) {
        const __m256i p = _mm256_maddubs_epi16(q[i], Load32(qx + 128 * n + 32 * i));
        const __m256i scales = ScalePair(sc[8 * n + 2 * i], sc[8 * n + 2 * i + 1]);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales));
      }
    }
    // bias = sum_j sc_j * bsum_j over the 16 groups
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
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
void IntDotRange(const void* w, const void* packed, int64_t k_in, int64_t n_out, int64_t n_begin,
                 int64_t n_end, const ActsView* acts, int64_t m_rows, float* y) {
  const int64_t row_bytes = RowBytes<T>(k_in);
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
          DotQ8_0PackedTokens<T, kTile>(groups + n / 8 * n_blocks * bytes, n_blocks, acts + t,
                                        out);
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
    } else if constexpr (T == DType::kQ4_K) DotQ45_K<R, false>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ5_K) DotQ45_K<R, true>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ2_K)
      DotQ2_K<R>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kQ3_K)
      DotQ3_K<R>(row, row_bytes, acts[t], k_in, out);
    else if constexpr (T == DType::kIQ4_XS)
      DotIq4Xs<R>(row, row_bytes, acts[t], k_in, out);
    else DotQ6_K<R>(row, row_bytes, acts[t], k_in, out);
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

// ---- streaming kernel ------------------------------------------------------------------------

// y[t, n0 + r] for r < R, t < MT.
//   w [n, k_in] (file dtype);  x [MT, k_in] (row stride k_in);  y row stride ldy
// While it runs, the tile prefetches [prefetch, prefetch + prefetch_bytes) (the weights it will
// read next), spread evenly over its k loop: rows are often only a few KB long, too short for
// the hardware prefetchers to ramp up on each.
template <DType T, int R, int MT>
inline void DirectTile(const void* w, int64_t k_in, int64_t n0, const float* x, float* y,
                       int64_t ldy, const char* prefetch, int64_t prefetch_bytes) {
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t k8 = k_in & ~int64_t{7};
  const int64_t row0 = n0 * k_in;
  const int64_t next_lines = prefetch != nullptr ? prefetch_bytes / 64 : 0;
  const int64_t lines_per_step = k8 > 0 ? (next_lines * 8 + k8 - 1) / k8 : 0;
  const char* next = prefetch;
  int64_t line = 0;
  if constexpr (kBlock<T>) {
    // Rows are whole blocks (k_in % 32 == 0): 32 elements per step, added to each accumulator
    // 8 at a time in k order, as the float path adds them.
    const int64_t row_bytes = RowBytes<T>(k_in);
    const uint8_t* w0 = static_cast<const uint8_t*>(w) + n0 * row_bytes;
    for (int64_t k = 0; k < k_in; k += 32) {
      for (int64_t i = 0; i < 4 * lines_per_step && line < next_lines; ++i, ++line) {
        _mm_prefetch(next + line * 64, _MM_HINT_T0);
      }
      for (int r = 0; r < R; ++r) {
        __m256 wv[4];
        Dequant32<T>(w0 + r * row_bytes, k, wv);
        for (int t = 0; t < MT; ++t) {
          for (int j = 0; j < 4; ++j) {
            acc[r][t] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(x + t * k_in + k + 8 * j), acc[r][t]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < MT; ++t) y[t * ldy + n0 + r] = HorizontalSum(acc[r][t]);
    }
    return;
  }
  for (int64_t k = 0; k < k8; k += 8) {
    for (int64_t i = 0; i < lines_per_step && line < next_lines; ++i, ++line) {
      _mm_prefetch(next + line * 64, _MM_HINT_T0);
    }
    if constexpr (MT == 1) {
      const __m256 xv = _mm256_loadu_ps(x + k);
      for (int r = 0; r < R; ++r) {
        acc[r][0] = _mm256_fmadd_ps(Load8<T>(w, row0 + r * k_in + k), xv, acc[r][0]);
      }
    } else {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = Load8<T>(w, row0 + r * k_in + k);
      for (int t = 0; t < MT; ++t) {
        const __m256 xv = _mm256_loadu_ps(x + t * k_in + k);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < MT; ++t) {
      float s = HorizontalSum(acc[r][t]);
      for (int64_t k = k8; k < k_in; ++k) {
        s = __builtin_fmaf(Load1<T>(w, row0 + r * k_in + k), x[t * k_in + k], s);
      }
      y[t * ldy + n0 + r] = s;
    }
  }
}

// Where the streaming kernel goes after a range of rows: a region to prefetch during the range's
// last tile (the first tile of the chunk the thread will run next), or none.
struct PrefetchNext {
  const char* data = nullptr;
  int64_t bytes = 0;
};

// Rows [n_begin, n_end) for MT token rows, R rows per tile and 1-row tiles for the remainder.
// Each tile prefetches the next tile's rows; the last one prefetches `after`.
template <DType T, int R, int MT>
void DirectRows(const void* w, int64_t k_in, int64_t n_begin, int64_t n_end, const float* x,
                float* y, int64_t ldy, PrefetchNext after) {
  const int64_t row_bytes = RowBytes<T>(k_in);
  const char* base = static_cast<const char*>(w);
  int64_t n = n_begin;
  for (; n + R <= n_end; n += R) {
    const int64_t next_end = n + 2 * R < n_end ? n + 2 * R : n_end;
    if (next_end > n + R) {
      DirectTile<T, R, MT>(w, k_in, n, x, y, ldy, base + (n + R) * row_bytes,
                           (next_end - n - R) * row_bytes);
    } else {
      DirectTile<T, R, MT>(w, k_in, n, x, y, ldy, after.data, after.bytes);
    }
  }
  for (; n < n_end; ++n) {
    DirectTile<T, 1, MT>(w, k_in, n, x, y, ldy, n + 1 == n_end ? after.data : nullptr,
                         after.bytes);
  }
}

// All m_rows token rows for output rows [n_begin, n_end), in token groups of at most 4 (the
// weight rows of the range stay in L2 between groups).
template <DType T>
void DirectRange(const void* w, int64_t k_in, int64_t n_out, int64_t n_begin, int64_t n_end,
                 const float* x, int64_t m_rows, float* y, PrefetchNext after) {
  const int64_t ldy = n_out;
  int64_t m = 0;
  for (; m + 4 <= m_rows; m += 4) {
    DirectRows<T, 3, 4>(w, k_in, n_begin, n_end, x + m * k_in, y + m * ldy, ldy,
                        m + 4 == m_rows ? after : PrefetchNext{});
  }
  const float* xm = x + m * k_in;
  float* ym = y + m * ldy;
  switch (m_rows - m) {
    case 3: DirectRows<T, 3, 3>(w, k_in, n_begin, n_end, xm, ym, ldy, after); break;
    case 2: DirectRows<T, 4, 2>(w, k_in, n_begin, n_end, xm, ym, ldy, after); break;
    case 1: DirectRows<T, 8, 1>(w, k_in, n_begin, n_end, xm, ym, ldy, after); break;
    default: break;
  }
}

// ---- packed kernel ---------------------------------------------------------------------------

constexpr int kNr = 16;   // outputs per panel (two ymm)
constexpr int kMr = 6;    // token rows per register tile
constexpr int kKc = 256;  // k per packed block: 16 x 256 f32 = 16 KB
constexpr int kMc = 96;   // token rows per packed x block: 96 x 256 f32 = 96 KB (L2)
constexpr int kChunkPanels = 4;  // panels per work chunk: 4 x 16 KB of packed W (L2)

inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
  const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
  const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
  const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
  const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// packed[k][j] = f32(w[n0 + j, k0 + k]) for k < kc, j < 16; rows j >= nr are zero.
template <DType T>
void PackPanel(const void* w, int64_t k_in, int64_t n0, int nr, int64_t k0, int kc,
               float* packed) {
  if constexpr (kBlock<T>) {
    // Dequantize the panel's rows into f32 (kc is a multiple of 32), then pack those.
    alignas(32) float stage[kNr * kKc];
    const int64_t row_bytes = RowBytes<T>(k_in);
    for (int j = 0; j < nr; ++j) {
      const uint8_t* row = static_cast<const uint8_t*>(w) + (n0 + j) * row_bytes;
      for (int k = 0; k < kc; k += 32) {
        __m256 v[4];
        Dequant32<T>(row, k0 + k, v);
        for (int q = 0; q < 4; ++q) _mm256_store_ps(stage + j * kKc + k + 8 * q, v[q]);
      }
    }
    PackPanel<DType::kF32>(stage, kKc, 0, nr, 0, kc, packed);
    return;
  }
  int k = 0;
  if (nr == kNr) {
    for (; k + 8 <= kc; k += 8) {
      for (int half = 0; half < 2; ++half) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = Load8<T>(w, (n0 + half * 8 + j) * k_in + k0 + k);
        Transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_store_ps(packed + (k + i) * kNr + half * 8, r[i]);
      }
    }
  }
  for (; k < kc; ++k) {
    for (int j = 0; j < kNr; ++j) {
      packed[k * kNr + j] = j < nr ? Load1<T>(w, (n0 + j) * k_in + k0 + k) : 0.0f;
    }
  }
}

// Asks for the cache lines of the panel at rows [n0, n0 + 16), columns [k0, k0 + kc), so that
// they arrive while the current panel is multiplied (16 short row segments are too short for the
// hardware prefetchers to pick up).
template <DType T>
inline void PrefetchPanel(const void* w, int64_t k_in, int64_t n_out, int64_t n0, int64_t k0,
                          int kc) {
  const int64_t row_bytes = RowBytes<T>(k_in), seg = RowBytes<T>(kc);
  const char* base = static_cast<const char*>(w);
  for (int64_t j = 0; j < kNr && n0 + j < n_out; ++j) {
    const char* row = base + (n0 + j) * row_bytes + RowBytes<T>(k0);
    for (int64_t b = 0; b < seg; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}

// xp[i][k] = x[m0 + i, k0 + k] for i < mc, k < kc: the k block of an m block of x copied into
// rows of kc floats. The copy keeps the block in L2 and its rows 1 KB apart: rows of x are k_in
// floats apart, and a power-of-two row stride would map every row's slice to the same cache sets.
void PackX(const float* x, int64_t k_in, int64_t m0, int mc, int64_t k0, int kc, float* xp) {
  for (int i = 0; i < mc; ++i) {
    std::memcpy(xp + static_cast<int64_t>(i) * kc, x + (m0 + i) * k_in + k0,
                static_cast<size_t>(kc) * sizeof(float));
  }
}

// y[i, 0:nr] (+)= sum_k xp[k][i] * packed[k][0:nr] for i < MR: one sequential FMA chain per
// element, continued from y unless `first`.
//   packed [kc][16] (32-byte aligned);  xp [kc][6];  y row stride ldy
template <int MR>
inline void MicroKernel(const float* packed, int kc, const float* xp, float* y, int64_t ldy,
                        bool first, int nr) {
  __m256 c[MR][2];
  const bool full = nr == kNr;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane),
                           _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane)};
  for (int i = 0; i < MR; ++i) {
    if (first) {
      c[i][0] = _mm256_setzero_ps();
      c[i][1] = _mm256_setzero_ps();
    } else if (full) {
      c[i][0] = _mm256_loadu_ps(y + i * ldy);
      c[i][1] = _mm256_loadu_ps(y + i * ldy + 8);
    } else {
      c[i][0] = _mm256_maskload_ps(y + i * ldy, mask[0]);
      c[i][1] = _mm256_maskload_ps(y + i * ldy + 8, mask[1]);
    }
  }
  for (int k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(packed + k * kNr);
    const __m256 w1 = _mm256_load_ps(packed + k * kNr + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 b = _mm256_broadcast_ss(xp + i * kc + k);
      c[i][0] = _mm256_fmadd_ps(b, w0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(b, w1, c[i][1]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    if (full) {
      _mm256_storeu_ps(y + i * ldy, c[i][0]);
      _mm256_storeu_ps(y + i * ldy + 8, c[i][1]);
    } else {
      _mm256_maskstore_ps(y + i * ldy, mask[0], c[i][0]);
      _mm256_maskstore_ps(y + i * ldy + 8, mask[1], c[i][1]);
    }
  }
}

// Panels [p_begin, p_end) (at most kChunkPanels) of y = x W^T for all m_rows. Loop order:
// k block -> the chunk's panels of W packed once (<= 64 KB, L2) -> m block (kMc rows of x
// packed, L2) -> panel (16 KB, L1) -> 6-row tiles. Every W element is converted exactly once
// per call; x is packed once per (k block, chunk).
template <DType T>
void PackedPanels(const void* w, int64_t n_out, int64_t k_in, int64_t p_begin, int64_t p_end,
                  const float* x, int64_t m_rows, float* y) {
  KCHECK(p_end - p_begin <= kChunkPanels);
  alignas(64) float packed[kChunkPanels][kKc * kNr];
  alignas(64) float xp[kMc * kKc];
  for (int64_t k0 = 0; k0 < k_in; k0 += kKc) {
    const int kc = static_cast<int>(k_in - k0 < kKc ? k_in - k0 : kKc);
    const bool first = k0 == 0;
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t n0 = p * kNr;
      const int nr = static_cast<int>(n_out - n0 < kNr ? n_out - n0 : kNr);
      PackPanel<T>(w, k_in, n0, nr, k0, kc, packed[p - p_begin]);
      if (p + 1 < p_end) PrefetchPanel<T>(w, k_in, n_out, n0 + kNr, k0, kc);
    }
    for (int64_t m0 = 0; m0 < m_rows; m0 += kMc) {
      const int mc = static_cast<int>(m_rows - m0 < kMc ? m_rows - m0 : kMc);
      PackX(x, k_in, m0, mc, k0, kc, xp);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int64_t n0 = p * kNr;
        const int nr = static_cast<int>(n_out - n0 < kNr ? n_out - n0 : kNr);
        const float* panel = packed[p - p_begin];
        float* yb = y + m0 * n_out + n0;
        int t = 0;
        for (; (t + 1) * kMr <= mc; ++t) {
          MicroKernel<kMr>(panel, kc, xp + t * kMr * kc, yb + t * kMr * n_out, n_out, first, nr);
        }
        const float* xt = xp + t * kMr * kc;
        float* yt = yb + t * kMr * n_out;
        switch (mc - t * kMr) {
          case 5: MicroKernel<5>(panel, kc, xt, yt, n_out, first, nr); break;
          case 4: MicroKernel<4>(panel, kc, xt, yt, n_out, first, nr); break;
          case 3: MicroKernel<3>(panel, kc, xt, yt, n_out, first, nr); break;
          case 2: MicroKernel<2>(panel, kc, xt, yt, n_out, first, nr); break;
          case 1: MicroKernel<1>(panel, kc, xt, yt, n_out, first, nr); break;
          default: break;
        }
      }
    }
  }
}

template <DType T>
void AddBias(const void* bias, int64_t n_out, int64_t n_begin, int64_t n_end, int64_t m_rows,
             float* y) {
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t n = n_begin; n < n_end; ++n) y[m * n_out + n] += Load1<T>(bias, n);
  }
}

template <class Fn>
inline void WithDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn.template operator()<DType::kF32>(); return;
    case DType::kF16: fn.template operator()<DType::kF16>(); return;
    case DType::kQ8_0: fn.template operator()<DType::kQ8_0>(); return;
    case DType::kQ4_K: fn.template operator()<DType::kQ4_K>(); return;
    case DType::kQ5_K: fn.template operator()<DType::kQ5_K>(); return;
    case DType::kQ6_K: fn.template operator()<DType::kQ6_K>(); return;
    case DType::kQ4_0: fn.template operator()<DType::kQ4_0>(); return;
    case DType::kQ4_1: fn.template operator()<DType::kQ4_1>(); return;
    case DType::kQ5_0: fn.template operator()<DType::kQ5_0>(); return;
    case DType::kQ5_1: fn.template operator()<DType::kQ5_1>(); return;
    case DType::kQ2_K:
      fn.template operator()<DType::kQ2_K>();
      return;
    case DType::kQ3_K:
      fn.template operator()<DType::kQ3_K>();
      return;
    case DType::kIQ4_NL:
      fn.template operator()<DType::kIQ4_NL>();
      return;
    case DType::kIQ4_XS:
      fn.template operator()<DType::kIQ4_XS>();
      return;
    case DType::kF8E4M3: fn.template operator()<DType::kF8E4M3>(); return;
    case DType::kMlxQ4: fn.template operator()<DType::kMlxQ4>(); return;
    case DType::kMlxQ8: fn.template operator()<DType::kMlxQ8>(); return;
    default: fn.template operator()<DType::kBF16>(); return;
  }
}

// Bytes of a row of k_in elements of dtype t.
int64_t RowBytesOf(DType t, int64_t k_in) {
  int64_t bytes = 0;
  WithDType(t, [&]<DType T>() { bytes = RowBytes<T>(k_in); });
  return bytes;
}

}  // namespace

void LinearGroup(ThreadPool* pool, int64_t m_rows, std::span<const LinearJob> jobs,
                 bool int8_activations, bool batch_invariant) {
  // Work is cut into chunks of whole units (8 output rows for the streaming kernel, one 16-row
  // panel for the packed one) that threads take from a shared counter: on a machine shared with
  // other work a static split waits for the slowest thread, dynamic chunks do not. A chunk
  // covers ~128 KB of weights (streaming) or 4 panels (packed). All jobs' chunks form one index
  // space, so a group of projections costs one thread wake-up. Chunk boundaries are fixed, and
  // every row's result is independent of its tile and thread, so the output bits do not depend
  // on which thread ran what.
  //
  // Block-quantized weights with int8 activations (the default) take the integer dot products at
  // every batch size: each job's x is quantized once, before the parallel region (jobs sharing
  // an x share its blocks).
  struct JobChunks {
    int64_t n_units, chunk_units, first_chunk, unit_rows;
    bool direct, int_dot;
  };
  JobChunks plan[kMaxLinearGroup];
  KCHECK(jobs.size() <= static_cast<size_t>(kMaxLinearGroup));
  thread_local std::vector<int8_t> act_q[kMaxLinearGroup];
  thread_local std::vector<float> act_d[kMaxLinearGroup];
  thread_local std::vector<int16_t> act_bsum[kMaxLinearGroup];
  thread_local std::vector<ActsView> act_rows_of_thread[kMaxLinearGroup];
  // The worker threads must see this (the calling) thread's buffers: named through a local
  // reference, since a lambda names a thread_local directly and would get its own thread's.
  std::vector<ActsView>(&act_rows)[kMaxLinearGroup] = act_rows_of_thread;
  int64_t n_chunks = 0, total_work = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const TensorView& w = *jobs[j].w;
    const int64_t n_out = w.shape[0], k_in = w.shape[1];
    const bool int_dot = int8_activations && HasIntDot(w.dtype);
    const bool direct = int_dot || batch_invariant || m_rows <= kDirectMaxRows;
    const int64_t unit_rows = direct ? 8 : kNr;
    const int64_t n_units = (n_out + unit_rows - 1) / unit_rows;
    const int64_t unit_bytes = unit_rows * RowBytesOf(w.dtype, k_in);
    const int64_t chunk_units =
        direct ? (unit_bytes >= (128 << 10) ? 1 : (128 << 10) / unit_bytes) : kChunkPanels;
    plan[j] = {n_units, chunk_units, n_chunks, unit_rows, direct, int_dot};
    if (int_dot) {
      const bool k_quant = !TakesQ8_0Activations(w.dtype);
      // An earlier job with the same x and activation format shares its blocks.
      size_t same = j;
      for (size_t i = 0; i < j; ++i) {
        if (plan[i].int_dot && jobs[i].x == jobs[j].x &&
            !TakesQ8_0Activations(jobs[i].w->dtype) == k_quant && jobs[i].w->shape[1] == k_in) {
          same = i;
        }
      }
      if (same != j) {
        act_rows[j] = act_rows[same];
      } else {
        const int64_t d_per_row = k_in / (k_quant ? 256 : 32);
        act_q[j].resize(static_cast<size_t>(m_rows * k_in));
        act_d[j].resize(static_cast<size_t>(m_rows * d_per_row));
        act_bsum[j].resize(k_quant ? static_cast<size_t>(m_rows * k_in / 16) : 0);
        act_rows[j].resize(static_cast<size_t>(m_rows));
        for (int64_t t = 0; t < m_rows; ++t) {
          int8_t* q = act_q[j].data() + t * k_in;
          float* d = act_d[j].data() + t * d_per_row;
          int16_t* bs = k_quant ? act_bsum[j].data() + t * k_in / 16 : nullptr;
          if (k_quant) {
            QuantizeActsQ8_K(jobs[j].x + t * k_in, k_in, q, d, bs);
          } else {
            QuantizeActsQ8_0(jobs[j].x + t * k_in, k_in, q, d);
          }
          act_rows[j][static_cast<size_t>(t)] = {q, d, bs};
        }
      }
    }
    n_chunks += (n_units + chunk_units - 1) / chunk_units;
    total_work += n_out * k_in * m_rows;
  }
  // Job index and unit range [u_begin, u_end) of chunk c.
  auto locate = [&](int64_t c, size_t* j, int64_t* u_begin, int64_t* u_end) {
    *j = 0;
    while (*j + 1 < jobs.size() && c >= plan[*j + 1].first_chunk) ++*j;
    *u_begin = (c - plan[*j].first_chunk) * plan[*j].chunk_units;
    *u_end = *u_begin + plan[*j].chunk_units < plan[*j].n_units
                 ? *u_begin + plan[*j].chunk_units
                 : plan[*j].n_units;
  };
  // Runs chunk c; `next` is the chunk this thread runs after it (or n_chunks for none), whose
  // first rows the streaming kernel prefetches during c's last tile.
  auto run_chunk = [&](int64_t c, int64_t next) {
    size_t j;
    int64_t u_begin, u_end;
    locate(c, &j, &u_begin, &u_end);
    const LinearJob& job = jobs[j];
    const TensorView& w = *job.w;
    const int64_t n_out = w.shape[0], k_in = w.shape[1];
    const int64_t unit_rows = plan[j].unit_rows;
    tl_scaled = w.dtype == DType::kF8E4M3 || w.dtype == DType::kMlxQ4 || w.dtype == DType::kMlxQ8 ? &w : nullptr;
    const int64_t n_begin = u_begin * unit_rows;
    const int64_t n_end = u_end * unit_rows < n_out ? u_end * unit_rows : n_out;
    WithDType(w.dtype, [&]<DType T>() {
      if constexpr (kIntDot<T>) {
        if (plan[j].int_dot) {
          IntDotRange<T>(w.data, w.cpu_packed, k_in, n_out, n_begin, n_end, act_rows[j].data(),
                         m_rows, job.y);
          return;
        }
      }
      if (plan[j].direct) {
        PrefetchNext after;
        if (next < n_chunks) {
          size_t nj;
          int64_t nu_begin, nu_end;
          locate(next, &nj, &nu_begin, &nu_end);
          const TensorView& nw = *jobs[nj].w;
          const int64_t nunit = plan[nj].unit_rows;
          const int64_t row_bytes = RowBytesOf(nw.dtype, nw.shape[1]);
          const int64_t rows = nw.shape[0] - nu_begin * nunit < nunit
                                   ? nw.shape[0] - nu_begin * nunit
                                   : nunit;
          after = {static_cast<const char*>(nw.data) + nu_begin * nunit * row_bytes,
                   rows * row_bytes};
        }
        DirectRange<T>(w.data, k_in, n_out, n_begin, n_end, job.x, m_rows, job.y, after);
      } else {
        PackedPanels<T>(w.data, n_out, k_in, u_begin, u_end, job.x, m_rows, job.y);
      }
    });
    if (job.bias != nullptr && !job.bias->empty()) {
      WithDType(job.bias->dtype, [&]<DType T>() {
        AddBias<T>(job.bias->data, n_out, n_begin, n_end, m_rows, job.y);
      });
    }
  };
  // Threads worth waking: each should get at least ~256K multiply-adds.
  int64_t n_workers = pool != nullptr ? pool->n_threads() : 1;
  if (n_workers > total_work / (256 << 10)) n_workers = total_work / (256 << 10);
  if (n_workers > n_chunks) n_workers = n_chunks;
  if (n_workers <= 1) {
    for (int64_t c = 0; c < n_chunks; ++c) run_chunk(c, c + 1);
    return;
  }
  // Each thread claims its next chunk before running the current one, so that it can prefetch it.
  std::atomic<int64_t> next_chunk{0};
  pool->ParallelFor(n_workers, 1, [&](int64_t, int64_t, int) {
    int64_t c = next_chunk.fetch_add(1, std::memory_order_relaxed);
    while (c < n_chunks) {
      int64_t next = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (next > n_chunks) next = n_chunks;
      run_chunk(c, next);
      c = next;
    }
  });
}

}  // namespace kestrel::cpu::avx2
