// The Gated DeltaNet kernels (backends/cuda/deltanet.h) against the CPU ops on a batch of two
// sequences: one starting at position 0 (zero state), one continuing from a random state slot,
// with a snapshot taken after a row inside the second. Conv outputs, windows, the delta rule's
// outputs and states, and the snapshot copies are compared.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/deltanet.h"
#include "backends/cuda/deltanet.h"
#include "cuda/cuda_test_util.h"

namespace kestrel {
namespace {

using cuda::testing::Download;
using cuda::testing::Upload;

std::vector<float> Random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double MaxRelDiff(const float* a, const float* b, size_t n) {
  double worst = 0, scale = 1e-6;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / scale);
  return worst;
}

// Key head dims 32 and 128 take the register kernel (128: Qwen3.5's, split over threads), 256 the
// shared-memory one; dv 72 leaves part of the last column group idle.
void CheckConvAndDeltaRule(int32_t dk, int32_t dv) {
  SCOPED_TRACE("dk " + std::to_string(dk) + " dv " + std::to_string(dv));
  const int32_t nk = 2, nv = 4, kernel = 4;
  const int32_t key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv;
  const int64_t conv_floats = (kernel - 1) * conv_dim, ssm_floats = int64_t{nv} * dk * dv;
  const int64_t slot_floats = conv_floats + ssm_floats;  // one recurrent layer
  const std::vector<int32_t> lens = {7, 70};
  const int32_t n = lens[0] + lens[1];
  std::mt19937 rng(5);
  const std::vector<float> x = Random(rng, size_t(n) * conv_dim, 1.0f);
  const std::vector<float> w = Random(rng, size_t(conv_dim) * kernel, 0.5f);
  // Slots: 0 and 1 live, 2 the snapshot target; slot 1 starts from random state.
  std::vector<float> state(size_t(3) * slot_floats, 0.0f);
  const std::vector<float> init = Random(rng, size_t(slot_floats), 0.3f);
  std::copy(init.begin(), init.end(), state.begin() + slot_floats);
  const std::vector<int32_t> seq_starts = {0, lens[0], n};
  std::vector<int32_t> positions;
  for (int32_t t = 0; t < lens[0]; ++t) positions.push_back(t);
  for (int32_t t = 0; t < lens[1]; ++t) positions.push_back(100 + t);
  const std::vector<int32_t> slots = {0, 1};
  std::vector<int32_t> snapshot(size_t(n), -1);
  const int32_t snap_row = lens[0] + 40;
  snapshot[size_t(snap_row)] = 2;

  // CPU: per sequence, conv then the rule, snapshot by splitting at the row.
  TensorView wv;
  wv.data = w.data();
  wv.dtype = DType::kF32;
  wv.n_dims = 3;
  wv.shape[0] = conv_dim;
  wv.shape[1] = 1;
  wv.shape[2] = kernel;
  std::vector<float> cpu_state = state, cpu_conv(size_t(n) * conv_dim);
  std::vector<float> q(size_t(n) * key_dim), k(size_t(n) * key_dim), v(size_t(n) * nv * dv);
  const std::vector<float> g = [&] {
    std::uniform_real_distribution<float> u(-1.5f, -0.01f);
    std::vector<float> r(size_t(n) * nv);
    for (float& e : r) e = u(rng);
    return r;
  }();
  const std::vector<float> beta = [&] {
    std::uniform_real_distribution<float> u(0.05f, 0.95f);
    std::vector<float> r(size_t(n) * nv);
    for (float& e : r) e = u(rng);
    return r;
  }();
  std::vector<float> cpu_out(size_t(n) * nv * dv);
  const cpu::OpContext ctx{cpu::KernelSet::kReference, nullptr};
  const cpu::DeltaShape shape{nk, nv, dk, dv};
  for (int s = 0; s < 2; ++s) {
    const int32_t a = seq_starts[s], b = seq_starts[s + 1];
    float* slot = cpu_state.data() + int64_t{slots[s]} * slot_floats;
    for (int32_t seg_a = a; seg_a < b;) {
      const int32_t seg_b = (seg_a <= snap_row && snap_row < b) ? std::min(b, snap_row + 1) : b;
      cpu::CausalConv1dSilu(x.data() + int64_t{seg_a} * conv_dim, seg_b - seg_a, conv_dim, wv, slot,
                            cpu_conv.data() + int64_t{seg_a} * conv_dim);
      for (int32_t t = seg_a; t < seg_b; ++t) {
        const float* row = cpu_conv.data() + int64_t{t} * conv_dim;
        std::copy(row, row + key_dim, q.begin() + int64_t{t} * key_dim);
        std::copy(row + key_dim, row + 2 * key_dim, k.begin() + int64_t{t} * key_dim);
        std::copy(row + 2 * key_dim, row + conv_dim, v.begin() + int64_t{t} * nv * dv);
      }
      cpu::L2NormRows(q.data() + int64_t{seg_a} * key_dim, int64_t{seg_b - seg_a} * nk, dk, 1e-6f,
                      1.0f / std::sqrt(float(dk)));
      cpu::L2NormRows(k.data() + int64_t{seg_a} * key_dim, int64_t{seg_b - seg_a} * nk, dk, 1e-6f,
                      1.0f);
      cpu::GatedDeltaRecurrent(
          ctx, shape, q.data() + int64_t{seg_a} * key_dim, k.data() + int64_t{seg_a} * key_dim,
          v.data() + int64_t{seg_a} * nv * dv, g.data() + seg_a * nv, beta.data() + seg_a * nv,
          seg_b - seg_a, slot + conv_floats, cpu_out.data() + int64_t{seg_a} * nv * dv);
      if (seg_b == snap_row + 1) {
        std::copy(slot, slot + slot_floats, cpu_state.begin() + 2 * slot_floats);
      }
      seg_a = seg_b;
    }
  }

  // GPU.
  cuda::DeviceBuffer d_x = Upload(x), d_w = Upload(w), d_state = Upload(state);
  cuda::DeviceBuffer d_starts = Upload(seq_starts), d_pos = Upload(positions),
                     d_slots = Upload(slots), d_snap = Upload(snapshot);
  cuda::DeviceBuffer d_conv = Upload(std::vector<float>(size_t(n) * conv_dim));
  cuda::DeviceBuffer d_q = Upload(std::vector<float>(q.size())),
                     d_k = Upload(std::vector<float>(k.size()));
  cuda::DeviceBuffer d_g = Upload(g), d_beta = Upload(beta);
  cuda::DeviceBuffer d_out = Upload(std::vector<float>(cpu_out.size()));
  cuda::DeltaBatchView bv;
  bv.seq_starts = d_starts.as<int32_t>();
  bv.positions = d_pos.as<int32_t>();
  bv.state_slots = d_slots.as<int32_t>();
  bv.snapshot_slot = d_snap.as<int32_t>();
  bv.n_seqs = 2;
  bv.n_tokens = n;
  cuda::DeltaStateView sv;
  sv.state = d_state.as<float>();
  sv.slot_floats = slot_floats;
  sv.layer_offset = 0;
  sv.conv_floats = conv_floats;
  cuda::CausalConv1dSilu(d_x.as<float>(), conv_dim, conv_dim, kernel, d_w.as<float>(), bv, sv,
                         d_conv.as<float>(), nullptr);
  // q, k normalised as DeltaPrep does (its gates are covered by the model fixtures).
  std::vector<float> zeros_ba(size_t(n) * 2 * nv, 0.0f), neg_a(size_t(nv), -1.0f),
      bias(size_t(nv), 0.0f);
  cuda::DeviceBuffer d_ba = Upload(zeros_ba), d_neg = Upload(neg_a), d_bias = Upload(bias);
  cuda::DeviceBuffer d_beta_scratch = Upload(std::vector<float>(beta.size())),
                     d_g_scratch = Upload(std::vector<float>(g.size()));
  cuda::DeltaPrep(d_conv.as<float>(), n, nk, dk, nv, dv, d_ba.as<float>(), 2 * nv,
                  d_neg.as<float>(), d_bias.as<float>(), d_q.as<float>(), d_k.as<float>(),
                  d_beta_scratch.as<float>(), d_g_scratch.as<float>(), nullptr);
  cuda::GatedDeltaRule(d_q.as<float>(), d_k.as<float>(), d_conv.as<float>() + 2 * key_dim, conv_dim,
                       d_g.as<float>(), d_beta.as<float>(), nk, dk, nv, dv, bv, sv,
                       d_out.as<float>(), nullptr);
  KCUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> gpu_conv = Download<float>(d_conv, cpu_conv.size());
  const std::vector<float> gpu_out = Download<float>(d_out, cpu_out.size());
  const std::vector<float> gpu_state = Download<float>(d_state, state.size());
  EXPECT_LT(MaxRelDiff(gpu_conv.data(), cpu_conv.data(), cpu_conv.size()), 1e-5);
  EXPECT_LT(MaxRelDiff(gpu_out.data(), cpu_out.data(), cpu_out.size()), 1e-4);
  for (int slot = 0; slot < 3; ++slot) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    const size_t off = size_t(slot) * slot_floats;
    EXPECT_LT(MaxRelDiff(gpu_state.data() + off, cpu_state.data() + off, size_t(conv_floats)),
              1e-6);
    EXPECT_LT(MaxRelDiff(gpu_state.data() + off + conv_floats, cpu_state.data() + off + conv_floats,
                         size_t(ssm_floats)),
              1e-4);
  }
}

TEST(CudaDeltaNet, ConvAndDeltaRuleMatchTheCpuWithSlotsAndSnapshots) {
  KESTREL_REQUIRE_CUDA();
  CheckConvAndDeltaRule(32, 48);
  CheckConvAndDeltaRule(128, 128);
  CheckConvAndDeltaRule(128, 72);
  CheckConvAndDeltaRule(256, 64);
}

// The decode form of CausalConv1dSiluDeltaPrep (one launch) against CausalConv1dSilu + DeltaPrep:
// the same conv outputs, q, k, beta, g and state windows bit for bit, on a decode batch with a
// fresh sequence, an empty one, sequences of 1 to 4 rows and a snapshot after a middle row.
void CheckConvPrepFused(int32_t dk, int32_t dv, int32_t nk, int32_t nv) {
  SCOPED_TRACE("dk " + std::to_string(dk) + " dv " + std::to_string(dv) + " nk " +
               std::to_string(nk) + " nv " + std::to_string(nv));
  const int32_t kernel = 4, key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv;
  const int32_t width = conv_dim + nv * dv + 2 * nv;  // qkv | z | b | a, as the in_proj rows
  const int64_t conv_floats = (kernel - 1) * conv_dim;
  const int64_t slot_floats = conv_floats + int64_t{nv} * dk * dv;
  const std::vector<int32_t> lens = {1, 3, 0, 1, 4, 2};
  const int32_t n_seqs = static_cast<int32_t>(lens.size());
  std::vector<int32_t> seq_starts = {0}, positions, slots, snapshot;
  for (int32_t s = 0; s < n_seqs; ++s) {
    seq_starts.push_back(seq_starts.back() + lens[size_t(s)]);
    for (int32_t i = 0; i < lens[size_t(s)]; ++i) positions.push_back(s == 1 ? i : 50 + 3 * s + i);
    slots.push_back(n_seqs - 1 - s);
  }
  const int32_t n = seq_starts.back();
  snapshot.assign(size_t(n), -1);
  snapshot[size_t(seq_starts[4] + 1)] = n_seqs;  // after the second row of sequence 4
  std::mt19937 rng(17);
  const std::vector<float> x = Random(rng, size_t(n) * width, 1.5f);
  const std::vector<float> w = Random(rng, size_t(conv_dim) * kernel, 0.5f);
  const std::vector<float> state = Random(rng, size_t(n_seqs + 1) * slot_floats, 0.3f);
  const std::vector<float> neg_a = Random(rng, size_t(nv), 1.0f),
                           dt = Random(rng, size_t(nv), 1.0f);
  const cuda::DeviceBuffer d_x = Upload(x), d_w = Upload(w), d_neg = Upload(neg_a),
                           d_dt = Upload(dt), d_starts = Upload(seq_starts),
                           d_pos = Upload(positions), d_slots = Upload(slots),
                           d_snap = Upload(snapshot);
  const cuda::DeltaBatchView bv{d_starts.as<int32_t>(), d_pos.as<int32_t>(),
                                d_slots.as<int32_t>(), d_snap.as<int32_t>(), n_seqs, n};
  struct Outputs {
    std::vector<float> conv, q, k, beta, g, state;
  };
  auto run = [&](bool fused) {
    cuda::DeviceBuffer d_state = Upload(state);
    cuda::DeviceBuffer d_conv = Upload(std::vector<float>(size_t(n) * conv_dim, -7.0f));
    cuda::DeviceBuffer d_q = Upload(std::vector<float>(size_t(n) * key_dim, -7.0f)),
                       d_k = Upload(std::vector<float>(size_t(n) * key_dim, -7.0f)),
                       d_beta = Upload(std::vector<float>(size_t(n) * nv, -7.0f)),
                       d_g = Upload(std::vector<float>(size_t(n) * nv, -7.0f));
    cuda::DeltaStateView sv;
    sv.state = d_state.as<float>();
    sv.slot_floats = slot_floats;
    sv.layer_offset = 0;
    sv.conv_floats = conv_floats;
    const float* ba = d_x.as<float>() + conv_dim + nv * dv;
    if (fused) {
      cuda::CausalConv1dSiluDeltaPrep(
          d_x.as<float>(), width, kernel, d_w.as<float>(), bv, sv, d_conv.as<float>(), nk, dk, nv,
          dv, ba, width, d_neg.as<float>(), d_dt.as<float>(), d_q.as<float>(), d_k.as<float>(),
          d_beta.as<float>(), d_g.as<float>(), nullptr);
    } else {
      cuda::CausalConv1dSilu(d_x.as<float>(), width, conv_dim, kernel, d_w.as<float>(), bv, sv,
                             d_conv.as<float>(), nullptr);
      cuda::DeltaPrep(d_conv.as<float>(), n, nk, dk, nv, dv, ba, width, d_neg.as<float>(),
                      d_dt.as<float>(), d_q.as<float>(), d_k.as<float>(), d_beta.as<float>(),
                      d_g.as<float>(), nullptr);
    }
    KCUDA_CHECK(cudaDeviceSynchronize());
    return Outputs{Download<float>(d_conv, size_t(n) * conv_dim),
                   Download<float>(d_q, size_t(n) * key_dim),
                   Download<float>(d_k, size_t(n) * key_dim),
                   Download<float>(d_beta, size_t(n) * nv),
                   Download<float>(d_g, size_t(n) * nv),
                   Download<float>(d_state, state.size())};
  };
  const Outputs two = run(false), one = run(true);
  EXPECT_EQ(one.conv, two.conv);
  EXPECT_EQ(one.q, two.q);
  EXPECT_EQ(one.k, two.k);
  EXPECT_EQ(one.beta, two.beta);
  EXPECT_EQ(one.g, two.g);
  EXPECT_EQ(one.state, two.state);
  EXPECT_NE(one.state, state) << "the windows were not updated";
}

TEST(CudaDeltaNet, FusedDecodeConvPrepEqualsTheTwoKernels) {
  KESTREL_REQUIRE_CUDA();
  CheckConvPrepFused(32, 48, 2, 6);
  CheckConvPrepFused(128, 128, 16, 32);  // Qwen3.5-35B-A3B's linear attention
  CheckConvPrepFused(128, 128, 16, 48);  // Qwen3.5-27B's
}

// The decode rule's shapes for key head dim 128 (deltanet.cu): a column's rows split over four
// warps (the default) and over four neighbouring lanes (SetDeltaRuleLaneSplit(4)) add the same
// partial sums in the same order, so outputs, states and snapshots agree bit for bit.
// Decode-like rows (one per sequence), a fresh sequence, a four-row one with a snapshot, an
// empty one; dv 128 and 72 (a part-filled column group).
void CheckDeltaRuleShapes(int32_t dv) {
  SCOPED_TRACE("dv " + std::to_string(dv));
  const int32_t dk = 128, nk = 2, nv = 6;
  const int64_t slot_floats = int64_t{nv} * dk * dv;  // conv_floats 0: the rule's state only
  const std::vector<int32_t> lens = {1, 1, 4, 0, 1, 1, 1};
  const int32_t n_seqs = static_cast<int32_t>(lens.size());
  std::vector<int32_t> seq_starts = {0}, positions, slots;
  for (int32_t s = 0; s < n_seqs; ++s) {
    seq_starts.push_back(seq_starts.back() + lens[size_t(s)]);
    for (int32_t i = 0; i < lens[size_t(s)]; ++i) positions.push_back(s == 1 ? i : 300 + s + i);
    slots.push_back((s * 3) % n_seqs);
  }
  const int32_t n = seq_starts.back();
  std::vector<int32_t> snapshot(size_t(n), -1);
  snapshot[size_t(seq_starts[2] + 2)] = n_seqs;  // after the third row of sequence 2
  std::mt19937 rng(23);
  const std::vector<float> q = Random(rng, size_t(n) * nk * dk, 0.09f),
                           k = Random(rng, size_t(n) * nk * dk, 0.09f),
                           v = Random(rng, size_t(n) * nv * dv, 1.0f),
                           state = Random(rng, size_t(n_seqs + 1) * slot_floats, 0.3f);
  std::vector<float> g(size_t(n) * nv), beta(size_t(n) * nv);
  std::uniform_real_distribution<float> ug(-1.5f, -0.01f), ub(0.05f, 0.95f);
  for (float& e : g) e = ug(rng);
  for (float& e : beta) e = ub(rng);
  const cuda::DeviceBuffer d_q = Upload(q), d_k = Upload(k), d_v = Upload(v), d_g = Upload(g),
                           d_beta = Upload(beta), d_starts = Upload(seq_starts),
                           d_pos = Upload(positions), d_slots = Upload(slots),
                           d_snap = Upload(snapshot);
  const cuda::DeltaBatchView bv{d_starts.as<int32_t>(), d_pos.as<int32_t>(),
                                d_slots.as<int32_t>(), d_snap.as<int32_t>(), n_seqs, n};
  struct Outputs {
    std::vector<float> out, state;
  };
  auto run = [&](int lanes) {
    const int saved = cuda::DeltaRuleLaneSplit();
    cuda::SetDeltaRuleLaneSplit(lanes);
    cuda::DeviceBuffer d_state = Upload(state);
    cuda::DeviceBuffer d_out = Upload(std::vector<float>(size_t(n) * nv * dv, -7.0f));
    cuda::DeltaStateView sv;
    sv.state = d_state.as<float>();
    sv.slot_floats = slot_floats;
    sv.layer_offset = 0;
    sv.conv_floats = 0;
    cuda::GatedDeltaRule(d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), nv * dv,
                         d_g.as<float>(), d_beta.as<float>(), nk, dk, nv, dv, bv, sv,
                         d_out.as<float>(), nullptr);
    KCUDA_CHECK(cudaDeviceSynchronize());
    cuda::SetDeltaRuleLaneSplit(saved);
    return Outputs{Download<float>(d_out, size_t(n) * nv * dv),
                   Download<float>(d_state, state.size())};
  };
  const Outputs rows = run(0), lanes = run(4);
  EXPECT_EQ(rows.out, lanes.out);
  EXPECT_EQ(rows.state, lanes.state);
  EXPECT_NE(rows.state, state) << "the states were not updated";
}

TEST(CudaDeltaNet, DecodeRuleShapesAgree) {
  KESTREL_REQUIRE_CUDA();
  CheckDeltaRuleShapes(128);
  CheckDeltaRuleShapes(72);
}

}  // namespace
}  // namespace kestrel
