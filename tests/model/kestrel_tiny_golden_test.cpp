// The embedded model (models/kestrel-tiny) against the transformers goldens written at training
// time (golden.json): tokenization of each prompt, the chat template render, the argmax at every
// prompt position, and the greedy continuation token for token.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "engine/generator.h"
#include "models/model.h"
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
  Generator gen(model->get(), &*tok);
  const int64_t vocab = (*model)->config().vocab_size;
  std::vector<int32_t> eos = golden["eos_token_ids"];

  ASSERT_GE(golden["cases"].size(), 6u);
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

    Result<std::vector<float>> logits = gen.AllLogits(prompt);
    ASSERT_TRUE(logits.ok());
    std::vector<int32_t> argmax;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const float* row = &(*logits)[i * vocab];
      argmax.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    EXPECT_EQ(argmax, c["prompt_argmax"].get<std::vector<int32_t>>());

    GenerationRequest req;
    req.prompt_ids = prompt;
    req.sampling.temperature = 0;
    req.max_new_tokens = golden["max_new_tokens"];
    req.eos_ids = eos;
    Result<GenerationResult> r = gen.Run(req, [](const GenerationEvent&) { return true; });
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->tokens, c["output_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(FinishReasonName(r->finish), c["finish_reason"].get<std::string>());
    EXPECT_EQ(tok->Decode(r->tokens), c["output_text"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, KestrelTinyGolden,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kAuto),
                         [](const auto& info) {
                           return info.param == CpuKernels::kReference ? "Reference" : "Fast";
                         });

}  // namespace
}  // namespace kestrel
