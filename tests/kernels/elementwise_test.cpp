// The element-wise ops shared by both kernel sets, against direct double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "backends/cpu/ops.h"
#include "kernel_test_util.h"

namespace kestrel {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(EmbeddingGather, CopiesRowsOfEveryDtype) {
  std::mt19937 rng(31);
  for (DType dt : kDTypes) {
    testing::OwnedWeights table = testing::MakeWeights(rng, dt, {50, 13}, 3);
    const std::vector<int32_t> ids = {7, 0, 49, 7};
    std::vector<float> out(ids.size() * 13);
    cpu::EmbeddingGather(table.view, ids, out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t j = 0; j < 13; ++j) {
        ASSERT_EQ(out[i * 13 + j], table.values[ids[i] * 13 + j]) << testing::DTypeLabel(dt);
      }
    }
  }
}

TEST(RmsNorm, MatchesDoubleFormulaInPlaceAndOutOfPlace) {
  std::mt19937 rng(32);
  for (DType dt : kDTypes) {
    for (int64_t d : {1, 7, 64, 1000}) {
      testing::OwnedWeights w = testing::MakeWeights(rng, dt, {d}, 1);
      std::vector<float> x = testing::RandomFloats(rng, 3 * d, 3.0f);
      const float eps = 1e-6f;
      std::vector<float> y(x.size());
      cpu::RmsNorm(x.data(), 3, d, w.view, eps, y.data());
      std::vector<float> y_inplace = x;
      cpu::RmsNorm(y_inplace.data(), 3, d, w.view, eps, y_inplace.data());
      EXPECT_TRUE(testing::SameBits(y, y_inplace));
      for (int64_t r = 0; r < 3; ++r) {
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[r * d + j]) * x[r * d + j];
        const double inv = 1.0 / std::sqrt(ss / d + eps);
        for (int64_t j = 0; j < d; ++j) {
          const double want = w.values[j] * (x[r * d + j] * inv);
          ASSERT_NEAR(y[r * d + j], want, 1e-5 * (std::fabs(want) + 1e-3)) << d;
        }
      }
    }
  }
}

TEST(Rope, RotatesPairsHalfApartWithScaledTables) {
  std::mt19937 rng(33);
  const int64_t n_heads = 3, head_dim = 10, n_half = 4;  // partial rotation: dims 8, 9 untouched
  const std::vector<int32_t> positions = {0, 1, 17, 4000};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  const float scaling = 1.25f;
  std::vector<float> cos(positions.size() * n_half), sin(cos.size());
  cpu::RopeTables(positions, inv_freq, scaling, cos.data(), sin.data());
  std::vector<float> x = testing::RandomFloats(rng, 4 * n_heads * head_dim);
  std::vector<float> y = x;
  cpu::ApplyRope(y.data(), 4, n_heads, head_dim, cos.data(), sin.data(), n_half);
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t i = 0; i < n_half; ++i) {
      // The angle is the f32 product, as transformers computes it.
      const double angle = static_cast<float>(positions[t]) * inv_freq[i];
      ASSERT_NEAR(cos[t * n_half + i], std::cos(angle) * scaling, 1e-6);
      ASSERT_NEAR(sin[t * n_half + i], std::sin(angle) * scaling, 1e-6);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* a = x.data() + (t * n_heads + h) * head_dim;
      const float* b = y.data() + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < n_half; ++i) {
        const double c = cos[t * n_half + i], s = sin[t * n_half + i];
        EXPECT_NEAR(b[i], a[i] * c - a[i + n_half] * s, 1e-5);
        EXPECT_NEAR(b[i + n_half], a[i + n_half] * c + a[i] * s, 1e-5);
      }
      EXPECT_EQ(b[8], a[8]);
      EXPECT_EQ(b[9], a[9]);
    }
  }
  // Position 0 with scaling 1 is the identity.
  std::vector<float> c1(4), s1(4);
  const std::vector<int32_t> zero = {0};
  cpu::RopeTables(zero, inv_freq, 1.0f, c1.data(), s1.data());
  std::vector<float> z = testing::RandomFloats(rng, head_dim);
  std::vector<float> z2 = z;
  cpu::ApplyRope(z2.data(), 1, 1, head_dim, c1.data(), s1.data(), n_half);
  EXPECT_TRUE(testing::SameBits(z, z2));
}

TEST(SiluMul, BothKernelSetsMatchFormula) {
  std::mt19937 rng(34);
  std::vector<float> g = testing::RandomFloats(rng, 1001, 8.0f);
  std::vector<float> u = testing::RandomFloats(rng, 1001);
  // Extremes: exp overflow / underflow on either side, zero, tiny values.
  const float special[] = {-100.0f, 100.0f, -87.5f, 87.5f, 0.0f, -0.0f, 1e-30f, -1e-30f, -20.0f};
  for (size_t i = 0; i < std::size(special); ++i) g[i * 7] = special[i];
  ThreadPool pool(2);
  std::vector<cpu::OpContext> sets = {cpu::OpContext{}};
  if (cpu::CpuHasAvx2Fma()) sets.push_back({cpu::KernelSet::kAvx2, &pool});
  for (const cpu::OpContext& ctx : sets) {
    std::vector<float> out(g.size());
    cpu::SiluMul(ctx, g.data(), u.data(), static_cast<int64_t>(g.size()), out.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      ASSERT_NEAR(out[i], want, 1e-6 * (std::fabs(want) + 1e-6))
          << KernelSetName(ctx.kernels) << " g=" << g[i];
    }
    // In place (out aliases gate).
    std::vector<float> inplace = g;
    cpu::SiluMul(ctx, inplace.data(), u.data(), static_cast<int64_t>(g.size()), inplace.data());
    EXPECT_TRUE(testing::SameBits(inplace, out)) << KernelSetName(ctx.kernels);
  }
}

}  // namespace
}  // namespace kestrel
