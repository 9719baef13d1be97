// EmbeddingGather: one block row per token (grid.x), grid.y splits long rows so a single decode
// token still spreads over a few SMs.
#include "backends/cuda/embedding.h"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

// bf16 -> f32 is the bf16 bits in the high half of the f32; a 32-bit word holds element 2i in
// its low half (little endian).
__device__ __forceinline__ float LowBf16(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float HighBf16(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

// 8 bf16 (one 16-byte load) -> 8 f32 (two 16-byte stores) per step.
__global__ void EmbeddingGatherVec8Kernel(const uint4* __restrict__ table /*[vocab, row_vecs]*/,
                                          int64_t row_vecs, const int32_t* __restrict__ ids /*[n]*/,
                                          float4* __restrict__ out /*[n, 2 * row_vecs]*/) {
  const int64_t i = blockIdx.x;
  const uint4* src = table + static_cast<int64_t>(ids[i]) * row_vecs;
  float4* dst = out + i * row_vecs * 2;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.y;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < row_vecs;
       j += stride) {
    const uint4 raw = src[j];
    dst[2 * j] = make_float4(LowBf16(raw.x), HighBf16(raw.x), LowBf16(raw.y), HighBf16(raw.y));
    dst[2 * j + 1] = make_float4(LowBf16(raw.z), HighBf16(raw.z), LowBf16(raw.w), HighBf16(raw.w));
  }
}

// Any hidden size or alignment: one element per step.
__global__ void EmbeddingGatherScalarKernel(const __nv_bfloat16* __restrict__ table
                                            /*[vocab, hidden]*/,
                                            int64_t hidden, const int32_t* __restrict__ ids /*[n]*/,
                                            float* __restrict__ out /*[n, hidden]*/) {
  const int64_t i = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<int64_t>(ids[i]) * hidden;
  float* dst = out + i * hidden;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.y;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < hidden;
       j += stride) {
    dst[j] = __bfloat162float(src[j]);
  }
}

__global__ void ResolveSampledTokensKernel(int32_t* __restrict__ ids /*[n]*/,
                                           const int32_t* __restrict__ rows /*[n]*/,
                                           const int32_t* __restrict__ sampled, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && rows[i] >= 0) ids[i] = sampled[rows[i]];
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

void EmbeddingGather(const __nv_bfloat16* table /*[vocab, hidden]*/, int64_t vocab, int64_t hidden,
                     const int32_t* ids /*[n] device*/, int64_t n, float* out /*[n, hidden]*/,
                     cudaStream_t stream) {
  KCHECK(vocab > 0 && hidden > 0 && n >= 0);
  KCHECK(n <= INT32_MAX);  // grid.x
  if (n == 0) return;
  KCHECK(table != nullptr && ids != nullptr && out != nullptr);
  const bool vec8 = hidden % 8 == 0 && Aligned16(table) && Aligned16(out);
  const int64_t items = vec8 ? hidden / 8 : hidden;
  const int64_t blocks_per_row = std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(blocks_per_row));
  if (vec8) {
    EmbeddingGatherVec8Kernel<<<grid, kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(table), items, ids, reinterpret_cast<float4*>(out));
  } else {
    EmbeddingGatherScalarKernel<<<grid, kThreads, 0, stream>>>(table, hidden, ids, out);
  }
  KCUDA_CHECK_LAUNCH();
}

void ResolveSampledTokens(int32_t* ids /*[n] device*/, const int32_t* rows /*[n] device*/,
                          const int32_t* sampled /*[n_sampled] device*/, int64_t n,
                          cudaStream_t stream) {
  KCHECK(n >= 0 && n <= INT32_MAX);
  if (n == 0) return;
  KCHECK(ids != nullptr && rows != nullptr && sampled != nullptr);
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  ResolveSampledTokensKernel<<<blocks, kThreads, 0, stream>>>(ids, rows, sampled, n);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
