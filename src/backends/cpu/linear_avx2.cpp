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
//
// Block-quantized weights with int8 activations (the default for the formats with HasIntDot)
// take the integer kernels of linear_int8_kernels.inc instead, through the same chunking.
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

inline __m256i Bytes8ToI32(const uint8_t* p) {  // 8 unsigned bytes -> 8 x i32
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Where a row's side values are (FP8's block scales, MLX's scales and biases), found once per
// row: the divisions that locate them cost more than the 32 elements' dequantization when run
// for each (FP8 decode measured 2x faster without them).
struct RowSide {
  const float* scale = nullptr;  // the row's first block / group
  const float* bias = nullptr;
  int64_t width = 1;  // columns per block / group (a multiple of 32)
  int shift = -1;     // log2(width) when a power of two
  const float* At(int64_t k, const float* p) const {
    return p + (shift >= 0 ? k >> shift : k / width);
  }
};

template <DType T>
inline RowSide SideOf(const uint8_t* row) {
  RowSide side;
  if constexpr (T == DType::kF8E4M3 || T == DType::kMlxQ4 || T == DType::kMlxQ8) {
    const TensorView& v = *tl_scaled;
    const int64_t cols = v.shape[1];
    const int64_t n = (row - static_cast<const uint8_t*>(v.data)) / RowBytes<T>(cols);
    side.width = v.block_cols;
    if ((side.width & (side.width - 1)) == 0) side.shift = __builtin_ctzll(side.width);
    if constexpr (T == DType::kF8E4M3) {
      side.scale = v.block_scale + n / v.block_rows * ((cols + v.block_cols - 1) / v.block_cols);
    } else {
      side.scale = v.block_scale + n * (cols / v.block_cols);
      side.bias = v.group_bias + n * (cols / v.block_cols);
    }
  }
  return side;
}

// out[0..4) = elements [k, k + 32) of the row starting at `row` (k a multiple of 32), each the
// exact value of the format's definition; out[j] holds elements k + 8j .. k + 8j + 7. side: the
// row's SideOf (FP8, MLX).
template <DType T>
inline void Dequant32(const uint8_t* row, int64_t k, __m256 out[4], const RowSide& side = {}) {
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
    // e4m3 byte e as f16 bits: e in the high byte of a 16-bit lane, shifted right by one
    // arithmetically (the sign at bits 15 and 14, exponent and mantissa at 13-7), bit 14
    // cleared: an f16 with e4m3's exponent and mantissa fields, 2^-8 times e's value (f16's
    // exponent bias 15 against e4m3's 7; e4m3's subnormals are f16 subnormals, which vcvtph2ps
    // converts exactly). The 2^8 is folded into the block's scale: (h * 2^8) * s and
    // h * (2^8 * s) are the same exact product rounded once, and 2^8 * s is exact.
    const __m256 s = _mm256_set1_ps(*side.At(k, side.scale) * 256.0f);
    const __m256i e = Load32(row + k);
    const __m256i fields = _mm256_set1_epi16(static_cast<short>(0xBF80));
    const __m256i lo = _mm256_and_si256(
        _mm256_srai_epi16(_mm256_unpacklo_epi8(_mm256_setzero_si256(), e), 1), fields);
    const __m256i hi = _mm256_and_si256(
        _mm256_srai_epi16(_mm256_unpackhi_epi8(_mm256_setzero_si256(), e), 1), fields);
    // unpacklo / unpackhi work within 128-bit lanes: lo holds elements 0-7 and 16-23, hi 8-15
    // and 24-31.
    out[0] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(lo)), s);
    out[1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hi)), s);
    out[2] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1)), s);
    out[3] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1)), s);
  } else if constexpr (T == DType::kMlxQ4 || T == DType::kMlxQ8) {
    const __m256 s = _mm256_set1_ps(*side.At(k, side.scale));
    const __m256 bias = _mm256_set1_ps(*side.At(k, side.bias));
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
    RowSide side[R];
    for (int r = 0; r < R; ++r) side[r] = SideOf<T>(w0 + r * row_bytes);
    for (int64_t k = 0; k < k_in; k += 32) {
      for (int64_t i = 0; i < 4 * lines_per_step && line < next_lines; ++i, ++line) {
        _mm_prefetch(next + line * 64, _MM_HINT_T0);
      }
      for (int r = 0; r < R; ++r) {
        __m256 wv[4];
        Dequant32<T>(w0 + r * row_bytes, k, wv, side[r]);
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
      const RowSide side = SideOf<T>(row);
      for (int k = 0; k < kc; k += 32) {
        __m256 v[4];
        Dequant32<T>(row, k0 + k, v, side);
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

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps() (`__m512 __Y = __Y;`), which
// -Wmaybe-uninitialized reports in every caller.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// MicroKernel with AVX-512 (only called where CpuHasAvx512() holds): the 16 outputs of a panel in
// one register and kMr512 token rows, each element the same sequential FMA chain over k as
// MicroKernel's, so the same bits.
constexpr int kMr512 = 12;
template <int MR>
KESTREL_AVX512 void MicroKernel512(const float* packed, int kc, const float* xp, float* y,
                                   int64_t ldy, bool first, int nr) {
  __m512 c[MR];
  const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
  for (int i = 0; i < MR; ++i) {
    c[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(keep, y + i * ldy);
  }
  for (int k = 0; k < kc; ++k) {
    const __m512 w = _mm512_load_ps(packed + k * kNr);
    for (int i = 0; i < MR; ++i) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(xp[i * kc + k]), w, c[i]);
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, c[i]);
}

// Panels [p_begin, p_end) (at most kChunkPanels) of y = x W^T for all m_rows. Loop order:
// k block -> the chunk's panels of W packed once (<= 64 KB, L2) -> m block (kMc rows of x
// packed, L2) -> panel (16 KB, L1) -> 6-row tiles. Every W element is converted exactly once
// per call; x is packed once per (k block, chunk).
// avx512: tiles of kMr512 rows through MicroKernel512 first (the same bits).
template <DType T>
void PackedPanels(const void* w, int64_t n_out, int64_t k_in, int64_t p_begin, int64_t p_end,
                  const float* x, int64_t m_rows, float* y, bool avx512) {
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
        int wide = 0;  // rows taken by the AVX-512 tiles
        if (avx512) {
          for (; wide + kMr512 <= mc; wide += kMr512) {
            MicroKernel512<kMr512>(panel, kc, xp + wide * kc, y + (m0 + wide) * n_out + n0, n_out,
                                   first, nr);
          }
        }
        float* yb = y + (m0 + wide) * n_out + n0;
        const float* xb = xp + wide * kc;
        const int rest = mc - wide;
        int t = 0;
        for (; (t + 1) * kMr <= rest; ++t) {
          MicroKernel<kMr>(panel, kc, xb + t * kMr * kc, yb + t * kMr * n_out, n_out, first, nr);
        }
        const float* xt = xb + t * kMr * kc;
        float* yt = yb + t * kMr * n_out;
        switch (rest - t * kMr) {
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
                 bool int8_activations, bool batch_invariant, Int8DotIsa int8_isa, bool avx512) {
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
  thread_local std::vector<int32_t> act_sum32[kMaxLinearGroup];
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
        // The VNNI builds' packed Q8_0-family kernels take unsigned weights (ActsView::sum32).
        const bool sum32 = !k_quant && int8_isa != Int8DotIsa::kAvx2;
        act_sum32[j].resize(sum32 ? static_cast<size_t>(m_rows * k_in / 32) : 0);
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
          int32_t* s32 = sum32 ? act_sum32[j].data() + t * k_in / 32 : nullptr;
          if (sum32) Sum32Offsets(q, k_in, s32);
          act_rows[j][static_cast<size_t>(t)] = {q, d, bs, s32};
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
      if (plan[j].int_dot) {
        IntDotRangeOn(int8_isa, w.dtype, w.data, w.cpu_packed, k_in, n_out, n_begin, n_end,
                      act_rows[j].data(), m_rows, job.y);
        return;
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
        PackedPanels<T>(w.data, n_out, k_in, u_begin, u_end, job.x, m_rows, job.y, avx512);
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
