// The CUDA element-wise kernels (embedding gather, fused add + RMSNorm, gathered RMSNorm, fused
// QKV bias / qk-norm / RoPE / KV write, SiLU-mul) against the CPU reference ops
// (backends/cpu/ops.h, reference kernel set).
//
// Tolerances: f32 outputs that are pure copies or the same IEEE additions are compared bit for
// bit. bf16 outputs must be within 1 bf16 ulp of bf16(CPU f32 result): the kernels repeat the CPU's
// operation order (no FMA contraction), and what still differs (the order of the RMS sums of
// squares, CUDA's 2-ulp expf/sincosf against glibc's) moves the f32 result by a few f32 ulps,
// which can flip one bf16 rounding. RoPE outputs also get an absolute floor of 1e-5 * max|ref|:
// x1*c - x2*s cancels, so a few f32 ulps of the O(1) terms can be many bf16 ulps of a result near
// zero. Every output buffer starts poisoned (NaN) so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cuda/activation.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/norm.h"
#include "backends/cuda/rope.h"
#include "core/tensor.h"
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

using testing::Download;
using testing::Poisoned;
using testing::RandomBf16;
using testing::RandomF32;
using testing::RelL2;
using testing::Upload;

constexpr int64_t kRowSizes[] = {64, 256, 1024, 4096, 5120, 130};
constexpr int64_t kTokenCounts[] = {1, 3, 17, 300};
constexpr uint16_t kBf16Poison = 0xFFFF;  // Poisoned<>'s 0xFF bytes

__nv_bfloat16* Bf16Ptr(const DeviceBuffer& b) {
  return b.as<__nv_bfloat16>();
}

// A host bf16 array as the CPU ops take weights (1-D when cols < 0).
TensorView Bf16View(const std::vector<uint16_t>& v, int64_t rows, int64_t cols = -1) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::kBF16;
  t.n_dims = cols < 0 ? 1 : 2;
  t.shape[0] = rows;
  if (cols >= 0) t.shape[1] = cols;
  KCHECK(t.numel() == static_cast<int64_t>(v.size()));
  return t;
}

// Spacing of bf16 values at magnitude `mag` (8 significant bits).
double Bf16Ulp(double mag) {
  if (mag < 1e-38) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(mag, &e);  // mag = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// out (bf16 bits) against ref (f32): where ref is NaN the element must not have been written
// (still the poison pattern); elsewhere |out - bf16(ref)| <= 1 bf16 ulp (at the larger magnitude
// of the two) + abs_floor, and the written elements together within rel L2 4e-3.
::testing::AssertionResult Bf16Near(const std::vector<uint16_t>& out, const std::vector<float>& ref,
                                    double abs_floor = 0.0) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  int64_t n_bad = 0;
  std::ostringstream examples;
  std::vector<float> written_out, written_ref;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(ref[i])) {
      if (out[i] != kBf16Poison) {
        if (n_bad++ < 5) examples << " [" << i << "] written but should be untouched;";
      }
      continue;
    }
    const double o = kestrel::Bf16ToF32(out[i]);
    const double r = kestrel::Bf16ToF32(F32ToBf16(ref[i]));
    written_out.push_back(static_cast<float>(o));
    written_ref.push_back(ref[i]);
    const double tol =
        std::isfinite(o) ? Bf16Ulp(std::max(std::fabs(o), std::fabs(r))) + abs_floor : 0.0;
    if (!std::isfinite(o) || std::fabs(o - r) > tol) {
      if (n_bad++ < 5) {
        examples << " [" << i << "] got " << o << " want " << r << " (f32 " << ref[i] << ");";
      }
    }
  }
  if (n_bad > 0) {
    return ::testing::AssertionFailure()
           << n_bad << " of " << out.size() << " elements off:" << examples.str();
  }
  const double rel = RelL2(written_out, written_ref);
  if (rel > 4e-3) return ::testing::AssertionFailure() << "rel L2 " << rel;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameBits(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::memcmp(&out[i], &ref[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << out[i] << " want " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// n ids in [0, vocab), the first two pinned to the extremes.
std::vector<int32_t> RandomIds(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(rng);
  ids[0] = static_cast<int32_t>(vocab - 1);
  if (n > 1) ids[1] = 0;
  return ids;
}

// ---- EmbeddingGather ---------------------------------------------------------------------------

TEST(CudaEmbeddingGather, MatchesCpuBitForBit) {
  KESTREL_REQUIRE_CUDA();
  const int64_t vocab = 1000;
  uint64_t seed = 100;
  for (int64_t hidden : kRowSizes) {
    for (int64_t n : kTokenCounts) {
      SCOPED_TRACE("hidden " + std::to_string(hidden) + " n " + std::to_string(n));
      const std::vector<uint16_t> table = RandomBf16(vocab * hidden, seed++, -2.0f, 2.0f);
      const std::vector<int32_t> ids = RandomIds(n, vocab, seed++);
      std::vector<float> ref(n * hidden);
      cpu::EmbeddingGather(Bf16View(table, vocab, hidden), ids, ref.data());

      const DeviceBuffer d_table = Upload(table);
      const DeviceBuffer d_ids = Upload(ids);
      const DeviceBuffer d_out = Poisoned<float>(n * hidden);
      EmbeddingGather(Bf16Ptr(d_table), vocab, hidden, d_ids.as<int32_t>(), n, d_out.as<float>(),
                      nullptr);
      EXPECT_TRUE(SameBits(Download<float>(d_out, n * hidden), ref));
    }
  }
}

// Table and output one element past a 16-byte boundary: the per-element path, at a row size the
// vector path would otherwise take.
TEST(CudaEmbeddingGather, UnalignedPointersTakeTheScalarPath) {
  KESTREL_REQUIRE_CUDA();
  const int64_t vocab = 50, hidden = 64, n = 7;
  std::vector<uint16_t> padded = RandomBf16(vocab * hidden + 1, 7, -2.0f, 2.0f);
  const std::vector<uint16_t> table(padded.begin() + 1, padded.end());
  const std::vector<int32_t> ids = RandomIds(n, vocab, 8);
  std::vector<float> ref(n * hidden);
  cpu::EmbeddingGather(Bf16View(table, vocab, hidden), ids, ref.data());

  const DeviceBuffer d_table = Upload(padded);
  const DeviceBuffer d_ids = Upload(ids);
  const DeviceBuffer d_out = Poisoned<float>(n * hidden + 1);
  EmbeddingGather(Bf16Ptr(d_table) + 1, vocab, hidden, d_ids.as<int32_t>(), n,
                  d_out.as<float>() + 1, nullptr);
  std::vector<float> out = Download<float>(d_out, n * hidden + 1);
  EXPECT_TRUE(std::isnan(out[0]));  // nothing written before the output
  out.erase(out.begin());
  EXPECT_TRUE(SameBits(out, ref));
}

// ---- RMSNorm -----------------------------------------------------------------------------------

enum class DeltaMode { kNone, kDelta, kDeltaAndBias };

TEST(CudaAddRmsNorm, MatchesCpuWithAndWithoutResidualDelta) {
  KESTREL_REQUIRE_CUDA();
  uint64_t seed = 200;
  std::vector<int64_t> sizes(std::begin(kRowSizes), std::end(kRowSizes));
  sizes.push_back(16384);  // the largest supported row
  for (int64_t d : sizes) {
    for (int64_t n : kTokenCounts) {
      for (DeltaMode mode : {DeltaMode::kNone, DeltaMode::kDelta, DeltaMode::kDeltaAndBias}) {
        SCOPED_TRACE("d " + std::to_string(d) + " n " + std::to_string(n) + " mode " +
                     std::to_string(static_cast<int>(mode)));
        const float eps = seed % 2 == 0 ? 1e-6f : 1e-5f;
        const std::vector<float> x = RandomF32(n * d, seed++, -2.0f, 2.0f);
        const std::vector<float> delta = RandomF32(n * d, seed++, -1.0f, 1.0f);
        const std::vector<uint16_t> bias = RandomBf16(d, seed++, -0.5f, 0.5f);
        const std::vector<uint16_t> w = RandomBf16(d, seed++, -1.5f, 1.5f);

        // The CPU forward: Linear adds its bias to its output, then AddInPlace into the residual.
        std::vector<float> x_ref = x;
        if (mode != DeltaMode::kNone) {
          for (int64_t i = 0; i < n * d; ++i) {
            float dv = delta[i];
            if (mode == DeltaMode::kDeltaAndBias) dv = dv + kestrel::Bf16ToF32(bias[i % d]);
            x_ref[i] = x_ref[i] + dv;
          }
        }
        std::vector<float> y_ref(n * d);
        cpu::RmsNorm(x_ref.data(), n, d, Bf16View(w, d), eps, y_ref.data());

        const DeviceBuffer d_x = Upload(x);
        const DeviceBuffer d_delta = Upload(delta);
        const DeviceBuffer d_bias = Upload(bias);
        const DeviceBuffer d_w = Upload(w);
        const DeviceBuffer d_y = Poisoned<uint16_t>(n * d);
        AddRmsNorm(d_x.as<float>(), mode != DeltaMode::kNone ? d_delta.as<float>() : nullptr,
                   mode == DeltaMode::kDeltaAndBias ? Bf16Ptr(d_bias) : nullptr, Bf16Ptr(d_w), eps,
                   n, d, Bf16Ptr(d_y), nullptr);
        EXPECT_TRUE(Bf16Near(Download<uint16_t>(d_y, n * d), y_ref));
        // The residual is updated in place by the same f32 additions (unchanged without delta).
        EXPECT_TRUE(SameBits(Download<float>(d_x, n * d), x_ref));
      }
    }
  }
}

TEST(CudaGatherRmsNorm, NormalisesTheSelectedRowsOnly) {
  KESTREL_REQUIRE_CUDA();
  uint64_t seed = 300;
  const int64_t n_tokens = 300;
  for (int64_t d : kRowSizes) {
    for (int64_t n_rows : kTokenCounts) {
      SCOPED_TRACE("d " + std::to_string(d) + " n_rows " + std::to_string(n_rows));
      const float eps = 1e-6f;
      const std::vector<float> x = RandomF32(n_tokens * d, seed++, -3.0f, 3.0f);
      const std::vector<uint16_t> w = RandomBf16(d, seed++, -1.5f, 1.5f);
      // Arbitrary rows, repeats allowed, the last token first (the usual decode pick).
      std::vector<int32_t> rows = RandomIds(n_rows, n_tokens, seed++);

      std::vector<float> gathered(n_rows * d);
      for (int64_t i = 0; i < n_rows; ++i) {
        std::copy_n(x.begin() + rows[i] * d, d, gathered.begin() + i * d);
      }
      std::vector<float> y_ref(n_rows * d);
      cpu::RmsNorm(gathered.data(), n_rows, d, Bf16View(w, d), eps, y_ref.data());

      const DeviceBuffer d_x = Upload(x);
      const DeviceBuffer d_rows = Upload(rows);
      const DeviceBuffer d_w = Upload(w);
      const DeviceBuffer d_y = Poisoned<uint16_t>(n_rows * d);
      GatherRmsNorm(d_x.as<float>(), d_rows.as<int32_t>(), n_rows, d, Bf16Ptr(d_w), eps,
                    Bf16Ptr(d_y), nullptr);
      EXPECT_TRUE(Bf16Near(Download<uint16_t>(d_y, n_rows * d), y_ref));
      EXPECT_TRUE(SameBits(Download<float>(d_x, n_tokens * d), x));  // input untouched
    }
  }
}

// ---- QkvRope -----------------------------------------------------------------------------------

struct RopeCase {
  int32_t head_dim = 0, n_heads = 0, n_kv_heads = 0;
  int64_t n = 0;
  bool bias = false, q_norm = false, k_norm = false;
  float attention_scaling = 1.0f;
  int32_t block_size = 16;
  std::vector<int32_t> slots;  // empty: a shuffled choice of distinct slots

  std::string Name() const {
    std::ostringstream s;
    s << "head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads << " n " << n
      << " bias " << bias << " q_norm " << q_norm << " k_norm " << k_norm << " scaling "
      << attention_scaling << " bs " << block_size;
    return s.str();
  }
};

// Largest magnitude of the finite elements, for the RoPE cancellation floor.
double MaxAbsFinite(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) {
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  }
  return m;
}

void RunRopeCase(const RopeCase& c, uint64_t seed) {
  SCOPED_TRACE(c.Name());
  const int64_t hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, n = c.n;
  const int64_t half = hd / 2;
  const int64_t n_total = nh + 2 * nkv;
  const int64_t bs = c.block_size;

  std::vector<int32_t> slots = c.slots;
  int64_t n_blocks = 0;
  if (slots.empty()) {
    // Spare blocks so some slots stay untouched; the slots are a shuffled subset.
    n_blocks = (n + bs - 1) / bs + 2;
    std::vector<int32_t> all(n_blocks * bs);
    std::iota(all.begin(), all.end(), 0);
    std::mt19937_64 rng(seed + 1);
    std::shuffle(all.begin(), all.end(), rng);
    slots.assign(all.begin(), all.begin() + n);
  } else {
    KCHECK(static_cast<int64_t>(slots.size()) == n);
    n_blocks = (*std::max_element(slots.begin(), slots.end())) / bs + 2;
  }

  const std::vector<float> qkv = RandomF32(n * n_total * hd, seed + 2, -3.0f, 3.0f);
  const std::vector<uint16_t> bias = RandomBf16(n_total * hd, seed + 3, -1.0f, 1.0f);
  const std::vector<uint16_t> q_norm = RandomBf16(hd, seed + 4, -2.0f, 2.0f);
  const std::vector<uint16_t> k_norm = RandomBf16(hd, seed + 5, -2.0f, 2.0f);
  std::vector<int32_t> positions(n);
  {
    std::mt19937_64 rng(seed + 6);
    std::uniform_int_distribution<int32_t> dist(0, 40000);
    for (int32_t& p : positions) p = dist(rng);
    positions[0] = 40000;  // the largest angle: pos * inv_freq[0] = 40000 rad
    if (n > 1) positions[1] = 0;
  }
  // transformers' default inv_freq, in f32 (theta alternates between common values).
  const double theta = seed % 2 == 0 ? 10000.0 : 1000000.0;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / hd));
  }
  const float eps = 1e-6f;

  // CPU reference: split (+ bias), per-head RmsNorm, RopeTables + ApplyRope, WriteKv into f32
  // caches whose NaN marks "must stay untouched".
  std::vector<float> q(n * nh * hd), k(n * nkv * hd), v(n * nkv * hd);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < n_total; ++h) {
      for (int64_t j = 0; j < hd; ++j) {
        float a = qkv[(t * n_total + h) * hd + j];
        if (c.bias) a = a + kestrel::Bf16ToF32(bias[h * hd + j]);
        if (h < nh) {
          q[(t * nh + h) * hd + j] = a;
        } else if (h < nh + nkv) {
          k[(t * nkv + (h - nh)) * hd + j] = a;
        } else {
          v[(t * nkv + (h - nh - nkv)) * hd + j] = a;
        }
      }
    }
  }
  if (c.q_norm) cpu::RmsNorm(q.data(), n * nh, hd, Bf16View(q_norm, hd), eps, q.data());
  if (c.k_norm) cpu::RmsNorm(k.data(), n * nkv, hd, Bf16View(k_norm, hd), eps, k.data());
  std::vector<float> cos(n * half), sin(n * half);
  cpu::RopeTables(positions, inv_freq, c.attention_scaling, cos.data(), sin.data());
  cpu::ApplyRope(q.data(), n, nh, hd, cos.data(), sin.data(), half);
  cpu::ApplyRope(k.data(), n, nkv, hd, cos.data(), sin.data(), half);

  const cpu::KvLayout layout{nkv, hd, c.block_size, n_blocks};
  const int64_t cache_elems = n_blocks * nkv * bs * hd;
  std::vector<float> k_cache_ref(cache_elems, NAN), v_cache_ref(cache_elems, NAN);
  {
    std::vector<float> k_kept, v_kept;
    std::vector<int32_t> slots_kept;
    for (int64_t t = 0; t < n; ++t) {
      if (slots[t] < 0) continue;  // padding token: no K/V
      slots_kept.push_back(slots[t]);
      k_kept.insert(k_kept.end(), k.begin() + t * nkv * hd, k.begin() + (t + 1) * nkv * hd);
      v_kept.insert(v_kept.end(), v.begin() + t * nkv * hd, v.begin() + (t + 1) * nkv * hd);
    }
    cpu::WriteKv(k_kept.data(), v_kept.data(), slots_kept, layout, k_cache_ref.data(),
                 v_cache_ref.data());
  }

  const DeviceBuffer d_qkv = Upload(qkv);
  const DeviceBuffer d_bias = Upload(bias);
  const DeviceBuffer d_q_norm = Upload(q_norm);
  const DeviceBuffer d_k_norm = Upload(k_norm);
  const DeviceBuffer d_positions = Upload(positions);
  const DeviceBuffer d_inv_freq = Upload(inv_freq);
  const DeviceBuffer d_slots = Upload(slots);
  const DeviceBuffer d_q = Poisoned<uint16_t>(n * nh * hd);
  const DeviceBuffer d_k_cache = Poisoned<uint16_t>(cache_elems);
  const DeviceBuffer d_v_cache = Poisoned<uint16_t>(cache_elems);
  QkvRopeShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.rotary_half = c.head_dim / 2;
  shape.block_size_tokens = c.block_size;
  shape.qk_norm_eps = eps;
  shape.attention_scaling = c.attention_scaling;
  QkvRope(d_qkv.as<float>(), c.bias ? Bf16Ptr(d_bias) : nullptr,
          c.q_norm ? Bf16Ptr(d_q_norm) : nullptr, c.k_norm ? Bf16Ptr(d_k_norm) : nullptr,
          d_positions.as<int32_t>(), d_inv_freq.as<float>(), d_slots.as<int32_t>(), n, shape,
          Bf16Ptr(d_q), Bf16Ptr(d_k_cache), Bf16Ptr(d_v_cache), nullptr);

  EXPECT_TRUE(Bf16Near(Download<uint16_t>(d_q, n * nh * hd), q, 1e-5 * MaxAbsFinite(q))) << "q";
  EXPECT_TRUE(Bf16Near(Download<uint16_t>(d_k_cache, cache_elems), k_cache_ref,
                       1e-5 * MaxAbsFinite(k_cache_ref)))
      << "k cache";
  // V is bias + one rounding: no floor.
  EXPECT_TRUE(Bf16Near(Download<uint16_t>(d_v_cache, cache_elems), v_cache_ref)) << "v cache";

  // The same into quantized caches (kv_cache.h). The kernel quantizes its f32 row, which is
  // within a few f32 ulps (+ the RoPE floor) of the reference row, so: each written row's scale
  // is the reference row's within that, at least 99% of the codes equal the reference row's
  // codes and the others are the neighbouring code; rows not written keep their poison.
  const int64_t n_rows = cache_elems / hd;
  for (KvCacheType type : {KvCacheType::kFp8, KvCacheType::kInt8}) {
    SCOPED_TRACE(KvCacheTypeName(type));
    const DeviceBuffer d_kc = Poisoned<uint8_t>(cache_elems);
    const DeviceBuffer d_vc = Poisoned<uint8_t>(cache_elems);
    const DeviceBuffer d_ks = Poisoned<float>(n_rows);
    const DeviceBuffer d_vs = Poisoned<float>(n_rows);
    QkvRope(d_qkv.as<float>(), c.bias ? Bf16Ptr(d_bias) : nullptr,
            c.q_norm ? Bf16Ptr(d_q_norm) : nullptr, c.k_norm ? Bf16Ptr(d_k_norm) : nullptr,
            d_positions.as<int32_t>(), d_inv_freq.as<float>(), d_slots.as<int32_t>(), n, shape,
            Bf16Ptr(d_q), KvCacheOut{d_kc.get(), d_vc.get(), d_ks.as<float>(), d_vs.as<float>(), type},
            nullptr);
    for (const bool is_v : {false, true}) {
      SCOPED_TRACE(is_v ? "v" : "k");
      const std::vector<float>& ref = is_v ? v_cache_ref : k_cache_ref;
      const std::vector<uint8_t> codes = Download<uint8_t>(is_v ? d_vc : d_kc, cache_elems);
      const std::vector<float> scales = Download<float>(is_v ? d_vs : d_ks, n_rows);
      const double floor = is_v ? 0.0 : 1e-5 * MaxAbsFinite(ref);
      int64_t n_codes = 0, n_other = 0;
      std::vector<uint8_t> want(hd);
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* x = ref.data() + r * hd;
        const uint8_t* got = codes.data() + r * hd;
        if (std::isnan(x[0])) {  // not written
          ASSERT_TRUE(std::isnan(scales[r])) << "row " << r;
          ASSERT_TRUE(std::all_of(got, got + hd, [](uint8_t b) { return b == 0xFF; }));
          continue;
        }
        const float scale = testing::QuantizeKvRow(x, hd, type, want.data());
        ASSERT_NEAR(scales[r], scale, 1e-6 * scale + floor / KvCacheCodeMax(type)) << "row " << r;
        for (int64_t i = 0; i < hd; ++i) {
          ++n_codes;
          if (got[i] == want[i]) continue;
          ++n_other;
          // The neighbouring code: within one step of the reference value.
          const float g = testing::KvCodeValue(got[i], type) * scales[r];
          const float w = testing::KvCodeValue(want[i], type) * scale;
          const float step = type == KvCacheType::kInt8
                                 ? scale
                                 : std::max(std::fabs(w) / 8.0f, scale * 0x1p-9f);
          ASSERT_LE(std::fabs(g - w), 1.01 * step + floor) << "row " << r << " dim " << i;
        }
      }
      EXPECT_LE(n_other, n_codes / 100) << n_other << " of " << n_codes << " codes differ";
    }
  }
}

// The host e4m3 encoder the quantized-cache checks use: every finite code round-trips, ties go
// to the even code, and values past 448 saturate.
TEST(CudaQkvRope, HostE4m3EncoderRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(testing::EncodeE4m3(testing::DecodeE4m3(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(testing::EncodeE4m3(1.0625f), 0x38);  // between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(testing::EncodeE4m3(1.1875f), 0x3A);  // between 0x39 and 0x3A: even
  EXPECT_EQ(testing::EncodeE4m3(1000.0f), 0x7E);
  EXPECT_EQ(testing::EncodeE4m3(-1000.0f), 0xFE);
}

TEST(CudaQkvRope, MatchesCpuOverHeadDimsGqaAndOptions) {
  KESTREL_REQUIRE_CUDA();
  // (n_heads, n_kv_heads) for GQA ratios 1, 2, 4, 8.
  const int32_t kHeads[][2] = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};
  struct Options {
    bool bias, q_norm, k_norm;
    float scaling;
    int32_t block_size;
  };
  const Options kOptions[] = {
      {false, false, false, 1.0f, 16}, {true, false, false, 1.3f, 32},
      {false, true, true, 1.3f, 16},   {true, true, true, 1.0f, 32},
      {true, true, false, 1.3f, 16},  // q-norm only
  };
  uint64_t seed = 400;
  for (int32_t hd : {16, 32, 64, 128, 256}) {
    for (const auto& heads : kHeads) {
      for (int64_t n : kTokenCounts) {
        for (const Options& o : kOptions) {
          RopeCase c;
          c.head_dim = hd;
          c.n_heads = heads[0];
          c.n_kv_heads = heads[1];
          c.n = n;
          c.bias = o.bias;
          c.q_norm = o.q_norm;
          c.k_norm = o.k_norm;
          c.attention_scaling = o.scaling;
          c.block_size = o.block_size;
          RunRopeCase(c, seed);
          seed += 10;
        }
      }
    }
  }
}

// Model-sized head counts and batches large enough for the several-heads-per-warp path, including
// head counts that are not a multiple of the heads one block or one warp covers.
TEST(CudaQkvRope, MatchesCpuAtModelShapes) {
  KESTREL_REQUIRE_CUDA();
  std::vector<RopeCase> cases;
  auto add = [&](int32_t hd, int32_t nh, int32_t nkv, int64_t n, bool bias, bool norm, float sc,
                 int32_t bs) {
    RopeCase c;
    c.head_dim = hd;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    c.n = n;
    c.bias = bias;
    c.q_norm = c.k_norm = norm;
    c.attention_scaling = sc;
    c.block_size = bs;
    cases.push_back(c);
  };
  add(128, 32, 8, 300, false, true, 1.0f, 16);  // Qwen3-8B-like
  add(128, 28, 4, 300, true, false, 1.0f, 16);  // Qwen2-7B-like (qkv bias)
  add(64, 40, 5, 300, true, true, 1.3f, 32);    // 50 heads: a warp's last group is partial
  add(256, 16, 2, 513, false, true, 1.0f, 16);
  add(128, 32, 8, 1, false, true, 1.0f, 16);  // decode
  add(128, 32, 8, 17, true, false, 1.3f, 32);
  add(64, 8, 2, 1400, false, true, 1.0f, 16);   // kestrel-tiny, a long prefill
  add(128, 32, 8, 2100, false, true, 1.0f, 16);  // Qwen3-8B, a long prefill
  uint64_t seed = 900;
  for (const RopeCase& c : cases) {
    RunRopeCase(c, seed);
    seed += 10;
  }
}

// Slot -1 marks a padding token: its q is still written, its K/V go nowhere.
TEST(CudaQkvRope, NegativeSlotWritesNoKv) {
  KESTREL_REQUIRE_CUDA();
  RopeCase c;
  c.head_dim = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.n = 5;
  c.bias = true;
  c.q_norm = c.k_norm = true;
  c.block_size = 16;
  c.slots = {3, -1, 0, -1, 21};
  RunRopeCase(c, 1000);
}

// ---- SiluMul -----------------------------------------------------------------------------------

enum class SiluBias { kNone, kBoth, kGateOnly, kUpOnly };

void RunSiluCase(int64_t n, int64_t inter, SiluBias bias_mode, uint64_t seed, int64_t ptr_offset) {
  SCOPED_TRACE("I " + std::to_string(inter) + " n " + std::to_string(n) + " bias " +
               std::to_string(static_cast<int>(bias_mode)) + " offset " +
               std::to_string(ptr_offset));
  std::vector<float> gate_up = RandomF32(n * 2 * inter, seed, -8.0f, 8.0f);
  // Tails: exp(-g) overflowing (g = -100) and underflowing (g = 100), and zero.
  const float special[] = {-100.0f, 100.0f, -20.0f, 0.0f, 20.0f};
  for (size_t i = 0; i < std::size(special) && static_cast<int64_t>(i) < inter; ++i) {
    gate_up[i] = special[i];
  }
  const std::vector<uint16_t> gate_bias = RandomBf16(inter, seed + 1, -1.0f, 1.0f);
  const std::vector<uint16_t> up_bias = RandomBf16(inter, seed + 2, -1.0f, 1.0f);
  const bool use_gate_bias = bias_mode == SiluBias::kBoth || bias_mode == SiluBias::kGateOnly;
  const bool use_up_bias = bias_mode == SiluBias::kBoth || bias_mode == SiluBias::kUpOnly;

  std::vector<float> gate(n * inter), up(n * inter), ref(n * inter);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < inter; ++i) {
      float g = gate_up[t * 2 * inter + i];
      float u = gate_up[t * 2 * inter + inter + i];
      if (use_gate_bias) g = g + kestrel::Bf16ToF32(gate_bias[i]);
      if (use_up_bias) u = u + kestrel::Bf16ToF32(up_bias[i]);
      gate[t * inter + i] = g;
      up[t * inter + i] = u;
    }
  }
  cpu::SiluMul(cpu::OpContext{}, gate.data(), up.data(), n * inter, ref.data());

  const DeviceBuffer d_gate_up = Upload(gate_up);
  const DeviceBuffer d_gate_bias = Upload(gate_bias);
  const DeviceBuffer d_up_bias = Upload(up_bias);
  const DeviceBuffer d_out = Poisoned<uint16_t>(n * inter + ptr_offset);
  SiluMul(d_gate_up.as<float>(), use_gate_bias ? Bf16Ptr(d_gate_bias) : nullptr,
          use_up_bias ? Bf16Ptr(d_up_bias) : nullptr, n, inter, Bf16Ptr(d_out) + ptr_offset,
          nullptr);
  std::vector<uint16_t> out = Download<uint16_t>(d_out, n * inter + ptr_offset);
  for (int64_t i = 0; i < ptr_offset; ++i) EXPECT_EQ(out[i], kBf16Poison);
  out.erase(out.begin(), out.begin() + ptr_offset);
  EXPECT_TRUE(Bf16Near(out, ref));
}

TEST(CudaSiluMul, MatchesCpuWithEveryBiasCombination) {
  KESTREL_REQUIRE_CUDA();
  uint64_t seed = 500;
  for (int64_t inter : kRowSizes) {
    for (int64_t n : kTokenCounts) {
      for (SiluBias b :
           {SiluBias::kNone, SiluBias::kBoth, SiluBias::kGateOnly, SiluBias::kUpOnly}) {
        RunSiluCase(n, inter, b, seed, 0);
        seed += 3;
      }
    }
  }
}

// An output one element past a 16-byte boundary takes the per-element path.
TEST(CudaSiluMul, UnalignedOutputTakesTheScalarPath) {
  KESTREL_REQUIRE_CUDA();
  RunSiluCase(5, 64, SiluBias::kBoth, 600, 1);
}

// Gate|up rows at the start of wider rows (the MoE layers' [shared gate|up | router] product):
// bitwise the contiguous call's output, the other columns (NaN) never read; strides that keep
// rows 16-byte aligned take the vector path, others the per-element one.
TEST(CudaSiluMul, StridedRowsEqualContiguousRows) {
  KESTREL_REQUIRE_CUDA();
  const int64_t n = 7, inter = 64;
  const std::vector<float> gate_up = RandomF32(n * 2 * inter, 700, -8.0f, 8.0f);
  const DeviceBuffer d_dense = Upload(gate_up);
  const DeviceBuffer d_want = Poisoned<uint16_t>(n * inter);
  SiluMul(d_dense.as<float>(), nullptr, nullptr, n, inter, Bf16Ptr(d_want), nullptr);
  const std::vector<uint16_t> want = Download<uint16_t>(d_want, n * inter);
  for (int64_t stride : {2 * inter + 260, 2 * inter + 257}) {
    SCOPED_TRACE(stride);
    std::vector<float> wide(static_cast<size_t>(n * stride), std::nanf(""));
    for (int64_t t = 0; t < n; ++t) {
      std::copy(gate_up.begin() + t * 2 * inter, gate_up.begin() + (t + 1) * 2 * inter,
                wide.begin() + t * stride);
    }
    const DeviceBuffer d_wide = Upload(wide);
    const DeviceBuffer d_out = Poisoned<uint16_t>(n * inter);
    SiluMul(d_wide.as<float>(), stride, nullptr, nullptr, n, inter, Bf16Ptr(d_out), nullptr);
    EXPECT_EQ(Download<uint16_t>(d_out, n * inter), want);
  }
}

}  // namespace
}  // namespace kestrel::cuda
