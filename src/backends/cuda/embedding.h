// Token embedding lookup on the GPU: rows of the bf16 table widened to the f32 residual stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// out[i, :] = f32(table[ids[i], :]) (exact: bf16 -> f32 is a widening).
// The ids are validated on the host before upload; the kernel assumes 0 <= ids[i] < vocab.
// Rows move as 16-byte vectors when hidden % 8 == 0 and table/out are 16-byte aligned, else per
// element.
void EmbeddingGather(const __nv_bfloat16* table /*[vocab, hidden]*/, int64_t vocab, int64_t hidden,
                     const int32_t* ids /*[n] device*/, int64_t n, float* out /*[n, hidden]*/,
                     cudaStream_t stream);

// ids[i] = sampled[rows[i]] where rows[i] >= 0, else unchanged: feeds the tokens a sampling
// kernel left on the device into the next step without a round trip through the host. The
// caller guarantees rows[i] < the number of rows sampled.
void ResolveSampledTokens(int32_t* ids /*[n] device*/, const int32_t* rows /*[n] device*/,
                          const int32_t* sampled /*[n_sampled] device*/, int64_t n,
                          cudaStream_t stream);

}  // namespace kestrel::cuda
