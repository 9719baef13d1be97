// The forward against an independent dense implementation (tiny_model.cpp: NaiveForward, plain
// loops in double) on small random models of every supported architecture and weight dtype:
// prefill logits at every position, then greedy decode one token per Forward through the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "tiny_model.h"

namespace kestrel {
namespace {

using testing::TinyModelSpec;

struct Case {
  std::string name;
  TinyModelSpec spec;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  TinyModelSpec llama;  // GQA 4/2, head_dim 12 != hidden/heads, untied, bf16
  cases.push_back({"llama_bf16", llama});
  TinyModelSpec llama_f32 = llama;
  llama_f32.dtype = DType::kF32;
  llama_f32.attention_bias = true;  // q/k/v and o_proj biases
  llama_f32.seed = 2;
  cases.push_back({"llama_f32_bias", llama_f32});
  TinyModelSpec llama_f16 = llama;
  llama_f16.dtype = DType::kF16;
  llama_f16.n_kv_heads = 4;  // MHA
  llama_f16.seed = 3;
  cases.push_back({"llama_f16_mha", llama_f16});
  TinyModelSpec qwen2 = llama;
  qwen2.architecture = "Qwen2ForCausalLM";
  qwen2.tie_embeddings = true;
  qwen2.n_kv_heads = 1;  // MQA
  qwen2.seed = 4;
  cases.push_back({"qwen2_tied_mqa", qwen2});
  TinyModelSpec qwen3 = llama;
  qwen3.architecture = "Qwen3ForCausalLM";
  qwen3.head_dim = 16;
  qwen3.n_layers = 3;
  qwen3.rope_theta = 1000000.0;
  qwen3.seed = 5;
  cases.push_back({"qwen3_qknorm", qwen3});
  TinyModelSpec mistral = llama;
  mistral.architecture = "MistralForCausalLM";
  mistral.sliding_window = 5;
  mistral.seed = 6;
  cases.push_back({"mistral_window5", mistral});
  return cases;
}

// Checks one row of engine logits against the double-precision reference.
void ExpectRowClose(const std::vector<float>& got, const std::vector<double>& want,
                    const std::string& where) {
  std::vector<float> want_f(want.begin(), want.end());
  const double range = testing::Range(want_f);
  ASSERT_GT(range, 0.0) << where;
  EXPECT_LE(testing::MaxAbsDiff(got, want_f), 1e-4 * range) << where;
  // Argmax must agree unless the top two are within the tolerance of each other.
  std::vector<float> sorted = want_f;
  std::sort(sorted.rbegin(), sorted.rend());
  if (sorted[0] - sorted[1] > 2e-4 * range) {
    EXPECT_EQ(testing::Argmax(got), testing::Argmax(want_f)) << where;
  }
}

class ForwardVsNaive : public ::testing::TestWithParam<CpuKernels> {};

TEST_P(ForwardVsNaive, PrefillAndGreedyDecodeMatchDenseDouble) {
  const CpuKernels kernels = GetParam();
  if (kernels == CpuKernels::kAuto && !cpu::CpuHasAvx2Fma()) GTEST_SKIP();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string dir = testing::MakeTempDir(c.name);
    const testing::TensorMap weights = testing::WriteTinyModel(dir, c.spec);
    ModelLoadOptions opts;
    opts.kernels = kernels;
    opts.block_size_tokens = 4;
    opts.kv_cache_tokens = 64;
    opts.n_threads = 2;
    Result<std::unique_ptr<Model>> model = Model::Load(dir, opts);
    ASSERT_TRUE(model.ok()) << model.status().message();
    std::mt19937 rng(c.spec.seed);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.spec.vocab) - 1);
    std::vector<int32_t> prompt(19);
    for (int32_t& t : prompt) t = tok(rng);

    testing::SeqRunner runner(model->get(), {5, 3, 9, 0, 1, 2, 4, 6, 7, 8, 10, 11, 12, 13, 14, 15});
    const int seq = runner.AddSequence(prompt);
    auto out = runner.Step({{seq, static_cast<int64_t>(prompt.size())}});
    std::vector<int32_t> tokens = prompt;
    const auto want = testing::NaiveForward(c.spec, weights, tokens);
    for (size_t p = 0; p < prompt.size(); ++p) {
      ExpectRowClose(out[0][p], want[p], "prefill position " + std::to_string(p));
    }
    std::vector<float> last = out[0].back();
    for (int step = 0; step < 8; ++step) {
      const int32_t next = testing::Argmax(last);
      tokens.push_back(next);
      runner.Append(seq, next);
      last = runner.Step({{seq, 1}})[0][0];
      const auto ref = testing::NaiveForward(c.spec, weights, tokens);
      ExpectRowClose(last, ref.back(), "decode step " + std::to_string(step));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ForwardVsNaive,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kAuto),
                         [](const auto& info) {
                           return info.param == CpuKernels::kReference ? "Reference" : "Auto";
                         });

}  // namespace
}  // namespace kestrel
