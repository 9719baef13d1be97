// --deterministic on CUDA: a row's logits depend on its own sequence only, not on what else the
// step computes. One decode row of the embedded model (position 23 of a 24-token sequence) is
// computed five ways: alone, beside another sequence's 100-token prefill chunk, inside a step of
// 71 decode rows (more than the 64 rows of one skinny-kernel call), after its prompt was
// prefilled in three chunks, and as the last row of the whole prompt in one chunk. With the flag
// all five must be bitwise equal; without it they are only close (the report says how close).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "models/model.h"
#include "tiny_model.h"

namespace kestrel {
namespace {

Result<std::unique_ptr<Model>> Load(const std::string& dir, bool deterministic) {
  ModelLoadOptions opts;
  opts.device = Device::kCuda;
  opts.kv_cache_tokens = 4096;
  opts.deterministic = deterministic;
  return Model::Load(dir, opts);
}

std::vector<int32_t> Tokens(size_t n, uint32_t mul, uint32_t add, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * mul + add) % vocab);
  return t;
}

bool Same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The logits of position 23 of `a`, computed in each of the five ways.
std::vector<std::vector<float>> FiveWays(Model* m, const std::vector<int32_t>& a) {
  const int64_t vocab = m->config().vocab_size;
  std::vector<std::vector<float>> rows;
  {  // alone: 23 tokens, then the 24th as a one-row decode step
    testing::SeqRunner r(m, testing::ReversedBlocks(*m));
    const int s = r.AddSequence(a);
    r.Step({{s, 23}});
    rows.push_back(r.Step({{s, 1}})[0][0]);
  }
  {  // beside a 100-token prefill chunk of another sequence
    testing::SeqRunner r(m, testing::ReversedBlocks(*m));
    const int s = r.AddSequence(a);
    const int b = r.AddSequence(Tokens(100, 17, 3, vocab));
    r.Step({{s, 23}});
    rows.push_back(r.Step({{s, 1}, {b, 100}})[0][0]);
  }
  {  // one of 71 decode rows
    testing::SeqRunner r(m, testing::ReversedBlocks(*m));
    std::vector<testing::SeqRunner::Work> prefill, decode;
    const int s = r.AddSequence(a);
    prefill.push_back({s, 23});
    decode.push_back({s, 1});
    for (uint32_t i = 0; i < 70; ++i) {
      const int o = r.AddSequence(Tokens(10 + i % 7, 13 + i, i, vocab));
      prefill.push_back({o, r.n_tokens(o) - 1});
      decode.push_back({o, 1});
    }
    r.Step(prefill);
    rows.push_back(r.Step(decode)[0][0]);
  }
  {  // the prompt in chunks of 5, 13 and 5 tokens, then the decode step
    testing::SeqRunner r(m, testing::ReversedBlocks(*m));
    const int s = r.AddSequence(a);
    r.Step({{s, 5}});
    r.Step({{s, 13}});
    r.Step({{s, 5}});
    rows.push_back(r.Step({{s, 1}})[0][0]);
  }
  {  // the whole prompt in one chunk: its last row
    testing::SeqRunner r(m, testing::ReversedBlocks(*m));
    const int s = r.AddSequence(a);
    rows.push_back(r.Step({{s, 24}})[0].back());
  }
  return rows;
}

TEST(CudaDeterministic, ARowsLogitsDoNotDependOnTheBatchOrTheChunking) {
  KESTREL_REQUIRE_CUDA();
  const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
  const char* kWays[] = {"alone", "beside a prefill chunk", "among 71 decode rows",
                         "after a chunked prefill", "in one prefill chunk"};
  std::vector<std::vector<float>> det, plain;
  for (bool deterministic : {true, false}) {
    Result<std::unique_ptr<Model>> m = Load(dir, deterministic);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const std::vector<int32_t> a = Tokens(24, 31, 7, (*m)->config().vocab_size);
    (deterministic ? det : plain) = FiveWays(m->get(), a);
  }
  for (size_t w = 1; w < det.size(); ++w) {
    EXPECT_TRUE(Same(det[w], det[0]))
        << kWays[w] << ": max |delta| " << testing::MaxAbsDiff(det[w], det[0]);
    std::printf("[ info     ] without --deterministic, %-24s max |delta| vs alone %.3g\n",
                kWays[w], testing::MaxAbsDiff(plain[w], plain[0]));
  }
  // The batch-invariant kernels compute the same function: close to the default path.
  EXPECT_LE(testing::MaxAbsDiff(det[0], plain[0]) / testing::Range(plain[0]), 1e-2);
  EXPECT_EQ(testing::Argmax(det[0]), testing::Argmax(plain[0]));
}

// What has no batch-invariant form on CUDA is refused at load, with the reason, before the GPU
// is touched (so this runs without one too).
TEST(CudaDeterministic, RecurrentAndMoeModelsAreRefusedWithTheReason) {
  const std::string fx = std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/";
  for (const char* name : {"qwen3_5", "qwen3_moe"}) {
    Result<std::unique_ptr<Model>> m = Load(fx + name, true);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_NE(m.status().message().find("--deterministic on CUDA"), std::string::npos)
        << m.status().message();
  }
}

}  // namespace
}  // namespace kestrel
