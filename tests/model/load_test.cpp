// Model::Load: weight validation errors, KV pool sizing, parameter counts, forward statistics.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/llama.h"
#include "tiny_model.h"

namespace kestrel {
namespace {

TEST(ModelLoad, MissingTensorIsReportedByName) {
  testing::TinyModelSpec spec;
  spec.omit_tensor = "model.layers.1.mlp.up_proj.weight";
  const std::string dir = testing::MakeTempDir("missing");
  testing::WriteTinyModel(dir, spec);
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << m.status().message();
}

TEST(ModelLoad, WrongShapeNamesTensorAndBothShapes) {
  testing::TinyModelSpec spec;
  spec.grow_tensor = "model.layers.0.self_attn.k_proj.weight";
  const std::string dir = testing::MakeTempDir("shape");
  testing::WriteTinyModel(dir, spec);
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[25, 48]"), std::string::npos) << msg;  // found: kv_dim 24 + 1 rows
  EXPECT_NE(msg.find("[24, 48]"), std::string::npos) << msg;  // expected
}

TEST(ModelLoad, MissingBiasOfQwen2IsAnError) {
  testing::TinyModelSpec spec;
  spec.architecture = "Qwen2ForCausalLM";
  spec.omit_tensor = "model.layers.0.self_attn.v_proj.bias";
  const std::string dir = testing::MakeTempDir("bias");
  testing::WriteTinyModel(dir, spec);
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("v_proj.bias"), std::string::npos);
}

TEST(ModelLoad, TiedModelNeedsNoLmHead) {
  testing::TinyModelSpec spec;
  spec.tie_embeddings = true;
  const std::string dir = testing::MakeTempDir("tied");
  testing::WriteTinyModel(dir, spec);
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok()) << m.status().message();
}

TEST(ModelLoad, KvPoolSizingAndCounts) {
  testing::TinyModelSpec spec;  // max_position 256, 2 layers, 2 kv heads x 12
  const std::string dir = testing::MakeTempDir("sizing");
  const testing::TensorMap w = testing::WriteTinyModel(dir, spec);
  int64_t n_params = 0;
  for (const auto& [name, v] : w) n_params += static_cast<int64_t>(v.size());

  ModelLoadOptions opts;
  Result<std::unique_ptr<Model>> m = Model::Load(dir, opts);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->block_size_tokens(), 16);
  EXPECT_EQ((*m)->n_kv_blocks(), 256 / 16);  // default: max_position_embeddings
  EXPECT_EQ((*m)->kv_bytes_per_token(), 2 * 2 * 2 * 12 * 4);
  EXPECT_EQ((*m)->n_parameters(), n_params);
  EXPECT_EQ((*m)->weight_bytes(), 2 * n_params);  // bf16

  opts.kv_cache_tokens = 100;
  opts.block_size_tokens = 7;
  m = Model::Load(dir, opts);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->n_kv_blocks(), 15);  // ceil(100 / 7)

  opts.block_size_tokens = 0;
  m = Model::Load(dir, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
}

TEST(ModelLoad, DefaultKvCapacityIsCapped) {
  ModelConfig c;
  c.n_layers = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;  // 256 KiB per token in f32
  c.max_position_embeddings = 131072;
  ModelLoadOptions opts;
  // min(131072, 32768, 4 GiB / 256 KiB = 16384)
  EXPECT_EQ(ResolveKvCacheTokens(c, opts), 16384);
  c.n_layers = 2;
  EXPECT_EQ(ResolveKvCacheTokens(c, opts), kDefaultKvCacheTokensCap);
  c.max_position_embeddings = 4096;
  EXPECT_EQ(ResolveKvCacheTokens(c, opts), 4096);
  opts.kv_cache_tokens = 200000;
  EXPECT_EQ(ResolveKvCacheTokens(c, opts), 200000);  // explicit values are taken as they are
}

TEST(ModelLoad, ForwardStatsAccumulateAndReset) {
  testing::TinyModelSpec spec;
  const std::string dir = testing::MakeTempDir("stats");
  testing::WriteTinyModel(dir, spec);
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok());
  testing::SeqRunner runner(m->get(), {0, 1, 2, 3});
  const int s = runner.AddSequence({1, 2, 3, 4, 5});
  runner.Step({{s, 5}});
  const ForwardStats& st = (*m)->stats();
  EXPECT_EQ(st.n_forwards, 1);
  EXPECT_EQ(st.n_tokens, 5);
  EXPECT_GT(st.matmul_s, 0.0);
  EXPECT_GT(st.attention_s, 0.0);
  // Every linear weight once (LM head included), plus 5 embedding rows.
  const int64_t embed_bytes = spec.vocab * spec.hidden * 2;
  EXPECT_EQ(st.weight_bytes_read, (*m)->weight_bytes() - embed_bytes + 5 * spec.hidden * 2 -
                                      2 * spec.hidden * (1 + 2 * spec.n_layers));
  (*m)->ResetStats();
  EXPECT_EQ((*m)->stats().n_forwards, 0);
  EXPECT_EQ((*m)->stats().weight_bytes_read, 0);
}

}  // namespace
}  // namespace kestrel
