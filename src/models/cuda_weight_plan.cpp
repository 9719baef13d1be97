// The CUDA weight plan (see cuda_weight_plan.h): placement and the host-side conversion of
// checkpoint formats into the device formats of backends/cuda/quant_linear.h.
#ifdef KESTREL_HAS_CUDA

#include "models/cuda_weight_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "core/check.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace kestrel {
namespace {

using cuda::WeightFormat;

int64_t Rows(const TensorView& t) { return t.n_dims == 1 ? 1 : t.shape[0]; }
int64_t Cols(const TensorView& t) { return t.shape[t.n_dims - 1]; }

bool PowerOfTwoIn(int64_t g, int64_t lo, int64_t hi) {
  return g >= lo && g <= hi && (g & (g - 1)) == 0;
}

// The device format a linear part keeps, and its group; kBf16 for anything the quantized
// kernels cannot read as is (it is then dequantized to bf16).
struct Kind {
  WeightFormat format = WeightFormat::kBf16;
  int32_t group = 0;
  bool operator==(const Kind&) const = default;
};

Kind KindOf(const TensorView& t) {
  if (t.n_dims != 2) return {};
  const int64_t k = t.shape[1];
  switch (t.dtype) {
    case DType::kF8E4M3:
      if (t.block_rows == 128 && t.block_cols == 128 && k % 16 == 0) {
        return {WeightFormat::kFp8Block, 128};
      }
      return {};
    case DType::kMlxQ4:
      if (PowerOfTwoIn(t.block_cols, 32, 128) && k % t.block_cols == 0) {
        return {WeightFormat::kAffine4, static_cast<int32_t>(t.block_cols)};
      }
      return {};
    case DType::kMlxQ8:
      if (PowerOfTwoIn(t.block_cols, 16, 128) && k % t.block_cols == 0) {
        return {WeightFormat::kAffine8, static_cast<int32_t>(t.block_cols)};
      }
      return {};
    case DType::kQ8_0: return {WeightFormat::kAffine8, 32};
    case DType::kQ4_0:
    case DType::kQ4_1: return {WeightFormat::kAffine4, 32};
    case DType::kQ5_0:
    case DType::kQ5_1: return {WeightFormat::kAffine8, 32};  // 5-bit codes in bytes
    case DType::kQ4_K: return {WeightFormat::kAffine4, 32};
    case DType::kQ5_K: return {WeightFormat::kAffine8, 32};  // 5-bit codes in bytes
    case DType::kQ6_K: return {WeightFormat::kAffine8, 16};
    case DType::kQ2_K:
    case DType::kQ3_K:
      return {WeightFormat::kAffine8, 16};  // 2- / 3-bit codes in bytes
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return {WeightFormat::kAffine8, 32};  // codebook values + 128
    default: return {};
  }
}

// The tensor as bf16 bits (a host copy).
std::vector<uint8_t> ToBf16(const TensorView& t) {
  const int64_t rows = Rows(t), cols = Cols(t);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols) * 2);
  std::vector<float> row(static_cast<size_t>(cols));
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  for (int64_t r = 0; r < rows; ++r) {
    if (t.n_dims == 1) {
      quant::DequantizeRow(t.dtype, t.data, cols, row.data());
    } else {
      quant::DequantizeMatrixRow(t, r, row.data());
    }
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = F32ToBf16(row[static_cast<size_t>(c)]);
  }
  return out;
}

// Affine codes of one part (in the checkpoint's order: element j of a row at byte j, or nibble
// j % 2 of byte j / 2) with the s and b of each group of its q * s + b, row by row.
struct AffinePart {
  std::vector<uint8_t> codes;  // empty: the part's own bytes are the codes
  std::vector<float> scale, bias;
};

void PushAffine(float s, float b, AffinePart* p) {
  p->scale.push_back(s);
  p->bias.push_back(b);
}

AffinePart ConvertAffine(const TensorView& t, const Kind& kind) {
  const int64_t rows = t.shape[0], k = t.shape[1];
  AffinePart p;
  const size_t groups = static_cast<size_t>(rows * (k / kind.group));
  p.scale.reserve(groups);
  p.bias.reserve(groups);
  const auto* src = static_cast<const uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::kMlxQ4:
    case DType::kMlxQ8:
      // Codes as published (uint32 words, element j of a word at bits bits*j: little-endian
      // bytes in element order).
      for (int64_t i = 0; i < rows * (k / kind.group); ++i) {
        PushAffine(t.block_scale[i], t.group_bias[i], &p);
      }
      break;
    case DType::kQ8_0: {
      // d * q, q int8: code q + 128, s = d, b = -128 d.
      p.codes.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t blk = 0; blk < k / quant::kQ8_0Block; ++blk) {
          const uint8_t* b = row + blk * quant::kQ8_0Bytes;
          const float d = quant::LoadF16(b);
          uint8_t* c = p.codes.data() + r * k + blk * quant::kQ8_0Block;
          for (int i = 0; i < quant::kQ8_0Block; ++i) c[i] = static_cast<uint8_t>(b[2 + i] ^ 0x80);
          PushAffine(d, -128.0f * d, &p);
        }
      }
      break;
    }
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1: {
      // Per 32-block: q * d + m, or (q - offset) * d as q * d + (-offset * d) (exact: offset is
      // 8 or 16). 4-bit codes re-packed so element e is the nibble (e & 1) of byte e / 2; 5-bit
      // ones a code per byte.
      const quant::LegacyBlock l = quant::LegacyLayout(t.dtype);
      const bool four = l.qh_at < 0;
      p.codes.resize(static_cast<size_t>(four ? rows * k / 2 : rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t blk = 0; blk < k / 32; ++blk) {
          const uint8_t* b = row + blk * l.bytes;
          const float d = quant::LoadF16(b);
          uint8_t vals[32];
          quant::LegacyCodes(t.dtype, b, vals);
          const int64_t e0 = r * k + blk * 32;
          if (four) {
            for (int e = 0; e < 32; e += 2) {
              p.codes[static_cast<size_t>((e0 + e) / 2)] =
                  static_cast<uint8_t>(vals[e] | (vals[e + 1] << 4));
            }
          } else {
            std::memcpy(p.codes.data() + e0, vals, 32);
          }
          PushAffine(d, l.has_min ? quant::LoadF16(b + 2) : -static_cast<float>(l.offset) * d, &p);
        }
      }
      break;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      // Per 256-block, sub-block j of 32: d*sc_j * q - dmin*m_j. Q4_K: 4-bit codes re-packed so
      // element e is the nibble (e & 1) of byte e/2; Q5_K: the fifth bit of element l of group j
      // is bit j of qh[l], one code per byte.
      const bool five = t.dtype == DType::kQ5_K;
      p.codes.resize(static_cast<size_t>(five ? rows * k : rows * k / 2));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t blk = 0; blk < k / quant::kQKBlock; ++blk) {
          const uint8_t* b = row + blk * (five ? quant::kQ5_KBytes : quant::kQ4_KBytes);
          const float d = quant::LoadF16(b), dmin = quant::LoadF16(b + 2);
          const uint8_t* qh = b + 16;
          const uint8_t* q = b + (five ? 48 : 16);
          uint8_t vals[quant::kQKBlock];
          for (int j = 0; j < 8; ++j) {
            const int c = j / 2, shift = (j % 2) * 4;
            for (int l = 0; l < 32; ++l) {
              vals[32 * j + l] = static_cast<uint8_t>(((q[32 * c + l] >> shift) & 0xF) |
                                                      (five ? ((qh[l] >> j) & 1) << 4 : 0));
            }
            int sc, m;
            quant::Q4KScaleMin(b + 4, j, &sc, &m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            PushAffine(d1, -m1, &p);
          }
          const int64_t e0 = r * k + blk * quant::kQKBlock;  // first element of the block
          if (five) {
            std::memcpy(p.codes.data() + e0, vals, quant::kQKBlock);
          } else {
            for (int e = 0; e < quant::kQKBlock; e += 2) {
              p.codes[static_cast<size_t>((e0 + e) / 2)] =
                  static_cast<uint8_t>(vals[e] | (vals[e + 1] << 4));
            }
          }
        }
      }
      break;
    }
    case DType::kQ6_K: {
      // Per 256-block, group of 16: d*sc * (q - 32), q 6-bit.
      p.codes.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t blk = 0; blk < k / quant::kQKBlock; ++blk) {
          const uint8_t* b = row + blk * quant::kQ6_KBytes;
          const uint8_t* ql = b;
          const uint8_t* qh = b + 128;
          const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
          const float d = quant::LoadF16(b + 208);
          uint8_t* out = p.codes.data() + r * k + blk * quant::kQKBlock;
          for (int n = 0; n < 2; ++n) {
            for (int l = 0; l < 32; ++l) {
              out[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
              out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
              out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
              out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
            out += 128;
            ql += 64;
            qh += 32;
          }
          // Group g (16 elements) of the block has scale sc[g]: elements 16g .. 16g+15.
          for (int g = 0; g < 16; ++g) {
            const float s = d * static_cast<float>(sc[g]);
            PushAffine(s, -32.0f * s, &p);
          }
        }
      }
      break;
    }
    case DType::kQ2_K:
    case DType::kQ3_K: {
      // Per 256-block, group g of 16: Q2_K (d * sc) * q - dmin * m, Q3_K (d * (sc - 32)) * q
      // - 4 (d * (sc - 32)) (exact), a code per byte.
      const bool q3 = t.dtype == DType::kQ3_K;
      p.codes.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t blk = 0; blk < k / quant::kQKBlock; ++blk) {
          const uint8_t* b = row + blk * (q3 ? quant::kQ3_KBytes : quant::kQ2_KBytes);
          uint8_t* out = p.codes.data() + r * k + blk * quant::kQKBlock;
          if (q3) {
            quant::Q3_KCodes(b, out);
            const float d = quant::LoadF16(b + 108);
            for (int g = 0; g < 16; ++g) {
              const float s = d * static_cast<float>(quant::Q3KScale(b + 96, g) - 32);
              PushAffine(s, -4.0f * s, &p);
            }
          } else {
            quant::Q2_KCodes(b, out);
            const float d = quant::LoadF16(b + 80), dmin = quant::LoadF16(b + 82);
            for (int g = 0; g < 16; ++g) {
              PushAffine(d * static_cast<float>(b[g] & 0xF),
                         -(dmin * static_cast<float>(b[g] >> 4)), &p);
            }
          }
        }
      }
      break;
    }
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: {
      // Per group of 32: s * kIq4Values[q] as code kIq4Values[q] + 128, bias -128 s (exact).
      const bool nl = t.dtype == DType::kIQ4_NL;
      p.codes.resize(static_cast<size_t>(rows * k));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * t.row_bytes();
        for (int64_t grp = 0; grp < k / 32; ++grp) {
          const uint8_t* qs;
          float s;
          if (nl) {
            const uint8_t* b = row + grp * quant::kIQ4_NLBytes;
            s = quant::LoadF16(b);
            qs = b + 2;
          } else {
            const uint8_t* b = row + grp / 8 * quant::kIQ4_XSBytes;
            const int ib = static_cast<int>(grp % 8);
            s = quant::LoadF16(b) * static_cast<float>(quant::Iq4XsScale(b, ib) - 32);
            qs = b + 8 + 16 * ib;
          }
          uint8_t* out = p.codes.data() + r * k + grp * 32;
          for (int j = 0; j < 16; ++j) {
            out[j] = static_cast<uint8_t>(quant::kIq4Values[qs[j] & 0xF] + 128);
            out[j + 16] = static_cast<uint8_t>(quant::kIq4Values[qs[j] >> 4] + 128);
          }
          PushAffine(s, -128.0f * s, &p);
        }
      }
      break;
    }
    default: KCHECK(false);
  }
  return p;
}

// r where r * scale[i] (one f32 multiply, as the kernels do it) is bias[i] for every group:
// symmetric codes (Q8_0 -1.5, Q6_K -1.125, Q3_K -1.015625, Q5_0 -1.0625, IQ4_* -1.5 for the
// (1 + q/256) form), exact for their scales' few significant bits. nullopt when any group
// differs (independent minimums: Q2_K, Q5_K, Q5_1, MLX).
std::optional<float> BiasRatio(const std::vector<float>& scale, const std::vector<float>& bias) {
  size_t i0 = 0;
  while (i0 < scale.size() && scale[i0] == 0.0f) ++i0;
  if (i0 == scale.size()) return std::nullopt;
  const float r = static_cast<float>(static_cast<double>(bias[i0]) / scale[i0]);
  for (size_t i = 0; i < scale.size(); ++i) {
    if (!(r * scale[i] == bias[i])) return std::nullopt;
  }
  return r;
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

size_t CudaWeightPlan::Reserve(size_t bytes) {
  const size_t off = total_;
  total_ += CudaWeightPlan::AlignUp(bytes);
  return off;
}

size_t CudaWeightPlan::Own(std::vector<uint8_t> bytes) {
  const size_t off = Reserve(bytes.size());
  owned_.push_back(std::move(bytes));
  pieces_.push_back({owned_.back().data(), owned_.back().size(), off});
  return off;
}

size_t CudaWeightPlan::Place(std::initializer_list<const TensorView*> parts) {
  return Place(std::vector<const TensorView*>(parts));
}

size_t CudaWeightPlan::Place(const std::vector<const TensorView*>& parts) {
  size_t bytes = 0;
  for (const TensorView* t : parts) bytes += static_cast<size_t>(Rows(*t) * Cols(*t)) * 2;
  const size_t off = Reserve(bytes);
  size_t at = off;
  for (const TensorView* t : parts) {
    if (t->dtype == DType::kBF16) {
      pieces_.push_back({t->data, t->size_bytes(), at});
      at += t->size_bytes();
    } else {
      owned_.push_back(ToBf16(*t));
      pieces_.push_back({owned_.back().data(), owned_.back().size(), at});
      at += owned_.back().size();
    }
  }
  return off;
}

size_t CudaWeightPlan::PlaceOptional(std::initializer_list<const TensorView*> parts) {
  if (parts.size() == 0 || (*parts.begin())->empty()) return kNone;
  return Place(parts);
}

void CudaWeightPlan::AddSegment(const std::vector<const TensorView*>& parts, int64_t rows,
                                Linear* out) {
  const Kind kind = KindOf(*parts.front());
  const int64_t k = parts.front()->shape[1];
  Segment s;
  s.format = kind.format;
  s.rows = rows;
  s.group = kind.group;
  formats_used_ |= 1u << static_cast<unsigned>(kind.format);
  if (kind.format == WeightFormat::kBf16) {
    s.data = Place(parts);
    out->push_back(s);
    return;
  }
  if (kind.format == WeightFormat::kFp8Block) {
    // Codes as they are; block scales concatenated, rows padded to scale_ld floats.
    const int64_t kb = (k + 127) / 128;
    s.scale_ld = static_cast<int32_t>((kb + 3) / 4 * 4);
    s.data = Reserve(static_cast<size_t>(rows * k));
    size_t at = s.data;
    std::vector<float> scale;
    for (const TensorView* t : parts) {
      pieces_.push_back({t->data, t->size_bytes(), at});
      at += t->size_bytes();
      const int64_t rb = (t->shape[0] + 127) / 128;
      for (int64_t i = 0; i < rb; ++i) {
        for (int64_t j = 0; j < s.scale_ld; ++j) scale.push_back(j < kb ? t->block_scale[i * kb + j] : 0.0f);
      }
    }
    s.scale = Own(FloatBytes(scale));
    out->push_back(s);
    return;
  }
  const bool four = kind.format == WeightFormat::kAffine4;
  const int64_t code_bytes = four ? k / 2 : k;
  s.data = Reserve(static_cast<size_t>(rows * code_bytes));
  if (four) affine4_codes_.push_back({s.data, static_cast<size_t>(rows * code_bytes)});
  if (!four && affine8_mma_ && k % 64 == 0) {
    s.mma_order = true;
    affine8_codes_.push_back({s.data, static_cast<size_t>(rows * code_bytes)});
  }
  size_t at = s.data;
  std::vector<float> scale, bias;
  for (const TensorView* t : parts) {
    AffinePart p = ConvertAffine(*t, kind);
    if (p.codes.empty()) {
      pieces_.push_back({t->data, static_cast<size_t>(t->shape[0] * code_bytes), at});
    } else {
      owned_.push_back(std::move(p.codes));
      pieces_.push_back({owned_.back().data(), owned_.back().size(), at});
    }
    at += static_cast<size_t>(t->shape[0] * code_bytes);
    scale.insert(scale.end(), p.scale.begin(), p.scale.end());
    bias.insert(bias.end(), p.bias.begin(), p.bias.end());
  }
  if (four) {
    // bf16 pairs (s, b): the kernels' bf16 fma q * s + b; (s * 2^133, b) where every |s| < 2^-5
    // (quant_linear.h, scaled_codes: then s * 2^133 is a finite bf16, exactly).
    std::vector<uint16_t> s16(scale.size());
    bool small = scaled_affine4_codes_;
    for (size_t i = 0; i < scale.size(); ++i) {
      s16[i] = F32ToBf16(scale[i]);
      small = small && std::fabs(Bf16ToF32(s16[i])) < 0x1p-5f;
    }
    s.scaled_codes = small;
    std::vector<uint8_t> pairs(scale.size() * 4);
    for (size_t i = 0; i < scale.size(); ++i) {
      const float scaled = static_cast<float>(std::ldexp(double{Bf16ToF32(s16[i])}, 133));
      const uint16_t sv = small ? F32ToBf16(scaled) : s16[i];
      const uint32_t v = sv | static_cast<uint32_t>(F32ToBf16(bias[i])) << 16;
      std::memcpy(pairs.data() + 4 * i, &v, 4);
    }
    s.scale_bias = Own(std::move(pairs));
  } else {
    // (1 + q/256) * scale' + bias' with scale' = 256 s, bias' = b - scale'.
    for (size_t i = 0; i < scale.size(); ++i) {
      scale[i] *= 256.0f;
      bias[i] -= scale[i];
    }
    s.scale = Own(FloatBytes(scale));
    const std::optional<float> ratio =
        affine8_bias_from_scale_ ? BiasRatio(scale, bias) : std::nullopt;
    if (ratio) {
      s.bias_from_scale = true;
      s.bias_ratio = *ratio;
    } else {
      s.bias = Own(FloatBytes(bias));
    }
  }
  out->push_back(s);
}

void CudaWeightPlan::ArrangeOnDevice(uint8_t* base, cudaStream_t stream) const {
  for (const auto& [offset, bytes] : affine4_codes_) {
    cuda::ArrangeAffine4Codes(base + offset, static_cast<int64_t>(bytes), stream);
  }
  for (const auto& [offset, bytes] : affine8_codes_) {
    cuda::ArrangeAffine8Codes(base + offset, static_cast<int64_t>(bytes), stream);
  }
}

CudaWeightPlan::Linear CudaWeightPlan::PlaceLinear(const std::vector<const TensorView*>& parts) {
  Linear out;
  const int32_t* perm = parts.front()->input_perm;
  bool permuted = false, perm_kept = true;
  for (const TensorView* t : parts) {
    permuted |= t->input_perm != nullptr;
    perm_kept &= perm != nullptr && t->input_perm != nullptr &&
                 KindOf(*t).format == WeightFormat::kAffine4 &&
                 (t->input_perm == perm ||
                  std::memcmp(t->input_perm, perm, static_cast<size_t>(t->shape[1]) * 4) == 0);
  }
  if (permuted && !perm_kept) {
    Segment s;
    s.format = WeightFormat::kBf16;
    for (const TensorView* t : parts) s.rows += t->shape[0];
    s.data = Place(parts);  // ToBf16: rows in the inputs' own order
    formats_used_ |= 1u << static_cast<unsigned>(WeightFormat::kBf16);
    out.push_back(s);
    return out;
  }
  std::vector<const TensorView*> run;
  int64_t run_rows = 0;
  Kind run_kind;
  for (const TensorView* t : parts) {
    KCHECK(t->n_dims == 2 && t->shape[1] == parts.front()->shape[1]);
    const Kind kind = KindOf(*t);
    // FP8 block scales stay whole 128-row blocks only when the segment so far ends on one.
    const bool joins = !run.empty() && kind == run_kind &&
                       (kind.format != WeightFormat::kFp8Block || run_rows % 128 == 0);
    if (!run.empty() && !joins) {
      AddSegment(run, run_rows, &out);
      run.clear();
      run_rows = 0;
    }
    run.push_back(t);
    run_rows += t->shape[0];
    run_kind = kind;
  }
  if (!run.empty()) AddSegment(run, run_rows, &out);
  KCHECK_MSG(out.size() <= static_cast<size_t>(cuda::kMaxWeightSegments),
             "a fused linear weight has more format changes than the device descriptor holds");
  if (permuted) {
    std::vector<uint8_t> bytes(static_cast<size_t>(parts.front()->shape[1]) * 4);
    std::memcpy(bytes.data(), perm, bytes.size());
    const size_t at = Own(std::move(bytes));
    for (Segment& s : out) s.input_perm = at;
  }
  return out;
}

// KESTREL_AFFINE4_SCALED_CODES=0 keeps every 4-bit segment's pairs unscaled (to compare the
// two forms of the kernels, whose weights are the same bits).
bool CudaWeightPlan::ScaledAffine4CodesByDefault() {
  static const bool on = [] {
    const char* env = std::getenv("KESTREL_AFFINE4_SCALED_CODES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

// KESTREL_AFFINE8_BIAS_FROM_SCALE=0 keeps every 8-bit segment's bias array (comparisons).
bool CudaWeightPlan::Affine8BiasFromScaleByDefault() {
  static const bool on = [] {
    const char* env = std::getenv("KESTREL_AFFINE8_BIAS_FROM_SCALE");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

// 8-bit codes are arranged for the tensor-core GEMV (on the H200 faster than the CUDA-core one
// at every row count, 3x at 8 rows: docs/quantization.md); KESTREL_AFFINE8_MMA=0 keeps the
// CUDA-core form (comparisons). The tests set both forms.
bool CudaWeightPlan::Affine8MmaByDefault() {
  static const bool on = [] {
    const char* env = std::getenv("KESTREL_AFFINE8_MMA");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

cuda::Weight CudaWeightPlan::Bind(const Linear& w, const uint8_t* base) {
  cuda::Weight d;
  auto at = [&](size_t off) -> const void* { return off == kNone ? nullptr : base + off; };
  for (const Segment& s : w) {
    cuda::WeightSegment& o = d.seg[d.n_segments++];
    o.format = s.format;
    o.rows = s.rows;
    o.data = at(s.data);
    o.scale = static_cast<const float*>(at(s.scale));
    o.bias = static_cast<const float*>(at(s.bias));
    o.scale_bias = static_cast<const uint32_t*>(at(s.scale_bias));
    o.scaled_codes = s.scaled_codes;
    o.bias_from_scale = s.bias_from_scale;
    o.bias_ratio = s.bias_ratio;
    o.mma_order = s.mma_order;
    o.group = s.group;
    o.scale_ld = s.scale_ld;
  }
  if (!w.empty()) d.input_perm = static_cast<const int32_t*>(at(w.front().input_perm));
  return d;
}

std::string CudaWeightPlan::formats() const {
  std::string out;
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kAffine4,
                         WeightFormat::kAffine8}) {
    if ((formats_used_ & (1u << static_cast<unsigned>(f))) == 0) continue;
    if (!out.empty()) out += "+";
    out += cuda::WeightFormatName(f);
  }
  return out.empty() ? "bf16" : out;
}

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
