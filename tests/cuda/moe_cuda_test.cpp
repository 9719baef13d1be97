// The MoE kernels (backends/cuda/moe.h) against a CPU reference written here from the CPU
// decoder's definition (cpu_decoder.cpp, CpuDecoder::Moe): softmax top-k with ties to the lower
// id and renormalisation, the grouping of token rows by expert, the grouped expert GEMMs reading
// only routed experts, and the weighted sum with the gated shared expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backends/cuda/activation.h"
#include "backends/cuda/moe.h"
#include "backends/cuda/moe_gemm.h"
#include "cuda/cuda_test_util.h"

namespace kestrel {
namespace {

using cuda::DeviceBuffer;
using cuda::testing::Download;
using cuda::testing::Poisoned;
using cuda::testing::RandomBf16;
using cuda::testing::RandomF32;
using cuda::testing::Upload;

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routing CpuRoute(const std::vector<float>& logits, int64_t stride, int n, int n_e, int k,
                 bool norm) {
  Routing r;
  std::vector<float> p(static_cast<size_t>(n_e));
  std::vector<int32_t> order(static_cast<size_t>(n_e));
  for (int t = 0; t < n; ++t) {
    const float* row = logits.data() + t * stride;
    const float mx = *std::max_element(row, row + n_e);
    float sum = 0;
    for (int e = 0; e < n_e; ++e) sum += (p[e] = std::exp(row[e] - mx));
    for (int e = 0; e < n_e; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float top = 0;
    for (int j = 0; j < k; ++j) top += p[order[j]];
    for (int j = 0; j < k; ++j) {
      r.ids.push_back(order[j]);
      r.w.push_back(norm ? p[order[j]] / top : p[order[j]]);
    }
  }
  return r;
}

struct DeviceRouting {
  DeviceBuffer ids, w, begin, active, n_active, rows, pos, tiles, log;
  cuda::MoeRouting view;
  DeviceRouting(int n, int n_e, int k)
      : ids(Poisoned<int32_t>(size_t(n) * k)),
        w(Poisoned<float>(size_t(n) * k)),
        begin(Poisoned<int32_t>(size_t(n_e) + 1)),
        active(Poisoned<int32_t>(size_t(n_e))),
        n_active(Poisoned<int32_t>(1)),
        rows(Poisoned<int32_t>(size_t(n) * k)),
        pos(Poisoned<int32_t>(size_t(n) * k)),
        tiles(Poisoned<int32_t>(size_t(n_e) + 1)),
        log(Poisoned<int32_t>(1)) {
    view = {ids.as<int32_t>(),      w.as<float>(),      begin.as<int32_t>(), active.as<int32_t>(),
            n_active.as<int32_t>(), rows.as<int32_t>(), pos.as<int32_t>(),   tiles.as<int32_t>()};
  }
};

TEST(CudaMoe, RouteMatchesTheCpuAndGroupsRowsByExpert) {
  KESTREL_REQUIRE_CUDA();
  for (const auto& [n, n_e, k, norm] : std::vector<std::tuple<int, int, int, bool>>{
           {1, 8, 2, true}, {5, 64, 8, false}, {37, 256, 8, true}, {300, 512, 10, true}}) {
    SCOPED_TRACE(testing::Message() << "n " << n << " experts " << n_e << " k " << k);
    const int64_t stride = n_e + 1;  // the shared-expert gate column rides along
    std::vector<float> logits = RandomF32(size_t(n) * stride, 11 + n, -4.0f, 4.0f);
    // Exact ties: expert 3 copies expert 1 in every other token (the lower id must win).
    for (int t = 0; t < n; t += 2) logits[size_t(t) * stride + 3] = logits[size_t(t) * stride + 1];
    const Routing want = CpuRoute(logits, stride, n, n_e, k, norm);
    const DeviceBuffer d_logits = Upload(logits);
    DeviceRouting r(n, n_e, k);
    cuda::MoeRoute(d_logits.as<float>(), stride, n, n_e, k, norm, false, r.view,
                   r.log.as<int32_t>(), nullptr);
    const auto ids = Download<int32_t>(r.ids, size_t(n) * k);
    const auto w = Download<float>(r.w, size_t(n) * k);
    EXPECT_EQ(ids, want.ids);
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], want.w[i], 1e-6f) << i;

    // Grouping: begin is the prefix sum of the counts, active lists the used experts in order,
    // rows/pos are inverse permutations placing each pair inside its expert's range.
    std::vector<int32_t> count(size_t(n_e), 0);
    for (int32_t e : want.ids) ++count[size_t(e)];
    const auto begin = Download<int32_t>(r.begin, size_t(n_e) + 1);
    const auto active = Download<int32_t>(r.active, size_t(n_e));
    const int32_t n_active = Download<int32_t>(r.n_active, 1)[0];
    EXPECT_EQ(Download<int32_t>(r.log, 1)[0], n_active);
    const auto tiles = Download<int32_t>(r.tiles, size_t(n_e) + 1);
    std::vector<int32_t> want_active;
    int32_t acc = 0, tile_acc = 0;
    for (int e = 0; e < n_e; ++e) {
      EXPECT_EQ(begin[size_t(e)], acc) << "expert " << e;
      EXPECT_EQ(tiles[size_t(e)], tile_acc) << "expert " << e;
      acc += count[size_t(e)];
      tile_acc += (count[size_t(e)] + cuda::kMoeGemmTileRows - 1) / cuda::kMoeGemmTileRows;
      if (count[size_t(e)] > 0) want_active.push_back(e);
    }
    EXPECT_EQ(begin[size_t(n_e)], n * k);
    EXPECT_EQ(tiles[size_t(n_e)], tile_acc);
    ASSERT_EQ(n_active, static_cast<int32_t>(want_active.size()));
    EXPECT_TRUE(std::equal(want_active.begin(), want_active.end(), active.begin()));
    const auto rows = Download<int32_t>(r.rows, size_t(n) * k);
    const auto pos = Download<int32_t>(r.pos, size_t(n) * k);
    std::set<int32_t> seen;
    for (int i = 0; i < n * k; ++i) {
      const int32_t p = pos[size_t(i)], e = want.ids[size_t(i)];
      ASSERT_GE(p, begin[size_t(e)]);
      ASSERT_LT(p, begin[size_t(e) + 1]);
      EXPECT_EQ(rows[size_t(p)], i / k);
      seen.insert(p);
    }
    EXPECT_EQ(seen.size(), size_t(n) * k);
  }
}

// The shared slot: every token's routed picks as without it, then the shared expert (id n_e)
// weighted by the sigmoid of its gate logit; the grouping covers n_e + 1 experts. MoeCombine over
// those k + 1 picks equals, bit for bit, MoeCombine over the k routed picks plus separate shared
// rows (what the decoder ran before the slot).
TEST(CudaMoe, SharedSlotRoutesEveryTokenAndCombinesAsTheSharedRows) {
  KESTREL_REQUIRE_CUDA();
  for (const auto& [n, n_e, k] : std::vector<std::tuple<int, int, int>>{
           {1, 8, 2}, {5, 64, 8}, {37, 256, 8}, {300, 512, 10}}) {
    SCOPED_TRACE(testing::Message() << "n " << n << " experts " << n_e << " k " << k);
    const int64_t stride = n_e + 1;
    const int hidden = 72, picks = k + 1;
    const std::vector<float> logits = RandomF32(size_t(n) * stride, 31 + n, -4.0f, 4.0f);
    const Routing want = CpuRoute(logits, stride, n, n_e, k, true);
    const DeviceBuffer d_logits = Upload(logits);
    DeviceRouting plain(n, n_e, k), slot(n, n_e + 1, picks);
    cuda::MoeRoute(d_logits.as<float>(), stride, n, n_e, k, true, false, plain.view, nullptr,
                   nullptr);
    cuda::MoeRoute(d_logits.as<float>(), stride, n, n_e, k, true, true, slot.view,
                   slot.log.as<int32_t>(), nullptr);
    const auto ids = Download<int32_t>(slot.ids, size_t(n) * picks);
    const auto w = Download<float>(slot.w, size_t(n) * picks);
    const auto plain_w = Download<float>(plain.w, size_t(n) * k);
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(ids[size_t(t) * picks + j], want.ids[size_t(t) * k + j]) << t << " " << j;
        EXPECT_EQ(w[size_t(t) * picks + j], plain_w[size_t(t) * k + j]) << t << " " << j;
      }
      EXPECT_EQ(ids[size_t(t) * picks + k], n_e) << t;
      const double gate = 1.0 / (1.0 + std::exp(-double(logits[size_t(t) * stride + n_e])));
      EXPECT_NEAR(w[size_t(t) * picks + k], gate, 1e-6) << t;
    }
    const auto begin = Download<int32_t>(slot.begin, size_t(n_e) + 2);
    EXPECT_EQ(begin[size_t(n_e) + 1], n * picks);
    EXPECT_EQ(begin[size_t(n_e) + 1] - begin[size_t(n_e)], n) << "the shared expert's rows";
    const int32_t n_active = Download<int32_t>(slot.n_active, 1)[0];
    EXPECT_EQ(Download<int32_t>(slot.log, 1)[0], n_active);
    EXPECT_EQ(Download<int32_t>(slot.active, size_t(n_active))[size_t(n_active) - 1], n_e);
    const auto rows = Download<int32_t>(slot.rows, size_t(n) * picks);
    const auto pos = Download<int32_t>(slot.pos, size_t(n) * picks);
    for (int i = 0; i < n * picks; ++i) {
      const int32_t e = ids[size_t(i)], p = pos[size_t(i)];
      ASSERT_GE(p, begin[size_t(e)]);
      ASSERT_LT(p, begin[size_t(e) + 1]);
      EXPECT_EQ(rows[size_t(p)], i / picks);
    }

    // Expert outputs for the k routed picks and the shared rows, placed at both routings' rows.
    const std::vector<float> y_plain = RandomF32(size_t(n) * k * hidden, 41 + n);
    const std::vector<float> shared = RandomF32(size_t(n) * hidden, 43 + n);
    const auto plain_pos = Download<int32_t>(plain.pos, size_t(n) * k);
    std::vector<float> y_slot(size_t(n) * picks * hidden);
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < picks; ++j) {
        const float* from = j < k ? &y_plain[size_t(plain_pos[size_t(t) * k + j]) * hidden]
                                  : &shared[size_t(t) * hidden];
        std::copy(from, from + hidden, &y_slot[size_t(pos[size_t(t) * picks + j]) * hidden]);
      }
    }
    const DeviceBuffer d_y_plain = Upload(y_plain), d_y_slot = Upload(y_slot),
                       d_shared = Upload(shared);
    DeviceBuffer d_sum_plain = Poisoned<float>(size_t(n) * hidden);
    DeviceBuffer d_sum_slot = Poisoned<float>(size_t(n) * hidden);
    cuda::MoeCombine(d_y_plain.as<float>(), plain.view, n, k, hidden, d_shared.as<float>(),
                     d_logits.as<float>() + n_e, stride, d_sum_plain.as<float>(), nullptr);
    cuda::MoeCombine(d_y_slot.as<float>(), slot.view, n, picks, hidden, nullptr, nullptr, 0,
                     d_sum_slot.as<float>(), nullptr);
    EXPECT_EQ(Download<float>(d_sum_slot, size_t(n) * hidden),
              Download<float>(d_sum_plain, size_t(n) * hidden));
  }
}

// The full routed MLP: gate|up grouped GEMM (gathered token rows), SiLU*up on the host from the
// device's gate|up (the activation kernel has its own test), down grouped GEMM, weighted sum with
// a gated shared expert; every stage against f64 sums of the same bf16 inputs. Only routed
// experts are read: the unrouted ones hold NaN and would poison any row that touched them.
TEST(CudaMoe, GroupedExpertGemmsAndCombineMatchTheReference) {
  KESTREL_REQUIRE_CUDA();
  // hidden 136 and inter 40 (not multiples of the 16-row tile) take the kernel whose warps own
  // rows (k <= 1024) for both GEMMs; hidden 1032 takes the one whose warps split k for gate|up.
  for (const auto& [n, n_e, k, hidden] :
       std::vector<std::tuple<int, int, int, int>>{{1, 16, 4, 136},
                                                   {7, 16, 2, 136},
                                                   {70, 32, 4, 136},
                                                   {200, 8, 2, 136},
                                                   {1, 16, 4, 1032},
                                                   {70, 32, 4, 1032}}) {
    SCOPED_TRACE(testing::Message()
                 << "n " << n << " experts " << n_e << " k " << k << " hidden " << hidden);
    const int inter = 40;
    const int64_t stride = n_e + 1;
    const std::vector<float> logits = RandomF32(size_t(n) * stride, 3 + n, -3.0f, 3.0f);
    const Routing route = CpuRoute(logits, stride, n, n_e, k, true);
    std::set<int32_t> used(route.ids.begin(), route.ids.end());
    const auto x = RandomBf16(size_t(n) * hidden, 5);
    auto w_gu = RandomBf16(size_t(n_e) * 2 * inter * hidden, 6, -0.2f, 0.2f);
    auto w_down = RandomBf16(size_t(n_e) * hidden * inter, 7, -0.2f, 0.2f);
    for (int e = 0; e < n_e; ++e) {
      if (used.count(e)) continue;
      std::fill(w_gu.begin() + size_t(e) * 2 * inter * hidden,
                w_gu.begin() + size_t(e + 1) * 2 * inter * hidden, uint16_t{0x7FC0});  // NaN
      std::fill(w_down.begin() + size_t(e) * hidden * inter,
                w_down.begin() + size_t(e + 1) * hidden * inter, uint16_t{0x7FC0});
    }
    const std::vector<float> shared = RandomF32(size_t(n) * hidden, 8);
    const auto xf = cuda::testing::Bf16ToF32(x);
    const auto guf = cuda::testing::Bf16ToF32(w_gu);
    const auto downf = cuda::testing::Bf16ToF32(w_down);

    const DeviceBuffer d_logits = Upload(logits), d_x = Upload(x), d_gu = Upload(w_gu),
                       d_down = Upload(w_down), d_shared = Upload(shared);
    DeviceRouting r(n, n_e, k);
    const int pairs = n * k;
    DeviceBuffer d_gate_up = Poisoned<float>(size_t(pairs) * 2 * inter);
    DeviceBuffer d_out = Poisoned<float>(size_t(pairs) * hidden);
    DeviceBuffer d_sum = Poisoned<float>(size_t(n) * hidden);
    cuda::MoeRoute(d_logits.as<float>(), stride, n, n_e, k, true, false, r.view, nullptr, nullptr);
    const auto* xb = static_cast<const __nv_bfloat16*>(d_x.get());
    cuda::MoeLinear(xb, r.view.rows, hidden, static_cast<const __nv_bfloat16*>(d_gu.get()),
                    2 * inter, r.view, std::min(n_e, pairs), d_gate_up.as<float>(), nullptr);
    const auto pos = Download<int32_t>(r.pos, size_t(pairs));
    const auto gate_up = Download<float>(d_gate_up, size_t(pairs) * 2 * inter);
    // gate|up of pair (t, j) against the reference; then the activation in bf16 on the host.
    std::vector<uint16_t> act(size_t(pairs) * inter);
    double worst = 0;
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < k; ++j) {
        const int e = route.ids[size_t(t) * k + j];
        const int p = pos[size_t(t) * k + j];
        for (int o = 0; o < 2 * inter; ++o) {
          double ref = 0;
          for (int h = 0; h < hidden; ++h) {
            ref +=
                double(xf[size_t(t) * hidden + h]) * guf[(size_t(e) * 2 * inter + o) * hidden + h];
          }
          worst = std::max(worst, std::fabs(ref - gate_up[size_t(p) * 2 * inter + o]));
        }
        for (int i = 0; i < inter; ++i) {
          const float g = gate_up[size_t(p) * 2 * inter + i];
          const float u = gate_up[size_t(p) * 2 * inter + inter + i];
          act[size_t(p) * inter + i] = F32ToBf16(g / (1.0f + std::exp(-g)) * u);
        }
      }
    }
    EXPECT_LT(worst, 1e-4) << "gate|up";
    // The fused form: bitwise the product through SiluMul.
    {
      DeviceBuffer d_act_ref = Poisoned<uint16_t>(size_t(pairs) * inter);
      DeviceBuffer d_act_fused = Poisoned<uint16_t>(size_t(pairs) * inter);
      cuda::SiluMul(d_gate_up.as<float>(), nullptr, nullptr, pairs, inter,
                    static_cast<__nv_bfloat16*>(d_act_ref.get()), nullptr);
      cuda::MoeLinearSiluMul(xb, r.view.rows, hidden, static_cast<const __nv_bfloat16*>(d_gu.get()),
                             inter, r.view, std::min(n_e, pairs),
                             static_cast<__nv_bfloat16*>(d_act_fused.get()), nullptr);
      EXPECT_EQ(Download<uint16_t>(d_act_ref, size_t(pairs) * inter),
                Download<uint16_t>(d_act_fused, size_t(pairs) * inter))
          << "MoeLinearSiluMul against MoeLinear + SiluMul";
    }
    const DeviceBuffer d_act = Upload(act);
    cuda::MoeLinear(static_cast<const __nv_bfloat16*>(d_act.get()), nullptr, inter,
                    static_cast<const __nv_bfloat16*>(d_down.get()), hidden, r.view,
                    std::min(n_e, pairs), d_out.as<float>(), nullptr);
    cuda::MoeCombine(d_out.as<float>(), r.view, n, k, hidden, d_shared.as<float>(),
                     d_logits.as<float>() + n_e, stride, d_sum.as<float>(), nullptr);
    const auto out = Download<float>(d_out, size_t(pairs) * hidden);
    const auto sum = Download<float>(d_sum, size_t(n) * hidden);
    const auto actf = cuda::testing::Bf16ToF32(act);
    worst = 0;
    double worst_sum = 0;
    for (int t = 0; t < n; ++t) {
      std::vector<double> want(size_t(hidden), 0.0);
      for (int j = 0; j < k; ++j) {
        const int e = route.ids[size_t(t) * k + j];
        const int p = pos[size_t(t) * k + j];
        for (int o = 0; o < hidden; ++o) {
          double ref = 0;
          for (int i = 0; i < inter; ++i) {
            ref +=
                double(actf[size_t(p) * inter + i]) * downf[(size_t(e) * hidden + o) * inter + i];
          }
          worst = std::max(worst, std::fabs(ref - out[size_t(p) * hidden + o]));
          want[size_t(o)] += route.w[size_t(t) * k + j] * ref;
        }
      }
      const double gate = 1.0 / (1.0 + std::exp(-double(logits[size_t(t) * stride + n_e])));
      for (int o = 0; o < hidden; ++o) {
        want[size_t(o)] += gate * shared[size_t(t) * hidden + o];
        worst_sum = std::max(worst_sum, std::fabs(want[size_t(o)] - sum[size_t(t) * hidden + o]));
      }
    }
    EXPECT_LT(worst, 1e-4) << "down";
    EXPECT_LT(worst_sum, 1e-4) << "combine";
  }
}

void ExpertRowsIndependentOfTheBatch(int hidden);

// A token's expert outputs do not depend on the other tokens of the step: routing the same token
// alone and inside a batch of 64 gives bitwise the same gate|up rows.
TEST(CudaMoe, ExpertRowsAreIndependentOfTheBatch) {
  KESTREL_REQUIRE_CUDA();
  for (int hidden : {256, 2048}) {  // warps owning rows; warps splitting k
    SCOPED_TRACE(hidden);
    ExpertRowsIndependentOfTheBatch(hidden);
  }
}

void ExpertRowsIndependentOfTheBatch(int hidden) {
  const int n_e = 32, k = 4, inter = 64;
  const auto w_gu = RandomBf16(size_t(n_e) * 2 * inter * hidden, 21, -0.2f, 0.2f);
  const DeviceBuffer d_gu = Upload(w_gu);
  std::vector<std::vector<float>> first_rows;
  for (int n : {1, 64, 130}) {
    const std::vector<float> logits = RandomF32(size_t(n) * n_e, 99, -3.0f, 3.0f);  // row 0 same
    const auto x = RandomBf16(size_t(n) * hidden, 23);  // row 0 the same for every n
    const DeviceBuffer d_logits = Upload(logits), d_x = Upload(x);
    DeviceRouting r(n, n_e, k);
    DeviceBuffer d_gate_up = Poisoned<float>(size_t(n) * k * 2 * inter);
    cuda::MoeRoute(d_logits.as<float>(), n_e, n, n_e, k, true, false, r.view, nullptr, nullptr);
    cuda::MoeLinear(static_cast<const __nv_bfloat16*>(d_x.get()), r.view.rows, hidden,
                    static_cast<const __nv_bfloat16*>(d_gu.get()), 2 * inter, r.view,
                    std::min(n_e, n * k), d_gate_up.as<float>(), nullptr);
    const auto pos = Download<int32_t>(r.pos, size_t(n) * k);
    const auto gate_up = Download<float>(d_gate_up, size_t(n) * k * 2 * inter);
    std::vector<float> token0;
    for (int j = 0; j < k; ++j) {
      token0.insert(token0.end(), gate_up.begin() + size_t(pos[size_t(j)]) * 2 * inter,
                    gate_up.begin() + size_t(pos[size_t(j)] + 1) * 2 * inter);
    }
    first_rows.push_back(token0);
  }
  EXPECT_EQ(first_rows[0], first_rows[1]);
  EXPECT_EQ(first_rows[0], first_rows[2]);
}

}  // namespace
}  // namespace kestrel
