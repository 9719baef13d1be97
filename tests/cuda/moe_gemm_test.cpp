// The grouped expert GEMM (backends/cuda/moe_gemm.h) against f64 sums of the same bf16 inputs:
// tails in rows (experts of 1, 127, 128, 129 rows), in columns (n_out not a multiple of the
// 128-wide tile) and in k (not a multiple of the 32-wide step); experts without rows hold NaN
// weights, so a read of them would poison a row; y rows outside every expert keep their poison;
// x gathered through x_rows and already permuted; grids with more tiles than needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/moe_gemm.h"
#include "cuda/cuda_test_util.h"

namespace kestrel {
namespace {

using cuda::DeviceBuffer;
using cuda::testing::Download;
using cuda::testing::Poisoned;
using cuda::testing::RandomBf16;
using cuda::testing::Upload;

constexpr uint16_t kBf16NaN = 0x7FC0;

struct GemmCase {
  std::vector<int32_t> counts;  // rows of each expert
  int32_t k, n_out;
  int32_t first_row;    // expert_begin[0]: y rows [0, first_row) belong to no expert
  int32_t spare_tiles;  // grid rows past the tile count
};

// The device inputs and outputs of one case, run gathered (x_rows into the token rows) and
// already permuted (x_perm[r] = x_tok[x_rows[r]]; NaN outside the experts).
struct GemmRun {
  std::vector<int32_t> begin, tiles, x_rows;
  std::vector<uint16_t> w, x_tok, x_perm;
  int32_t y_rows = 0;
  DeviceBuffer d_w, d_x_tok, d_x_perm, d_x_rows, d_begin, d_tiles;

  GemmRun(const GemmCase& c, uint64_t seed) {
    const size_t k = size_t(c.k), per_expert = size_t(c.n_out) * k;
    begin = {c.first_row};
    tiles = {0};
    for (int32_t m : c.counts) {
      begin.push_back(begin.back() + m);
      tiles.push_back(tiles.back() + (m + cuda::kMoeGemmTileRows - 1) / cuda::kMoeGemmTileRows);
    }
    const int32_t end = begin.back();
    y_rows = end + 3;
    w = RandomBf16(c.counts.size() * per_expert, seed, -0.5f, 0.5f);
    for (size_t e = 0; e < c.counts.size(); ++e) {
      if (c.counts[e] == 0) std::fill_n(w.begin() + e * per_expert, per_expert, kBf16NaN);
    }
    // Half as many tokens as rows: most tokens feed several experts, as with top-k routing.
    const int32_t n_tokens = std::max(1, (end - c.first_row) / 2);
    x_tok = RandomBf16(size_t(n_tokens) * k, seed + 1);
    std::mt19937 rng(static_cast<uint32_t>(seed + 2));
    x_rows.assign(size_t(y_rows), -1);  // never read outside the experts
    x_perm.assign(size_t(y_rows) * k, kBf16NaN);
    for (int32_t r = c.first_row; r < end; ++r) {
      x_rows[size_t(r)] = static_cast<int32_t>(rng() % uint32_t(n_tokens));
      std::copy_n(x_tok.begin() + size_t(x_rows[size_t(r)]) * k, k, x_perm.begin() + size_t(r) * k);
    }
    d_w = Upload(w);
    d_x_tok = Upload(x_tok);
    d_x_perm = Upload(x_perm);
    d_x_rows = Upload(x_rows);
    d_begin = Upload(begin);
    d_tiles = Upload(tiles);
  }

  void Gemm(const GemmCase& c, bool gather, float* y, cudaStream_t stream) const {
    const DeviceBuffer& x = gather ? d_x_tok : d_x_perm;
    cuda::MoeGroupedGemm(x.as<const __nv_bfloat16>(), gather ? d_x_rows.as<int32_t>() : nullptr,
                         c.k, d_w.as<const __nv_bfloat16>(), c.n_out, d_begin.as<int32_t>(),
                         d_tiles.as<int32_t>(), static_cast<int32_t>(c.counts.size()),
                         tiles.back() + c.spare_tiles, y, stream);
  }
};

// Both forms against the reference (error over the largest |value| of the row), bitwise equal to
// each other, and every y row outside the experts still the 0xFF poison.
void CheckCase(const GemmCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "experts " << c.counts.size() << " k " << c.k << " n_out "
                                  << c.n_out);
  const GemmRun run(c, seed);
  const size_t y_size = size_t(run.y_rows) * size_t(c.n_out);
  DeviceBuffer d_y_gather = Poisoned<float>(y_size);
  DeviceBuffer d_y_perm = Poisoned<float>(y_size);
  run.Gemm(c, true, d_y_gather.as<float>(), nullptr);
  run.Gemm(c, false, d_y_perm.as<float>(), nullptr);
  const auto y = Download<float>(d_y_gather, y_size);
  const auto y_perm = Download<float>(d_y_perm, y_size);

  const auto xf = cuda::testing::Bf16ToF32(run.x_tok);
  const auto wf = cuda::testing::Bf16ToF32(run.w);
  const size_t k = size_t(c.k), n_out = size_t(c.n_out);
  std::vector<double> ref(n_out);
  double worst = 0;
  for (size_t e = 0; e < c.counts.size(); ++e) {
    for (int32_t r = run.begin[e]; r < run.begin[e + 1]; ++r) {
      const float* xr = xf.data() + size_t(run.x_rows[size_t(r)]) * k;
      double scale = 0;
      for (size_t o = 0; o < n_out; ++o) {
        const float* wr = wf.data() + (e * n_out + o) * k;
        double s = 0;
        for (size_t h = 0; h < k; ++h) s += double(xr[h]) * wr[h];
        ref[o] = s;
        scale = std::max(scale, std::fabs(s));
      }
      for (size_t o = 0; o < n_out; ++o) {
        const float v = y[size_t(r) * n_out + o];
        const double err = std::isfinite(v) ? std::fabs(v - ref[o]) / scale : INFINITY;
        worst = std::max(worst, err);
      }
    }
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(std::memcmp(y.data(), y_perm.data(), y_size * sizeof(float)), 0)
      << "gathered and permuted x differ";
  size_t touched = 0;
  for (int32_t r = 0; r < run.y_rows; ++r) {
    if (r >= run.begin.front() && r < run.begin.back()) continue;
    for (size_t o = 0; o < n_out; ++o) {
      uint32_t bits;
      std::memcpy(&bits, &y[size_t(r) * n_out + o], sizeof(bits));
      touched += bits != 0xFFFFFFFFu ? 1 : 0;
    }
  }
  EXPECT_EQ(touched, 0u) << "values written outside the experts' rows";
}

TEST(CudaMoeGemm, TailsAndEmptyExpertsMatchTheReference) {
  KESTREL_REQUIRE_CUDA();
  const std::vector<int32_t> counts = {0, 1, 127, 128, 129, 300, 0, 5};
  for (int32_t k : {64, 136, 2048}) {
    for (int32_t n_out : {96, 1024, 130}) CheckCase({counts, k, n_out, 3, 2}, uint64_t(k + n_out));
  }
}

// Prefill-sized routing: 256 experts and ~16k rows, some experts empty, some past one tile; and
// 512 experts, more than the kernel's threads, so the tile lookup loops.
TEST(CudaMoeGemm, ManyExpertsMatchTheReference) {
  KESTREL_REQUIRE_CUDA();
  std::mt19937 rng(5);
  std::vector<int32_t> counts(256);
  for (int32_t& m : counts) m = static_cast<int32_t>(rng() % 128);
  for (size_t e = 0; e < counts.size(); e += 17) counts[e] = 0;
  counts[100] = 300;
  counts[200] = 129;
  CheckCase({counts, 136, 130, 0, 40}, 11);

  counts.assign(512, 0);
  for (int32_t& m : counts) m = rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 40);
  counts[300] = 257;
  counts[511] = 128;
  CheckCase({counts, 64, 96, 1, 1}, 12);
}

// Launched inside a captured CUDA graph it gives bitwise what a direct call gives.
TEST(CudaMoeGemm, IsCapturableInAGraph) {
  KESTREL_REQUIRE_CUDA();
  const GemmCase c{{0, 1, 127, 128, 129, 300, 0, 5}, 136, 130, 0, 1};
  const GemmRun run(c, 21);
  const size_t y_size = size_t(run.y_rows) * size_t(c.n_out);
  DeviceBuffer direct_dev = Poisoned<float>(y_size);
  DeviceBuffer graph_dev = Poisoned<float>(y_size);
  cudaStream_t stream;
  KCUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run.Gemm(c, true, direct_dev.as<float>(), stream);
  KCUDA_CHECK(cudaStreamSynchronize(stream));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KCUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  run.Gemm(c, true, graph_dev.as<float>(), stream);
  KCUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  KCUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  KCUDA_CHECK(cudaGraphLaunch(exec, stream));
  KCUDA_CHECK(cudaStreamSynchronize(stream));
  KCUDA_CHECK(cudaGraphExecDestroy(exec));
  KCUDA_CHECK(cudaGraphDestroy(graph));
  KCUDA_CHECK(cudaStreamDestroy(stream));

  const auto direct = Download<float>(direct_dev, y_size);
  const auto graphed = Download<float>(graph_dev, y_size);
  EXPECT_TRUE(std::all_of(direct.begin() + c.first_row * c.n_out,
                          direct.begin() + run.begin.back() * c.n_out,
                          [](float v) { return std::isfinite(v); }));
  EXPECT_EQ(std::memcmp(direct.data(), graphed.data(), y_size * sizeof(float)), 0);
}

}  // namespace
}  // namespace kestrel
