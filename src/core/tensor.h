// Non-owning views of weights and activations. Shapes are listed outermost first,
// row-major contiguous (a [rows, cols] matrix has cols contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace kestrel {

// 8: vision towers of multimodal checkpoints hold rank-5 conv weights.
inline constexpr int kMaxDims = 8;

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int n_dims = 0;
  std::array<int64_t, kMaxDims> shape{};  // outermost first
  // kF8E4M3 matrices: f32 scales [ceil(rows / block_rows), ceil(cols / block_cols)], row-major;
  // element (i, j) is f32(fp8) * block_scale[i / block_rows][j / block_cols].
  // kMlxQ4 / kMlxQ8: block_rows 1, block_cols the group size, and group_bias beside the scales:
  // element (i, j) is block_scale[i][j / g] * q + group_bias[i][j / g].
  const float* block_scale = nullptr;
  const float* group_bias = nullptr;
  int64_t block_rows = 0, block_cols = 0;
  // kMlxQ4 matrices from GPTQ act-order checkpoints: the stored columns are the inputs in the
  // order perm[0 .. cols) (stored column j holds input perm[j]), so that each group's inputs are
  // contiguous; y = W_stored . x[perm]. The kernels that read the codes gather x by it;
  // quant::DequantizeMatrixRow returns rows in the inputs' own order. Null: no permutation.
  const int32_t* input_perm = nullptr;
  // kQ4_K and kQ8_0 matrices on the CPU: the same rows interleaved in groups of 8 for the AVX2
  // integer kernels (cpu::PackRows), or null. Only those kernels read it; everything else reads
  // data.
  const void* cpu_packed = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_dims; ++i) n *= shape[i];
    return n_dims == 0 ? 0 : n;
  }
  size_t size_bytes() const {
    const int64_t n = numel();
    if (n == 0) return 0;
    return static_cast<size_t>(n / shape[n_dims - 1] * DTypeRowBytes(dtype, shape[n_dims - 1]));
  }
  // Bytes of one innermost row.
  int64_t row_bytes() const { return DTypeRowBytes(dtype, shape[n_dims - 1]); }
  int64_t dim(int i) const {
    KCHECK(i >= 0 && i < n_dims);
    return shape[i];
  }
  bool empty() const { return data == nullptr; }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

std::string ShapeString(const TensorView& t);

}  // namespace kestrel
