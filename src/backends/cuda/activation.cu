// SiluMul: a flat grid-stride loop over the n * I / kVec output vectors (the row is recovered by
// a division), so every row length and token count gets the same full-GPU launch.
#include "backends/cuda/activation.h"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/silu.cuh"
#include "backends/cuda/vec_io.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU many times over; the grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;


template <int kVec>
__global__ void SiluMulKernel(const float* __restrict__ gate_up /*[n, row_stride]*/,
                              const __nv_bfloat16* __restrict__ gate_bias /*[I] or null*/,
                              const __nv_bfloat16* __restrict__ up_bias /*[I] or null*/, int64_t n,
                              int64_t I, int64_t row_stride,
                              __nv_bfloat16* __restrict__ out /*[n, I]*/) {
  PdlWait();  // launched with PDL (pdl.cuh)
  PdlLaunchDependents();
  const int64_t row_vecs = I / kVec;
  const int64_t total = n * row_vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t t = idx / row_vecs;
    const int64_t col = (idx - t * row_vecs) * kVec;
    const float* gate_row = gate_up + t * row_stride;
    float g[kVec], u[kVec];
    LoadF32<kVec>(gate_row + col, g);
    LoadF32<kVec>(gate_row + I + col, u);
    if (gate_bias != nullptr) {
      float b[kVec];
      LoadBf16<kVec>(gate_bias + col, b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[e] = __fadd_rn(g[e], b[e]);
    }
    if (up_bias != nullptr) {
      float b[kVec];
      LoadBf16<kVec>(up_bias + col, b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) u[e] = __fadd_rn(u[e], b[e]);
    }
    float y[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) y[e] = SiluTimes(g[e], u[e]);
    StoreBf16<kVec>(out + t * I + col, y);
  }
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void SiluMul(const float* gate_up, int64_t gate_up_stride, const __nv_bfloat16* gate_bias,
             const __nv_bfloat16* up_bias, int64_t n, int64_t I, __nv_bfloat16* out,
             cudaStream_t stream) {
  KCHECK(n >= 0 && I > 0 && gate_up_stride >= 2 * I);
  if (n == 0) return;
  KCHECK(gate_up != nullptr && out != nullptr);
  // The up half starts I floats into each row: 16-byte aligned when I % 8 == 0 (I * 4 bytes is a
  // multiple of 32), and so is every row of gate_up when its stride is a multiple of 4 floats,
  // and of out (I bf16).
  const bool vec8 = I % 8 == 0 && gate_up_stride % 4 == 0 && Aligned16(gate_up) &&
                    Aligned16(out) && (gate_bias == nullptr || Aligned16(gate_bias)) &&
                    (up_bias == nullptr || Aligned16(up_bias));
  const int64_t total = vec8 ? n * (I / 8) : n * I;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  LaunchPdl(vec8 ? &SiluMulKernel<8> : &SiluMulKernel<1>, dim3(static_cast<unsigned>(blocks)),
            dim3(kThreads), 0, stream, gate_up, gate_bias, up_bias, n, I, gate_up_stride, out);
  KCUDA_CHECK_LAUNCH();
}

void SiluMul(const float* gate_up /*[n, 2*I]: gate in columns [0, I), up in [I, 2I)*/,
             const __nv_bfloat16* gate_bias /*[I] or nullptr*/,
             const __nv_bfloat16* up_bias /*[I] or nullptr*/, int64_t n, int64_t I,
             __nv_bfloat16* out /*[n, I]*/, cudaStream_t stream) {
  SiluMul(gate_up, 2 * I, gate_bias, up_bias, n, I, out, stream);
}

}  // namespace kestrel::cuda
