// silu(g) * u as every CUDA kernel computes it (SiluMul, the MoE experts' fused epilogue): the
// CPU's operation order (divide, then multiply; no FMA) with CUDA's accurate expf (2 ulp), so
// that all of them give the same bits. exp(-g) overflowing to inf for g < -88 gives -0 (silu's
// limit), as on the CPU.
#pragma once

namespace kestrel::cuda {

__device__ __forceinline__ float SiluTimes(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

}  // namespace kestrel::cuda
