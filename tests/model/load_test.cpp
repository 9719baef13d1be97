// Model::Load: weight validation errors, KV pool sizing, parameter counts, forward statistics.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/cpu_runner.h"
#include "models/weights.h"
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

TEST(ModelLoad, TensorTheArchitectureDoesNotKnowIsAnError) {
  // Qwen3 weights (with QK-norm tensors) under a Llama config: the norms would be ignored and
  // the logits silently wrong, so loading refuses and names them.
  testing::TinyModelSpec spec;
  spec.architecture = "Qwen3ForCausalLM";
  const std::string dir = testing::MakeTempDir("unexpected");
  testing::WriteTinyModel(dir, spec);
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "llama";
  std::ofstream(dir + "/config.json") << config.dump();
  Result<std::unique_ptr<Model>> m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("LlamaForCausalLM"), std::string::npos) << msg;
  EXPECT_NE(msg.find("self_attn.q_norm.weight"), std::string::npos) << msg;
}

TEST(ModelLoad, HybridCheckpointsReportWhatTheyHoldAndSizeTheirCaches) {
  const std::string root = std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/";
  ModelLoadOptions options;
  options.max_num_seqs = 3;
  options.state_snapshot_bytes = 0;
  Result<std::unique_ptr<Model>> m = Model::Load(root + "qwen3_5", options);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const CacheSpec& spec = (*m)->cache_spec();
  EXPECT_EQ(spec.n_attention_layers, 1);
  EXPECT_EQ(spec.n_recurrent_layers, 3);
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(spec.state_bytes_per_slot(),
            3 * (c.linear.conv_state_floats() + c.linear.ssm_state_floats()) * 4);
  EXPECT_EQ((*m)->kv_bytes_per_token(), 2 * 1 * c.n_kv_heads * c.head_dim * 4);
  EXPECT_EQ((*m)->n_state_slots(), 3);  // live slots only: no snapshot budget
  auto has_note = [](const Model& model, const std::string& what) {
    for (const std::string& n : model.load_notes()) {
      if (n.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_note(**m, "mtp")) << "the MTP head is loaded and reported";

  options.state_snapshot_bytes = 10 * spec.state_bytes_per_slot() + 1;
  m = Model::Load(root + "qwen3_5_vl", options);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->n_state_slots(), 3 + 10);
  EXPECT_TRUE(has_note(**m, "vision")) << "the vision tower is skipped with a note";

  // A dense model keeps no state.
  m = Model::Load(root + "qwen3", {});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->n_state_slots(), 0);
  EXPECT_FALSE((*m)->cache_spec().has_recurrent_state());
#ifdef KESTREL_HAS_CUDA
  // The CUDA backend says it does not run these layers yet (before touching any GPU).
  options.device = Device::kCuda;
  m = Model::Load(root + "qwen3_next", options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--device cpu"), std::string::npos) << m.status().message();
#endif
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
  c.layer_types.assign(32, LayerType::kAttention);
  ModelLoadOptions opts;
  // min(131072, 32768, 4 GiB / 256 KiB = 16384)
  EXPECT_EQ(ResolveKvCacheTokens(c, opts), 16384);
  c.n_layers = 2;
  c.layer_types.assign(2, LayerType::kAttention);
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
  EXPECT_EQ(st.decode.n_forwards, 0);  // a prefill step
  const double prefill_matmul_s = st.matmul_s;
  runner.Append(s, 6);
  runner.Step({{s, 1}});  // a decode step: its stage times, and only those, in st.decode
  EXPECT_EQ(st.decode.n_forwards, 1);
  EXPECT_GT(st.decode.matmul_s, 0.0);
  EXPECT_DOUBLE_EQ(st.decode.matmul_s, st.matmul_s - prefill_matmul_s);
  (*m)->ResetStats();
  EXPECT_EQ((*m)->stats().n_forwards, 0);
  EXPECT_EQ((*m)->stats().weight_bytes_read, 0);
  EXPECT_EQ((*m)->stats().decode.n_forwards, 0);
}

}  // namespace
}  // namespace kestrel
