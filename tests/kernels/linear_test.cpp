// Linear (y = x W^T + b): the reference against double precision, and the AVX2 kernels against
// the reference over shapes, dtypes, alignments and thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "kernel_test_util.h"

namespace kestrel {
namespace {

using cpu::KernelSet;
using cpu::OpContext;
using testing::MakeWeights;
using testing::OwnedWeights;
using testing::RandomFloats;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

std::vector<float> RunLinear(const OpContext& ctx, const std::vector<float>& x, int64_t m,
                             const TensorView& w, const TensorView& bias) {
  std::vector<float> y(static_cast<size_t>(m * w.shape[0]), -777.0f);
  cpu::Linear(ctx, x.data(), m, w, bias, y.data());
  return y;
}

// Every y element within the forward-error bound of a length-k f32 sum (plus the bias add) of
// the exact value: |y - exact| <= (k + 2) * u * (sum |x w| + |b|), u = 2^-24; times 2 for FMA
// kernels whose order differs, which stay under the same bound.
void ExpectNearExact(const std::vector<float>& y, const std::vector<float>& x, int64_t m,
                     const OwnedWeights& w, const OwnedWeights* bias, const std::string& label) {
  const int64_t n = w.view.shape[0];
  const int64_t k = w.view.shape[1];
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double p = static_cast<double>(x[i * k + l]) * w.values[j * k + l];
        exact += p;
        magnitude += std::fabs(p);
      }
      if (bias != nullptr) {
        exact += bias->values[j];
        magnitude += std::fabs(bias->values[j]);
      }
      const double bound = 2.0 * (k + 2) * u * magnitude + 1e-30;
      ASSERT_LE(std::fabs(y[i * n + j] - exact), bound)
          << label << " at (" << i << ", " << j << ")";
    }
  }
}

TEST(Linear, ReferenceIsWithinRoundingOfExact) {
  std::mt19937 rng(1);
  for (DType dt : kDTypes) {
    for (auto [m, n, k] : {std::tuple{1, 1, 1}, {3, 5, 7}, {2, 17, 300}, {5, 33, 1000}}) {
      OwnedWeights w = MakeWeights(rng, dt, {n, k}, 3);
      OwnedWeights b = MakeWeights(rng, dt, {n}, 1);
      std::vector<float> x = RandomFloats(rng, m * k);
      OpContext ref;
      ExpectNearExact(RunLinear(ref, x, m, w.view, TensorView{}), x, m, w, nullptr, "no bias");
      ExpectNearExact(RunLinear(ref, x, m, w.view, b.view), x, m, w, &b, "bias");
    }
  }
}

class LinearFast : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  }
};

TEST_F(LinearFast, MatchesReferenceOverShapesAndDtypes) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  const OpContext ref;
  const OpContext fast{KernelSet::kAvx2, &pool};
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 23, 40};
  const int64_t ns[] = {1, 7, 8, 15, 16, 17, 33, 100};
  const int64_t ks[] = {1, 7, 8, 9, 31, 64, 65, 255, 256, 257, 520};
  int n_cases = 0;
  for (DType dt : kDTypes) {
    for (int64_t n : ns) {
      for (int64_t k : ks) {
        // Byte offsets that leave the weights unaligned (odd ones for every dtype).
        const size_t offset = static_cast<size_t>((n + k) % 5);
        OwnedWeights w = MakeWeights(rng, dt, {n, k}, offset);
        OwnedWeights b = MakeWeights(rng, dt, {n}, offset + 1);
        for (int64_t m : ms) {
          std::vector<float> x = RandomFloats(rng, m * k);
          const TensorView bias = (m + n) % 2 ? b.view : TensorView{};
          std::vector<float> y_ref = RunLinear(ref, x, m, w.view, bias);
          std::vector<float> y_fast = RunLinear(fast, x, m, w.view, bias);
          const std::string label = std::string(testing::DTypeLabel(dt)) + " m=" +
                                    std::to_string(m) + " n=" + std::to_string(n) +
                                    " k=" + std::to_string(k);
          EXPECT_LE(testing::RelativeError(y_fast, y_ref), 1e-5) << label;
          ExpectNearExact(y_fast, x, m, w, bias.empty() ? nullptr : &b, label);
          ++n_cases;
        }
      }
    }
  }
  EXPECT_EQ(n_cases, 3 * 8 * 11 * 13);
}

TEST_F(LinearFast, LargeMatrixMatchesReference) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  for (DType dt : kDTypes) {
    OwnedWeights w = MakeWeights(rng, dt, {523, 1100}, 2, 0.05f);
    for (int64_t m : {1, 4, 11, 29}) {
      std::vector<float> x = RandomFloats(rng, m * 1100);
      std::vector<float> y_ref = RunLinear(OpContext{}, x, m, w.view, TensorView{});
      std::vector<float> y_fast =
          RunLinear(OpContext{KernelSet::kAvx2, &pool}, x, m, w.view, TensorView{});
      EXPECT_LE(testing::RelativeError(y_fast, y_ref), 1e-5) << testing::DTypeLabel(dt) << m;
    }
  }
}

TEST_F(LinearFast, SameBitsForAnyThreadCount) {
  std::mt19937 rng(4);
  ThreadPool pool1(1), pool2(2), pool3(3), pool5(5);
  for (DType dt : kDTypes) {
    // 701 x 777: even one token row (545K multiply-adds) is split across threads.
    OwnedWeights w = MakeWeights(rng, dt, {701, 777}, 1);
    OwnedWeights b = MakeWeights(rng, dt, {701}, 0);
    for (int64_t m : {1, 3, 4, 5, 16, 37}) {
      std::vector<float> x = RandomFloats(rng, m * 777);
      std::vector<float> y0 = RunLinear(OpContext{KernelSet::kAvx2, nullptr}, x, m, w.view, b.view);
      for (ThreadPool* p : {&pool1, &pool2, &pool3, &pool5}) {
        std::vector<float> y = RunLinear(OpContext{KernelSet::kAvx2, p}, x, m, w.view, b.view);
        EXPECT_TRUE(testing::SameBits(y, y0))
            << testing::DTypeLabel(dt) << " m=" << m << " threads=" << p->n_threads();
      }
    }
  }
}

// The packed kernel's AVX-512 register tiles (12 token rows x 16 outputs) give the AVX2 tiles'
// bits: each element is the same FMA chain over k. Row counts with and without a remainder of
// 12- and 6-row tiles, several x blocks; partial panels; k across packed blocks.
TEST_F(LinearFast, Avx512PackedKernelGivesTheAvx2Bits) {
  if (!cpu::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(9);
  ThreadPool pool(2);
  OpContext wide{KernelSet::kAvx2, &pool}, narrow{KernelSet::kAvx2, &pool};
  wide.avx512 = true;
  narrow.avx512 = false;
  for (DType dt : kDTypes) {
    for (int64_t n : {7, 16, 33, 100}) {
      for (int64_t k : {64, 257, 520}) {
        OwnedWeights w = MakeWeights(rng, dt, {n, k}, 1);
        OwnedWeights b = MakeWeights(rng, dt, {n}, 0);
        for (int64_t m : {17, 24, 29, 40, 97, 130}) {
          std::vector<float> x = RandomFloats(rng, m * k);
          EXPECT_TRUE(testing::SameBits(RunLinear(wide, x, m, w.view, b.view),
                                        RunLinear(narrow, x, m, w.view, b.view)))
              << testing::DTypeLabel(dt) << " m=" << m << " n=" << n << " k=" << k;
        }
      }
    }
  }
}

// Within one kernel family a row's result does not depend on the other rows of the batch:
// m <= kDirectMaxRows (streaming) and m > kDirectMaxRows (packed) each give fixed bits per row.
TEST_F(LinearFast, RowResultIndependentOfBatchCompositionWithinKernel) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const OpContext fast{KernelSet::kAvx2, &pool};
  for (DType dt : kDTypes) {
    const int64_t n = 70, k = 333;
    OwnedWeights w = MakeWeights(rng, dt, {n, k}, 2);
    std::vector<float> x = RandomFloats(rng, 48 * k);
    // Streaming kernel: every m in [1, kDirectMaxRows].
    std::vector<float> one = RunLinear(fast, x, 1, w.view, TensorView{});
    for (int64_t m = 2; m <= cpu::kDirectMaxRows; ++m) {
      std::vector<float> y = RunLinear(fast, x, m, w.view, TensorView{});
      y.resize(static_cast<size_t>(n));
      EXPECT_TRUE(testing::SameBits(y, one)) << testing::DTypeLabel(dt) << " m=" << m;
    }
    // Packed kernel: every m > kDirectMaxRows, compared on the first kDirectMaxRows+1 rows.
    const int64_t m0 = cpu::kDirectMaxRows + 1;
    std::vector<float> base = RunLinear(fast, x, m0, w.view, TensorView{});
    for (int64_t m : {m0 + 1, m0 + 6, m0 + 23}) {
      std::vector<float> y = RunLinear(fast, x, m, w.view, TensorView{});
      y.resize(base.size());
      EXPECT_TRUE(testing::SameBits(y, base)) << testing::DTypeLabel(dt) << " m=" << m;
    }
  }
}

// A group of projections in one parallel region gives exactly what separate calls give.
TEST(LinearGroup, SameBitsAsSeparateLinearCalls) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  std::vector<OpContext> sets = {OpContext{}};
  if (cpu::CpuHasAvx2Fma()) sets.push_back({KernelSet::kAvx2, &pool});
  OwnedWeights wa = MakeWeights(rng, DType::kBF16, {300, 200}, 1);
  OwnedWeights wb = MakeWeights(rng, DType::kF16, {33, 200}, 0);
  OwnedWeights wc = MakeWeights(rng, DType::kF32, {129, 200}, 3);
  OwnedWeights bb = MakeWeights(rng, DType::kBF16, {33}, 1);
  for (const OpContext& ctx : sets) {
    for (int64_t m : {1, 3, 16, 20}) {
      std::vector<float> x = RandomFloats(rng, m * 200);
      std::vector<float> ya(m * 300), yb(m * 33), yc(m * 129);
      const TensorView none;
      const cpu::LinearJob jobs[] = {{x.data(), &wa.view, nullptr, ya.data()},
                                     {x.data(), &wb.view, &bb.view, yb.data()},
                                     {x.data(), &wc.view, &none, yc.data()}};
      cpu::LinearGroup(ctx, m, jobs);
      EXPECT_TRUE(testing::SameBits(ya, RunLinear(ctx, x, m, wa.view, TensorView{})));
      EXPECT_TRUE(testing::SameBits(yb, RunLinear(ctx, x, m, wb.view, bb.view)));
      EXPECT_TRUE(testing::SameBits(yc, RunLinear(ctx, x, m, wc.view, TensorView{})))
          << KernelSetName(ctx.kernels) << " m=" << m;
    }
  }
}

}  // namespace
}  // namespace kestrel
