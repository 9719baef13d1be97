// Quantized weight-only GEMV and the dequantizing copy (see quant_linear.h).
//
// QuantGemv design (the bf16 FmaGemvKernel of linear.cu with codes instead of bf16):
//   - A block has 8 warps in groups of KS; a group owns R consecutive rows of W and its KS warps
//     split k in chunks of 32 lanes x 16 bytes of codes (512 elements of 8-bit codes, 1024 of
//     4-bit ones); warp s of a group takes chunks s, s+KS, ... Each lane issues U*R streaming
//     16-byte loads per trip before using any.
//   - A lane's 16-byte vector lies in one scale group (group >= elements per vector for the
//     affine formats; 128-element blocks for FP8), so per (row, token) it computes
//     s1 = sum(f * x) over the vector, and for the affine formats sx = sum(x), then
//     acc += scale * s1 (+ bias * sx).
//   - Codes become floats with integer ops only: affine codes go under the exponent of 1.0
//     (f = 1 + q/2^bits, exact); an e4m3 byte's sign goes to bit 31 and its exponent|mantissa to
//     bits 20..26, which is the e4m3 value times 2^-120 exactly (normal and subnormal codes; the
//     build flushes no denormals), and the 2^120 is folded into the block scale.
//   - Lanes combine by a warp butterfly, the KS warps of a group through shared memory in slice
//     order: no atomics, so the result is deterministic; the order per (row, token) does not
//     depend on m, so row i of an m-row call equals the 1-row call.
#include "backends/cuda/quant_linear.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/vec_io.cuh"
#include "core/check.h"

namespace kestrel::cuda {

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8Block: return "fp8-block128";
    case WeightFormat::kAffine4: return "int4-affine";
    case WeightFormat::kAffine8: return "int8-affine";
  }
  return "?";
}

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;


__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Shift left by s (right by -s), s a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t Shift(uint32_t v, int s) { return s >= 0 ? v << s : v >> -s; }

// Per format: kE elements per 16-byte vector, read as kE/8 pieces of 8; Piece(v, p, f) gives
// the floats of elements 8p .. 8p+7 of the vector (before the group's scale).
template <WeightFormat F>
struct Codes;

// Nibble of element e of a kAffine4 word (quant_linear.h): pairs (2j, 2j + 1) at nibbles j, j + 4.
__host__ __device__ constexpr int Affine4Nibble(int e) { return (e & 1) * 4 + e / 2; }

template <>
struct Codes<WeightFormat::kAffine4> {
  static constexpr int kE = 32;
  static constexpr bool kBias = true;
  // Word p holds element 8p + j at nibble Affine4Nibble(j); f = 1 + q/16 has q at bits 19..22.
  __device__ static void Piece(const uint4& v, int p, float (&f)[8]) {
    const uint32_t w = Word(v, p);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      f[j] = __uint_as_float(0x3F800000u | (Shift(w, 19 - 4 * Affine4Nibble(j)) & 0x00780000u));
    }
  }
};

template <>
struct Codes<WeightFormat::kAffine8> {
  static constexpr int kE = 16;
  static constexpr bool kBias = true;
  // f = 1 + q/256 of byte b of a word (bits 8b): q moved to bits 15..22 under 1.0f.
  __device__ static float Unit(uint32_t w, int b) {
    return __uint_as_float(0x3F800000u | (Shift(w, 15 - 8 * b) & 0x007F8000u));
  }
  // Words 2p, 2p+1 hold elements 8p .. 8p+7.
  __device__ static void Piece(const uint4& v, int p, float (&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = Unit(Word(v, 2 * p + j / 4), j % 4);
  }
};

template <>
struct Codes<WeightFormat::kFp8Block> {
  static constexpr int kE = 16;
  static constexpr bool kBias = false;
  // e4m3fn byte s|eeee|mmm -> f32 bits s at 31, eeee|mmm at 20..26: the value times 2^-120.
  __device__ static void Piece(const uint4& v, int p, float (&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t w = Word(v, 2 * p + j / 4);
      const int b = j % 4;
      f[j] = __uint_as_float((Shift(w, 24 - 8 * b) & 0x80000000u) |
                             (Shift(w, 20 - 8 * b) & 0x07F00000u));
    }
  }
};

constexpr float kFp8Unscale = 0x1p120f;

// log2 of an affine segment's group (a power of two, CheckSegment): group indices by shifts.
__device__ __forceinline__ int GroupShift(const WeightSegment& w) { return __ffs(w.group) - 1; }

__device__ __forceinline__ float Bf16BitsToF32(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// Index of the affine group of element e of row `row` in its segment's per-group arrays.
__device__ __forceinline__ int64_t AffineGroup(const WeightSegment& w, int row, int e, int k) {
  const int gshift = GroupShift(w);
  return static_cast<int64_t>(row) * (k >> gshift) + (e >> gshift);
}

// Scale and bias of the vector starting at element e of row `row`, for Codes<F>::Piece's floats
// (kAffine4: its bf16 s and b as s' = 16 s, b' = b - s', exact in f32).
template <WeightFormat F>
__device__ __forceinline__ void GroupScale(const WeightSegment& w, int row, int e, int k,
                                           float* s, float* b) {
  if constexpr (F == WeightFormat::kFp8Block) {
    *s = __ldg(w.scale + static_cast<int64_t>(row / 128) * w.scale_ld + e / 128) * kFp8Unscale;
    *b = 0.0f;
  } else {
    const int64_t at = AffineGroup(w, row, e, k);
    if constexpr (F == WeightFormat::kAffine4) {
      const uint32_t sb = __ldg(w.scale_bias + at);
      // A scaled pair's s * 2^133 back to s by exact power-of-two steps (f32 holds s * 2^133).
      const float sv = Bf16BitsToF32(sb & 0xFFFFu);
      *s = w.scaled_codes ? sv * 0x1p-70f * 0x1p-59f : 16.0f * sv;
      *b = Bf16BitsToF32(sb >> 16) - *s;
    } else {
      *s = __ldg(w.scale + at);
      *b = w.bias_from_scale ? w.bias_ratio * *s : __ldg(w.bias + at);
    }
  }
}

// A kAffine4 word's four pairs j (elements 2j, 2j + 1; nibbles j and j + 4) as bf16x2 q * s + b,
// s and b the group's bf16 pair broadcast (sx2 = (s, s), bx2 = (b, b)), each rounded once.
//   Unscaled: one mask per pair makes the bf16 (128 + q) exactly, minus 128 is q, one fma.
//   Scaled (WeightSegment::scaled_codes; sx2 holds s * 2^133): a bf16 whose bits are an integer
//   N < 256 (exponent field 0 or 1) is N * 2^-133, so the nibble masked in place at bits 0-3 is
//   q * 2^-133 and at bits 4-7 q * 2^-129; one fma with s * 2^133 or s * 2^129 is then exactly
//   q * s + b before its rounding (bf16 arithmetic keeps subnormals). The same bits, with one
//   shift per word instead of three and no subtraction.
// sx2_16 is Affine4Scale16<kScaled>(sx2), made once per group by the caller (the compiler does
// not merge repeated bf16 multiplies). The GEMV's fragments and DequantizeRows' tiles both come
// from here.
template <bool kScaled>
__device__ __forceinline__ __nv_bfloat162 Affine4Scale16(__nv_bfloat162 sx2) {
  if constexpr (kScaled) {
    const uint32_t sixteenth = 0x3D803D80u;  // bf16x2 (2^-4, 2^-4): exact
    return __hmul2(sx2, *reinterpret_cast<const __nv_bfloat162*>(&sixteenth));
  } else {
    return sx2;
  }
}
template <bool kScaled>
__device__ __forceinline__ void Affine4Pairs(uint32_t word, __nv_bfloat162 sx2,
                                             __nv_bfloat162 sx2_16, __nv_bfloat162 bx2,
                                             uint32_t (&out)[4]) {
  auto bf = [](uint32_t v) { return *reinterpret_cast<const __nv_bfloat162*>(&v); };
  auto bits = [](__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); };
  if constexpr (kScaled) {
    const uint32_t w8 = word >> 8;
    out[0] = bits(__hfma2(bf(word & 0x000F000Fu), sx2, bx2));
    out[1] = bits(__hfma2(bf(word & 0x00F000F0u), sx2_16, bx2));
    out[2] = bits(__hfma2(bf(w8 & 0x000F000Fu), sx2, bx2));
    out[3] = bits(__hfma2(bf(w8 & 0x00F000F0u), sx2_16, bx2));
  } else {
    constexpr uint32_t k128 = 0x43004300u;  // bf16x2 (128, 128)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t q = ((word >> (4 * j)) & 0x000F000Fu) | k128;
      out[j] = bits(__hfma2(__hsub2(bf(q), bf(k128)), sx2, bx2));
    }
  }
}

// (s, s) and (b, b) of a kAffine4 scale_bias entry.
__device__ __forceinline__ __nv_bfloat162 Bf16x2Lo(uint32_t sb) {
  const uint32_t v = __byte_perm(sb, 0, 0x1010);
  return *reinterpret_cast<const __nv_bfloat162*>(&v);
}
__device__ __forceinline__ __nv_bfloat162 Bf16x2Hi(uint32_t sb) {
  const uint32_t v = __byte_perm(sb, 0, 0x3232);
  return *reinterpret_cast<const __nv_bfloat162*>(&v);
}

template <WeightFormat F, int M, int R, int KS, int U>
__global__ void __launch_bounds__(kThreads)
    QuantGemvKernel(const __nv_bfloat16* __restrict__ x,  // [M, k]
                    int k, const WeightSegment w, int n,
                    float* __restrict__ y, int64_t ldy) {  // [M, ldy]
  using C = Codes<F>;
  constexpr int kE = C::kE;
  constexpr int kPieces = kE / 8;
  constexpr int kGroups = kWarps / KS;
  constexpr int kRowsPerBlock = kGroups * R;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int group = warp / KS;
  const int slice = warp % KS;
  const int row0 = blockIdx.x * kRowsPerBlock + group * R;
  const int64_t row_vecs = k / kE;  // 16-byte vectors per row of codes
  const int64_t x_vecs = k / 8;     // 16-byte vectors per row of x
  PdlWait();

  const uint4* w_base = reinterpret_cast<const uint4*>(w.data) +
                        static_cast<int64_t>(row0 < n ? row0 : 0) * row_vecs;
  bool row_ok[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row_ok[r] = row0 + r < n;
  const uint4* xv = reinterpret_cast<const uint4*>(x);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  }

  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int n_chunks = static_cast<int>((row_vecs + 31) / 32);
#pragma unroll 1
  for (int c0 = slice; c0 < n_chunks; c0 += KS * U) {
    uint4 wr[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = static_cast<int64_t>(c0 + u * KS) * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wr[u][r] = (v < row_vecs && row_ok[r]) ? LoadStreaming(w_base + (r * row_vecs + v)) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = static_cast<int64_t>(c0 + u * KS) * 32 + lane;
      if (v >= row_vecs) continue;
      const int e0 = static_cast<int>(v) * kE;
      float s[R], b[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (row_ok[r]) {
          GroupScale<F>(w, row0 + r, e0, k, &s[r], &b[r]);
        } else {
          s[r] = 0.0f;
          b[r] = 0.0f;
        }
      }
      float s1[R][M], sx[M];
#pragma unroll
      for (int i = 0; i < M; ++i) {
        sx[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) s1[r][i] = 0.0f;
      }
#pragma unroll
      for (int p = 0; p < kPieces; ++p) {
        float f[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) C::Piece(wr[u][r], p, f[r]);
#pragma unroll
        for (int i = 0; i < M; ++i) {
          const uint4 xi = __ldg(xv + i * x_vecs + v * kPieces + p);
          const float xf[8] = {Bf16Lo(xi.x), Bf16Hi(xi.x), Bf16Lo(xi.y), Bf16Hi(xi.y),
                               Bf16Lo(xi.z), Bf16Hi(xi.z), Bf16Lo(xi.w), Bf16Hi(xi.w)};
          if constexpr (C::kBias) {
#pragma unroll
            for (int j = 0; j < 8; ++j) sx[i] += xf[j];
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) s1[r][i] = __fmaf_rn(f[r][j], xf[j], s1[r][i]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < M; ++i) {
          float t = s[r] * s1[r][i];
          if constexpr (C::kBias) t = __fmaf_rn(b[r], sx[i], t);
          acc[r][i] += t;
        }
      }
    }
  }
  PdlLaunchDependents();

  // Lane butterfly (fixed order), then the KS slices in order.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) {
        acc[r][i] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][i], off);
      }
    }
  }
  __shared__ float partial[KS][kGroups][R * M];
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < M; ++i) partial[slice][group][r * M + i] = acc[r][i];
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < kGroups * R * M; t += kThreads) {
    const int g = t / (R * M), j = t % (R * M);
    const int row = blockIdx.x * kRowsPerBlock + g * R + j / M;
    if (row < n) {
      float sum = partial[0][g][j];
#pragma unroll
      for (int sl = 1; sl < KS; ++sl) sum += partial[sl][g][j];
      y[static_cast<int64_t>(j % M) * ldy + row] = sum;
    }
  }
}

// The tensor-core GEMVs' ending: each thread's four sums (rows g and g + 8 of the block's 16,
// token columns 2t and 2t + 1) to shared memory, then the W warps' partials of each (token, row)
// added in warp order, so the result does not depend on which warp finished first.
template <int W>
__device__ __forceinline__ void StoreMmaGemvSums(float (&partial)[W][8][20], const float (&acc)[4],
                                                 int warp, int g, int t, int n0, int m, int n,
                                                 float* __restrict__ y, int64_t ldy) {
  constexpr int kRows = 16;
#pragma unroll
  for (int r = 0; r < 4; ++r) partial[warp][2 * t + (r & 1)][g + 8 * (r >> 1)] = acc[r];
  __syncthreads();
  for (int i = threadIdx.x; i < 8 * kRows; i += W * 32) {
    const int token = i / kRows, col = n0 + i % kRows;
    if (token < m && col < n) {
      float sum = partial[0][token][i % kRows];
#pragma unroll
      for (int wi = 1; wi < W; ++wi) sum += partial[wi][token][i % kRows];
      y[static_cast<int64_t>(token) * ldy + col] = sum;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV for 4-bit affine and FP8 codes (m <= 8): the "swap AB" layout of linear.cu's
// SkinnyLinearKernel (W as the mma's A operand, 16 rows per block; x^T as B, 8 token columns;
// W warps split k and add their partials in a fixed order), with the codes turned into bf16 A
// fragments in registers. Per 16-byte vector a thread holds kE consecutive k of rows g and g+8;
// the 4 threads of a fragment row group hold 4 consecutive vectors (one step of 4 kE k).
//   - kAffine4: word p of the vector (k 8p .. 8p+7) gives the pairs (k 2j, k 2j+1), j < 4, by
//     one mask each (Affine4Pairs: the codes' order was arranged at load for it), then one bf16x2
//     fma with the group's bf16 scale and bias (one 4-byte load per row and step): the weight in
//     bf16, bitwise the one DequantizeRows writes for larger m.
//   - kFp8Block: bytes 0,2 and 1,3 of word p (k 4p .. 4p+3) as bf16x2 by sign and payload moves
//     (the e4m3 value times 2^-120, exact); the block's scale (times 2^120) multiplies the f32
//     accumulator of each 128-k block (a step of 64 k lies in one block; rows g, g+8 in one
//     128-row block). x is re-paired to match with byte permutes. (Natural pairs, bytes 0,1 and
//     2,3 with x as loaded, and one shift fewer per pair — 120 PTX instructions per step instead
//     of 150 — ran slower on the H200: decode batch 1 318.0 against 322.5 tok/s, gate|up 33.4
//     against 32.7 us; this kernel is not bound by its instruction count as the 4-bit one is.)
// Both feed two (affine4) or one (fp8) mma per word; any k order both operands share leaves the
// sum unchanged (linear.cu explains the freedom).
// A warp's first step of codes and scales (immutable weights) is loaded before PdlWait, while
// the previous kernel finishes; each later step's at the end of the one before. (Measured on the
// H200, Qwen3-8B shapes, decode batch 1: int4 (MLX, group 64) 281.8 -> 297.8 tok/s, FP8 282.3 ->
// 284.7 against loading after PdlWait; loading the next step before using the current one's, two
// in flight per warp, was slower: 280.8 and 260.1 tok/s, and slower per GEMV in
// bench_cuda_linear. At these sizes a GEMV is a few microseconds, its time the launch and the
// memory round trips more than the bytes.) ncu puts both formats at the same issue rate (0.68
// per scheduler and cycle, SM 66 %), so the loop keeps address math out: per-row scale pointers,
// shifts for the group, x read without predicates; 48 registers, 5 blocks of 8 warps per SM
// (2026-12-03: int4 group 64 296.8 -> 328.6 tok/s, FP8 284.7 -> 294.2). Bounded to 6 blocks of 8
// warps (40 registers, no spills; 7 spill): FP8 gate|up 32.6 -> 30.8 us, LM head 155.2 -> 153.3,
// q|k|v 12.85 -> 13.15; int4 (group 64) LM head 132.7 -> 128.7, the rest within 1 %; decode
// batch 1 FP8 3.150 -> 3.113 ms, int4 2.880 -> 2.871 (H200, 2026-12-04, two rounds each).
// Then the 4-bit loop (2026-12-04, twelfth session; SASS per 128-k step 324 -> 166 -> 153): codes
// loaded without predicates and 32-bit indices (decode batch 1, random Qwen3-8B, MLX group 64
// 2.87 -> 2.64-2.65 ms, GPTQ 2.85 -> 2.62-2.64), then scaled codes (kScaled, Affine4Pairs)
// 2.49-2.51 and 2.44-2.47 ms (bf16 4.63-4.70: 1.87-1.91x). The same 32-bit indices in the FP8 loop
// took its step from 3.11 to 3.46 ms, so that loop keeps its 64-bit ones. Bounded to 5 blocks (48
// registers, no rematerialized row indices) the scaled kernel's LM head gained (112 -> 105 us)
// and gate|up lost (22.6 -> 24.7), the step 2 % slower: 6 kept.
template <WeightFormat F, int W, bool kScaled>
__global__ void __launch_bounds__(W * 32, W == 8 ? 6 : 2)
    QuantMmaGemvKernel(const __nv_bfloat16* __restrict__ x,  // [m, k]
                       int m, int k, const WeightSegment w, int n,
                       float* __restrict__ y, int64_t ldy) {    // [m, ldy]
  constexpr int kE = Codes<F>::kE;
  constexpr int kRows = 16;
  __shared__ float partial[W][8][kRows + 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kRows;
  const int64_t row_vecs = k / kE;
  const int64_t x_vecs = k / 8;
  const int n_steps = static_cast<int>((row_vecs + 3) / 4);
  const bool lo_ok = n0 + g < n, hi_ok = n0 + g + 8 < n;
  const int row_lo = lo_ok ? n0 + g : 0, row_hi = hi_ok ? n0 + g + 8 : 0;
  const uint4* w_lo = reinterpret_cast<const uint4*>(w.data) + static_cast<int64_t>(row_lo) * row_vecs;
  const uint4* w_hi = reinterpret_cast<const uint4*>(w.data) + static_cast<int64_t>(row_hi) * row_vecs;
  // Token columns past m read token 0's x (their sums are never stored), so x loads need no
  // predicate; past k (a last step short of 4 vectors) they read the row's last vector, against
  // zero weights.
  const uint4* xg = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g < m ? g : 0) * x_vecs;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // 4-bit: this thread's rows' scale-bias pairs (GroupScale's index, its row part hoisted).
  const int gshift = GroupShift(w);
  const int64_t row_groups = F == WeightFormat::kAffine4 ? k >> gshift : 0;
  const uint32_t* sb_lo = w.scale_bias + row_lo * row_groups;
  const uint32_t* sb_hi = w.scale_bias + row_hi * row_groups;
  // One step of a thread's weights: the codes of rows g and g+8 (zeros past k or n) and their
  // scales: 4-bit, each row's bf16 scale-bias pair (zero past k, so that the weights there are
  // zero; rows past n are never stored); FP8, the block's scale in sc.
  struct Stage {
    uint4 lo, hi;
    uint32_t sbl, sbh;
    float sc;
  };
  const int last_vec = static_cast<int>(row_vecs) - 1;
  auto load = [&](int step, Stage* st) {
    if constexpr (F == WeightFormat::kAffine4) {
      // No predicates on the codes: past k (a short last step, or the load after a warp's last
      // step) the row's last vector is read again and its pair is zero (weights 0 * q + 0);
      // rows past n read row 0, whose sums are never stored.
      const int v = step * 4 + t;
      const bool in_k = v <= last_vec;
      const int vc = in_k ? v : last_vec;
      st->lo = LoadStreaming(w_lo + vc);
      st->hi = LoadStreaming(w_hi + vc);
      const int c = (vc * kE) >> gshift;
      st->sbl = in_k ? __ldg(sb_lo + c) : 0u;
      st->sbh = in_k ? __ldg(sb_hi + c) : 0u;
    } else {
      const int64_t v = static_cast<int64_t>(step) * 4 + t;
      const bool in_k = step < n_steps && v < row_vecs;
      st->lo = (in_k && lo_ok) ? LoadStreaming(w_lo + v) : zero;
      st->hi = (in_k && hi_ok) ? LoadStreaming(w_hi + v) : zero;
      // One scale per 128-k block and 128-row block (rows g and g+8 share it, as do the 4 kE k
      // of the step).
      float unused;
      st->sc = 0.0f;
      if (step < n_steps) GroupScale<F>(w, n0, step * 4 * kE, k, &st->sc, &unused);
    }
  };
  // Warp w takes steps w, w + W, ...
  Stage cur;
  load(warp, &cur);
  PdlWait();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int step = warp; step < n_steps; step += W) {
    const uint4 c_lo = cur.lo, c_hi = cur.hi;
    if constexpr (F == WeightFormat::kAffine4) {
      const int vx = min(step * 4 + t, last_vec);  // this thread's x (weights past k are zero)
      const __nv_bfloat162 s_lo = Bf16x2Lo(cur.sbl), b_lo = Bf16x2Hi(cur.sbl);
      const __nv_bfloat162 s_hi = Bf16x2Lo(cur.sbh), b_hi = Bf16x2Hi(cur.sbh);
      const __nv_bfloat162 s16_lo = Affine4Scale16<kScaled>(s_lo);
      const __nv_bfloat162 s16_hi = Affine4Scale16<kScaled>(s_hi);
      const uint4* xp = xg + vx * 4;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const uint32_t wl = Word(c_lo, p), wh = Word(c_hi, p);
        const uint4 xv = __ldg(xp + p);  // x of k 8p .. 8p+7: pairs (k 2j, k 2j+1)
        uint32_t a_lo[4], a_hi[4];
        Affine4Pairs<kScaled>(wl, s_lo, s16_lo, b_lo, a_lo);
        Affine4Pairs<kScaled>(wh, s_hi, s16_hi, b_hi, a_hi);
        MmaBf16(acc, a_lo[0], a_hi[0], a_lo[1], a_hi[1], xv.x, xv.y);
        MmaBf16(acc, a_lo[2], a_hi[2], a_lo[3], a_hi[3], xv.z, xv.w);
      }
    } else {
      // (int64 indices here: the int form above, built for both formats, took the FP8 kernel
      // from 3.11 to 3.46 ms per decode step on the H200.)
      const int64_t v = static_cast<int64_t>(step) * 4 + t;  // this thread's vector
      const int64_t vx = v < row_vecs ? v : row_vecs - 1;    // its x (weights past k are zero)
      const float sc = cur.sc;
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // this step's block, before its scale
      auto pair = [](uint32_t word, uint32_t sel) {
        const uint32_t b = __byte_perm(word, 0, sel);  // bytes at bits 0-7 and 16-23
        return ((b << 8) & 0x80008000u) | ((b << 4) & 0x07F007F0u);
      };
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const uint32_t wl = Word(c_lo, p), wh = Word(c_hi, p);
        // x of k 4p .. 4p+3 (half a 16-byte vector), re-paired as (k0, k2), (k1, k3).
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xg + vx * 2) + p);
        const uint32_t x02 = __byte_perm(xv.x, xv.y, 0x5410), x13 = __byte_perm(xv.x, xv.y, 0x7632);
        MmaBf16(part, pair(wl, 0x4240), pair(wh, 0x4240), pair(wl, 0x4341), pair(wh, 0x4341), x02,
                x13);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = __fmaf_rn(sc, part[r], acc[r]);
    }
    load(step + W, &cur);
  }
  PdlLaunchDependents();
  StoreMmaGemvSums<W>(partial, acc, warp, g, t, n0, m, n, y, ldy);
}

// Whether a tensor-core GEMV grid of `blocks` (16 rows each) takes blocks of 16 warps: grids of
// at most two blocks per SM (n <= 4224 on the H200: o_proj, down), whose warps then take half
// the steps each, so a latency-bound GEMV waits on half as many round trips. Larger grids keep 8
// warps per block. H200, m = 1, 8 -> 16 warps: FP8 down (4096 x 12288) 24.2 -> 17.9 us, o_proj
// 11.6 -> 9.6; 4-bit (group 64) 19.7 -> 18.2 and 10.7 -> 9.9; but gate|up 28.9 -> 33.3 and
// lm_head 141.8 -> 172.9 (4-bit).
bool WideMmaGemv(unsigned blocks) {
  return blocks <= 2u * static_cast<unsigned>(CurrentDeviceSmCount());
}

template <WeightFormat F>
void LaunchMmaGemv(const __nv_bfloat16* x, int m, int k, const WeightSegment& w, int n, float* y,
                   int64_t ldy, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + 15) / 16);
  const bool wide = WideMmaGemv(blocks);
  auto kernel = wide ? &QuantMmaGemvKernel<F, 16, false> : &QuantMmaGemvKernel<F, 8, false>;
  if constexpr (F == WeightFormat::kAffine4) {  // only 4-bit codes have a scaled form
    if (w.scaled_codes) {
      kernel = wide ? &QuantMmaGemvKernel<F, 16, true> : &QuantMmaGemvKernel<F, 8, true>;
    }
  }
  LaunchPdl(kernel, dim3(blocks), dim3(wide ? 16 * 32 : kThreads), 0, stream, x, m, k, w, n, y,
            ldy);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV for 8-bit affine codes (m <= 8; segments in mma order, WeightSegment::
// mma_order): QuantMmaGemvKernel's layout (W as A, 16 rows per block; x^T as B, 8 token columns;
// warp w takes the 64-k steps w, w + W, ...) with the scales applied per group after the
// products, so the weights stay exact:
//   - ArrangeAffine8Codes transposed each row's 64-byte spans as 4 x 4 words, so thread t's
//     16-byte vector of a step holds word t of each of the span's four original vectors: mma p
//     (p < 4) takes word p from every thread and so covers original vector p (16 consecutive k),
//     which lies in one group (groups are 16 .. 128 elements).
//   - A code q becomes an exact bf16 through f32: its byte under the bits of 2^23, minus 2^23,
//     then the f32's high half (q has at most 8 significant bits). Bytes 0, 2 and 1, 3 of a word
//     are the pairs, x re-paired to match (as the FP8 loop does).
//   - A second mma with all-ones A gives each column's sum of x over the same 16 k, so a group's
//     (1 + q/256) * scale + bias is applied as s * sum(q x) + b * sum(x) with s = scale / 256 and
//     b = scale + bias (the checkpoint's own q * s + b), per row and vector, in f32.
// kShift: log2 of the group (4 .. 7), so that the step's scale loads are one vector load.
__device__ __forceinline__ uint32_t ExactBf16Pair(uint32_t word, uint32_t sel_lo, uint32_t sel_hi) {
  // sel picks a byte of word under 0x4B000000 (2^23): 0x7650 + byte index.
  const float lo = __uint_as_float(__byte_perm(word, 0x4B000000u, sel_lo)) - 8388608.0f;
  const float hi = __uint_as_float(__byte_perm(word, 0x4B000000u, sel_hi)) - 8388608.0f;
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

template <int W, int kShift, bool kBiasFromScale>
__global__ void __launch_bounds__(W * 32, W == 8 ? 4 : 2)
    Affine8MmaGemvKernel(const __nv_bfloat16* __restrict__ x,  // [m, k]
                         int m, int k, const WeightSegment w, int n, float* __restrict__ y,
                         int64_t ldy) {  // [m, ldy]
  constexpr int kRows = 16;
  constexpr int kGroupsPerStep = kShift >= 6 ? 1 : 64 >> kShift;  // 4 (16), 2 (32), 1
  __shared__ float partial[W][8][kRows + 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kRows;
  const int row_vecs = k / 16;
  const int n_steps = k / 64;
  const int row_groups = k >> kShift;
  // Rows past n read row 0 (their sums are never stored).
  const int row_lo = n0 + g < n ? n0 + g : 0, row_hi = n0 + g + 8 < n ? n0 + g + 8 : 0;
  const uint4* w_lo =
      reinterpret_cast<const uint4*>(w.data) + static_cast<int64_t>(row_lo) * row_vecs + t;
  const uint4* w_hi =
      reinterpret_cast<const uint4*>(w.data) + static_cast<int64_t>(row_hi) * row_vecs + t;
  const float* s_lo = w.scale + static_cast<int64_t>(row_lo) * row_groups;
  const float* s_hi = w.scale + static_cast<int64_t>(row_hi) * row_groups;
  const float* b_lo = kBiasFromScale ? nullptr : w.bias + static_cast<int64_t>(row_lo) * row_groups;
  const float* b_hi = kBiasFromScale ? nullptr : w.bias + static_cast<int64_t>(row_hi) * row_groups;
  // Scale to bias: (1 + q/256) * S + r * S = q * (S / 256) + (1 + r) * S.
  const float bias_mult = 1.0f + w.bias_ratio;
  // Token columns past m read token 0's x (never stored).
  const uint2* xg = reinterpret_cast<const uint2*>(x + static_cast<int64_t>(g < m ? g : 0) * k) + t;
  constexpr int kBiases = kBiasFromScale ? 1 : kGroupsPerStep;  // (unused with the ratio)
  struct Stage {
    uint4 lo, hi;
    float sl[kGroupsPerStep], sh[kGroupsPerStep], bl[kBiases], bh[kBiases];
  };
  auto load_groups = [&](const float* p, int grp0, float* out) {
    if constexpr (kGroupsPerStep == 4) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p + grp0));
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else if constexpr (kGroupsPerStep == 2) {
      const float2 v = __ldg(reinterpret_cast<const float2*>(p + grp0));
      out[0] = v.x, out[1] = v.y;
    } else {
      out[0] = __ldg(p + grp0);
    }
  };
  auto load = [&](int step, Stage* st) {
    const int sidx = step < n_steps ? step : n_steps - 1;  // after a warp's last step: unused
    st->lo = LoadStreaming(w_lo + sidx * 4);
    st->hi = LoadStreaming(w_hi + sidx * 4);
    const int grp0 = (sidx * 64) >> kShift;
    load_groups(s_lo, grp0, st->sl);
    load_groups(s_hi, grp0, st->sh);
    if constexpr (!kBiasFromScale) {
      load_groups(b_lo, grp0, st->bl);
      load_groups(b_hi, grp0, st->bh);
    }
  };
  Stage cur;
  load(warp, &cur);
  PdlWait();
  constexpr uint32_t kOnes = 0x3F803F80u;  // bf16x2 (1, 1)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int step = warp; step < n_steps; step += W) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t wl = Word(cur.lo, p), wh = Word(cur.hi, p);
      // x of k 64 step + 16 p + 4 t .. + 3, re-paired as (k0, k2), (k1, k3).
      const uint2 xv = __ldg(xg + step * 16 + p * 4);
      const uint32_t x02 = __byte_perm(xv.x, xv.y, 0x5410), x13 = __byte_perm(xv.x, xv.y, 0x7632);
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sum_x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      MmaBf16(part, ExactBf16Pair(wl, 0x7650, 0x7652), ExactBf16Pair(wh, 0x7650, 0x7652),
              ExactBf16Pair(wl, 0x7651, 0x7653), ExactBf16Pair(wh, 0x7651, 0x7653), x02, x13);
      MmaBf16(sum_x, kOnes, kOnes, kOnes, kOnes, x02, x13);
      // Vector p's group: (64 step + 16 p) >> kShift, the step's group p >> (kShift - 4).
      constexpr int kDiv = kShift >= 6 ? 4 : 1 << (kShift - 4);
      const int gi = p / kDiv;
      // (1 + q/256) * S + B = q * (S / 256) + (S + B): f32, S / 256 exact.
      const float sl = cur.sl[gi] * 0.00390625f, sh = cur.sh[gi] * 0.00390625f;
      float bl, bh;
      if constexpr (kBiasFromScale) {
        bl = bias_mult * cur.sl[gi];
        bh = bias_mult * cur.sh[gi];
      } else {
        bl = cur.sl[gi] + cur.bl[gi];
        bh = cur.sh[gi] + cur.bh[gi];
      }
      acc[0] = __fmaf_rn(sl, part[0], __fmaf_rn(bl, sum_x[0], acc[0]));
      acc[1] = __fmaf_rn(sl, part[1], __fmaf_rn(bl, sum_x[1], acc[1]));
      acc[2] = __fmaf_rn(sh, part[2], __fmaf_rn(bh, sum_x[2], acc[2]));
      acc[3] = __fmaf_rn(sh, part[3], __fmaf_rn(bh, sum_x[3], acc[3]));
    }
    load(step + W, &cur);
  }
  PdlLaunchDependents();
  StoreMmaGemvSums<W>(partial, acc, warp, g, t, n0, m, n, y, ldy);
}

template <int W, bool kBiasFromScale>
void LaunchAffine8MmaGemvW(const __nv_bfloat16* x, int m, int k, const WeightSegment& w, int n,
                           float* y, int64_t ldy, cudaStream_t stream, unsigned blocks) {
  auto kernel = &Affine8MmaGemvKernel<W, 4, kBiasFromScale>;
  switch (w.group) {
    case 16:
      break;
    case 32:
      kernel = &Affine8MmaGemvKernel<W, 5, kBiasFromScale>;
      break;
    case 64:
      kernel = &Affine8MmaGemvKernel<W, 6, kBiasFromScale>;
      break;
    case 128:
      kernel = &Affine8MmaGemvKernel<W, 7, kBiasFromScale>;
      break;
    default:
      KCHECK_MSG(false, "8-bit affine tensor-core GEMV: group must be 16, 32, 64 or 128");
  }
  LaunchPdl(kernel, dim3(blocks), dim3(W * 32), 0, stream, x, m, k, w, n, y, ldy);
}

void LaunchAffine8MmaGemv(const __nv_bfloat16* x, int m, int k, const WeightSegment& w, int n,
                          float* y, int64_t ldy, cudaStream_t stream) {
  KCHECK_MSG(k % 64 == 0, "8-bit affine codes in mma order need k a multiple of 64");
  const unsigned blocks = static_cast<unsigned>((n + 15) / 16);
  const bool wide = WideMmaGemv(blocks);
  if (w.bias_from_scale) {
    (wide ? &LaunchAffine8MmaGemvW<16, true>
          : &LaunchAffine8MmaGemvW<8, true>)(x, m, k, w, n, y, ldy, stream, blocks);
  } else {
    (wide ? &LaunchAffine8MmaGemvW<16, false>
          : &LaunchAffine8MmaGemvW<8, false>)(x, m, k, w, n, y, ldy, stream, blocks);
  }
}

constexpr int kR = 2, kKS = 4, kU = 2;

template <WeightFormat F, int M, int R = kR, int KS = kKS, int U = kU>
void LaunchGemvM(const __nv_bfloat16* x, int k, const WeightSegment& w, int n, float* y,
                 int64_t ldy, cudaStream_t stream) {
  constexpr int kRowsPerBlock = (kWarps / KS) * R;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  LaunchPdl(&QuantGemvKernel<F, M, R, KS, U>, dim3(blocks), dim3(kThreads), 0, stream, x, k, w,
            n, y, ldy);
}

// One-row (decode batch 1) shapes of the kernel, chosen by KESTREL_QUANT_GEMV (a name below;
// tuning and the benchmark), else the first.
using GemvLaunch = void (*)(const __nv_bfloat16*, int, const WeightSegment&, int, float*, int64_t,
                            cudaStream_t);
template <WeightFormat F>
struct OneRowVariants {
  static constexpr GemvLaunch kLaunch[] = {
      &LaunchGemvM<F, 1, 2, 4, 2>, &LaunchGemvM<F, 1, 1, 4, 4>, &LaunchGemvM<F, 1, 2, 2, 4>,
      &LaunchGemvM<F, 1, 4, 2, 2>, &LaunchGemvM<F, 1, 1, 8, 4>, &LaunchGemvM<F, 1, 2, 8, 4>};
};
constexpr const char* kOneRowNames[] = {"r2_ks4_u2", "r1_ks4_u4", "r2_ks2_u4",
                                        "r4_ks2_u2", "r1_ks8_u4", "r2_ks8_u4"};

// -1: the default (the tensor-core kernel for 4-bit and FP8 codes, the first shape otherwise).
int OneRowVariant() {
  static const int v = [] {
    const char* env = std::getenv("KESTREL_QUANT_GEMV");
    if (env == nullptr) return -1;
    for (int i = 0; i < static_cast<int>(sizeof(kOneRowNames) / sizeof(kOneRowNames[0])); ++i) {
      if (std::strcmp(env, kOneRowNames[i]) == 0) return i;
    }
    return -1;
  }();
  return v;
}

template <WeightFormat F>
void LaunchGemv(const __nv_bfloat16* x, int m, int k, const WeightSegment& w, int n, float* y,
                int64_t ldy, cudaStream_t stream) {
  switch (m) {
    case 1: OneRowVariants<F>::kLaunch[std::max(OneRowVariant(), 0)](x, k, w, n, y, ldy, stream); break;
    case 2: LaunchGemvM<F, 2>(x, k, w, n, y, ldy, stream); break;
    case 3: LaunchGemvM<F, 3>(x, k, w, n, y, ldy, stream); break;
    case 4: LaunchGemvM<F, 4>(x, k, w, n, y, ldy, stream); break;
    case 5: LaunchGemvM<F, 5>(x, k, w, n, y, ldy, stream); break;
    case 6: LaunchGemvM<F, 6>(x, k, w, n, y, ldy, stream); break;
    case 7: LaunchGemvM<F, 7>(x, k, w, n, y, ldy, stream); break;
    case 8: LaunchGemvM<F, 8>(x, k, w, n, y, ldy, stream); break;
    default: KCHECK(false);
  }
}

// One thread per output element (bf16 values moved as their bits).
__global__ void GatherColumnsKernel(const uint16_t* __restrict__ x, int64_t m, int k,
                                    const int32_t* __restrict__ perm, uint16_t* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();
  PdlLaunchDependents();
  if (t >= m * k) return;
  const int64_t i = t / k;
  const int j = static_cast<int>(t % k);
  out[t] = x[i * k + __ldg(perm + j)];
}

// GPTQ act-order rows (kAffine4 with an input order): one block per row. Its values (bitwise
// DequantizeKernel's) go to their inputs' columns in shared memory (2 k bytes), then the row
// leaves in 16-byte stores. (Scattering 2-byte stores to global memory instead took a 2k-token
// prefill of an 8B model from 59.6 to 131.7 ms on the H200.)
constexpr int kPermutedDequantMaxK = 98304;  // 192 KB of bf16 (dynamic shared memory)

template <bool kScaled>
__global__ void __launch_bounds__(256)
    DequantizePermutedKernel(const WeightSegment w, int64_t row0, int k,
                             __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ perm) {
  constexpr int kE = Codes<WeightFormat::kAffine4>::kE;
  extern __shared__ __align__(16) uint16_t row_vals[];  // k values
  const int64_t r = blockIdx.x;
  const int row = static_cast<int>(row0 + r);
  const int row_vecs = k / kE;
  PdlWait();
  for (int v = threadIdx.x; v < row_vecs; v += blockDim.x) {
    const uint4 codes = LoadStreaming(reinterpret_cast<const uint4*>(w.data) +
                                      static_cast<int64_t>(row) * row_vecs + v);
    const uint32_t sb = __ldg(w.scale_bias + AffineGroup(w, row, v * kE, k));
    const __nv_bfloat162 s2 = Bf16x2Lo(sb), b2 = Bf16x2Hi(sb);
    const __nv_bfloat162 s2_16 = Affine4Scale16<kScaled>(s2);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t word = Word(codes, p);
      const int e0 = v * kE + 8 * p;
      const int4 c0 = __ldg(reinterpret_cast<const int4*>(perm + e0));
      const int4 c1 = __ldg(reinterpret_cast<const int4*>(perm + e0 + 4));
      const int cols[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      uint32_t pairs[4];
      Affine4Pairs<kScaled>(word, s2, s2_16, b2, pairs);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t pair = pairs[j];  // elements 2j, 2j + 1
        row_vals[cols[2 * j]] = static_cast<uint16_t>(pair);
        row_vals[cols[2 * j + 1]] = static_cast<uint16_t>(pair >> 16);
      }
    }
  }
  __syncthreads();
  PdlLaunchDependents();
  const uint4* src = reinterpret_cast<const uint4*>(row_vals);
  uint4* dst = reinterpret_cast<uint4*>(out + r * k);
  for (int i = threadIdx.x; i < k / 8; i += blockDim.x) dst[i] = src[i];
}

// One thread per 16-byte vector of codes: kE bf16 outputs.
template <WeightFormat F, bool kScaled = false>
__global__ void DequantizeKernel(const WeightSegment w, int64_t row0, int64_t rows, int k,
                                 __nv_bfloat16* __restrict__ out) {
  using C = Codes<F>;
  constexpr int kE = C::kE;
  const int64_t row_vecs = k / kE;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();
  if (t >= rows * row_vecs) return;
  const int64_t r = t / row_vecs;
  const int v = static_cast<int>(t % row_vecs);
  const int row = static_cast<int>(row0 + r);
  const uint4 codes =
      LoadStreaming(reinterpret_cast<const uint4*>(w.data) + static_cast<int64_t>(row) * row_vecs + v);
  if constexpr (F == WeightFormat::kAffine4) {
    // The GEMV's bf16 weights (Affine4Pairs), pair j of word p at k 8p + 2j.
    const uint32_t sb = __ldg(w.scale_bias + AffineGroup(w, row, v * kE, k));
    const __nv_bfloat162 s2 = Bf16x2Lo(sb), b2 = Bf16x2Hi(sb);
    const __nv_bfloat162 s2_16 = Affine4Scale16<kScaled>(s2);
    uint4* dst = reinterpret_cast<uint4*>(out + r * k + static_cast<int64_t>(v) * kE);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t word = Word(codes, p);
      uint32_t pairs[4];
      Affine4Pairs<kScaled>(word, s2, s2_16, b2, pairs);
      dst[p] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
    return;
  }
  if constexpr (F == WeightFormat::kAffine8) {
    if (w.mma_order) {
      // Stored vector t of a 64-byte span holds word t of each original vector p of it
      // (ArrangeAffine8Codes): elements 16 p + 4 t .. + 3 of the span, each word in its group.
      const int span0 = (v / 4) * 64, t = v % 4;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const int e0 = span0 + 16 * p + 4 * t;
        float s, b;
        GroupScale<F>(w, row, e0, k, &s, &b);
        const uint32_t word = Word(codes, p);
        float f[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) f[j] = __fmaf_rn(C::Unit(word, j), s, b);
        *reinterpret_cast<uint2*>(out + r * k + e0) =
            make_uint2(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]));
      }
      return;
    }
  }
  float s, b;
  GroupScale<F>(w, row, v * kE, k, &s, &b);
  uint4* dst = reinterpret_cast<uint4*>(out + r * k + static_cast<int64_t>(v) * kE);
#pragma unroll
  for (int p = 0; p < kE / 8; ++p) {
    float f[8];
    C::Piece(codes, p, f);
    uint32_t packed[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = C::kBias ? __fmaf_rn(f[2 * j], s, b) : f[2 * j] * s;
      const float hi = C::kBias ? __fmaf_rn(f[2 * j + 1], s, b) : f[2 * j + 1] * s;
      packed[j] = PackBf16x2(lo, hi);
    }
    dst[p] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

int ElementsPerVector(WeightFormat f) { return f == WeightFormat::kAffine4 ? 32 : 16; }

void CheckSegment(const WeightSegment& w, int64_t k) {
  KCHECK_MSG(w.format != WeightFormat::kBf16, "bf16 weights take the bf16 kernels");
  KCHECK(w.data != nullptr);
  KCHECK_MSG(reinterpret_cast<uintptr_t>(w.data) % 16 == 0, "codes must be 16-byte aligned");
  KCHECK_MSG(k > 0 && k <= INT_MAX && k % ElementsPerVector(w.format) == 0,
             "k must be a multiple of the elements per 16-byte vector");
  if (w.format == WeightFormat::kFp8Block) {
    KCHECK(w.scale != nullptr);
    KCHECK(w.group == 128 && w.scale_ld >= (k + 127) / 128);
  } else {
    KCHECK(w.format == WeightFormat::kAffine4
               ? w.scale_bias != nullptr
               : w.scale != nullptr && (w.bias != nullptr || w.bias_from_scale));
    KCHECK_MSG(w.group >= ElementsPerVector(w.format) && w.group <= 128 &&
                   (w.group & (w.group - 1)) == 0 && k % w.group == 0,
               "affine group must be a power of two in [elements per vector, 128] dividing k");
  }
}

// One thread per 64-byte span of 8-bit codes: its 4 x 4 words transposed (word p of vector t
// goes to word t of vector p; its own inverse).
__global__ void ArrangeAffine8CodesKernel(uint4* __restrict__ vecs, int64_t spans) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();
  if (i >= spans) return;
  uint4* v = vecs + 4 * i;
  const uint4 a = v[0], b = v[1], c = v[2], d = v[3];
  v[0] = make_uint4(a.x, b.x, c.x, d.x);
  v[1] = make_uint4(a.y, b.y, c.y, d.y);
  v[2] = make_uint4(a.z, b.z, c.z, d.z);
  v[3] = make_uint4(a.w, b.w, c.w, d.w);
}

// One thread per 32-bit word: element e's nibble e moves to Affine4Nibble(e).
__global__ void ArrangeAffine4CodesKernel(uint32_t* __restrict__ words, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();
  if (i >= n) return;
  const uint32_t w = words[i];
  uint32_t out = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) out |= ((w >> (4 * e)) & 0xFu) << (4 * Affine4Nibble(e));
  words[i] = out;
}

// One warp per (row, 128-column group): 4 values per lane.
__global__ void QuantizeActivationsFp8Kernel(const __nv_bfloat16* __restrict__ x, int m,
                                             int ld_xs, int k, uint8_t* __restrict__ xq,
                                             float* __restrict__ xs) {
  const int lane = threadIdx.x % 32;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int groups = k / 128;
  PdlWait();
  if (item >= static_cast<int64_t>(m) * groups) return;
  const int row = static_cast<int>(item / groups), g = static_cast<int>(item % groups);
  const int64_t at = static_cast<int64_t>(row) * k + g * 128 + lane * 4;
  const uint2 raw = *reinterpret_cast<const uint2*>(x + at);
  const float v[4] = {Bf16Lo(raw.x), Bf16Hi(raw.x), Bf16Lo(raw.y), Bf16Hi(raw.y)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] / scale, v[1] / scale),
                                                           __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] / scale, v[3] / scale),
                                                           __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(xq + at) = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) xs[static_cast<int64_t>(g) * ld_xs + row] = scale;
}

__global__ void Bf16RowsToF32Kernel(const __nv_bfloat16* __restrict__ src, int64_t rows, int n,
                                    float* __restrict__ y, int64_t ldy) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();
  if (t >= rows * n) return;
  const int64_t i = t / n, j = t % n;
  y[i * ldy + j] = __bfloat162float(src[t]);
}

}  // namespace

void QuantizeActivationsFp8(const __nv_bfloat16* x, int64_t m, int64_t ld_xs, int64_t k,
                            uint8_t* xq, float* xs, cudaStream_t stream) {
  KCHECK(m >= 1 && ld_xs >= m && ld_xs <= INT_MAX && k % 128 == 0 && k <= INT_MAX);
  KCHECK(x != nullptr && xq != nullptr && xs != nullptr);
  const int64_t warps = m * (k / 128);
  const unsigned blocks = static_cast<unsigned>((warps * 32 + 255) / 256);
  LaunchPdl(&QuantizeActivationsFp8Kernel, dim3(blocks), dim3(256), 0, stream, x,
            static_cast<int>(m), static_cast<int>(ld_xs), static_cast<int>(k), xq, xs);
  KCUDA_CHECK_LAUNCH();
}

void ArrangeAffine8Codes(void* codes, int64_t bytes, cudaStream_t stream) {
  KCHECK(codes != nullptr && bytes >= 0 && bytes % 64 == 0 &&
         reinterpret_cast<uintptr_t>(codes) % 16 == 0);
  if (bytes == 0) return;
  const int64_t spans = bytes / 64;
  LaunchPdl(&ArrangeAffine8CodesKernel, dim3(static_cast<unsigned>((spans + 255) / 256)), dim3(256),
            0, stream, static_cast<uint4*>(codes), spans);
  KCUDA_CHECK_LAUNCH();
}

void ArrangeAffine4Codes(void* codes, int64_t bytes, cudaStream_t stream) {
  KCHECK(codes != nullptr && bytes >= 0 && bytes % 4 == 0 &&
         reinterpret_cast<uintptr_t>(codes) % 4 == 0);
  if (bytes == 0) return;
  const int64_t words = bytes / 4;
  LaunchPdl(&ArrangeAffine4CodesKernel, dim3(static_cast<unsigned>((words + 255) / 256)), dim3(256),
            0, stream, static_cast<uint32_t*>(codes), words);
  KCUDA_CHECK_LAUNCH();
}

void GatherColumns(const __nv_bfloat16* x, int64_t m, int64_t k, const int32_t* perm,
                   __nv_bfloat16* out, cudaStream_t stream) {
  KCHECK(m >= 1 && k >= 1 && k <= INT_MAX && x != nullptr && perm != nullptr && out != nullptr);
  const unsigned blocks = static_cast<unsigned>((m * k + 255) / 256);
  LaunchPdl(&GatherColumnsKernel, dim3(blocks), dim3(256), 0, stream,
            reinterpret_cast<const uint16_t*>(x), m, static_cast<int>(k), perm,
            reinterpret_cast<uint16_t*>(out));
  KCUDA_CHECK_LAUNCH();
}

void Bf16RowsToF32(const __nv_bfloat16* src, int64_t rows, int64_t n, float* y, int64_t ldy,
                   cudaStream_t stream) {
  KCHECK(rows >= 1 && n >= 1 && n <= INT_MAX && ldy >= n);
  const unsigned blocks = static_cast<unsigned>((rows * n + 255) / 256);
  LaunchPdl(&Bf16RowsToF32Kernel, dim3(blocks), dim3(256), 0, stream, src, rows,
            static_cast<int>(n), y, ldy);
  KCUDA_CHECK_LAUNCH();
}

void QuantGemv(const __nv_bfloat16* x, int64_t m, int64_t k, const WeightSegment& w, int64_t n,
               float* y, int64_t ldy, cudaStream_t stream) {
  CheckSegment(w, k);
  KCHECK(m >= 1 && m <= kQuantGemvMaxRows && n >= 1 && n <= INT_MAX - 64 && ldy >= n);
  KCHECK(x != nullptr && y != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0);
  const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
  const bool cuda_cores = OneRowVariant() >= 0;  // KESTREL_QUANT_GEMV asks for them
  switch (w.format) {
    case WeightFormat::kFp8Block:
      if (cuda_cores) {
        LaunchGemv<WeightFormat::kFp8Block>(x, mi, ki, w, ni, y, ldy, stream);
      } else {
        LaunchMmaGemv<WeightFormat::kFp8Block>(x, mi, ki, w, ni, y, ldy, stream);
      }
      break;
    case WeightFormat::kAffine4:
      if (cuda_cores) {
        LaunchGemv<WeightFormat::kAffine4>(x, mi, ki, w, ni, y, ldy, stream);
      } else {
        LaunchMmaGemv<WeightFormat::kAffine4>(x, mi, ki, w, ni, y, ldy, stream);
      }
      break;
    case WeightFormat::kAffine8:
      if (w.mma_order) {
        LaunchAffine8MmaGemv(x, mi, ki, w, ni, y, ldy, stream);
      } else {
        LaunchGemv<WeightFormat::kAffine8>(x, mi, ki, w, ni, y, ldy, stream);
      }
      break;
    case WeightFormat::kBf16: KCHECK(false);
  }
  KCUDA_CHECK_LAUNCH();
}

void DequantizeRows(const WeightSegment& w, int64_t row0, int64_t rows, int64_t k,
                    __nv_bfloat16* out, cudaStream_t stream, const int32_t* input_perm) {
  CheckSegment(w, k);
  KCHECK(row0 >= 0 && rows >= 1 && out != nullptr);
  if (input_perm != nullptr) {
    KCHECK_MSG(w.format == WeightFormat::kAffine4 && k <= kPermutedDequantMaxK &&
                   reinterpret_cast<uintptr_t>(input_perm) % 16 == 0,
               "act-order weights: 4-bit codes, k up to 98304");
    static const bool attribute_set = [] {
      for (auto kernel : {&DequantizePermutedKernel<false>, &DequantizePermutedKernel<true>}) {
        KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kPermutedDequantMaxK * 2));
      }
      return true;
    }();
    (void)attribute_set;
    LaunchPdl(w.scaled_codes ? &DequantizePermutedKernel<true> : &DequantizePermutedKernel<false>,
              dim3(static_cast<unsigned>(rows)), dim3(256), static_cast<size_t>(k) * 2, stream, w,
              row0, static_cast<int>(k), out, input_perm);
    KCUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t threads = rows * (k / ElementsPerVector(w.format));
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  const int ki = static_cast<int>(k);
  switch (w.format) {
    case WeightFormat::kFp8Block:
      LaunchPdl(&DequantizeKernel<WeightFormat::kFp8Block>, dim3(blocks), dim3(256), 0, stream, w,
                row0, rows, ki, out);
      break;
    case WeightFormat::kAffine4:
      LaunchPdl(w.scaled_codes ? &DequantizeKernel<WeightFormat::kAffine4, true>
                               : &DequantizeKernel<WeightFormat::kAffine4, false>,
                dim3(blocks), dim3(256), 0, stream, w, row0, rows, ki, out);
      break;
    case WeightFormat::kAffine8:
      LaunchPdl(&DequantizeKernel<WeightFormat::kAffine8>, dim3(blocks), dim3(256), 0, stream, w,
                row0, rows, ki, out);
      break;
    case WeightFormat::kBf16: KCHECK(false);
  }
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
