// LinearEngine and SkinnyLinear against a float64 reference of the same bf16 inputs.
// Per shape: every m of kRows on the cuBLASLt path, every m <= kSkinnyKernelMaxRows on the skinny
// kernel; each output poisoned first (NaN), checked for determinism (two runs bitwise equal),
// and the skinny kernel for batch invariance (row i of an m-row call bitwise equals the 1-row call
// on x[i]). The reference is computed on a sample of outputs (all outputs of small shapes) to keep
// the host cost near a second; the two GPU paths are also compared with each other on every
// output.
#include "backends/cuda/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"  // KCHECK, used by cuda_test_util.h
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

namespace kt = ::kestrel::cuda::testing;

struct Shape {
  int64_t n, k;
};

constexpr int64_t kRows[] = {1, 2, 3, 4, 7, 8, 16, 33, 64, 65, 200, 1000, 1400};
constexpr int64_t kMaxRows = 1400;

// Skinny kernel: accumulator chains of k/128 mma's, then 8 partials added in f32; the expected
// error is ~2e-6 relative at k = 12288.
constexpr double kSkinnyTol = 1e-5;

// cuBLASLt walks all of k in one accumulator chain of k/16 tensor-core additions, and the tensor
// cores truncate each addition (round toward zero). The truncation errors are correlated (they
// all pull towards zero along the running sum), which predicts ~1.6e-9 * k relative: 6e-6 at
// k = 4096 but ~2e-5 at k = 12288. So the bound grows with k instead of a flat 1e-5.
double CublasTol(int64_t k) { return std::max(1e-5, 3e-9 * static_cast<double>(k)); }

// Random bf16 in (-1, 1) with no exact zeros (a zero hides a wrong index as well as a poisoned
// output would be hidden by zero inputs).
std::vector<uint16_t> RandomNonzeroBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v = kt::RandomBf16(n, seed);
  for (uint16_t& b : v) {
    if ((b & 0x7FFF) == 0) b = 0x3C00;  // 2^-7
  }
  return v;
}

// Token rows of an m-row result compared with the reference: all for m <= 8, else both ends,
// the middle and the thirds (rows in several 8-row tiles).
std::vector<int64_t> SampleRows(int64_t m) {
  std::vector<int64_t> rows;
  if (m <= 8) {
    for (int64_t i = 0; i < m; ++i) rows.push_back(i);
  } else {
    rows = {0, 1, m / 3, m / 2, 2 * m / 3, m - 2, m - 1};
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Columns: all when the reference stays within ~24M multiply-adds; else the first and last 40
// (partial tiles at both ends) and an odd stride between them, which visits every residue
// modulo the 16-row tiles.
std::vector<int64_t> SampleCols(int64_t n, int64_t k, size_t n_rows) {
  const int64_t budget = std::max<int64_t>(160, 24'000'000 / (k * static_cast<int64_t>(n_rows)));
  std::vector<int64_t> cols;
  if (n <= budget) {
    for (int64_t j = 0; j < n; ++j) cols.push_back(j);
    return cols;
  }
  int64_t stride = (n - 80 + (budget - 80) - 1) / (budget - 80);
  if (stride % 2 == 0) ++stride;
  for (int64_t j = 0; j < 40; ++j) cols.push_back(j);
  for (int64_t j = 40; j < n - 40; j += stride) cols.push_back(j);
  for (int64_t j = n - 40; j < n; ++j) cols.push_back(j);
  return cols;
}

// y[r, c] = sum_k x[r, k] * w[c, k] in float64 for the sampled (r, c), row-major over (rows, cols).
std::vector<float> Reference(const std::vector<float>& x,  // [*, k]
                             const std::vector<float>& w,  // [n, k]
                             int64_t k, const std::vector<int64_t>& rows,
                             const std::vector<int64_t>& cols) {
  std::vector<float> ref;
  ref.reserve(rows.size() * cols.size());
  for (int64_t r : rows) {
    const float* xr = x.data() + r * k;
    for (int64_t c : cols) {
      const float* wc = w.data() + c * k;
      double s[4] = {0, 0, 0, 0};  // four chains: the host reference is latency bound otherwise
      for (int64_t i = 0; i < k; i += 4) {
        for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(xr[i + j]) * wc[i + j];
      }
      ref.push_back(static_cast<float>((s[0] + s[1]) + (s[2] + s[3])));
    }
  }
  return ref;
}

std::vector<float> Gather(const std::vector<float>& y, int64_t n, const std::vector<int64_t>& rows,
                          const std::vector<int64_t>& cols) {
  std::vector<float> out;
  out.reserve(rows.size() * cols.size());
  for (int64_t r : rows) {
    for (int64_t c : cols) out.push_back(y[r * n + c]);
  }
  return out;
}

bool AllFinite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
}

bool BitwiseEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class LinearShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearShapeTest, MatchesFloat64ReferenceOnBothPaths) {
  KESTREL_REQUIRE_CUDA();
  const auto [n, k] = GetParam();
  ASSERT_EQ(k % 8, 0);

  const std::vector<uint16_t> x_bf16 = RandomNonzeroBf16(kMaxRows * k, 1000 + k);  // [1000, k]
  const std::vector<uint16_t> w_bf16 = RandomNonzeroBf16(n * k, 2000 + n);         // [n, k]
  const std::vector<float> x_f32 = kt::Bf16ToF32(x_bf16);
  const std::vector<float> w_f32 = kt::Bf16ToF32(w_bf16);
  const DeviceBuffer x_dev = kt::Upload(x_bf16);
  const DeviceBuffer w_dev = kt::Upload(w_bf16);
  const auto* x = x_dev.as<const __nv_bfloat16>();  // [1000, k]
  const auto* w = w_dev.as<const __nv_bfloat16>();  // [n, k]

  auto engine_or = LinearEngine::Create();
  ASSERT_TRUE(engine_or.ok()) << engine_or.status().message();
  LinearEngine& engine = *engine_or.value();

  // The skinny kernel on one token row at a time, for the batch-invariance check.
  const int64_t n_single = kSkinnyKernelMaxRows;
  DeviceBuffer single_dev = kt::Poisoned<float>(n_single * n);  // [64, n]
  for (int64_t i = 0; i < n_single; ++i) {
    SkinnyLinear(x + i * k, 1, k, w, n, single_dev.as<float>() + i * n, nullptr);
  }
  const std::vector<float> single = kt::Download<float>(single_dev, n_single * n);
  ASSERT_TRUE(AllFinite(single));

  // Runs one path twice (each into a freshly poisoned buffer), checks that every output was
  // written and that the runs agree bitwise, returns the first.
  auto run_twice = [&](auto&& fn, int64_t m, const char* path) {
    std::vector<float> out[2];
    for (auto& o : out) {
      DeviceBuffer y_dev = kt::Poisoned<float>(m * n);
      fn(y_dev.as<float>());
      o = kt::Download<float>(y_dev, m * n);
    }
    EXPECT_TRUE(AllFinite(out[0])) << path << ": unwritten or non-finite output, m=" << m;
    EXPECT_TRUE(BitwiseEqual(out[0].data(), out[1].data(), out[0].size()))
        << path << ": two runs differ, m=" << m;
    return out[0];
  };

  for (const int64_t m : kRows) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " m=" << m);
    const std::vector<int64_t> rows = SampleRows(m);
    const std::vector<int64_t> cols = SampleCols(n, k, rows.size());
    const std::vector<float> ref = Reference(x_f32, w_f32, k, rows, cols);

    const std::vector<float> y_lt = run_twice(
        [&](float* y) { engine.RunCublasLt(x, m, k, w, n, y, nullptr); }, m, "cublaslt");
    const double err_lt = kt::RelL2(Gather(y_lt, n, rows, cols), ref);
    EXPECT_LE(err_lt, CublasTol(k)) << "cublaslt";
    RecordProperty("rel_l2_cublaslt_n" + std::to_string(n) + "_k" + std::to_string(k) + "_m" +
                       std::to_string(m),
                   std::to_string(err_lt));

    std::vector<float> y_sk;
    if (m <= kSkinnyKernelMaxRows) {
      y_sk = run_twice([&](float* y) { SkinnyLinear(x, m, k, w, n, y, nullptr); }, m, "skinny");
      const double err_sk = kt::RelL2(Gather(y_sk, n, rows, cols), ref);
      EXPECT_LE(err_sk, kSkinnyTol) << "skinny";
      RecordProperty("rel_l2_skinny_n" + std::to_string(n) + "_k" + std::to_string(k) + "_m" +
                         std::to_string(m),
                     std::to_string(err_sk));
      // Both paths on every output: catches a wrong element the sample missed.
      EXPECT_LE(kt::RelL2(y_sk, y_lt), kSkinnyTol + CublasTol(k)) << "skinny vs cublaslt";
      const bool same_variant = m <= SkinnyVariantMaxRows(DefaultSkinnyVariant());
      for (int64_t i = 0; same_variant && i < m; ++i) {
        EXPECT_TRUE(BitwiseEqual(y_sk.data() + i * n, single.data() + i * n, n))
            << "skinny: row " << i << " of the " << m << "-row call differs from the 1-row call";
      }
    }

    // Run takes the path PathName names, with bitwise the same result.
    const std::vector<float> y_run =
        run_twice([&](float* y) { engine.Run(x, m, k, w, n, y, nullptr); }, m, "run");
    const std::vector<float>& expected =
        std::string(LinearEngine::PathName(m)) == "skinny" ? y_sk : y_lt;
    ASSERT_EQ(expected.size(), y_run.size()) << LinearEngine::PathName(m);
    EXPECT_TRUE(BitwiseEqual(y_run.data(), expected.data(), y_run.size()))
        << "Run differs from its path " << LinearEngine::PathName(m);
  }
}

// Every skinny variant at every m it supports (up to 16): f64 reference, poisoned outputs, two
// runs bitwise equal, and row i equal to the variant's 1-row call where it claims invariance.
TEST_P(LinearShapeTest, EverySkinnyVariantMatchesReference) {
  KESTREL_REQUIRE_CUDA();
  const auto [n, k] = GetParam();
  const int64_t max_m = 16;
  const std::vector<uint16_t> x_bf16 = RandomNonzeroBf16(max_m * k, 3000 + k);  // [16, k]
  const std::vector<uint16_t> w_bf16 = RandomNonzeroBf16(n * k, 4000 + n);     // [n, k]
  const std::vector<float> x_f32 = kt::Bf16ToF32(x_bf16);
  const std::vector<float> w_f32 = kt::Bf16ToF32(w_bf16);
  const DeviceBuffer x_dev = kt::Upload(x_bf16);
  const DeviceBuffer w_dev = kt::Upload(w_bf16);
  const auto* x = x_dev.as<const __nv_bfloat16>();
  const auto* w = w_dev.as<const __nv_bfloat16>();
  for (int v = 0; v < SkinnyVariantCount(); ++v) {
    const int64_t vmax = std::min<int64_t>(max_m, SkinnyVariantMaxRows(v));
    // One-row variants ("stream", "auto") or ones that cover at least 8 rows.
    ASSERT_TRUE(vmax == 1 || vmax >= 8) << SkinnyVariantName(v);
    auto run = [&](const __nv_bfloat16* xs, int64_t m) {
      DeviceBuffer y_dev = kt::Poisoned<float>(m * n);
      SkinnyLinearVariant(v, xs, m, k, w, n, y_dev.as<float>(), nullptr);
      return kt::Download<float>(y_dev, m * n);
    };
    std::vector<float> single(vmax * n);
    for (int64_t i = 0; i < vmax; ++i) {
      const std::vector<float> yi = run(x + i * k, 1);
      std::copy(yi.begin(), yi.end(), single.begin() + i * n);
    }
    for (int64_t m = 1; m <= vmax; ++m) {
      SCOPED_TRACE(::testing::Message() << SkinnyVariantName(v) << " n=" << n << " k=" << k
                                        << " m=" << m);
      const std::vector<float> y0 = run(x, m);
      const std::vector<float> y1 = run(x, m);
      EXPECT_TRUE(AllFinite(y0)) << "unwritten or non-finite output";
      EXPECT_TRUE(BitwiseEqual(y0.data(), y1.data(), y0.size())) << "two runs differ";
      const std::vector<int64_t> rows = SampleRows(m);
      const std::vector<int64_t> cols = SampleCols(n, k, rows.size());
      const std::vector<float> ref = Reference(x_f32, w_f32, k, rows, cols);
      EXPECT_LE(kt::RelL2(Gather(y0, n, rows, cols), ref), kSkinnyTol);
      if (SkinnyVariantBatchInvariant(v)) {
        for (int64_t i = 0; i < m; ++i) {
          EXPECT_TRUE(BitwiseEqual(y0.data() + i * n, single.data() + i * n, n))
              << "row " << i << " differs from the 1-row call";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearShapeTest,
    ::testing::Values(Shape{64, 64}, Shape{8003, 256}, Shape{6144, 4096}, Shape{4096, 12288},
                      Shape{1000, 520}, Shape{768, 256}, Shape{256, 768}, Shape{1536, 256},
                      // Edge cases of the k loop: k below one 32-wide chunk, one 128-wide step
                      // plus a partial one, and 9 steps so warp 0 wraps to a partial step 8.
                      Shape{5, 8}, Shape{17, 136}, Shape{40, 1160}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      return "n" + std::to_string(info.param.n) + "_k" + std::to_string(info.param.k);
    });

TEST(CudaLinear, SkinnyVariantRegistry) {
  KESTREL_REQUIRE_CUDA();
  ASSERT_GE(SkinnyVariantCount(), 2);
  EXPECT_STREQ(SkinnyVariantName(0), "tc16");
  EXPECT_EQ(SkinnyVariantMaxRows(0), kSkinnyKernelMaxRows);
  const int saved = DefaultSkinnyVariant();
  for (int v = 0; v < SkinnyVariantCount(); ++v) {
    EXPECT_EQ(FindSkinnyVariant(SkinnyVariantName(v)), v);
    SetDefaultSkinnyVariant(v);
    EXPECT_EQ(DefaultSkinnyVariant(), v);
  }
  SetDefaultSkinnyVariant(saved);
  EXPECT_EQ(FindSkinnyVariant("no such variant"), -1);
}

TEST(CudaLinear, PathNameFollowsSkinnyMaxRows) {
  KESTREL_REQUIRE_CUDA();
  static_assert(kSkinnyMaxRows >= 1 && kSkinnyMaxRows <= kSkinnyKernelMaxRows);
  EXPECT_STREQ(LinearEngine::PathName(1), "skinny");
  EXPECT_STREQ(LinearEngine::PathName(kSkinnyMaxRows), "skinny");
  EXPECT_STREQ(LinearEngine::PathName(kSkinnyMaxRows + 1), "cublaslt");
}

// Run inside a captured CUDA graph gives bitwise what a direct call gives, on both paths.
TEST(CudaLinear, RunIsCapturableInAGraph) {
  KESTREL_REQUIRE_CUDA();
  const int64_t n = 1000, k = 520;
  const int64_t ms[] = {1, kSkinnyMaxRows + 1};
  const std::vector<uint16_t> x_bf16 = RandomNonzeroBf16(ms[1] * k, 7);
  const std::vector<uint16_t> w_bf16 = RandomNonzeroBf16(n * k, 8);
  const DeviceBuffer x_dev = kt::Upload(x_bf16);
  const DeviceBuffer w_dev = kt::Upload(w_bf16);
  const auto* x = x_dev.as<const __nv_bfloat16>();  // [ms[1], k]
  const auto* w = w_dev.as<const __nv_bfloat16>();  // [n, k]
  auto engine_or = LinearEngine::Create();
  ASSERT_TRUE(engine_or.ok()) << engine_or.status().message();
  LinearEngine& engine = *engine_or.value();

  cudaStream_t stream;
  KCUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const int64_t m : ms) {
    DeviceBuffer direct_dev = kt::Poisoned<float>(m * n);  // [m, n]
    DeviceBuffer graph_dev = kt::Poisoned<float>(m * n);   // [m, n]
    engine.Run(x, m, k, w, n, direct_dev.as<float>(), stream);  // also picks the algorithm
    KCUDA_CHECK(cudaStreamSynchronize(stream));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KCUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    engine.Run(x, m, k, w, n, graph_dev.as<float>(), stream);
    KCUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KCUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KCUDA_CHECK(cudaGraphLaunch(exec, stream));
    KCUDA_CHECK(cudaStreamSynchronize(stream));
    KCUDA_CHECK(cudaGraphExecDestroy(exec));
    KCUDA_CHECK(cudaGraphDestroy(graph));

    const std::vector<float> direct = kt::Download<float>(direct_dev, m * n);
    const std::vector<float> graphed = kt::Download<float>(graph_dev, m * n);
    EXPECT_TRUE(AllFinite(graphed)) << LinearEngine::PathName(m);
    EXPECT_TRUE(BitwiseEqual(direct.data(), graphed.data(), direct.size()))
        << LinearEngine::PathName(m);
  }
  KCUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace kestrel::cuda
