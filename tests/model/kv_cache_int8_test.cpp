// The int8 KV cache (--kv-cache-dtype int8) on the trained embedded model: what it costs in
// logits against the f32 cache over a long prompt (printed), in both kernel sets, and that the
// option is refused where it does not apply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
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

TEST(Int8KvCache, LogitsStayNearTheF32CacheOverALongPrompt) {
  std::vector<CpuKernels> sets = {CpuKernels::kReference};
  if (cpu::CpuHasAvx2Fma()) sets.push_back(CpuKernels::kAuto);
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(300);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 8000);
  for (CpuKernels k : sets) {
    std::unique_ptr<Model> f32 = Load(KvDType::kF32, k), int8 = Load(KvDType::kInt8, k);
    ASSERT_TRUE(f32 && int8);
    const int64_t hd = f32->config().head_dim;  // int8 codes plus one f32 scale per row
    EXPECT_EQ(int8->kv_bytes_per_token() * 4 * hd, f32->kv_bytes_per_token() * (hd + 4));
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
    std::printf("[ info     ] %s: int8 KV max |logit - f32 KV| / range %.4f (mean %.4f), argmax "
                "equal at %d of %zu positions\n",
                k == CpuKernels::kReference ? "reference" : "avx2", worst,
                sum / static_cast<double>(lf.size()), same, lf.size());
    EXPECT_LE(worst, 0.05);
    EXPECT_GE(same, static_cast<int>(lf.size()) * 95 / 100);
    EXPECT_GT(worst, 0.0) << "the int8 cache was not used";
  }
}

TEST(Int8KvCache, Bf16IsRefusedOnTheCpu) {
  ModelLoadOptions opts;
  opts.kv_cache_dtype = KvDType::kBf16;
  Result<std::unique_ptr<Model>> m =
      Model::Load(std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny", opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--kv-cache-dtype bf16"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
