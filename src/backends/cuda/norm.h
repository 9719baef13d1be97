// RMSNorm on the GPU, fused with the residual add that precedes it in a decoder layer.
// Numerics follow cpu::RmsNorm (transformers' LlamaRMSNorm in f32): mean of squares in f32,
// inv_rms = 1/sqrt(mean + eps) (IEEE sqrt and division), y = w * (x * inv_rms), rounded to bf16.
// Only the order of the sum of squares differs from the CPU (a tree instead of a sequential sum).
// weight_offset 1 applies zero-centred weights as (1 + w), rounded in f32 as the CPU does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// If delta != nullptr: x[r, :] += delta[r, :] + f32(delta_bias[:]) (bias optional; delta and bias
// are added first, as the CPU forward adds the biased Linear output to the residual), x updated in
// place. Then y[r, :] = bf16(f32(weight[:]) * (x[r, :] * inv_rms(x[r, :]))).
// delta_bias without delta is a bug. d <= 16384 (any d; 16-byte vectors when d % 8 == 0 and every
// pointer is 16-byte aligned).
void AddRmsNorm(float* x /*[n, d] residual, in/out*/, const float* delta /*[n, d] or nullptr*/,
                const __nv_bfloat16* delta_bias /*[d] or nullptr*/,
                const __nv_bfloat16* weight /*[d]*/, float eps, int64_t n, int64_t d,
                __nv_bfloat16* y /*[n, d]*/, cudaStream_t stream, float weight_offset = 0.0f);

// RMSNorm of selected rows (the final norm before the LM head, only on the rows that sample):
// y[i, :] = bf16(norm(x[rows[i], :]) * weight). rows are valid indices into x (host-checked).
void GatherRmsNorm(const float* x /*[n_tokens, d]*/, const int32_t* rows /*[n_rows] device*/,
                   int64_t n_rows, int64_t d, const __nv_bfloat16* weight /*[d]*/, float eps,
                   __nv_bfloat16* y /*[n_rows, d]*/, cudaStream_t stream,
                   float weight_offset = 0.0f);

}  // namespace kestrel::cuda
