// The embedded model (models/kestrel-tiny) against the transformers goldens written at training
// time (golden.json): tokenization of each prompt, the chat template render, the argmax at every
// prompt position, and the greedy continuation token for token.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/engine.h"
#include "models/model.h"
#include "models/score.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {
namespace {

using nlohmann::json;

const std::string kDir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";

json LoadGolden() {
  std::ifstream f(kDir + "/golden.json");
  KCHECK_MSG(f.good(), "models/kestrel-tiny/golden.json missing");
  return json::parse(f);
}

class KestrelTinyGolden : public ::testing::TestWithParam<CpuKernels> {};

TEST_P(KestrelTinyGolden, GreedyContinuationsMatchTransformers) {
  json golden = LoadGolden();
  Result<Tokenizer> tok = Tokenizer::FromDirectory(kDir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  Result<ChatTemplate> tmpl = ChatTemplate::FromDirectory(kDir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
  ModelLoadOptions options;
  options.kernels = GetParam();
  options.kv_cache_tokens = 512;
  Result<std::unique_ptr<Model>> model = Model::Load(kDir, options);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::shared_ptr<Model> shared = std::move(*model);
  const int64_t vocab = shared->config().vocab_size;
  std::vector<int32_t> eos = golden["eos_token_ids"];

  // First the prompts' logits (ScorePrompt drives the model directly, so it runs before the
  // engine owns the model), then the generations.
  ASSERT_GE(golden["cases"].size(), 6u);
  std::vector<std::vector<int32_t>> prompts;
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    std::string text = c["text"];
    if (c["kind"] == "chat") {
      Result<std::string> rendered = tmpl->Render(c["messages"], nullptr,
                                                  c["add_generation_prompt"], json::object());
      ASSERT_TRUE(rendered.ok()) << rendered.status().message();
      EXPECT_EQ(*rendered, text);
    }
    std::vector<int32_t> prompt = tok->Encode(text, /*add_special_tokens=*/false);
    ASSERT_EQ(prompt, c["prompt_ids"].get<std::vector<int32_t>>());

    Result<std::vector<float>> logits = ScorePrompt(*shared, prompt);
    ASSERT_TRUE(logits.ok());
    std::vector<int32_t> argmax;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const float* row = &(*logits)[i * vocab];
      argmax.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    EXPECT_EQ(argmax, c["prompt_argmax"].get<std::vector<int32_t>>());
    prompts.push_back(prompt);
  }

  // Generation runs on the Engine, as `kestrel generate` and the server do.
  EngineConfig config;
  config.max_num_seqs = 1;
  Engine engine(shared, &*tok, eos, config);
  engine.Start();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& c = golden["cases"][i];
    SCOPED_TRACE(c["text"].get<std::string>());
    EngineRequest req;
    req.prompt_ids = prompts[i];
    req.sampling.temperature = 0;
    req.max_new_tokens = golden["max_new_tokens"];
    Result<std::shared_ptr<RequestHandle>> handle = engine.Submit(req);
    ASSERT_TRUE(handle.ok()) << handle.status().message();
    std::vector<int32_t> tokens;
    RequestOutput ev;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ev.finished && std::chrono::steady_clock::now() < deadline) {
      if (!(*handle)->Next(&ev, std::chrono::milliseconds(100))) continue;
      tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    }
    ASSERT_TRUE(ev.finished);
    ASSERT_TRUE(ev.error.ok()) << ev.error.message();
    EXPECT_EQ(tokens, c["output_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(FinishReasonName(ev.finish_reason), c["finish_reason"].get<std::string>());
    EXPECT_EQ(tok->Decode(tokens), c["output_text"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, KestrelTinyGolden,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kAuto),
                         [](const auto& info) {
                           return info.param == CpuKernels::kReference ? "Reference" : "Fast";
                         });

}  // namespace
}  // namespace kestrel
