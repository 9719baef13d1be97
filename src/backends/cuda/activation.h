// The gated MLP activation on the GPU: SiLU(gate) * up, from the fused gate_up projection.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// out[t, i] = bf16(silu(g) * u), g = gate_up[t, i] + f32(gate_bias[i]),
// u = gate_up[t, I + i] + f32(up_bias[i]) (each bias optional), silu(g) = g / (1 + expf(-g)).
// Same operation order as cpu::SiluMul (divide, then multiply; no FMA); expf is CUDA's accurate
// expf (2 ulp), not __expf. 16-byte vectors when I % 8 == 0 and every pointer is 16-byte aligned.
void SiluMul(const float* gate_up /*[n, 2*I]: gate in columns [0, I), up in [I, 2I)*/,
             const __nv_bfloat16* gate_bias /*[I] or nullptr*/,
             const __nv_bfloat16* up_bias /*[I] or nullptr*/, int64_t n, int64_t I,
             __nv_bfloat16* out /*[n, I]*/, cudaStream_t stream);

// The same with row t's gate|up at gate_up + t * gate_up_stride (>= 2 * I floats): the gate|up
// columns at the start of a wider product's rows.
void SiluMul(const float* gate_up, int64_t gate_up_stride, const __nv_bfloat16* gate_bias,
             const __nv_bfloat16* up_bias, int64_t n, int64_t I, __nv_bfloat16* out,
             cudaStream_t stream);

}  // namespace kestrel::cuda
