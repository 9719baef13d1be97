// The int8 KV cache (--kv-cache-dtype int8) on the trained embedded model: what it costs in
// logits against the f32 cache over a long prompt (printed), in both kernel sets, and that the
// option is refused where it does not apply; and the quantization error of the int8 and fp8 (e4m3,
// CUDA's) row formats per layer, on the K/V rows the model writes (printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "models/cpu_runner.h"
#include "models/model.h"
#include "tiny_model.h"

namespace kestrel {
namespace {

using KvDType = ModelLoadOptions::KvCacheDType;

std::unique_ptr<Model> Load(KvDType kv, CpuKernels kernels) {
  ModelLoadOptions opts;
  opts.kernels = kernels;
  opts.kv_cache_tokens = 1024;
  opts.kv_cache_dtype = kv;
  Result<std::unique_ptr<Model>> m =
      Model::Load(std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny", opts);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> Blocks(const Model& m) {
  std::vector<int32_t> b(m.n_kv_blocks());
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>(i);
  return b;
}

// The int8 and bf16 caches against the f32 one (int8: within its rounding; bf16: 2^-9 relative
// per value, far closer).
TEST(Int8KvCache, LogitsStayNearTheF32CacheOverALongPrompt) {
  std::vector<CpuKernels> sets = {CpuKernels::kReference};
  if (cpu::CpuHasAvx2Fma()) sets.push_back(CpuKernels::kAuto);
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(300);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 8000);
  for (CpuKernels k : sets) {
    for (KvDType dt : {KvDType::kInt8, KvDType::kBf16}) {
      const bool is_bf16 = dt == KvDType::kBf16;
      std::unique_ptr<Model> f32 = Load(KvDType::kF32, k), int8 = Load(dt, k);
      ASSERT_TRUE(f32 && int8);
      EXPECT_STREQ(int8->kv_cache_dtype(), is_bf16 ? "bf16" : "int8");
      const int64_t hd = f32->config().head_dim;  // int8 codes plus one f32 scale per row
      if (is_bf16) {
        EXPECT_EQ(int8->kv_bytes_per_token() * 2, f32->kv_bytes_per_token());
      } else {
        EXPECT_EQ(int8->kv_bytes_per_token() * 4 * hd, f32->kv_bytes_per_token() * (hd + 4));
      }
      testing::SeqRunner rf(f32.get(), Blocks(*f32)), ri(int8.get(), Blocks(*int8));
      const int sf = rf.AddSequence(prompt), si = ri.AddSequence(prompt);
      // The prompt in two chunks (the second attends over the first's cached rows), then decode.
      std::vector<std::vector<float>> lf = rf.Step({{sf, 200}})[0], li = ri.Step({{si, 200}})[0];
      auto more_f = rf.Step({{sf, 100}})[0], more_i = ri.Step({{si, 100}})[0];
      lf.insert(lf.end(), more_f.begin(), more_f.end());
      li.insert(li.end(), more_i.begin(), more_i.end());
      double worst = 0, sum = 0;
      int same = 0;
      for (size_t t = 0; t < lf.size(); ++t) {
        const double e = testing::MaxAbsDiff(li[t], lf[t]) / testing::Range(lf[t]);
        worst = std::max(worst, e);
        sum += e;
        same += testing::Argmax(li[t]) == testing::Argmax(lf[t]);
      }
      std::printf(
          "[ info     ] %s: %s KV max |logit - f32 KV| / range %.4f (mean %.4f), argmax "
          "equal at %d of %zu positions\n",
          k == CpuKernels::kReference ? "reference" : "avx2", is_bf16 ? "bf16" : "int8", worst,
          sum / static_cast<double>(lf.size()), same, lf.size());
      EXPECT_LE(worst, is_bf16 ? 0.01 : 0.05);
      EXPECT_GE(same, static_cast<int>(lf.size()) * (is_bf16 ? 98 : 95) / 100);
      EXPECT_GT(worst, 0.0) << "the cache was not used";
    }
  }
}

// e4m3 (bias 7, max 448) rounded to nearest even, as the CUDA cache writes its codes.
float RoundE4m3(float y) {
  const float a = std::min(std::fabs(y), 448.0f);
  float r;
  if (a < 0x1p-6f) {
    r = std::nearbyint(a * 0x1p9f) * 0x1p-9f;  // subnormal steps of 2^-9
  } else {
    int e2 = 0;
    std::frexp(a, &e2);  // a = m 2^e2, m in [0.5, 1): 3 mantissa bits are steps of 2^(e2 - 4)
    r = std::ldexp(std::nearbyint(std::ldexp(a, 4 - e2)), e2 - 4);
  }
  return std::copysign(r, y);
}

// The relative RMS error sqrt(sum (x - q(x))^2 / sum x^2) per attention layer of the K and V rows
// a 300-token prompt wrote, for the int8 rows of --kv-cache-dtype int8 (CPU and CUDA) and the
// e4m3 rows of --kv-cache-dtype fp8 (CUDA), each with its scale max|row| / code max.
TEST(Int8KvCache, RowQuantizationErrorPerLayer) {
  std::unique_ptr<Model> m = Load(KvDType::kF32, CpuKernels::kAuto);
  ASSERT_TRUE(m);
  std::mt19937 rng(9);
  std::vector<int32_t> prompt(300);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 8000);
  testing::SeqRunner runner(m.get(), Blocks(*m));  // blocks in order: position p is slot p
  runner.Step({{runner.AddSequence(prompt), 300}});
  const CpuCaches& c = static_cast<const CpuRunner&>(*m).caches();
  const int64_t hd = c.spec.head_dim;
  auto quantize = [&](const float* x, float code_max, bool fp8, double& err, double& ref) {
    float amax = 0.0f;
    for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float scale = amax / code_max;
    for (int64_t d = 0; d < hd; ++d) {
      float q = 0.0f;
      if (scale > 0.0f) {
        const float y = x[d] / scale;
        q = (fp8 ? RoundE4m3(y) : std::clamp(std::nearbyint(y), -127.0f, 127.0f)) * scale;
      }
      err += (static_cast<double>(x[d]) - q) * (static_cast<double>(x[d]) - q);
      ref += static_cast<double>(x[d]) * x[d];
    }
  };
  std::printf("[ info     ] layer  K int8   V int8   K fp8    V fp8   (relative RMS error)\n");
  for (int64_t layer = 0; layer < c.spec.n_attention_layers; ++layer) {
    double rel[2][2];  // [int8, fp8][K, V]
    for (int which = 0; which < 2; ++which) {
      const float* cache = c.kv.get() + (2 * layer + which) * c.kv_floats_per_layer();
      for (int fmt = 0; fmt < 2; ++fmt) {
        double err = 0, ref = 0;
        for (int32_t pos = 0; pos < 300; ++pos) {
          for (int64_t h = 0; h < c.spec.n_kv_heads; ++h) {
            quantize(cache + c.kv_layout.RowOffset(pos, h), fmt == 0 ? 127.0f : 448.0f, fmt == 1,
                     err, ref);
          }
        }
        rel[fmt][which] = std::sqrt(err / ref);
      }
    }
    std::printf("[ info     ] %5lld  %.5f  %.5f  %.5f  %.5f\n", static_cast<long long>(layer),
                rel[0][0], rel[0][1], rel[1][0], rel[1][1]);
    // int8 steps are max|row| / 127 (an error of at most half a step per element); e4m3 keeps 3
    // mantissa bits (at most 2^-4 relative per element). Both well below those worst cases on
    // average, and never zero (the rows are not already on the grid).
    for (int which = 0; which < 2; ++which) {
      EXPECT_GT(rel[0][which], 0.0);
      EXPECT_LT(rel[0][which], 0.02);
      EXPECT_GT(rel[1][which], rel[0][which]);
      EXPECT_LT(rel[1][which], 0.0625);
    }
  }
}

TEST(Int8KvCache, Fp8IsRefusedOnTheCpu) {
  ModelLoadOptions opts;
  opts.kv_cache_dtype = KvDType::kFp8;
  Result<std::unique_ptr<Model>> m =
      Model::Load(std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny", opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--kv-cache-dtype fp8"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
