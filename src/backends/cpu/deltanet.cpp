// Gated DeltaNet ops (see deltanet.h). One implementation for both kernel sets: the fast set
// spreads value heads over the thread pool, each head computed by one thread in the same order,
// and takes the delta rule's AVX2 build (deltanet_rule.inc: the same operations, eight floats
// wide), so the two sets give bitwise the same results.
#include "backends/cpu/deltanet.h"

#define KESTREL_DELTA_NS delta_base
#include "backends/cpu/deltanet_rule.inc"
#undef KESTREL_DELTA_NS

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "core/check.h"

namespace kestrel::cpu {
namespace delta_avx2 {  // deltanet_avx2.cpp: deltanet_rule.inc built with AVX2 and FMA
int64_t ChunkScratchFloats(const OpContext& ctx, const DeltaShape& s);
void GatedDeltaRecurrent(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                         const float* v, const float* g, const float* beta, int64_t n, float* state,
                         float* out);
void GatedDeltaChunked(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t n, float* state,
                       float* out, std::span<float> scratch);
}  // namespace delta_avx2

namespace {

// The delta rule's AVX2 build (the same bits) for the fast kernel set where the CPU has AVX2.
bool UseAvx2(const OpContext& ctx) {
  return ctx.kernels == KernelSet::kAvx2 && CpuHasAvx2Fma();
}

float Silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float Sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// torch.nn.functional.softplus(x) with beta 1, threshold 20.
float Softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace

void CausalConv1dSilu(const float* x, int64_t n, int64_t channels, const TensorView& w,
                      float* window, float* out) {
  KCHECK(w.n_dims == 3 && w.shape[0] == channels && w.shape[1] == 1);
  const int64_t kernel = w.shape[2];
  const int64_t hist = kernel - 1;
  DispatchWeightDType(w.dtype, [&]<DType T>() {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < channels; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) {
          const int64_t src = t - hist + j;  // input position relative to x[0]
          const float in = src >= 0 ? x[src * channels + c] : window[(hist + src) * channels + c];
          acc += LoadWeight<T>(w.data, c * kernel + j) * in;
        }
        out[t * channels + c] = Silu(acc);
      }
    }
  });
  // The new window: the last `hist` inputs of window ++ x.
  if (n >= hist) {
    std::copy(x + (n - hist) * channels, x + n * channels, window);
  } else {
    std::copy(window + n * channels, window + hist * channels, window);
    std::copy(x, x + n * channels, window + (hist - n) * channels);
  }
}

void L2NormRows(float* x, int64_t n_rows, int64_t d, float eps, float scale) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * d;
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < d; ++j) sum_sq += row[j] * row[j];
    const float inv = 1.0f / std::sqrt(sum_sq + eps);
    for (int64_t j = 0; j < d; ++j) row[j] = row[j] * inv * scale;
  }
}

void DeltaGates(const float* b, const float* a, const TensorView& a_log, const TensorView& dt_bias,
                int64_t n, int64_t nv, float* beta, float* g) {
  KCHECK(a_log.n_dims == 1 && a_log.shape[0] == nv && dt_bias.n_dims == 1 &&
         dt_bias.shape[0] == nv);
  std::vector<float> neg_a(static_cast<size_t>(nv)), bias(static_cast<size_t>(nv));
  DispatchWeightDType(a_log.dtype, [&]<DType T>() {
    for (int64_t h = 0; h < nv; ++h) neg_a[h] = -std::exp(LoadWeight<T>(a_log.data, h));
  });
  DispatchWeightDType(dt_bias.dtype, [&]<DType T>() {
    for (int64_t h = 0; h < nv; ++h) bias[h] = LoadWeight<T>(dt_bias.data, h);
  });
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t i = t * nv + h;
      beta[i] = Sigmoid(b[i]);
      g[i] = neg_a[static_cast<size_t>(h)] * Softplus(a[i] + bias[static_cast<size_t>(h)]);
    }
  }
}

void GatedDeltaRecurrent(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                         const float* v, const float* g, const float* beta, int64_t n, float* state,
                         float* out) {
  if (UseAvx2(ctx)) return delta_avx2::GatedDeltaRecurrent(ctx, s, q, k, v, g, beta, n, state, out);
  delta_base::GatedDeltaRecurrent(ctx, s, q, k, v, g, beta, n, state, out);
}

int64_t DeltaChunkScratchFloats(const OpContext& ctx, const DeltaShape& s) {
  return delta_base::ChunkScratchFloats(ctx, s);
}

void GatedDeltaChunked(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t n, float* state,
                       float* out, std::span<float> scratch) {
  if (UseAvx2(ctx)) {
    return delta_avx2::GatedDeltaChunked(ctx, s, q, k, v, g, beta, n, state, out, scratch);
  }
  delta_base::GatedDeltaChunked(ctx, s, q, k, v, g, beta, n, state, out, scratch);
}

void GatedRmsNorm(const float* x, const float* z, int64_t n_rows, int64_t d, const TensorView& w,
                  float eps, float* y) {
  KCHECK(w.n_dims == 1 && w.shape[0] == d);
  DispatchWeightDType(w.dtype, [&]<DType T>() {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * d;
      const float* zr = z + r * d;
      float* yr = y + r * d;
      float sum_sq = 0.0f;
      for (int64_t j = 0; j < d; ++j) sum_sq += xr[j] * xr[j];
      const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
      for (int64_t j = 0; j < d; ++j) {
        yr[j] = LoadWeight<T>(w.data, j) * (xr[j] * inv_rms) * Silu(zr[j]);
      }
    }
  });
}

void SigmoidGateInPlace(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= Sigmoid(gate[i]);
}

}  // namespace kestrel::cpu
