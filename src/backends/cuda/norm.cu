// RMSNorm kernels: one block per row. Each thread keeps its slice of the row in registers between
// the sum-of-squares pass and the scaling pass, so x is read (and, with a delta, written) once.
#include "backends/cuda/norm.h"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/vec_io.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int64_t kMaxD = 16384;

struct NormArgs {
  const float* x_in;                // [n_tokens, d]: row src_row is normalised
  float* x_out;                     // [n, d]: x_in + delta written back (AddRmsNorm), or null
  const float* delta;               // [n, d] or null
  const __nv_bfloat16* delta_bias;  // [d] or null
  const int32_t* rows;              // [n] source rows (GatherRmsNorm), or null: row r
  const __nv_bfloat16* weight;      // [d]
  float eps;
  int64_t d;
  __nv_bfloat16* y;  // [n, d]
  float weight_offset;  // 1 for zero-centred (1 + w) weights (Qwen3.5), else 0
};

// Sum over the block (blockDim.x a multiple of 32), returned to every thread. Called once per
// kernel, so the shared partials need no second barrier.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f;
  return WarpSum(v);
}


// One block per output row; thread i owns vectors i, i + blockDim.x, ... (kMaxIters at most).
// kVec = 8: 16-byte loads of x/delta, 16-byte loads of weight/bias and stores of y.
// Launched with PDL (pdl.cuh): waits first; lets the next kernel (a GEMV that prefetches its
// weights) be scheduled at once, since the rows are tiny next to that GEMV's weights.
template <int kVec, int kMaxIters>
__global__ void __launch_bounds__(1024) RmsNormKernel(NormArgs a) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t r = blockIdx.x;
  const int64_t src_row = a.rows != nullptr ? static_cast<int64_t>(a.rows[r]) : r;
  const int64_t d = a.d;
  const int64_t n_items = d / kVec;
  const float* xr = a.x_in + src_row * d;

  float v[kMaxIters][kVec];
  float sum_sq = 0.0f;
#pragma unroll
  for (int it = 0; it < kMaxIters; ++it) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(it) * blockDim.x;
    if (j < n_items) {
      LoadF32<kVec>(xr + j * kVec, v[it]);
      if (a.delta != nullptr) {
        float dv[kVec];
        LoadF32<kVec>(a.delta + r * d + j * kVec, dv);
        if (a.delta_bias != nullptr) {
          float b[kVec];
          LoadBf16<kVec>(a.delta_bias + j * kVec, b);
#pragma unroll
          for (int e = 0; e < kVec; ++e) dv[e] = __fadd_rn(dv[e], b[e]);
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[it][e] = __fadd_rn(v[it][e], dv[e]);
        StoreF32<kVec>(a.x_out + r * d + j * kVec, v[it]);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum_sq = fmaf(v[it][e], v[it][e], sum_sq);
    }
  }
  sum_sq = BlockSum(sum_sq);
  // IEEE division and sqrt (the _rn intrinsics), as the CPU: 1.0f / std::sqrt(sum / d + eps).
  const float inv_rms =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(d)), a.eps)));

  __nv_bfloat16* yr = a.y + r * d;
#pragma unroll
  for (int it = 0; it < kMaxIters; ++it) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(it) * blockDim.x;
    if (j < n_items) {
      float w[kVec];
      LoadBf16<kVec>(a.weight + j * kVec, w);
      if (a.weight_offset != 0.0f) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) w[e] = __fadd_rn(a.weight_offset, w[e]);
      }
      float out[kVec];
      // w * (x * inv_rms), both products rounded (no FMA contraction), as the CPU.
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = __fmul_rn(w[e], __fmul_rn(v[it][e], inv_rms));
      StoreBf16<kVec>(yr + j * kVec, out);
    }
  }
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Threads per block: enough that each thread owns about kTargetIters vectors (more threads for
// latency when rows are long), a multiple of 32, at most 1024.
template <int kVec, int kMaxIters, int kTargetIters>
void LaunchRmsNorm(const NormArgs& a, int64_t n_rows, cudaStream_t stream) {
  const int64_t n_items = a.d / kVec;
  const int64_t want = (n_items + kTargetIters - 1) / kTargetIters;
  const int threads =
      static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (want + 31) / 32 * 32)));
  KCHECK((n_items + threads - 1) / threads <= kMaxIters);
  LaunchPdl(&RmsNormKernel<kVec, kMaxIters>, dim3(static_cast<unsigned>(n_rows)), dim3(threads), 0,
            stream, a);
  KCUDA_CHECK_LAUNCH();
}

void RunRmsNorm(const NormArgs& a, int64_t n_rows, cudaStream_t stream) {
  KCHECK(a.d > 0 && a.d <= kMaxD);
  KCHECK(n_rows >= 0 && n_rows <= INT32_MAX);  // grid.x
  if (n_rows == 0) return;
  KCHECK(a.x_in != nullptr && a.weight != nullptr && a.y != nullptr);
  const bool vec8 = a.d % 8 == 0 && Aligned16(a.x_in) && Aligned16(a.weight) && Aligned16(a.y) &&
                    (a.delta == nullptr || Aligned16(a.delta)) &&
                    (a.delta_bias == nullptr || Aligned16(a.delta_bias));
  // kMaxIters * kVec * 1024 >= kMaxD for both: 4 * 8 * 1024 and 16 * 1 * 1024.
  if (vec8) {
    LaunchRmsNorm<8, 4, 2>(a, n_rows, stream);
  } else {
    LaunchRmsNorm<1, 16, 4>(a, n_rows, stream);
  }
}

}  // namespace

void AddRmsNorm(float* x /*[n, d] residual, in/out*/, const float* delta /*[n, d] or nullptr*/,
                const __nv_bfloat16* delta_bias /*[d] or nullptr*/,
                const __nv_bfloat16* weight /*[d]*/, float eps, int64_t n, int64_t d,
                __nv_bfloat16* y /*[n, d]*/, cudaStream_t stream, float weight_offset) {
  KCHECK(delta != nullptr || delta_bias == nullptr);
  const NormArgs a{x, x, delta, delta_bias, nullptr, weight, eps, d, y, weight_offset};
  RunRmsNorm(a, n, stream);
}

void GatherRmsNorm(const float* x /*[n_tokens, d]*/, const int32_t* rows /*[n_rows] device*/,
                   int64_t n_rows, int64_t d, const __nv_bfloat16* weight /*[d]*/, float eps,
                   __nv_bfloat16* y /*[n_rows, d]*/, cudaStream_t stream, float weight_offset) {
  KCHECK(n_rows == 0 || rows != nullptr);
  const NormArgs a{x, nullptr, nullptr, nullptr, rows, weight, eps, d, y, weight_offset};
  RunRmsNorm(a, n_rows, stream);
}

}  // namespace kestrel::cuda
