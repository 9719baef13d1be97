#include "core/quant_blocks.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace kestrel::quant {

void DequantizeQ8_0Block(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
  for (int i = 0; i < kQ8_0Block; ++i) out[i] = static_cast<float>(q[i]) * d;
}

namespace {

// Q4_K and Q5_K (kFifthBit: the fifth bit of element l of group g is bit g of qh[l]).
template <bool kFifthBit>
void DequantizeQ45_KBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const float dmin = LoadF16(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* q = block + (kFifthBit ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    for (int half = 0; half < 2; ++half) {
      const int g = 2 * c + half;
      int sc, m;
      Q4KScaleMin(scales, g, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int v = (q[32 * c + l] >> (4 * half)) & 0xF;
        if constexpr (kFifthBit) v |= ((qh[l] >> g) & 1) << 4;
        out[32 * g + l] = d1 * static_cast<float>(v) - m1;
      }
    }
  }
}

}  // namespace

void DequantizeQ4_KBlock(const uint8_t* block, float* out) {
  DequantizeQ45_KBlock<false>(block, out);
}

void DequantizeQ5_KBlock(const uint8_t* block, float* out) {
  DequantizeQ45_KBlock<true>(block, out);
}

void DequantizeQ6_KBlock(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
  const float d = LoadF16(block + 208);
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    out += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void LegacyCodes(DType t, const uint8_t* block, uint8_t q[32]) {
  const LegacyBlock l = LegacyLayout(t);
  uint32_t qh = 0;
  if (l.qh_at >= 0) std::memcpy(&qh, block + l.qh_at, 4);
  const uint8_t* nib = block + l.nibbles_at;
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<uint8_t>((j < 16 ? nib[j] & 0xF : nib[j - 16] >> 4) | ((qh >> j) & 1u) << 4);
  }
}

void DequantizeLegacyBlock(DType t, const uint8_t* block, float* out) {
  const LegacyBlock l = LegacyLayout(t);
  const float d = LoadF16(block);
  const float m = l.has_min ? LoadF16(block + 2) : 0.0f;
  uint8_t q[32];
  LegacyCodes(t, block, q);
  for (int j = 0; j < 32; ++j) {
    out[j] = l.has_min ? static_cast<float>(q[j]) * d + m : static_cast<float>(q[j] - l.offset) * d;
  }
}

namespace {

// Element e = 128 n + 32 j + 16 h + l of a Q2_K / Q3_K block: its 2 low bits.
template <int kQsAt>
inline int LowBits(const uint8_t* block, int e) {
  const int n = e >> 7, j = (e >> 5) & 3, h = (e >> 4) & 1, l = e & 15;
  return (block[kQsAt + 32 * n + 16 * h + l] >> (2 * j)) & 3;
}

}  // namespace

void Q2_KCodes(const uint8_t* block, uint8_t q[256]) {
  for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(LowBits<16>(block, e));
}

void Q3_KCodes(const uint8_t* block, uint8_t q[256]) {
  for (int e = 0; e < 256; ++e) {
    const int n = e >> 7, j = (e >> 5) & 3, hl = e & 31;
    const int third = (block[hl] >> (4 * n + j)) & 1;
    q[e] = static_cast<uint8_t>(LowBits<32>(block, e) | third << 2);
  }
}

void DequantizeQ2_KBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block + 80), dmin = LoadF16(block + 82);
  uint8_t q[256];
  Q2_KCodes(block, q);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(block[g] & 0xF);
    const float ml = dmin * static_cast<float>(block[g] >> 4);
    for (int l = 0; l < 16; ++l) out[16 * g + l] = dl * static_cast<float>(q[16 * g + l]) - ml;
  }
}

void DequantizeQ3_KBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block + 108);
  uint8_t q[256];
  Q3_KCodes(block, q);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(Q3KScale(block + 96, g) - 32);
    for (int l = 0; l < 16; ++l) out[16 * g + l] = dl * static_cast<float>(q[16 * g + l] - 4);
  }
}

void DequantizeIq4NlBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>(kIq4Values[block[2 + j] & 0xF]);
    out[j + 16] = d * static_cast<float>(kIq4Values[block[2 + j] >> 4]);
  }
}

void DequantizeIq4XsBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  for (int ib = 0; ib < 8; ++ib) {
    const float dl = d * static_cast<float>(Iq4XsScale(block, ib) - 32);
    const uint8_t* qs = block + 8 + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      out[32 * ib + j] = dl * static_cast<float>(kIq4Values[qs[j] & 0xF]);
      out[32 * ib + j + 16] = dl * static_cast<float>(kIq4Values[qs[j] >> 4]);
    }
  }
}

void DequantizeRow(DType t, const void* row, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(row);
  switch (t) {
    case DType::kF32: std::memcpy(out, p, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
      }
      return;
    case DType::kQ8_0:
      KCHECK(n % kQ8_0Block == 0);
      for (int64_t b = 0; b < n / kQ8_0Block; ++b) DequantizeQ8_0Block(p + b * kQ8_0Bytes, out + b * kQ8_0Block);
      return;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1: {
      KCHECK(n % 32 == 0);
      const int64_t bytes = LegacyLayout(t).bytes;
      for (int64_t b = 0; b < n / 32; ++b) DequantizeLegacyBlock(t, p + b * bytes, out + b * 32);
      return;
    }
    case DType::kQ4_K:
      KCHECK(n % kQKBlock == 0);
      for (int64_t b = 0; b < n / kQKBlock; ++b) DequantizeQ4_KBlock(p + b * kQ4_KBytes, out + b * kQKBlock);
      return;
    case DType::kQ5_K:
      KCHECK(n % kQKBlock == 0);
      for (int64_t b = 0; b < n / kQKBlock; ++b) DequantizeQ5_KBlock(p + b * kQ5_KBytes, out + b * kQKBlock);
      return;
    case DType::kQ6_K:
      KCHECK(n % kQKBlock == 0);
      for (int64_t b = 0; b < n / kQKBlock; ++b) DequantizeQ6_KBlock(p + b * kQ6_KBytes, out + b * kQKBlock);
      return;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS: {
      KCHECK(n % kQKBlock == 0);
      const int64_t bytes = DTypeSize(t);
      auto* fn = t == DType::kQ2_K   ? DequantizeQ2_KBlock
                 : t == DType::kQ3_K ? DequantizeQ3_KBlock
                                     : DequantizeIq4XsBlock;
      for (int64_t b = 0; b < n / kQKBlock; ++b) fn(p + b * bytes, out + b * kQKBlock);
      return;
    }
    case DType::kIQ4_NL:
      KCHECK(n % 32 == 0);
      for (int64_t b = 0; b < n / 32; ++b) DequantizeIq4NlBlock(p + b * kIQ4_NLBytes, out + b * 32);
      return;
    default: KCHECK_MSG(false, "DequantizeRow: not a weight dtype");
  }
}

void DequantizeMatrixRow(const TensorView& w, int64_t row, float* out) {
  const int64_t cols = w.shape[1];
  const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * w.row_bytes();
  if (!HasSideScales(w.dtype)) {
    DequantizeRow(w.dtype, p, cols, out);
    return;
  }
  KCHECK(w.block_scale != nullptr && w.block_rows > 0 && w.block_cols > 0);
  if (w.dtype == DType::kMlxQ4 || w.dtype == DType::kMlxQ8) {
    const int bits = w.dtype == DType::kMlxQ4 ? 4 : 8;
    const int64_t groups = cols / w.block_cols;
    const float* scales = w.block_scale + row * groups;
    const float* biases = w.group_bias + row * groups;
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t q = (p[j * bits / 8] >> ((j * bits) % 8)) & ((1u << bits) - 1);
      const float sq = scales[j / w.block_cols] * static_cast<float>(q);
      out[w.input_perm != nullptr ? w.input_perm[j] : j] = sq + biases[j / w.block_cols];
    }
    return;
  }
  const int64_t scale_cols = (cols + w.block_cols - 1) / w.block_cols;
  const float* scales = w.block_scale + row / w.block_rows * scale_cols;
  for (int64_t j = 0; j < cols; ++j) out[j] = F8E4M3ToF32(p[j]) * scales[j / w.block_cols];
}

namespace {

// q[i] = nearbyint(x[i] * id) over n elements; the scale d and id from the block's amax.
void QuantizeBlock(const float* x, int n, int8_t* q, float* d_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  *d_out = d;
}

}  // namespace

void QuantizeActsQ8_0(const float* x, int64_t k, int8_t* q, float* d) {
  for (int64_t b = 0; b < k / kQ8_0Block; ++b) {
    QuantizeBlock(x + b * kQ8_0Block, kQ8_0Block, q + b * kQ8_0Block, &d[b]);
    d[b] = F16ToF32(F32ToF16(d[b]));
  }
}

void QuantizeActsQ8_K(const float* x, int64_t k, int8_t* q, float* d, int16_t* bsum) {
  for (int64_t b = 0; b < k / kQKBlock; ++b) QuantizeBlock(x + b * kQKBlock, kQKBlock, q + b * kQKBlock, &d[b]);
  for (int64_t g = 0; g < k / kQ8_KGroup; ++g) {
    int sum = 0;
    for (int i = 0; i < kQ8_KGroup; ++i) sum += q[g * kQ8_KGroup + i];
    bsum[g] = static_cast<int16_t>(sum);
  }
}

namespace {

// Q8_0's eight lanes over blocks of 32 int8 weights, block b's term in lane b % 8:
// codes(b, qw) fills block b's weights and returns the weight block's f16 scale as f32.
template <class Codes>
float DotQ8_0Lanes(ActsQ8_0View x, int64_t k, Codes codes) {
  float lane[8] = {};
  int qw[32];
  for (int64_t b = 0; b < k / kQ8_0Block; ++b) {
    const int8_t* qx = x.q + b * kQ8_0Block;
    const float scale = codes(b, qw) * x.d[b];
    int32_t p = 0;
    for (int i = 0; i < kQ8_0Block; ++i) p += qw[i] * qx[i];
    lane[b % 8] = std::fma(scale, static_cast<float>(p), lane[b % 8]);
  }
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace

float DotQ8_0(const uint8_t* w_row, ActsQ8_0View x, int64_t k) {
  return DotQ8_0Lanes(x, k, [&](int64_t b, int* qw) {
    const uint8_t* blk = w_row + b * kQ8_0Bytes;
    for (int i = 0; i < 32; ++i) qw[i] = static_cast<int8_t>(blk[2 + i]);
    return LoadF16(blk);
  });
}

float DotLegacySymmetric(DType t, const uint8_t* w_row, ActsQ8_0View x, int64_t k) {
  KCHECK(t == DType::kQ4_0 || t == DType::kQ5_0);
  const LegacyBlock l = LegacyLayout(t);
  return DotQ8_0Lanes(x, k, [&](int64_t b, int* qw) {
    const uint8_t* blk = w_row + b * l.bytes;
    uint8_t q[32];
    LegacyCodes(t, blk, q);
    for (int i = 0; i < 32; ++i) qw[i] = q[i] - l.offset;
    return LoadF16(blk);
  });
}

namespace {

// acc + (dx * d) * float(sumi): Q6_K's, Q3_K's and IQ4_XS's float step (this file is compiled
// without contraction).
float AddBlockTerm(float acc, float dx, float d, int32_t sumi) {
  const float scale = dx * d;
  const float term = scale * static_cast<float>(sumi);
  return acc + term;
}

}  // namespace

float DotIq4Nl(const uint8_t* w_row, ActsQ8_0View x, int64_t k) {
  return DotQ8_0Lanes(x, k, [&](int64_t b, int* qw) {
    const uint8_t* blk = w_row + b * kIQ4_NLBytes;
    for (int i = 0; i < 16; ++i) {
      qw[i] = kIq4Values[blk[2 + i] & 0xF];
      qw[i + 16] = kIq4Values[blk[2 + i] >> 4];
    }
    return LoadF16(blk);
  });
}

float DotQ2_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  float acc = 0.0f;
  float acc_m = 0.0f;
  uint8_t q[kQKBlock];
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kQ2_KBytes;
    const int8_t* qx = x.q + b * kQKBlock;
    Q2_KCodes(blk, q);
    int32_t isum = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t p = 0;
      for (int l = 16 * g; l < 16 * g + 16; ++l) p += q[l] * int32_t{qx[l]};
      isum += (blk[g] & 0xF) * p;
      summ += (blk[g] >> 4) * int32_t{x.bsum[b * 16 + g]};
    }
    acc = std::fma(x.d[b] * LoadF16(blk + 80), static_cast<float>(isum), acc);
    const float m = (x.d[b] * LoadF16(blk + 82)) * static_cast<float>(summ);
    acc_m = acc_m + m;
  }
  return acc - acc_m;
}

float DotQ3_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  float acc = 0.0f;
  uint8_t q[kQKBlock];
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kQ3_KBytes;
    const int8_t* qx = x.q + b * kQKBlock;
    Q3_KCodes(blk, q);
    int32_t sumi = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t p = 0;
      for (int l = 16 * g; l < 16 * g + 16; ++l) p += (q[l] - 4) * int32_t{qx[l]};
      sumi += (Q3KScale(blk + 96, g) - 32) * p;
    }
    acc = AddBlockTerm(acc, x.d[b], LoadF16(blk + 108), sumi);
  }
  return acc;
}

float DotIq4Xs(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kIQ4_XSBytes;
    const int8_t* qx = x.q + b * kQKBlock;
    int32_t sumi = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = blk + 8 + 16 * ib;
      int32_t p = 0;
      for (int j = 0; j < 16; ++j) {
        p += kIq4Values[qs[j] & 0xF] * int32_t{qx[32 * ib + j]};
        p += kIq4Values[qs[j] >> 4] * int32_t{qx[32 * ib + j + 16]};
      }
      sumi += (Iq4XsScale(blk, ib) - 32) * p;
    }
    acc = AddBlockTerm(acc, x.d[b], LoadF16(blk), sumi);
  }
  return acc;
}

namespace {

// Q5_K: Q4_K's nibbles (at byte 48) with their fifth bits from qh; eight lanes.
float DotQ5_KLanes(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  constexpr int64_t kBytes = kQ5_KBytes;
  float lane[8] = {};
  float acc_m = 0.0f;
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kBytes;
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 48;
    const int8_t* qx = x.q + b * kQKBlock;
    int32_t lane_int[8] = {};
    int32_t summ = 0;
    for (int g = 0; g < 8; ++g) {
      int sc, m;
      Q4KScaleMin(blk + 4, g, &sc, &m);
      const int c = g / 2, shift = (g % 2) * 4;
      for (int j = 0; j < 8; ++j) {
        int32_t p = 0;
        for (int l = 4 * j; l < 4 * j + 4; ++l) {
          int q = (qs[32 * c + l] >> shift) & 0xF;
          q |= ((qh[l] >> g) & 1) << 4;
          p += q * int32_t{qx[32 * g + l]};
        }
        lane_int[j] += sc * p;
      }
      summ += m * (x.bsum[b * 16 + 2 * g] + x.bsum[b * 16 + 2 * g + 1]);
    }
    const float scale = x.d[b] * LoadF16(blk);
    for (int j = 0; j < 8; ++j) lane[j] = std::fma(scale, static_cast<float>(lane_int[j]), lane[j]);
    const float m = (x.d[b] * LoadF16(blk + 2)) * static_cast<float>(summ);
    acc_m = acc_m + m;
  }
  const float sum =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  return sum - acc_m;
}

}  // namespace

float DotQ4_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  float acc = 0.0f;
  float acc_m = 0.0f;
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kQ4_KBytes;
    const uint8_t* qs = blk + 16;
    const int8_t* qx = x.q + b * kQKBlock;
    int32_t isum = 0, summ = 0;
    for (int g = 0; g < 8; ++g) {
      int sc, m;
      Q4KScaleMin(blk + 4, g, &sc, &m);
      const int c = g / 2, shift = (g % 2) * 4;
      int32_t p = 0;
      for (int l = 0; l < 32; ++l) p += ((qs[32 * c + l] >> shift) & 0xF) * int32_t{qx[32 * g + l]};
      isum += sc * p;
      summ += m * (x.bsum[b * 16 + 2 * g] + x.bsum[b * 16 + 2 * g + 1]);
    }
    acc = std::fma(x.d[b] * LoadF16(blk), static_cast<float>(isum), acc);
    const float m = (x.d[b] * LoadF16(blk + 2)) * static_cast<float>(summ);
    acc_m = acc_m + m;
  }
  return acc - acc_m;
}

float DotQ5_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  return DotQ5_KLanes(w_row, x, k);
}

float DotQ6_K(const uint8_t* w_row, ActsQ8_KView x, int64_t k) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kQKBlock; ++b) {
    const uint8_t* blk = w_row + b * kQ6_KBytes;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const int8_t* qx = x.q + b * kQKBlock;
    int32_t sumi = 0;
    for (int n = 0; n < 2; ++n) {
      for (int i = 0; i < 4; ++i) {  // elements 128n + 32i + l
        for (int half = 0; half < 2; ++half) {
          int32_t isum = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int lo = (ql[64 * n + 32 * (i & 1) + l] >> (4 * (i >> 1))) & 0xF;
            const int hi = (qh[32 * n + l] >> (2 * i)) & 3;
            isum += ((lo | (hi << 4)) - 32) * int32_t{qx[128 * n + 32 * i + l]};
          }
          sumi += sc[8 * n + 2 * i + half] * isum;
        }
      }
    }
    acc = AddBlockTerm(acc, x.d[b], LoadF16(blk + 208), sumi);
  }
  return acc;
}

}  // namespace kestrel::quant
