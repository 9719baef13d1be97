// Element types of weights and activations, and scalar conversions to/from f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kestrel {

// kQ8_0, kQ4_K, kQ5_K, kQ6_K, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ2_K, kQ3_K, kIQ4_NL, kIQ4_XS:
// GGUF/ggml block-quantized matrices
// (core/quant_blocks.h), row-major, each row a whole number of blocks; a view's shape counts
// elements, its bytes count blocks.
// kF8E4M3: FP8 (e4m3fn) weights of block-quantized checkpoints; the view's block_scale holds
// the f32 scale of each 128 x 128 block (TensorView::block_scale).
// kMlxQ4, kMlxQ8: MLX affine-quantized matrices (uint32 words of 8 nibbles / 4 bytes, element j
// of a word in bits [b*j, b*j + b)); the view's block_scale and group_bias hold each group's
// f32 scale and bias: w = scale * q + bias. kU32: the packed words as the file stores them.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kU8,
  kQ8_0,
  kQ4_K,
  kQ6_K,
  kF8E4M3,
  kU32,
  kMlxQ4,
  kMlxQ8,
  kQ5_K,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kIQ4_NL,
  kIQ4_XS
};

// Elements per block and bytes per block: (1, element size) for the plain types.
inline int64_t DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL:
      return 32;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return 256;
    case DType::kMlxQ4: return 8;  // per uint32 word
    case DType::kMlxQ8: return 4;
    default: return 1;
  }
}
// The GGUF block formats (self-contained blocks with their scales).
inline bool IsBlockQuantized(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
         t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kIQ4_NL || t == DType::kIQ4_XS;
}
// The block formats the CPU's integer kernels take with int8 activations (llama.cpp's
// semantics, quant_blocks.h); Q4_1 and Q5_1 are dequantized in the f32 kernels whatever the
// activations.
constexpr bool HasIntDot(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
         t == DType::kQ4_0 || t == DType::kQ5_0 || t == DType::kQ2_K || t == DType::kQ3_K ||
         t == DType::kIQ4_NL || t == DType::kIQ4_XS;
}
// Int8 activations in 32-element blocks with an f16 scale (Q8_0's); the K formats (and IQ4_XS)
// take 256.
constexpr bool TakesQ8_0Activations(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ5_0 || t == DType::kIQ4_NL;
}
// Formats whose scales live beside the weights (TensorView::block_scale): FP8 blocks, MLX groups.
inline bool HasSideScales(DType t) {
  return t == DType::kF8E4M3 || t == DType::kMlxQ4 || t == DType::kMlxQ8;
}


// Bytes per element; for the block types, bytes per block (see DTypeRowBytes).
inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kQ8_0: return 34;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ2_K:
      return 84;
    case DType::kQ3_K:
      return 110;
    case DType::kIQ4_NL:
      return 18;
    case DType::kIQ4_XS:
      return 136;
    case DType::kF8E4M3: return 1;
    case DType::kU32: return 4;
    case DType::kMlxQ4:
    case DType::kMlxQ8: return 4;
  }
  return 0;
}

// Bytes of n consecutive elements of one row (n a multiple of the block size for block types).
inline int64_t DTypeRowBytes(DType t, int64_t n) {
  return n / DTypeBlockElems(t) * static_cast<int64_t>(DTypeSize(t));
}

inline std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kQ5_0: return "Q5_0";
    case DType::kQ5_1: return "Q5_1";
    case DType::kQ2_K:
      return "Q2_K";
    case DType::kQ3_K:
      return "Q3_K";
    case DType::kIQ4_NL:
      return "IQ4_NL";
    case DType::kIQ4_XS:
      return "IQ4_XS";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kU32: return "U32";
    case DType::kMlxQ4: return "MLX_Q4";
    case DType::kMlxQ8: return "MLX_Q8";
  }
  return "?";
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN preserved (quiet).
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// x[i] = the nearest bf16 value of x[i] (round to nearest even), in place.
inline void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToF32(F32ToBf16(x[i]));
}

// FP8 e4m3fn (bias 7, no infinities, 0x7f / 0xff NaN) to f32, exactly.
inline float F8E4M3ToF32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  uint32_t u;
  if ((v & 0x7fu) == 0x7fu) {
    u = sign | 0x7fc00000u;
  } else if (exp == 0) {  // subnormal: mant * 2^-9
    float f = static_cast<float>(mant) * (1.0f / 512.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else {
    u = sign | ((exp + 127 - 7) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xffu);
  uint32_t mant = u & 0x7fffffu;
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

}  // namespace kestrel
