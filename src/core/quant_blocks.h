// The ggml block formats Kestrel reads from GGUF files, and their dequantization exactly as the
// format defines it (ggml's dequantize_row_*: the same f32 operations in the same order), so a
// quantized weight means one f32 value everywhere: in the reference kernels, the AVX2 kernels,
// the embedding gather and the tests' numpy reference (tools/make_gguf.py).
//
//   Q8_0  32 elements, 34 bytes: f16 d, int8 q[32];                 w = q * d
//   Q4_K  256 elements, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for the
//         eight 32-element groups, 128 bytes of nibbles (group 2c in the low nibbles of bytes
//         [32c, 32c + 32), group 2c + 1 in their high nibbles);
//                                    w = (d * sc[g]) * q - (dmin * m[g])
//   Q5_K  256 elements, 176 bytes: f16 d, f16 dmin, the 12 scale/min bytes of Q4_K, 32 bytes qh,
//         128 bytes of nibbles as in Q4_K; element 32g + l (group g, l < 32) has the nibble of
//         Q4_K's layout as its low bits and bit g of qh[l] as its fifth:
//         q = nibble | ((qh[l] >> g) & 1) << 4
//                                    w = (d * sc[g]) * q - (dmin * m[g])
//   Q6_K  256 elements, 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs,
//         int8 scales[16] (one per 16 elements), f16 d;      w = (d * scale) * (q - 32)
// The legacy 32-element formats: 16 bytes of nibbles, element j < 16 in the low nibble of byte j
// and element j + 16 in its high nibble; Q5_* add a little-endian u32 qh whose bit j is the
// fifth bit of element j (q = nibble | bit << 4).
//   Q4_0  18 bytes: f16 d, nibbles;               w = (q - 8) * d
//   Q4_1  20 bytes: f16 d, f16 m, nibbles;        w = q * d + m
//   Q5_0  22 bytes: f16 d, qh, nibbles;           w = (q - 16) * d
//   Q5_1  24 bytes: f16 d, f16 m, qh, nibbles;    w = q * d + m
// (q * d is exact in f32 for these, so a fused q * d + m rounds as the definition does.)
// The low-bit K formats, 16 groups of 16 per 256-block (element e in group e / 16). Element
// e = 128 n + 32 j + 16 h + l (n < 2, j < 4, h < 2, l < 16) has its 2 low bits at bits 2j of
// qs[32 n + 16 h + l]:
//   Q2_K  84 bytes: scales[16] (low nibble sc, high nibble m), qs[64], f16 d, f16 dmin;
//                                    w = (d * sc) * q - (dmin * m),  q in 0..3
//   Q3_K  110 bytes: hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d; the third bit of e is
//         bit 4n + j of hmask[16 h + l], and w = (d * (sc - 32)) * (q - 4) with q = low bits |
//         third bit << 2 (ggml subtracts 4 where the bit is clear). Scale g: low nibble of byte g
//         (g < 8) or high nibble of byte g - 8, bits 2 (g / 4) of byte 8 + g % 4 as bits 4-5.
// The non-linear 4-bit formats, each nibble an index into kIq4Values:
//   IQ4_NL  32 elements, 18 bytes: f16 d, nibbles as Q4_0's;  w = d * kIq4Values[q]
//   IQ4_XS  256 elements, 136 bytes: f16 d, u16 scales_h, scales_l[4], qs[128]; group ib < 8 of
//           32 has ls = (scales_l[ib / 2] >> 4 (ib % 2)) & 15 | ((scales_h >> 2 ib) & 3) << 4,
//           its nibbles at qs[16 ib] as Q4_0's;  w = (d * (ls - 32)) * kIq4Values[q]
// Every product in Q3_K, IQ4_NL and IQ4_XS is exact in f32 (at most 11 + 6 + 7 bits), and in
// Q2_K (d * sc) * q is, so its fused form rounds as the definition does.
// In Q8_0, Q4_K and Q5_K every product is exact in f32 (an f16 times integers of at most 11 bits
// together: 7 for Q8_0, 6 + 4 for Q4_K, 6 + 5 for Q5_K), so a fused multiply-add gives the same
// value as the separate operations.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kestrel::quant {

inline constexpr int kQ8_0Block = 32, kQ8_0Bytes = 34;
inline constexpr int kQKBlock = 256, kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;
inline constexpr int kQ2_KBytes = 84, kQ3_KBytes = 110, kIQ4_NLBytes = 18, kIQ4_XSBytes = 136;
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// The legacy 32-element formats' layout: bytes of the block before the nibbles, whether it has
// a min m (at byte 2) and a qh word (after d, or after d and m).
struct LegacyBlock {
  int bytes, nibbles_at, qh_at;  // qh_at < 0: none
  bool has_min;
  int offset;  // subtracted from q when there is no min: 8 or 16
};
inline constexpr LegacyBlock LegacyLayout(DType t) {
  switch (t) {
    case DType::kQ4_0: return {18, 2, -1, false, 8};
    case DType::kQ4_1: return {20, 4, -1, true, 0};
    case DType::kQ5_0: return {22, 6, 2, false, 16};
    default: return {24, 8, 4, true, 0};  // kQ5_1
  }
}

inline float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Scale and min of group j (0..7) of a Q4_K or Q5_K block from its 12 packed bytes.
inline void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Q3_K's 6-bit scale g (0..63; the factor is sc - 32) from its 12 packed bytes.
inline int Q3KScale(const uint8_t* scales, int g) {
  const int low = g < 8 ? scales[g] & 0xF : scales[g - 8] >> 4;
  return low | ((scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
}
// IQ4_XS's 6-bit scale of group ib (0..7; the factor is ls - 32).
inline int Iq4XsScale(const uint8_t* block, int ib) {
  const int high = (block[2] | block[3] << 8) >> (2 * ib) & 3;
  return ((block[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | high << 4;
}
// q[0..256) = the unsigned codes of a Q2_K (0..3) or Q3_K (0..7, the value q - 4) block.
void Q2_KCodes(const uint8_t* block, uint8_t q[256]);
void Q3_KCodes(const uint8_t* block, uint8_t q[256]);

// out[0..256) = the elements of one block.
void DequantizeQ8_0Block(const uint8_t* block, float* out);  // 32 elements
void DequantizeQ4_KBlock(const uint8_t* block, float* out);
void DequantizeQ5_KBlock(const uint8_t* block, float* out);
void DequantizeQ6_KBlock(const uint8_t* block, float* out);
void DequantizeLegacyBlock(DType t, const uint8_t* block, float* out);  // Q4_0 .. Q5_1: 32
void DequantizeQ2_KBlock(const uint8_t* block, float* out);
void DequantizeQ3_KBlock(const uint8_t* block, float* out);
void DequantizeIq4NlBlock(const uint8_t* block, float* out);  // 32 elements
void DequantizeIq4XsBlock(const uint8_t* block, float* out);
// q[0..32) = the unsigned codes of a Q4_0 .. Q5_1 block (the nibble, with Q5_*'s fifth bit).
void LegacyCodes(DType t, const uint8_t* block, uint8_t q[32]);

// out[0..n) = elements [0, n) of a row of type t starting at `row` (n a multiple of the block
// size for block types; any F32/F16/BF16 row too).
void DequantizeRow(DType t, const void* row, int64_t n, float* out);

// out[0..cols) = row `row` of a 2-D weight of any dtype Kestrel reads: plain, GGUF blocks, or FP8
// with block scales (f32(fp8) * scale, one rounding), MLX affine (a GPTQ act-order matrix's in
// its inputs' own order, undoing input_perm).
void DequantizeMatrixRow(const TensorView& w, int64_t row, float* out);

// ---- Integer dot products against quantized activations (llama.cpp's CPU semantics) ---------
//
// What the CPU computes by default for a block-quantized weight: the activation row is quantized
// to int8 in blocks too, and each weight block meets its activation block in an exact integer
// dot product; only the per-block scales are floating point. Activation blocks:
//   for Q8_0 weights, per 32:  d = f32(f16(amax / 127)), q = nearbyint(x * (127 / amax))
//   for Q4_K / Q5_K / Q6_K, per 256:  d = amax / 127 (f32), same q, and bsums = the sums of each
//                                     16 q
// (`nearbyint`: round half to even; q = 0 where amax = 0). The row's result, block by block in
// order, each term computed and then added (no fused multiply-add), except where eight lanes are
// kept as the AVX2 kernel keeps them:
//   Q8_0:  lane[b % 8] = fma(dw * dx, float(sum of q_w q_x over block b), lane[b % 8]);
//          result ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) (one conversion and one
//          fused multiply-add per block, llama.cpp's count; eight lanes so that the AVX2 row
//          kernel can take eight blocks per vector and the packed kernels keep the chains short)
//   Q4_K:  one lane: acc = fma(dx * d, float(sum_g sc_g * (sum of q_w q_x over group g)), acc);
//          acc_m += (dx * dmin) * float(sum_g m_g * bsum_g); result = acc - acc_m (the block's
//          integer is one sum, so the AVX2 kernel may add a group's products in int16 before
//          scaling them)
//   Q5_K:  eight lanes: lane[j] = fma(dx * d, float(sum_g sc_g * (sum of q_w q_x over elements
//          4j..4j+3 of group g)), lane[j]) with the 5-bit q; acc_m as Q4_K's; result = (the lane
//          sum as for Q8_0) - acc_m
//   Q6_K:  acc += (dx * d) * float(sum_j sc_j * (sum (q6 - 32) * q_x)_j)
//   Q3_K:  acc += (dx * d) * float(sum_g (sc_g - 32) * (sum (q3 - 4) * q_x)_g), groups of 16
//   IQ4_XS:  acc += (dx * d) * float(sum_g (ls_g - 32) * (sum kIq4Values[q] * q_x)_g), of 32
//   Q2_K:  Q4_K's one lane over groups of 16: acc = fma(dx * d, float(sum_g sc_g * (sum of
//          q_w q_x over group g)), acc); acc_m += (dx * dmin) * float(sum_g m_g * bsum_g);
//          result = acc - acc_m
//   Q4_0, Q5_0, IQ4_NL:  Q8_0's activations and lanes, with q_w = q - 8, q - 16 or
//          kIq4Values[q] (Q8_0 blocks with fewer bits); Q4_1 and Q5_1 have no integer form here.
// The AVX2 kernels compute the same integers and the same float operations, so both kernel sets
// give the same bits.
inline constexpr int kQ8_KGroup = 16;  // elements per bsum

// Activation blocks of one row of k elements (k a multiple of the block size).
struct ActsQ8_0View {
  const int8_t* q;
  const float* d;  // k / 32
};
struct ActsQ8_KView {
  const int8_t* q;
  const float* d;       // k / 256
  const int16_t* bsum;  // k / 16
};
void QuantizeActsQ8_0(const float* x, int64_t k, int8_t* q, float* d);
void QuantizeActsQ8_K(const float* x, int64_t k, int8_t* q, float* d, int16_t* bsum);

float DotQ8_0(const uint8_t* w_row, ActsQ8_0View x, int64_t k);
float DotQ4_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k);
float DotQ5_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k);
float DotQ6_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k);
float DotLegacySymmetric(DType t, const uint8_t* w_row, ActsQ8_0View x, int64_t k);  // Q4_0, Q5_0
float DotIq4Nl(const uint8_t* w_row, ActsQ8_0View x, int64_t k);
float DotQ2_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k);
float DotQ3_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k);
float DotIq4Xs(const uint8_t* w_row, ActsQ8_KView x, int64_t k);

}  // namespace kestrel::quant
