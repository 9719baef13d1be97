// The Gated DeltaNet CPU ops (backends/cpu/deltanet.h) against plain double-precision loops
// written here from the formulas, and the two forms of the delta rule against each other:
//   * causal conv1d + SiLU, in one call and split across calls (the window carries over);
//   * the gates, L2 norm and gated RMSNorm;
//   * GatedDeltaRecurrent and GatedDeltaChunked vs the double reference, for lengths around the
//     chunk size, from a zero and a non-zero state, with grouped value heads; chunked over a
//     split sequence equals chunked over the whole (the state carries over);
//   * both kernel sets and any thread count give the same bits (one thread per value head).
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backends/cpu/deltanet.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"

namespace kestrel {
namespace {

using testing::MakeWeights;
using testing::OwnedWeights;
using testing::RandomFloats;

double Silu(double x) {
  return x / (1.0 + std::exp(-x));
}

TEST(DeltaNet, CausalConvMatchesReferenceAndCarriesItsWindow) {
  std::mt19937 rng(3);
  const int64_t channels = 24, kernel = 4, n = 11;
  OwnedWeights w = MakeWeights(rng, DType::kBF16, {channels, 1, kernel}, 2);
  const std::vector<float> x = RandomFloats(rng, n * channels);
  const std::vector<float> window0 = RandomFloats(rng, (kernel - 1) * channels);

  // Reference in double: the window's K-1 inputs precede x.
  std::vector<double> ext;
  for (float v : window0) ext.push_back(v);
  for (float v : x) ext.push_back(v);
  std::vector<float> want(static_cast<size_t>(n * channels));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < kernel; ++j) {
        acc += w.values[static_cast<size_t>(c * kernel + j)] *
               ext[static_cast<size_t>((t + j) * channels + c)];
      }
      want[static_cast<size_t>(t * channels + c)] = static_cast<float>(Silu(acc));
    }
  }

  std::vector<float> window = window0, out(static_cast<size_t>(n * channels));
  cpu::CausalConv1dSilu(x.data(), n, channels, w.view, window.data(), out.data());
  EXPECT_LT(testing::RelativeError(out, want), 1e-6);
  // The window now holds the last K-1 inputs.
  for (int64_t i = 0; i < (kernel - 1) * channels; ++i) {
    EXPECT_EQ(window[static_cast<size_t>(i)],
              x[static_cast<size_t>((n - kernel + 1) * channels + i)]);
  }

  // Split 5 + 1 + 5: the same bits.
  std::vector<float> window2 = window0, out2(out.size());
  int64_t at = 0;
  for (int64_t len : {5, 1, 5}) {
    cpu::CausalConv1dSilu(x.data() + at * channels, len, channels, w.view, window2.data(),
                          out2.data() + at * channels);
    at += len;
  }
  EXPECT_TRUE(testing::SameBits(out2, out));
  EXPECT_TRUE(testing::SameBits(window2, window));
}

TEST(DeltaNet, GatesAndNorms) {
  std::mt19937 rng(4);
  const int64_t n = 7, nv = 6;
  OwnedWeights a_log = MakeWeights(rng, DType::kF32, {nv}, 0);
  OwnedWeights dt_bias = MakeWeights(rng, DType::kBF16, {nv}, 2);
  std::vector<float> b = RandomFloats(rng, n * nv, 3.0f), a = RandomFloats(rng, n * nv, 12.0f);
  a[0] = 25.0f;  // softplus's linear branch
  std::vector<float> beta(b.size()), g(b.size());
  cpu::DeltaGates(b.data(), a.data(), a_log.view, dt_bias.view, n, nv, beta.data(), g.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < nv; ++h) {
      const size_t i = static_cast<size_t>(t * nv + h);
      const double x = static_cast<double>(a[i]) + dt_bias.values[static_cast<size_t>(h)];
      const double softplus = x > 20 ? x : std::log1p(std::exp(x));
      EXPECT_NEAR(beta[i], 1.0 / (1.0 + std::exp(-static_cast<double>(b[i]))), 1e-6);
      const double want_g =
          -std::exp(static_cast<double>(a_log.values[static_cast<size_t>(h)])) * softplus;
      EXPECT_NEAR(g[i], want_g, 1e-5 * std::max(1.0, std::abs(want_g)));
    }
  }

  const int64_t d = 16;
  std::vector<float> x = RandomFloats(rng, 3 * d), z = RandomFloats(rng, 3 * d), y(x.size());
  std::vector<float> l2 = x;
  cpu::L2NormRows(l2.data(), 3, d, 1e-6f, 0.5f);
  OwnedWeights w = MakeWeights(rng, DType::kBF16, {d}, 0);
  cpu::GatedRmsNorm(x.data(), z.data(), 3, d, w.view, 1e-6f, y.data());
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    for (int64_t i = 0; i < d; ++i) {
      const size_t j = static_cast<size_t>(r * d + i);
      EXPECT_NEAR(l2[j], x[j] / std::sqrt(ss + 1e-6) * 0.5, 1e-6);
      const double want =
          w.values[static_cast<size_t>(i)] * (x[j] / std::sqrt(ss / d + 1e-6)) * Silu(z[j]);
      EXPECT_NEAR(y[j], want, 1e-5 * std::max(1.0, std::abs(want)));
    }
  }
}

// The gated delta rule in double, token by token.
void ReferenceDelta(const cpu::DeltaShape& s, const std::vector<float>& q,
                    const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& g, const std::vector<float>& beta, int64_t n,
                    std::vector<double>* state, std::vector<double>* out) {
  const int64_t nk = s.n_key_heads, nv = s.n_value_heads, dk = s.key_head_dim,
                dv = s.value_head_dim, r = nv / nk;
  out->assign(static_cast<size_t>(n * nv * dv), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t kh = h / r;
      double* S = state->data() + h * dk * dv;
      const float* qt = q.data() + (t * nk + kh) * dk;
      const float* kt = k.data() + (t * nk + kh) * dk;
      const float* vt = v.data() + (t * nv + h) * dv;
      const double decay = std::exp(static_cast<double>(g[static_cast<size_t>(t * nv + h)]));
      const double b = beta[static_cast<size_t>(t * nv + h)];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double mem = 0;
        for (int64_t i = 0; i < dk; ++i) mem += S[i * dv + j] * kt[i];
        const double delta = (vt[j] - mem) * b;
        for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += kt[i] * delta;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * qt[i];
        (*out)[static_cast<size_t>((t * nv + h) * dv + j)] = o;
      }
    }
  }
}

struct DeltaInputs {
  std::vector<float> q, k, v, g, beta, state;
};

DeltaInputs MakeDeltaInputs(std::mt19937& rng, const cpu::DeltaShape& s, int64_t n,
                            bool zero_state) {
  DeltaInputs in;
  const int64_t nk = s.n_key_heads, nv = s.n_value_heads, dk = s.key_head_dim,
                dv = s.value_head_dim;
  in.q = RandomFloats(rng, n * nk * dk);
  in.k = RandomFloats(rng, n * nk * dk);
  cpu::L2NormRows(in.q.data(), n * nk, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)));
  cpu::L2NormRows(in.k.data(), n * nk, dk, 1e-6f, 1.0f);
  in.v = RandomFloats(rng, n * nv * dv);
  std::uniform_real_distribution<float> gd(-2.0f, -0.01f), bd(0.05f, 0.95f);
  for (int64_t i = 0; i < n * nv; ++i) {
    in.g.push_back(gd(rng));
    in.beta.push_back(bd(rng));
  }
  in.state = zero_state ? std::vector<float>(static_cast<size_t>(nv * dk * dv), 0.0f)
                        : RandomFloats(rng, nv * dk * dv, 0.3f);
  return in;
}

// Both forms from `in` over n tokens against the float64 reference's output and state (within
// 1e-5); returns the chunked form's output and state, then the recurrent form's.
std::vector<float> ExpectBothFormsNearTheReference(const cpu::OpContext& ctx,
                                                   const cpu::DeltaShape& s, const DeltaInputs& in,
                                                   int64_t n) {
  std::vector<double> ref_state(in.state.begin(), in.state.end()), ref_out;
  ReferenceDelta(s, in.q, in.k, in.v, in.g, in.beta, n, &ref_state, &ref_out);
  const std::vector<float> want_out(ref_out.begin(), ref_out.end());
  const std::vector<float> want_state(ref_state.begin(), ref_state.end());
  std::vector<float> scratch(static_cast<size_t>(cpu::DeltaChunkScratchFloats(ctx, s)));
  std::vector<float> rs = in.state, ro(want_out.size());
  cpu::GatedDeltaRecurrent(ctx, s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                           in.beta.data(), n, rs.data(), ro.data());
  EXPECT_LT(testing::RelativeError(ro, want_out), 1e-5);
  EXPECT_LT(testing::RelativeError(rs, want_state), 1e-5);
  std::vector<float> cs = in.state, co(want_out.size());
  cpu::GatedDeltaChunked(ctx, s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                         n, cs.data(), co.data(), scratch);
  EXPECT_LT(testing::RelativeError(co, want_out), 1e-5);
  EXPECT_LT(testing::RelativeError(cs, want_state), 1e-5);
  for (const std::vector<float>* part : {&cs, &ro, &rs})
    co.insert(co.end(), part->begin(), part->end());
  return co;
}

TEST(DeltaNet, RecurrentAndChunkedMatchTheReference) {
  const cpu::DeltaShape s{2, 4, 16, 24};
  ThreadPool pool(2);
  for (cpu::KernelSet kernels : {cpu::KernelSet::kReference, cpu::KernelSet::kAvx2}) {
    if (kernels == cpu::KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
    const cpu::OpContext ctx{kernels, &pool};
    for (int64_t n : {1, 2, 17, 63, 64, 65, 130}) {
      for (bool zero_state : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + (zero_state ? " zero state" : " state") +
                     (kernels == cpu::KernelSet::kAvx2 ? " avx2" : " reference"));
        std::mt19937 rng(static_cast<uint32_t>(100 + n));
        ExpectBothFormsNearTheReference(ctx, s, MakeDeltaInputs(rng, s, n, zero_state), n);
      }
    }
  }
}

TEST(DeltaNet, ChunkedOverASplitSequenceCarriesTheState) {
  const cpu::DeltaShape s{1, 2, 16, 16};
  const cpu::OpContext ctx{cpu::KernelSet::kReference, nullptr};
  std::vector<float> scratch(static_cast<size_t>(cpu::DeltaChunkScratchFloats(ctx, s)));
  std::mt19937 rng(9);
  const int64_t n = 100;
  const DeltaInputs in = MakeDeltaInputs(rng, s, n, true);
  std::vector<float> whole_state = in.state, whole(static_cast<size_t>(n * 2 * 16));
  cpu::GatedDeltaChunked(ctx, s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                         n, whole_state.data(), whole.data(), scratch);
  // 37 + 1 (recurrent) + 62, the way a snapshot or a decode step splits it.
  std::vector<float> split_state = in.state, split(whole.size());
  int64_t at = 0;
  for (int64_t len : {37, 1, 62}) {
    const int64_t kq = at * 16, vq = at * 2 * 16, gq = at * 2;
    if (len == 1) {
      cpu::GatedDeltaRecurrent(ctx, s, in.q.data() + kq, in.k.data() + kq, in.v.data() + vq,
                               in.g.data() + gq, in.beta.data() + gq, len, split_state.data(),
                               split.data() + vq);
    } else {
      cpu::GatedDeltaChunked(ctx, s, in.q.data() + kq, in.k.data() + kq, in.v.data() + vq,
                             in.g.data() + gq, in.beta.data() + gq, len, split_state.data(),
                             split.data() + vq, scratch);
    }
    at += len;
  }
  EXPECT_LT(testing::RelativeError(split, whole), 1e-5);
  EXPECT_LT(testing::RelativeError(split_state, whole_state), 1e-5);
}

TEST(DeltaNet, ThreadCountDoesNotChangeTheBits) {
  const cpu::DeltaShape s{2, 8, 16, 16};
  std::mt19937 rng(11);
  const int64_t n = 90;
  const DeltaInputs in = MakeDeltaInputs(rng, s, n, false);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    const cpu::OpContext ctx{
        cpu::CpuHasAvx2Fma() ? cpu::KernelSet::kAvx2 : cpu::KernelSet::kReference, &pool};
    std::vector<float> scratch(static_cast<size_t>(cpu::DeltaChunkScratchFloats(ctx, s)));
    std::vector<float> st = in.state, out(static_cast<size_t>(n * 8 * 16));
    cpu::GatedDeltaChunked(ctx, s, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                           in.beta.data(), n, st.data(), out.data(), scratch);
    out.insert(out.end(), st.begin(), st.end());
    outs.push_back(out);
  }
  EXPECT_TRUE(testing::SameBits(outs[1], outs[0]));
  EXPECT_TRUE(testing::SameBits(outs[2], outs[0]));
}

// Qwen3.5's head dimensions (128 x 128), whose rows the AVX2 build of the delta rule takes 64
// floats at a time in registers: both kernel sets give the same bits, within 1e-5 of the float64
// reference, over 130 tokens (two full chunks and a partial one).
TEST(DeltaNet, RealHeadDimsGiveTheSameBitsInBothKernelSets) {
  const cpu::DeltaShape s{2, 4, 128, 128};
  const int64_t n = 130;
  std::mt19937 rng(31);
  const DeltaInputs in = MakeDeltaInputs(rng, s, n, false);
  ThreadPool pool(2);
  std::vector<std::vector<float>> results;
  for (cpu::KernelSet kernels : {cpu::KernelSet::kReference, cpu::KernelSet::kAvx2}) {
    if (kernels == cpu::KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
    results.push_back(ExpectBothFormsNearTheReference(cpu::OpContext{kernels, &pool}, s, in, n));
  }
  for (const std::vector<float>& r : results) EXPECT_TRUE(testing::SameBits(r, results[0]));
}

// Heads that forget fast (g from -12 to -4 per token: decays down to e^-768 within a chunk, far
// below f32's normal range, where the ops flush subnormals to zero): both forms still match the
// float64 reference, both kernel sets give the same bits, and the flush ends with the call: the
// calling thread's and the pool threads' MXCSR are as they were.
TEST(DeltaNet, FastDecayMatchesTheReferenceAndRestoresTheFloatMode) {
  const cpu::DeltaShape s{2, 4, 16, 24};
  const int64_t n = 130;
  std::mt19937 rng(77);
  DeltaInputs in = MakeDeltaInputs(rng, s, n, false);
  std::uniform_real_distribution<float> fast(-12.0f, -4.0f);
  for (float& g : in.g) g = fast(rng);
  ThreadPool pool(2);
  auto csr_of_threads = [&] {
    std::vector<unsigned> csr(3);
    csr[2] = _mm_getcsr();
    pool.ParallelFor(2, 1, [&](int64_t, int64_t, int thread) {
      csr[static_cast<size_t>(thread)] = _mm_getcsr();
    });
    return csr;
  };
  const std::vector<unsigned> csr_before = csr_of_threads();
  std::vector<std::vector<float>> results;
  for (cpu::KernelSet kernels : {cpu::KernelSet::kReference, cpu::KernelSet::kAvx2}) {
    if (kernels == cpu::KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
    results.push_back(ExpectBothFormsNearTheReference(cpu::OpContext{kernels, &pool}, s, in, n));
  }
  for (const std::vector<float>& r : results) EXPECT_TRUE(testing::SameBits(r, results[0]));
  EXPECT_EQ(csr_of_threads(), csr_before);
  volatile float tiny = 1e-38f;
  EXPECT_GT(tiny * 0.5f, 0.0f);  // subnormal results are kept again on this thread
}

}  // namespace
}  // namespace kestrel
