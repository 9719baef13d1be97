// The chunked gated delta rule (cuda::GatedDeltaRuleChunked) against the CPU recurrent rule
// (cpu::GatedDeltaRecurrent) and the recurrent CUDA kernel (cuda::GatedDeltaRule), on batches of
// sequences around the chunk edges (32-row chunks; lengths 1, 7, 0, 64, 65, 200, 31, 33), fresh
// (position 0) and continuing from a random state, with snapshot rows inside chunks, at chunk
// edges, at sequence ends and on every row of two chunks. Outputs, final states and every snapshot
// slot are compared; the rest of every slot (conv windows, the other layer) must be untouched, and
// two runs must agree bitwise. Outputs and the workspace start as NaN, so any value the kernels
// read before writing it shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/deltanet.h"
#include "backends/cuda/deltanet.h"
#include "cuda/cuda_test_util.h"

namespace kestrel {
namespace {

using cuda::DeviceBuffer;
using cuda::testing::Download;
using cuda::testing::Poisoned;
using cuda::testing::Upload;

struct RuleShape {
  int32_t dk, dv, nk, nv;
};

struct BatchSpec {
  std::vector<int32_t> lens;
  std::vector<bool> fresh;                 // per sequence: starts at position 0
  std::vector<std::pair<int, int>> snaps;  // (sequence, row in it): a snapshot slot each
};

// max |a - ref| / max |ref|; +inf when a has a value that is not finite.
double MaxRelErr(const float* a, const float* ref, size_t n) {
  double scale = 1e-30, worst = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - ref[i]) / scale);
  }
  return worst;
}

void CompareWithRecurrent(const RuleShape& shape, const BatchSpec& spec, uint32_t seed) {
  const int32_t nk = shape.nk, nv = shape.nv, dk = shape.dk, dv = shape.dv;
  const int32_t n_seqs = static_cast<int32_t>(spec.lens.size());
  const int32_t key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv;
  // Two recurrent layers per slot; the rule runs on layer 1, after its conv window (K = 4).
  const int64_t conv_floats = int64_t{3} * conv_dim, ssm_floats = int64_t{nv} * dk * dv;
  const int64_t layer_floats = conv_floats + ssm_floats, slot_floats = 2 * layer_floats;
  const int64_t ssm_offset = layer_floats + conv_floats;
  // Slots: the sequences' (in reverse order), one per snapshot, one spare never named.
  const int32_t n_slots = n_seqs + static_cast<int32_t>(spec.snaps.size()) + 1;

  std::vector<int32_t> seq_starts = {0};
  for (int32_t len : spec.lens) seq_starts.push_back(seq_starts.back() + len);
  const int32_t n = seq_starts.back();
  std::vector<int32_t> positions(static_cast<size_t>(n)), slots(static_cast<size_t>(n_seqs)),
      snapshot(static_cast<size_t>(n), -1);
  for (int32_t s = 0; s < n_seqs; ++s) {
    slots[s] = n_seqs - 1 - s;
    for (int32_t t = seq_starts[s]; t < seq_starts[s + 1]; ++t) {
      positions[t] = (spec.fresh[s] ? 0 : 300) + t - seq_starts[s];
    }
  }
  for (size_t i = 0; i < spec.snaps.size(); ++i) {
    const auto [s, row] = spec.snaps[i];
    ASSERT_LT(row, spec.lens[s]);
    snapshot[size_t(seq_starts[s] + row)] = n_seqs + static_cast<int32_t>(i);
  }

  // Inputs as the model makes them: q, k L2-normalised per head (q also / sqrt(dk)),
  // g = -exp(a) softplus(b) in [-3, 0), beta = sigmoid(.) in (0, 1); v inside the conv rows.
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> ua(-1.0f, 0.1f), ub(-4.0f, 2.4f);
  std::vector<float> q(size_t(n) * key_dim), k(size_t(n) * key_dim), conv(size_t(n) * conv_dim);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : conv) x = normal(rng);
  cpu::L2NormRows(q.data(), int64_t{n} * nk, dk, 1e-6f, 1.0f / std::sqrt(float(dk)));
  cpu::L2NormRows(k.data(), int64_t{n} * nk, dk, 1e-6f, 1.0f);
  std::vector<float> g(size_t(n) * nv), beta(size_t(n) * nv);
  for (float& x : g) {
    const float a = ua(rng), b = ub(rng);
    x = -std::exp(a) * std::log1p(std::exp(b));
  }
  for (float& x : beta) x = 1.0f / (1.0f + std::exp(-2.0f * normal(rng)));
  std::vector<float> v(size_t(n) * nv * dv);  // contiguous copy for the CPU op
  for (int32_t t = 0; t < n; ++t) {
    const float* row = conv.data() + int64_t{t} * conv_dim + 2 * key_dim;
    std::copy(row, row + nv * dv, v.begin() + int64_t{t} * nv * dv);
  }
  std::vector<float> state(size_t(n_slots) * slot_floats);
  for (float& x : state) x = 0.3f * normal(rng);

  // CPU: per sequence, segments split after each snapshot row.
  std::vector<float> cpu_state = state, cpu_out(size_t(n) * nv * dv);
  const cpu::OpContext ctx{cpu::KernelSet::kReference, nullptr};
  const cpu::DeltaShape cpu_shape{nk, nv, dk, dv};
  for (int32_t s = 0; s < n_seqs; ++s) {
    const int32_t begin = seq_starts[s], end = seq_starts[s + 1];
    if (begin == end) continue;
    float* ssm = cpu_state.data() + slots[s] * slot_floats + ssm_offset;
    if (spec.fresh[s]) std::fill(ssm, ssm + ssm_floats, 0.0f);
    for (int32_t a = begin; a < end;) {
      int32_t b = a + 1;
      while (b < end && snapshot[b - 1] < 0) ++b;
      cpu::GatedDeltaRecurrent(ctx, cpu_shape, q.data() + int64_t{a} * key_dim,
                               k.data() + int64_t{a} * key_dim, v.data() + int64_t{a} * nv * dv,
                               g.data() + int64_t{a} * nv, beta.data() + int64_t{a} * nv, b - a,
                               ssm, cpu_out.data() + int64_t{a} * nv * dv);
      if (snapshot[b - 1] >= 0) {
        std::copy(ssm, ssm + ssm_floats,
                  cpu_state.begin() + snapshot[b - 1] * slot_floats + ssm_offset);
      }
      a = b;
    }
  }

  // GPU: the recurrent kernel once, the chunked one twice from the same state.
  DeviceBuffer d_q = Upload(q), d_k = Upload(k), d_conv = Upload(conv), d_g = Upload(g),
               d_beta = Upload(beta);
  DeviceBuffer d_starts = Upload(seq_starts), d_pos = Upload(positions), d_slots = Upload(slots),
               d_snap = Upload(snapshot);
  cuda::DeltaBatchView bv;
  bv.seq_starts = d_starts.as<int32_t>();
  bv.positions = d_pos.as<int32_t>();
  bv.state_slots = d_slots.as<int32_t>();
  bv.snapshot_slot = d_snap.as<int32_t>();
  bv.n_seqs = n_seqs;
  bv.n_tokens = n;
  const size_t workspace_floats =
      cuda::GatedDeltaRuleChunkedWorkspaceBytes(n, n_seqs, nv) / sizeof(float);
  auto run = [&](bool chunked, std::vector<float>& out_host, std::vector<float>& state_host) {
    DeviceBuffer d_state = Upload(state);
    DeviceBuffer d_out = Poisoned<float>(cpu_out.size());
    DeviceBuffer d_workspace = Poisoned<float>(workspace_floats);
    cuda::DeltaStateView sv;
    sv.state = d_state.as<float>();
    sv.slot_floats = slot_floats;
    sv.layer_offset = layer_floats;
    sv.conv_floats = conv_floats;
    const float* v_in = d_conv.as<float>() + 2 * key_dim;
    if (chunked) {
      cuda::GatedDeltaRuleChunked(d_q.as<float>(), d_k.as<float>(), v_in, conv_dim, d_g.as<float>(),
                                  d_beta.as<float>(), nk, dk, nv, dv, bv, sv, d_out.as<float>(),
                                  d_workspace.as<float>(), nullptr);
    } else {
      cuda::GatedDeltaRule(d_q.as<float>(), d_k.as<float>(), v_in, conv_dim, d_g.as<float>(),
                           d_beta.as<float>(), nk, dk, nv, dv, bv, sv, d_out.as<float>(), nullptr);
    }
    KCUDA_CHECK(cudaDeviceSynchronize());
    out_host = Download<float>(d_out, cpu_out.size());
    state_host = Download<float>(d_state, state.size());
  };
  std::vector<float> rec_out, rec_state, out, out_state, again_out, again_state;
  run(false, rec_out, rec_state);
  run(true, out, out_state);
  run(true, again_out, again_state);

  EXPECT_LT(MaxRelErr(out.data(), cpu_out.data(), out.size()), 1e-4);
  EXPECT_LT(MaxRelErr(out.data(), rec_out.data(), out.size()), 1e-4);
  for (int32_t slot = 0; slot < n_slots; ++slot) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    const size_t base = size_t(slot) * slot_floats, ssm = base + size_t(ssm_offset);
    EXPECT_LT(MaxRelErr(&out_state[ssm], &cpu_state[ssm], size_t(ssm_floats)), 1e-4);
    EXPECT_LT(MaxRelErr(&out_state[ssm], &rec_state[ssm], size_t(ssm_floats)), 1e-4);
    int64_t foreign_writes = 0;
    for (size_t i = base; i < ssm; ++i) foreign_writes += out_state[i] != state[i];
    EXPECT_EQ(foreign_writes, 0);
  }
  EXPECT_TRUE(out == again_out && out_state == again_state) << "runs differ";
}

class CudaDeltaRuleChunked : public ::testing::TestWithParam<RuleShape> {};

TEST_P(CudaDeltaRuleChunked, MatchesTheRecurrentRuleWithSlotsAndSnapshots) {
  KESTREL_REQUIRE_CUDA();
  BatchSpec spec;
  spec.lens = {1, 7, 0, 64, 65, 200, 31, 33};
  spec.fresh = {true, false, false, true, false, false, false, true};
  // The only row of a 1-row sequence; inside a chunk; a sequence's end at the chunk edge; first
  // rows; a 1-row last chunk; both sides of chunk edges; inside a later chunk; the last row.
  spec.snaps = {{0, 0},  {1, 3},  {3, 63},  {4, 0},   {4, 64}, {5, 31}, {5, 32},
                {5, 63}, {5, 64}, {5, 130}, {5, 199}, {6, 30}, {7, 31}};
  CompareWithRecurrent(GetParam(), spec, 11);
}

// Key dim 100 is padded to 128; 50 with 33 (an odd v row stride) takes the 4-byte copies; six
// value heads per key head give pass 1's warps two heads each.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaDeltaRuleChunked,
                         ::testing::Values(RuleShape{128, 128, 2, 4}, RuleShape{16, 24, 2, 4},
                                           RuleShape{32, 48, 1, 2}, RuleShape{100, 40, 2, 2},
                                           RuleShape{50, 33, 1, 3}, RuleShape{32, 32, 1, 6}),
                         [](const auto& info) {
                           const RuleShape& s = info.param;
                           return "dk" + std::to_string(s.dk) + "_dv" + std::to_string(s.dv) +
                                  "_nk" + std::to_string(s.nk) + "_nv" + std::to_string(s.nv);
                         });

// One continuing sequence over 16 chunks and a fresh one, at the Qwen3.5 head dims.
TEST(CudaDeltaRuleChunkedLong, ManyChunksStayWithinRounding) {
  KESTREL_REQUIRE_CUDA();
  BatchSpec spec;
  spec.lens = {1000, 333};
  spec.fresh = {false, true};
  spec.snaps = {{0, 511}, {0, 700}, {1, 332}};
  CompareWithRecurrent(RuleShape{128, 128, 1, 2}, spec, 12);
}

// A snapshot on every row of a 40-row sequence (many per chunk, consecutive, both chunks) and on
// the first and last rows of a 5-row one.
TEST(CudaDeltaRuleChunkedSnapshots, EveryRowOfTwoChunks) {
  KESTREL_REQUIRE_CUDA();
  BatchSpec spec;
  spec.lens = {40, 5};
  spec.fresh = {false, true};
  for (int row = 0; row < 40; ++row) spec.snaps.emplace_back(0, row);
  spec.snaps.emplace_back(1, 0);
  spec.snaps.emplace_back(1, 4);
  CompareWithRecurrent(RuleShape{64, 32, 1, 2}, spec, 13);
}

}  // namespace
}  // namespace kestrel
