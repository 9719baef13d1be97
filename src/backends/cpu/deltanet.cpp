// Gated DeltaNet ops (see deltanet.h). One implementation for both kernel sets: the fast set
// only spreads value heads over the thread pool, each head computed by one thread in the same
// order, so the two sets give bitwise the same results.
#include "backends/cpu/deltanet.h"

#include <algorithm>
#include <cmath>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "backends/cpu/kernels_internal.h"
#include "core/check.h"

namespace kestrel::cpu {
namespace {

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

// Subnormal floats flushed to zero, as inputs and as results, while it lives (the thread's
// MXCSR FTZ and DAZ bits, restored after). The delta rule's decays exp(cum_i - cum_j) and
// exp(cum_i) fall below f32's normal range (about 1.2e-38, cum < -87.3) in heads that forget
// fast, and every operation on a subnormal takes a microcode assist on x86 (about 100 cycles):
// a random Qwen3.5-shaped model prefilled 512 tokens 5.5x slower in the delta rule without this.
// What it changes: terms below 1.2e-38, added to states of order 1e-3 to 1.
class FlushSubnormals {
 public:
#if defined(__SSE__)
  FlushSubnormals() : csr_(_mm_getcsr()) {
    _mm_setcsr(csr_ | 0x8040);
  }
  ~FlushSubnormals() {
    _mm_setcsr(csr_);
  }

 private:
  unsigned csr_;
#endif
};

// Runs fn(head, thread) for every value head, over the pool in the fast set; subnormals flushed
// in both sets (the same bits).
template <class Fn>
void ForEachHead(const OpContext& ctx, int64_t n_heads, Fn&& fn) {
  if (ctx.kernels == KernelSet::kReference || ctx.pool == nullptr || n_heads == 1) {
    const FlushSubnormals flush;
    for (int64_t h = 0; h < n_heads; ++h) fn(h, 0);
    return;
  }
  ctx.pool->ParallelFor(n_heads, 1, [&](int64_t begin, int64_t end, int thread) {
    const FlushSubnormals flush;
    for (int64_t h = begin; h < end; ++h) fn(h, thread);
  });
}

int ThreadCount(const OpContext& ctx) {
  return ctx.kernels == KernelSet::kReference || ctx.pool == nullptr ? 1 : ctx.pool->n_threads();
}

// Per-thread scratch of the chunked rule, in floats.
struct ChunkScratch {
  int64_t dk, dv;
  static constexpr int64_t C = kDeltaChunk;
  int64_t floats() const { return C + 2 * C * C + C * (2 * dk + 3 * dv); }
};

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
  const int64_t nk = s.n_key_heads, nv = s.n_value_heads;
  const int64_t dk = s.key_head_dim, dv = s.value_head_dim;
  KCHECK(nk > 0 && nv % nk == 0);
  const int64_t group = nv / nk;
  std::vector<std::vector<float>> rows(static_cast<size_t>(ThreadCount(ctx)),
                                       std::vector<float>(static_cast<size_t>(dv)));
  ForEachHead(ctx, nv, [&](int64_t h, int thread) {
    float* S = state + h * dk * dv;  // [dk, dv]
    float* delta = rows[static_cast<size_t>(thread)].data();
    const int64_t kh = h / group;
    for (int64_t t = 0; t < n; ++t) {
      const float* qt = q + (t * nk + kh) * dk;
      const float* kt = k + (t * nk + kh) * dk;
      const float* vt = v + (t * nv + h) * dv;
      const float decay = std::exp(g[t * nv + h]);
      const float b = beta[t * nv + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      // delta = (v - S^T k) * beta
      for (int64_t e = 0; e < dv; ++e) delta[e] = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float kd = kt[d];
        const float* row = S + d * dv;
        for (int64_t e = 0; e < dv; ++e) delta[e] += row[e] * kd;
      }
      for (int64_t e = 0; e < dv; ++e) delta[e] = (vt[e] - delta[e]) * b;
      // S += k delta^T
      for (int64_t d = 0; d < dk; ++d) {
        const float kd = kt[d];
        float* row = S + d * dv;
        for (int64_t e = 0; e < dv; ++e) row[e] += kd * delta[e];
      }
      // o = S^T q
      float* ot = out + (t * nv + h) * dv;
      for (int64_t e = 0; e < dv; ++e) ot[e] = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float qd = qt[d];
        const float* row = S + d * dv;
        for (int64_t e = 0; e < dv; ++e) ot[e] += row[e] * qd;
      }
    }
  });
}

int64_t DeltaChunkScratchFloats(const OpContext& ctx, const DeltaShape& s) {
  return ThreadCount(ctx) * ChunkScratch{s.key_head_dim, s.value_head_dim}.floats();
}

// Per chunk of L <= C tokens with cumulative log-decay cum[i] (i within the chunk), as
// transformers' torch_chunk_gated_delta_rule:
//   A[i, j] = (beta_i k_i . k_j) exp(cum_i - cum_j)            j < i
//   U = (I + A)^-1 (beta v);  W = (I + A)^-1 (beta k exp(cum))   forward substitution
//   v'  = U - W S
//   o_i = exp(cum_i) q_i S + sum_{j <= i} (q_i . k_j) exp(cum_i - cum_j) v'_j
//   S   = exp(cum_last) S + sum_j exp(cum_last - cum_j) k_j v'_j^T
void GatedDeltaChunked(const OpContext& ctx, const DeltaShape& s, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t n, float* state,
                       float* out, std::span<float> scratch) {
  const int64_t nk = s.n_key_heads, nv = s.n_value_heads;
  const int64_t dk = s.key_head_dim, dv = s.value_head_dim;
  KCHECK(nk > 0 && nv % nk == 0);
  const int64_t group = nv / nk;
  constexpr int64_t C = kDeltaChunk;
  const ChunkScratch layout{dk, dv};
  KCHECK(static_cast<int64_t>(scratch.size()) >= DeltaChunkScratchFloats(ctx, s));
  ForEachHead(ctx, nv, [&](int64_t h, int thread) {
    float* base = scratch.data() + thread * layout.floats();
    float* cum = base;         // [C]
    float* A = cum + C;        // [C, C] strictly lower
    float* QK = A + C * C;     // [C, C] lower incl. diagonal
    float* kb = QK + C * C;    // [C, dk] beta k, then W
    float* U = kb + C * dk;    // [C, dv]
    float* vn = U + C * dv;    // [C, dv] v'
    float* tmp = vn + C * dv;  // [C, dv]
    float* kd = tmp + C * dv;  // [C, dk] exp(cum_last - cum_j) k_j
    float* S = state + h * dk * dv;
    const int64_t kh = h / group;
    auto K = [&](int64_t t) { return k + (t * nk + kh) * dk; };
    auto Q = [&](int64_t t) { return q + (t * nk + kh) * dk; };
    for (int64_t c0 = 0; c0 < n; c0 += C) {
      const int64_t L = std::min(C, n - c0);
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) {
        acc += g[(c0 + i) * nv + h];
        cum[i] = acc;
      }
      for (int64_t i = 0; i < L; ++i) {
        const float b = beta[(c0 + i) * nv + h];
        const float* ki = K(c0 + i);
        const float* vi = v + ((c0 + i) * nv + h) * dv;
        for (int64_t d = 0; d < dk; ++d) kb[i * dk + d] = ki[d] * b;
        for (int64_t e = 0; e < dv; ++e) U[i * dv + e] = vi[e] * b;
      }
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          const float decay = std::exp(cum[i] - cum[j]);
          const float* kj = K(c0 + j);
          float dot_a = 0.0f, dot_q = 0.0f;
          const float* qi = Q(c0 + i);
          for (int64_t d = 0; d < dk; ++d) {
            dot_a += kb[i * dk + d] * kj[d];
            dot_q += qi[d] * kj[d];
          }
          A[i * C + j] = dot_a * decay;
          QK[i * C + j] = dot_q * decay;
        }
      }
      // W = beta k exp(cum) (in place of kb, after A used kb), then both substitutions.
      for (int64_t i = 0; i < L; ++i) {
        const float e_cum = std::exp(cum[i]);
        for (int64_t d = 0; d < dk; ++d) kb[i * dk + d] *= e_cum;
      }
      for (int64_t i = 1; i < L; ++i) {
        for (int64_t j = 0; j < i; ++j) {
          const float a = A[i * C + j];
          for (int64_t e = 0; e < dv; ++e) U[i * dv + e] -= a * U[j * dv + e];
          for (int64_t d = 0; d < dk; ++d) kb[i * dk + d] -= a * kb[j * dk + d];
        }
      }
      // v' = U - W S;  inter-chunk output exp(cum_i) q_i S
      for (int64_t i = 0; i < L; ++i) {
        float* vi = vn + i * dv;
        float* oi = tmp + i * dv;
        const float* qi = Q(c0 + i);
        const float e_cum = std::exp(cum[i]);
        for (int64_t e = 0; e < dv; ++e) {
          vi[e] = 0.0f;
          oi[e] = 0.0f;
        }
        for (int64_t d = 0; d < dk; ++d) {
          const float w = kb[i * dk + d];
          const float qd = qi[d] * e_cum;
          const float* row = S + d * dv;
          for (int64_t e = 0; e < dv; ++e) {
            vi[e] += w * row[e];
            oi[e] += qd * row[e];
          }
        }
        for (int64_t e = 0; e < dv; ++e) vi[e] = U[i * dv + e] - vi[e];
      }
      // Intra-chunk output, then out.
      for (int64_t i = 0; i < L; ++i) {
        float* oi = tmp + i * dv;
        for (int64_t j = 0; j <= i; ++j) {
          const float a = QK[i * C + j];
          const float* vj = vn + j * dv;
          for (int64_t e = 0; e < dv; ++e) oi[e] += a * vj[e];
        }
        std::copy(oi, oi + dv, out + ((c0 + i) * nv + h) * dv);
      }
      // State update.
      const float last = cum[L - 1];
      for (int64_t j = 0; j < L; ++j) {
        const float f = std::exp(last - cum[j]);
        const float* kj = K(c0 + j);
        for (int64_t d = 0; d < dk; ++d) kd[j * dk + d] = kj[d] * f;
      }
      const float chunk_decay = std::exp(last);
      for (int64_t d = 0; d < dk; ++d) {
        float* row = S + d * dv;
        for (int64_t e = 0; e < dv; ++e) row[e] *= chunk_decay;
        for (int64_t j = 0; j < L; ++j) {
          const float kdj = kd[j * dk + d];
          const float* vj = vn + j * dv;
          for (int64_t e = 0; e < dv; ++e) row[e] += kdj * vj[e];
        }
      }
    }
  });
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
