// Where the CUDA decoder's weights go inside the runner's one weight allocation, and in which
// device format (backends/cuda/quant_linear.h).
//   - Place: bf16 tensors as they are; F32 / F16 ones rounded to bf16 and quantized ones
//     dequantized to bf16 (norms, biases, the embedding table, MoE experts), in host copies the
//     plan owns until the upload. A fused group (q|k|v, gate|up) is one row-major matrix.
//   - PlaceLinear: a linear layer's weight kept in its checkpoint's precision: row segments of
//     one device format each (consecutive parts of one format merge), FP8 blocks with their
//     block scales, MLX / AWQ / GPTQ / GGUF integer codes as the affine 4- or 8-bit codes with
//     a bf16 (4-bit) or f32 (8-bit) scale and bias per group. The pieces hold 4-bit codes in the
//     checkpoint's order; ArrangeOnDevice, run once after the upload, puts them in the kernels'.
// Pieces are 256-byte aligned.
#pragma once

#ifdef KESTREL_HAS_CUDA

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/quant_linear.h"
#include "core/tensor.h"

namespace kestrel {

class CudaWeightPlan {
 public:
  static constexpr size_t kAlign = 256;
  // n rounded up to a whole number of kAlign bytes (the pieces here, and the runner's other
  // device allocations laid out the same way).
  static constexpr size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  struct Piece {
    const void* data;
    size_t bytes;
    size_t offset;
  };
  struct Segment {
    cuda::WeightFormat format = cuda::WeightFormat::kBf16;
    int64_t rows = 0;
    size_t data = kNone, scale = kNone, bias = kNone, scale_bias = kNone;
    size_t input_perm = kNone;  // GPTQ act-order: the layer's int32 column order (every segment)
    int32_t group = 0, scale_ld = 0;
    bool scaled_codes = false;  // kAffine4: scale_bias pairs (s * 2^133, b) (quant_linear.h)
    bool bias_from_scale = false;  // kAffine8: bias = bias_ratio * scale, no bias array
    float bias_ratio = 0.0f;
    bool mma_order = false;  // kAffine8: codes arranged for the tensor-core GEMV (quant_linear.h)
  };
  using Linear = std::vector<Segment>;

  // Offset of the group (its parts one after the other), as bf16.
  size_t Place(std::initializer_list<const TensorView*> parts);
  size_t Place(const std::vector<const TensorView*>& parts);
  // kNone when the first part is empty (an optional tensor the checkpoint lacks).
  size_t PlaceOptional(std::initializer_list<const TensorView*> parts);
  // A linear weight [sum of rows, k] from its parts (2-D, same k). A part in a layout the
  // quantized kernels cannot read (e.g. an MLX group of 256, FP8 blocks other than 128 x 128) is
  // dequantized to bf16: slower, never wrong. GPTQ act-order parts (input_perm) keep their 4-bit
  // codes when every part is 4-bit with the same column order (q|k|v and gate|up of one GPTQ
  // layer share their inputs' order); otherwise the whole weight is bf16 in the inputs' order.
  Linear PlaceLinear(const std::vector<const TensorView*>& parts);
  Linear PlaceLinear(std::initializer_list<const TensorView*> parts) {
    return PlaceLinear(std::vector<const TensorView*>(parts));
  }
  // After the pieces are copied to `base`: the device-side rearrangement of the 4-bit codes
  // (cuda::ArrangeAffine4Codes), queued on `stream`. Run exactly once per upload.
  void ArrangeOnDevice(uint8_t* base, cudaStream_t stream) const;
  // The device descriptor of a placed linear weight once the plan is uploaded at `base`.
  static cuda::Weight Bind(const Linear& w, const uint8_t* base);

  size_t total_bytes() const { return total_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // The device formats used, e.g. "fp8-block128" or "int4-affine+int8-affine" ("bf16" if none).
  std::string formats() const;
  // Whether 4-bit segments whose scales allow it are placed with scaled_codes (quant_linear.h;
  // the same weights either way). On unless KESTREL_AFFINE4_SCALED_CODES=0; tests set both.
  void set_scaled_affine4_codes(bool on) { scaled_affine4_codes_ = on; }
  // Whether 8-bit segments whose biases are one multiple of their scales keep no bias array
  // (quant_linear.h, bias_from_scale; the same weights either way). On unless
  // KESTREL_AFFINE8_BIAS_FROM_SCALE=0.
  void set_affine8_bias_from_scale(bool on) { affine8_bias_from_scale_ = on; }
  // Whether 8-bit segments (k a multiple of 64) are arranged for the tensor-core GEMV
  // (quant_linear.h, mma_order) instead of the CUDA-core one. On unless KESTREL_AFFINE8_MMA=0.
  void set_affine8_mma(bool on) { affine8_mma_ = on; }

 private:
  size_t Reserve(size_t bytes);
  size_t Own(std::vector<uint8_t> bytes);  // a host copy uploaded like any piece
  void AddSegment(const std::vector<const TensorView*>& parts, int64_t rows, Linear* out);

  size_t total_ = 0;
  std::vector<Piece> pieces_;
  std::deque<std::vector<uint8_t>> owned_;
  std::vector<std::pair<size_t, size_t>> affine4_codes_;  // (offset, bytes) of 4-bit code runs
  std::vector<std::pair<size_t, size_t>> affine8_codes_;  // the same, 8-bit runs in mma order
  uint32_t formats_used_ = 0;  // bit per cuda::WeightFormat
  bool scaled_affine4_codes_ = ScaledAffine4CodesByDefault();
  bool affine8_bias_from_scale_ = Affine8BiasFromScaleByDefault();
  bool affine8_mma_ = Affine8MmaByDefault();

  static bool ScaledAffine4CodesByDefault();
  static bool Affine8BiasFromScaleByDefault();
  static bool Affine8MmaByDefault();
};

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
