// Quantized linear layers on the GPU: the weight formats the loader lays out on the device and
// the kernels that read them.
//
// Formats (rows of W are outputs, k the reduction; element (i, j) of W as a float):
//   kBf16      data bf16 [n, k].
//   kFp8Block  data e4m3fn [n, k]; scale f32 [ceil(n/128), scale_ld]:
//              W(i, j) = fp8(i, j) * scale[i/128][j/128]   (the checkpoints' weight_scale_inv).
//   kAffine4   data 4-bit codes [n, k/2] in 32-bit words of 8: element 8w + e of a row in word
//              w at nibble (e & 1) * 4 + e / 2, so that nibbles j and j + 4 are the pair
//              (8w + 2j, 8w + 2j + 1) one mask turns into bf16x2 (ArrangeAffine4Codes makes this
//              order from a checkpoint's, element j at nibble j % 8); scale_bias [n, k/group]
//              bf16 pairs (s low, b high): W(i, j) = bf16(q * s + b), one rounding (a bf16 fma).
//              With scaled_codes (the loader sets it where every |s| < 2^-5) the pairs hold
//              (s * 2^133, b) instead: a masked nibble is then the bf16 subnormal q * 2^-133, and
//              one fma of it with s * 2^133 gives the same bf16(q * s + b) without the
//              subtraction a normal bf16 (128 + q) needs.
//   kAffine8   data 8-bit codes [n, k];
//              scale and bias f32 [n, k/group]:  W(i, j) = (1 + q/2^bits) * scale + bias.
//              The loader turns a checkpoint's q*s + b (MLX, GGUF Q8_0 / Q5_K / Q6_K) into this
//              form with scale = 2^bits * s, bias = b - 2^bits * s: then 1 + q/2^bits is a float
//              whose bits are the code shifted under the exponent of 1.0 (one integer op per
//              element, no conversion instruction), and a group's dot product is
//              scale * sum(f * x) + bias * sum(x). Where every group's bias is the same multiple
//              of its scale (GGUF Q8_0, Q6_K, Q3_K, Q5_0, IQ4_*: symmetric codes), the segment
//              keeps no bias array: bias = bias_ratio * scale, one f32 multiply that the loader
//              checked gives each group's bias exactly (a quarter or a third fewer bytes).
// The 4-bit scales are bf16 (half the bytes of f32 pairs, and a fragment's weights are one bf16
// fma each): exact for MLX's bf16 / f16-in-range scales, the nearest bf16 for AWQ / GPTQ f16 ones
// and GGUF Q4_K's d * sc (2^-9 relative, the size of the bf16 rounding of the weight itself).
// A layer's weight is a list of row segments, each in one format (a fused q|k|v whose parts were
// quantized differently, or a GGUF Q4_K_M's Q6_K rows beside Q4_K ones).
//
// Paths (LinearEngine::Run, linear.h):
//   - m <= kQuantGemvMaxRows: QuantGemv, which reads each weight byte once. FP8 and 4-bit codes go
//     through the tensor cores (bf16 fragments made in registers; FP8 codes are exact in bf16, the
//     block scale multiplies the f32 sums; a 4-bit weight is its format's bf16 value, bitwise the
//     one the tiles below hold); 8-bit affine codes in mma order (WeightSegment::mma_order, the
//     loader's default where k is a multiple of 64; KESTREL_AFFINE8_MMA=0 turns it off) through
//     the tensor cores too, each code an exact bf16 and the group's scale and bias applied to the
//     f32 sums, else through a CUDA-core kernel in f32.
//     Weight-only quantization: activations stay bf16.
//   - larger m: DequantizeRows into a bf16 tile, then the bf16 cuBLASLt GEMM (LinearEngine).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

enum class WeightFormat : uint8_t { kBf16, kFp8Block, kAffine4, kAffine8 };

const char* WeightFormatName(WeightFormat f);

struct WeightSegment {
  WeightFormat format = WeightFormat::kBf16;
  int64_t rows = 0;             // rows of W (output features) in this segment
  const void* data = nullptr;   // 16-byte aligned
  const float* scale = nullptr;
  const float* bias = nullptr;  // kAffine8 only
  const uint32_t* scale_bias = nullptr;  // kAffine4 only (scale unused)
  int32_t group = 0;            // affine: elements per scale (16..128, a power of two; >= 32 for
                                // kAffine4); kFp8Block: 128
  int32_t scale_ld = 0;         // kFp8Block: floats per row of scale (>= ceil(k/128))
  bool scaled_codes = false;    // kAffine4: scale_bias holds (s * 2^133, b), above
  bool bias_from_scale = false;  // kAffine8: no bias array; bias = bias_ratio * scale, above
  float bias_ratio = 0.0f;
  bool mma_order = false;  // kAffine8: codes in the tensor-core GEMV's order (ArrangeAffine8Codes)
};

// A linear layer's weight: row segments in order (rows of y = concatenation). A plain bf16
// pointer converts to a one-segment bf16 weight covering all rows (rows = -1).
inline constexpr int kMaxWeightSegments = 8;
struct Weight {
  Weight() = default;
  Weight(const __nv_bfloat16* w) {  // NOLINT(google-explicit-constructor): bf16 is the default
    if (w != nullptr) {
      n_segments = 1;
      seg[0].data = w;
      seg[0].rows = -1;
    }
  }
  int n_segments = 0;
  WeightSegment seg[kMaxWeightSegments];
  // GPTQ act-order (kAffine4 segments only): the stored columns are the inputs in the order
  // input_perm[0 .. k) (core/tensor.h); LinearEngine::Run gathers x by it (m <= 8) or scatters
  // the dequantized tiles' columns back (larger m). Null: none.
  const int32_t* input_perm = nullptr;

  bool empty() const { return n_segments == 0; }
  bool is_bf16() const { return n_segments == 1 && seg[0].format == WeightFormat::kBf16; }
  const __nv_bfloat16* bf16() const { return static_cast<const __nv_bfloat16*>(seg[0].data); }
};

// The largest m QuantGemv takes.
inline constexpr int64_t kQuantGemvMaxRows = 8;

// y[i * ldy + j] = x[i, :] . W[j, :] for i < m, j < n, W one quantized segment (not kBf16).
// x [m, k] bf16 row-major, 16-byte aligned; k a multiple of 32 (and of the group); 1 <= m <= 8.
// Deterministic (fixed reduction order, no atomics) and batch invariant for m in [1, 8] (with the
// default one-row shape; KESTREL_QUANT_GEMV picks another for tuning, quant_linear.cu).
void QuantGemv(const __nv_bfloat16* x, int64_t m, int64_t k, const WeightSegment& w, int64_t n,
               float* y, int64_t ldy, cudaStream_t stream);

// out[r, :] = W[row0 + r, :] as bf16 (round to nearest even of the f32 value; kAffine4: its bf16
// value), r < rows. With input_perm (kAffine4 only), stored column j goes to out[r, perm[j]]: the
// rows in the inputs' own order.
void DequantizeRows(const WeightSegment& w, int64_t row0, int64_t rows, int64_t k,
                    __nv_bfloat16* out, cudaStream_t stream, const int32_t* input_perm = nullptr);

// out[i, j] = x[i, perm[j]] for i < m, j < k (bf16 rows of k; perm a permutation of [0, k)).
void GatherColumns(const __nv_bfloat16* x, int64_t m, int64_t k, const int32_t* perm,
                   __nv_bfloat16* out, cudaStream_t stream);

// Puts `bytes` (a multiple of 64) of 8-bit codes, rows of k a multiple of 64, into the order of
// the 8-bit tensor-core GEMV, in place on the device: in every 64-byte span of a row, word p of
// 16-byte vector t trades places with word t of vector p (WeightSegment::mma_order).
void ArrangeAffine8Codes(void* codes, int64_t bytes, cudaStream_t stream);

// Turns `bytes` (a multiple of 4) of 4-bit codes in a checkpoint's order (element j of a row at
// nibble j % 8 of word j / 8, little-endian) into kAffine4's, in place on the device.
void ArrangeAffine4Codes(void* codes, int64_t bytes, cudaStream_t stream);

// W8A8 for FP8 checkpoints (opt-in, LinearEngine::set_fp8_activations): the activations
// quantized per token and 128-column group as the checkpoints' reference implementation does:
// scale = amax / 448 (1 for an all-zero group), code = e4m3(x / scale) rounded to nearest even,
// saturating. xq [m, k] e4m3; xs f32 scales M-major with ld_xs >= m rows, xs[g * ld_xs + i]
// for row i and group g (the layout cuBLASLt's VEC128 scale mode reads). k a multiple of 128.
void QuantizeActivationsFp8(const __nv_bfloat16* x, int64_t m, int64_t ld_xs, int64_t k,
                            uint8_t* xq, float* xs, cudaStream_t stream);

// y[i * ldy + j] = f32(src[i * n + j]) for i < rows, j < n.
void Bf16RowsToF32(const __nv_bfloat16* src, int64_t rows, int64_t n, float* y, int64_t ldy,
                   cudaStream_t stream);

}  // namespace kestrel::cuda
