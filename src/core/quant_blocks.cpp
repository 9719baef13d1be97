#include "core/quant_blocks.h"

#include "core/check.h"

namespace kestrel::quant {

void DequantizeQ8_0Block(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
  for (int i = 0; i < kQ8_0Block; ++i) out[i] = static_cast<float>(q[i]) * d;
}

void DequantizeQ4_KBlock(const uint8_t* block, float* out) {
  const float d = LoadF16(block);
  const float dmin = LoadF16(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* q = block + 16;
  for (int c = 0; c < 4; ++c) {
    int sc, m;
    Q4KScaleMin(scales, 2 * c, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    Q4KScaleMin(scales, 2 * c + 1, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) out[64 * c + l] = d1 * static_cast<float>(q[32 * c + l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) out[64 * c + 32 + l] = d2 * static_cast<float>(q[32 * c + l] >> 4) - m2;
  }
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
    case DType::kQ4_K:
      KCHECK(n % kQKBlock == 0);
      for (int64_t b = 0; b < n / kQKBlock; ++b) DequantizeQ4_KBlock(p + b * kQ4_KBytes, out + b * kQKBlock);
      return;
    case DType::kQ6_K:
      KCHECK(n % kQKBlock == 0);
      for (int64_t b = 0; b < n / kQKBlock; ++b) DequantizeQ6_KBlock(p + b * kQ6_KBytes, out + b * kQKBlock);
      return;
    default: KCHECK_MSG(false, "DequantizeRow: not a weight dtype");
  }
}

float DequantizeElement(DType t, const void* data, int64_t cols, int64_t i) {
  const int64_t be = DTypeBlockElems(t);
  const int64_t row = i / cols, col = i % cols;
  const auto* block = static_cast<const uint8_t*>(data) + row * DTypeRowBytes(t, cols) +
                      col / be * static_cast<int64_t>(DTypeSize(t));
  if (be == 1) {
    float v;
    DequantizeRow(t, block, 1, &v);
    return v;
  }
  float buf[kQKBlock];
  DequantizeRow(t, block, be, buf);
  return buf[col % be];
}

}  // namespace kestrel::quant
