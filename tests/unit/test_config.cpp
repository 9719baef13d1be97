// config.json / generation_config.json parsing for every supported architecture, both RoPE
// spellings, and RoPE inverse frequencies checked against the formulas evaluated here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include "core/json_file.h"
#include "models/config.h"
#include "models/rope.h"
#include "models/safetensors.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#define EXPECT_ERROR(result, expected_code, ...)                                       \
  do {                                                                                 \
    const auto& result_ = (result);                                                    \
    ASSERT_FALSE(result_.ok());                                                        \
    EXPECT_EQ(result_.status().code(), (expected_code)) << result_.status().message(); \
    for (const char* needle : {__VA_ARGS__}) {                                         \
      EXPECT_TRUE(Contains(result_.status().message(), needle))                        \
          << "message: " << result_.status().message() << "\nmissing: " << needle;     \
    }                                                                                  \
  } while (0)

// A tiny config in the shape transformers writes, for `arch`.
json Base(const std::string& arch) {
  return json{{"architectures", {arch}},  {"vocab_size", 512},
              {"hidden_size", 64},        {"intermediate_size", 128},
              {"num_hidden_layers", 2},   {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 512},
              {"rms_norm_eps", 1e-5},     {"hidden_act", "silu"}};
}

Result<ModelConfig> Parse(const json& j) {
  return ParseModelConfig(j, "m/config.json");
}

// ---- architectures and fields ----------------------------------------------------------------

// A hybrid (Gated DeltaNet + attention) config in the shape transformers writes.
json Hybrid(const std::string& arch) {
  json j = Base(arch);
  j["num_hidden_layers"] = 8;
  j["head_dim"] = 32;
  j["linear_num_key_heads"] = 2;
  j["linear_num_value_heads"] = 4;
  j["linear_key_head_dim"] = 16;
  j["linear_value_head_dim"] = 24;
  j["linear_conv_kernel_dim"] = 4;
  return j;
}

TEST(ModelConfig, Qwen3_5LayerTypesFromIntervalOrList) {
  json j = Hybrid("Qwen3_5ForCausalLM");
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3_5);
  // full_attention_interval defaults to 4: layers 3 and 7 attend.
  EXPECT_EQ(c->n_layers_of(LayerType::kAttention), 2);
  EXPECT_EQ(c->layer_types[3], LayerType::kAttention);
  EXPECT_EQ(c->layer_types[0], LayerType::kLinearAttention);
  EXPECT_TRUE(c->norm_weight_offset);
  EXPECT_TRUE(c->attention_output_gate);
  EXPECT_DOUBLE_EQ(c->rope.partial_rotary_factor, 0.25);  // the hybrid default
  EXPECT_EQ(RopeRotaryDim(*c), 8);
  EXPECT_EQ(c->linear.conv_dim(), 2 * 2 * 16 + 4 * 24);
  EXPECT_EQ(c->linear.conv_state_floats(), 3 * (2 * 2 * 16 + 4 * 24));
  EXPECT_EQ(c->linear.ssm_state_floats(), 4 * 16 * 24);
  EXPECT_FALSE(c->linear.fused_projections);
  EXPECT_FALSE(c->has_moe());

  j["full_attention_interval"] = 2;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->n_layers_of(LayerType::kAttention), 4);

  j["layer_types"] = {"linear_attention", "full_attention",   "attention",        "mamba",
                      "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  j["partial_rotary_factor"] = 0.5;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_layers_of(LayerType::kAttention), 3);  // the list wins; legacy names map
  EXPECT_EQ(c->layer_types[3], LayerType::kLinearAttention);
  EXPECT_EQ(RopeRotaryDim(*c), 16);

  j["layer_types"] = {"full_attention"};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "layer_types", "8");
  j["layer_types"] = {
      "linear_attention", "full_attention",   "sliding_attention", "mamba",
      "linear_attention", "linear_attention", "linear_attention",  "full_attention"};
  EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, "layer_types[2]", "sliding_attention");
  j = Hybrid("Qwen3_5ForCausalLM");
  j["linear_num_value_heads"] = 3;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "linear_num_value_heads");
  j = Hybrid("Qwen3_5ForCausalLM");
  j["attn_output_gate"] = false;
  EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, "attn_output_gate");
}

TEST(ModelConfig, MultimodalWrapperReadsTextConfig) {
  json text = Hybrid("Qwen3_5ForCausalLM");
  text.erase("architectures");
  text["mtp_num_hidden_layers"] = 1;
  json j{{"architectures", {"Qwen3_5ForConditionalGeneration"}},
         {"text_config", text},
         {"vision_config", {{"depth", 2}}}};
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3_5);
  EXPECT_EQ(c->architecture_class, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c->weight_prefix, "model.language_model.");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->n_mtp_layers, 1);
  j.erase("text_config");
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "text_config");
}

TEST(ModelConfig, MoeLayersAndRouting) {
  json j = Base("Qwen3MoeForCausalLM");
  j["num_hidden_layers"] = 4;
  j["num_local_experts"] = 8;  // transformers 5 spelling
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 1;
  Result<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->moe.n_experts, 8);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.shared_expert_intermediate, 0);
  EXPECT_EQ(c->layer_moe, (std::vector<bool>{true, false, true, true}));
  EXPECT_TRUE(c->has_moe());
  j["decoder_sparse_step"] = 2;
  j["norm_topk_prob"] = true;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->layer_moe, (std::vector<bool>{false, false, false, true}));
  EXPECT_TRUE(c->moe.norm_topk_prob);
  j["num_experts_per_tok"] = 9;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "num_experts_per_tok");
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = {4};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "mlp_only_layers");

  // Qwen3.5-MoE: every layer sparse, always renormalised, with a shared expert.
  json h = Hybrid("Qwen3_5MoeForCausalLM");
  h.erase("intermediate_size");
  h["num_experts"] = 8;
  h["num_experts_per_tok"] = 2;
  h["moe_intermediate_size"] = 32;
  h["shared_expert_intermediate_size"] = 48;
  h["norm_topk_prob"] = false;
  c = Parse(h);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->intermediate_size, 0);
  EXPECT_EQ(c->moe.shared_expert_intermediate, 48);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->layer_moe, std::vector<bool>(8, true));

  // Qwen3-Next: fused projections, MoE per decoder_sparse_step.
  json n = Hybrid("Qwen3NextForCausalLM");
  n["num_experts"] = 8;
  n["num_experts_per_tok"] = 2;
  n["moe_intermediate_size"] = 32;
  n["shared_expert_intermediate_size"] = 48;
  c = Parse(n);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3Next);
  EXPECT_TRUE(c->linear.fused_projections);
  EXPECT_TRUE(c->moe.norm_topk_prob);  // Qwen3-Next's default
  EXPECT_EQ(c->layer_moe, std::vector<bool>(8, true));
}

TEST(ModelConfig, Llama3WithRopeParameters) {
  json j = Base("LlamaForCausalLM");
  j["dtype"] = "bfloat16";
  j["bos_token_id"] = 1;
  j["eos_token_id"] = json{2, 3};
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->n_layers, 2);
  EXPECT_EQ(c->n_heads, 4);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->layer_sliding, std::vector<bool>(2, false));
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position, 64);
  EXPECT_EQ(ArchitectureName(c->arch), "LlamaForCausalLM");
}

TEST(ModelConfig, LegacyRopeSpellingMatchesRopeParameters) {
  json modern = Base("LlamaForCausalLM");
  modern["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                               {"factor", 8.0},           {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  json legacy = Base("LlamaForCausalLM");
  legacy["rope_theta"] = 500000.0;
  legacy["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
  auto a = Parse(modern);
  auto b = Parse(legacy);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->rope.type, b->rope.type);
  EXPECT_EQ(a->rope.theta, b->rope.theta);
  EXPECT_EQ(a->rope.factor, b->rope.factor);
  EXPECT_EQ(a->rope.original_max_position, b->rope.original_max_position);
  EXPECT_EQ(RopeInvFreq(*a), RopeInvFreq(*b));

  // The oldest spelling: {"type": "linear"} and a top-level rope_theta.
  json old = Base("LlamaForCausalLM");
  old["rope_theta"] = 10000;
  old["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto c = Parse(old);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);

  // No RoPE keys at all: default RoPE with theta 10000.
  auto d = Parse(Base("LlamaForCausalLM"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(d->rope.theta, 10000.0);
  // rope_parameters without a type is default RoPE with its theta.
  json e = Base("LlamaForCausalLM");
  e["rope_parameters"] = {{"rope_theta", 1000000.0}};
  auto ec = Parse(e);
  ASSERT_TRUE(ec.ok());
  EXPECT_EQ(ec->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(ec->rope.theta, 1e6);
}

TEST(ModelConfig, LlamaBiasesAndDefaults) {
  json j = Base("LlamaForCausalLM");
  j.erase("num_key_value_heads");
  j.erase("max_position_embeddings");
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  j["torch_dtype"] = "float16";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_kv_heads, 4);  // = heads when absent
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->attention_out_bias);
  EXPECT_TRUE(c->mlp_bias);
  EXPECT_EQ(c->torch_dtype, DType::kF16);
  EXPECT_EQ(c->bos_token_id, 1);  // LlamaConfig defaults
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
}

TEST(ModelConfig, Mistral) {
  json j = Base("MistralForCausalLM");
  j["sliding_window"] = nullptr;
  j["head_dim"] = nullptr;
  j["attention_bias"] = true;  // ignored: transformers builds Mistral without biases
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->layer_sliding, std::vector<bool>(2, false));

  j["sliding_window"] = 32;
  auto w = Parse(j);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->sliding_window, 32);
  EXPECT_EQ(w->layer_sliding, std::vector<bool>(2, true));

  // Absent keys take MistralConfig's defaults: 8 kv heads, a 4096 window.
  json d = Base("MistralForCausalLM");
  d["num_attention_heads"] = 8;
  d.erase("num_key_value_heads");
  auto dc = Parse(d);
  ASSERT_TRUE(dc.ok()) << dc.status().message();
  EXPECT_EQ(dc->n_kv_heads, 8);
  EXPECT_EQ(dc->sliding_window, 4096);
}

TEST(ModelConfig, Qwen2) {
  json j = Base("Qwen2ForCausalLM");
  j["tie_word_embeddings"] = true;
  j["use_sliding_window"] = false;
  j["sliding_window"] = 4096;
  j["eos_token_id"] = 151643;
  j["bos_token_id"] = nullptr;
  j["torch_dtype"] = "bfloat16";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);  // q/k/v bias always
  EXPECT_FALSE(c->attention_out_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151643});

  // use_sliding_window: layers >= max_window_layers slide.
  j["num_hidden_layers"] = 4;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 3;
  auto s = Parse(j);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->sliding_window, 16);
  EXPECT_EQ(s->layer_sliding, (std::vector<bool>{false, false, false, true}));
  // An explicit layer_types (transformers >= 5 writes it) wins.
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  auto t = Parse(j);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->layer_sliding, (std::vector<bool>{true, false, true, false}));
  j["layer_types"] = {"full_attention"};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "layer_types");
}

TEST(ModelConfig, Qwen3) {
  json j = Base("Qwen3ForCausalLM");
  j["head_dim"] = 32;
  j["rope_theta"] = 1000000;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_EQ(c->head_dim, 32);  // != hidden / heads
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(RopeInvFreq(*c).size(), 16u);

  j.erase("head_dim");  // Qwen3Config's default head_dim is 128, not hidden / heads
  auto d = Parse(j);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->head_dim, 128);

  j["attention_bias"] = true;
  auto b = Parse(j);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->attention_bias);
  EXPECT_TRUE(b->attention_out_bias);
}

TEST(ModelConfig, ModelTypeFallbackAndUnknownArchitecture) {
  json j = Base("LlamaForCausalLM");
  j.erase("architectures");
  j["model_type"] = "qwen3";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen3);

  json u = Base("GPT2LMHeadModel");
  const std::string supported =
      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
      "Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, "
      "Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration";
  EXPECT_ERROR(Parse(u), StatusCode::kUnsupported, "m/config.json", "GPT2LMHeadModel",
               supported.c_str());
  EXPECT_EQ(SupportedArchitecturesList(), supported);
  j.erase("model_type");
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "architectures");
  j["architectures"] = "LlamaForCausalLM";
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"architectures\"");
}

TEST(ModelConfig, WrongTypesNameTheField) {
  json j = Base("LlamaForCausalLM");
  j["hidden_size"] = "64";
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "m/config.json", "\"hidden_size\"",
               "integer", "string");
  j = Base("LlamaForCausalLM");
  j["rms_norm_eps"] = "tiny";
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"rms_norm_eps\"");
  j = Base("LlamaForCausalLM");
  j["tie_word_embeddings"] = 1;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"tie_word_embeddings\"");
  j = Base("LlamaForCausalLM");
  j["eos_token_id"] = json{1, "two"};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"eos_token_id\"");
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "rope_scaling", "\"factor\"");
  j = Base("LlamaForCausalLM");
  j["rope_parameters"] = "yarn";
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"rope_parameters\"");
  EXPECT_ERROR(Parse(json::array()), StatusCode::kInvalidArgument, "JSON object");
}

TEST(ModelConfig, SizeValidation) {
  json j = Base("LlamaForCausalLM");
  j.erase("vocab_size");
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "missing required field \"vocab_size\"");
  j = Base("LlamaForCausalLM");
  j["num_hidden_layers"] = 0;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"num_hidden_layers\"", "positive");
  j = Base("LlamaForCausalLM");
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "num_key_value_heads (3)");
  j = Base("LlamaForCausalLM");
  j["hidden_size"] = 66;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "not a multiple");
  j = Base("LlamaForCausalLM");
  j["head_dim"] = 15;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "head_dim", "even");
  j = Base("LlamaForCausalLM");
  j["rms_norm_eps"] = 0;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "rms_norm_eps");
  j = Base("LlamaForCausalLM");
  j["hidden_act"] = "gelu";
  EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, "gelu");
  j = Base("LlamaForCausalLM");
  j["dtype"] = "float8_e4m3fn";
  EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, "float8_e4m3fn");
  j = Base("MistralForCausalLM");
  j["sliding_window"] = 0;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "sliding_window");
}

TEST(ModelConfig, UnsupportedRope) {
  for (const char* type : {"dynamic", "longrope", "su", "proportional"}) {
    json j = Base("LlamaForCausalLM");
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, type, "default, linear, llama3, yarn");
  }
  json j = Base("LlamaForCausalLM");
  j["partial_rotary_factor"] = 1.5;
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "partial_rotary_factor", "(0, 1]");
  j = Base("LlamaForCausalLM");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  EXPECT_ERROR(Parse(j), StatusCode::kUnsupported, "per-layer");
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "low_freq_factor");
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "\"factor\"");
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 4.0},
                       {"high_freq_factor", 4.0}};
  EXPECT_ERROR(Parse(j), StatusCode::kInvalidArgument, "high_freq_factor");
}

TEST(ModelConfig, YarnDefaultsAndDerivedValues) {
  json j = Base("Qwen3ForCausalLM");
  j["head_dim"] = 32;
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 10000.0},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 64}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);  // explicit factor wins over max_pos / original (8)
  EXPECT_EQ(c->rope.original_max_position, 64);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c->rope.beta_slow, 1.0);
  EXPECT_TRUE(c->rope.truncate);
  ASSERT_TRUE(c->rope.attention_factor.has_value());
  EXPECT_DOUBLE_EQ(*c->rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_FLOAT_EQ(RopeAttentionScale(*c), static_cast<float>(0.1 * std::log(4.0) + 1.0));

  // mscale / mscale_all_dim (DeepSeek style): ratio of the two get_mscale values.
  j["rope_parameters"]["mscale"] = 0.707;
  j["rope_parameters"]["mscale_all_dim"] = 1.0;
  auto m = Parse(j);
  ASSERT_TRUE(m.ok());
  const double expected = (0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * 1.0 * std::log(4.0) + 1.0);
  EXPECT_DOUBLE_EQ(*m->rope.attention_factor, expected);
  // Only one of them: the plain formula.
  j["rope_parameters"].erase("mscale_all_dim");
  auto one = Parse(j);
  ASSERT_TRUE(one.ok());
  EXPECT_DOUBLE_EQ(*one->rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  // An explicit attention_factor wins.
  j["rope_parameters"]["attention_factor"] = 0.5;
  auto af = Parse(j);
  ASSERT_TRUE(af.ok());
  EXPECT_DOUBLE_EQ(*af->rope.attention_factor, 0.5);
  EXPECT_FLOAT_EQ(RopeAttentionScale(*af), 0.5f);

  // factor null: derived from max_position_embeddings / original_max_position_embeddings.
  json n = Base("Qwen3ForCausalLM");
  n["rope_scaling"] = {{"type", "yarn"},
                       {"factor", nullptr},
                       {"original_max_position_embeddings", 128},
                       {"beta_fast", 0},
                       {"truncate", false}};
  auto nc = Parse(n);
  ASSERT_TRUE(nc.ok()) << nc.status().message();
  EXPECT_DOUBLE_EQ(nc->rope.factor, 4.0);
  EXPECT_DOUBLE_EQ(nc->rope.beta_fast, 32.0);  // `or 32`
  EXPECT_FALSE(nc->rope.truncate);
  // original_max_position_embeddings: a top-level key wins; absent everywhere -> max_position.
  n["original_max_position_embeddings"] = 256;
  auto top = Parse(n);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->rope.original_max_position, 256);
  json f = Base("Qwen3ForCausalLM");
  f["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}};
  auto fc = Parse(f);
  ASSERT_TRUE(fc.ok());
  EXPECT_EQ(fc->rope.original_max_position, 512);
}

TEST(ModelConfig, LoadFromDirectory) {
  std::string tmpl = (fs::temp_directory_path() / "kestrel_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  EXPECT_ERROR(LoadModelConfig(dir), StatusCode::kNotFound, "config.json");
  auto none = LoadGenerationDefaults(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->eos_token_ids.empty());
  EXPECT_FALSE(none->temperature.has_value());

  std::ofstream(dir + "/config.json") << Base("Qwen2ForCausalLM").dump(2);
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen2);

  std::ofstream(dir + "/config.json") << "{\n  \"vocab_size\": 512,\n  \"hidden_size\": ,\n}";
  EXPECT_ERROR(LoadModelConfig(dir), StatusCode::kInvalidArgument, "config.json", "line 3",
               "column 18");

  std::ofstream(dir + "/generation_config.json")
      << R"({"eos_token_id": [151645, 151643], "bos_token_id": 151643, "temperature": 0.7,
            "top_p": 0.8, "top_k": 20, "min_p": 0, "repetition_penalty": 1.05, "do_sample": true})";
  auto g = LoadGenerationDefaults(dir);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(g->bos_token_id, 151643);
  EXPECT_FLOAT_EQ(*g->temperature, 0.7f);
  EXPECT_FLOAT_EQ(*g->top_p, 0.8f);
  EXPECT_EQ(*g->top_k, 20);
  EXPECT_FLOAT_EQ(*g->min_p, 0.0f);
  EXPECT_FLOAT_EQ(*g->repetition_penalty, 1.05f);
  EXPECT_EQ(g->do_sample, true);

  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": 2, "top_k": "20"})";
  EXPECT_ERROR(LoadGenerationDefaults(dir), StatusCode::kInvalidArgument, "generation_config.json",
               "\"top_k\"");
  std::ofstream(dir + "/generation_config.json") << R"({"top_p": 1.5})";
  EXPECT_ERROR(LoadGenerationDefaults(dir), StatusCode::kInvalidArgument, "top_p");
  fs::remove_all(dir);
}

TEST(JsonFile, ErrorsCarryLineAndColumn) {
  auto r = ParseJsonText("{\n  \"a\": [1, 2,\n  ]\n}", "t.json");
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "t.json", "line 3, column 3");
  auto ok = ParseJsonText(R"({"a": [1, 2]})", "t.json");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["a"][1], 2);
  EXPECT_ERROR(ReadJsonFile("/nonexistent/k.json"), StatusCode::kNotFound, "/nonexistent/k.json");
  const TextPosition p = PositionOfByte("ab\ncd", 4);
  EXPECT_EQ(p.line, 2);
  EXPECT_EQ(p.column, 2);
}

// ---- RoPE inverse frequencies vs. the formulas in double ---------------------------------------

std::vector<double> DefaultFreqs(double theta, int dim) {
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) out.push_back(std::pow(theta, -2.0 * i / dim));
  return out;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << "i = " << i;
  }
}

ModelConfig RopeModel(RopeConfig rope, int64_t head_dim) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope = rope;
  return c;
}

TEST(RopeInvFreq, Default) {
  RopeConfig r;
  r.theta = 10000.0;
  ExpectClose(RopeInvFreq(RopeModel(r, 64)), DefaultFreqs(10000.0, 64), 3e-7);
  r.theta = 1e6;
  ExpectClose(RopeInvFreq(r, 128), DefaultFreqs(1e6, 128), 3e-7);
  EXPECT_EQ(RopeInvFreq(r, 128)[0], 1.0f);
  EXPECT_EQ(RopeAttentionScale(r), 1.0f);
}

TEST(RopeInvFreq, Linear) {
  RopeConfig r;
  r.type = RopeType::kLinear;
  r.theta = 10000.0;
  r.factor = 2.5;
  std::vector<double> want = DefaultFreqs(10000.0, 32);
  for (double& x : want) x /= 2.5;
  ExpectClose(RopeInvFreq(r, 32), want, 3e-7);
  EXPECT_EQ(RopeAttentionScale(r), 1.0f);
}

TEST(RopeInvFreq, Llama3) {
  // A short original context so all three bands occur for head_dim 32 at theta 10000:
  // wavelengths 2*pi*10000^(i/16) run 6.3, 11.2, 19.9, 35.3, 62.8, 111.7, ...;
  // the bands are < 16 (kept), 16..64 (blended), > 64 (divided by factor).
  RopeConfig r;
  r.type = RopeType::kLlama3;
  r.theta = 10000.0;
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position = 64;
  const std::vector<double> base = DefaultFreqs(10000.0, 32);
  std::vector<double> want;
  int n_kept = 0, n_blended = 0, n_divided = 0;
  for (double f : base) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < 64.0 / 4.0) {
      want.push_back(f);
      ++n_kept;
    } else if (wavelen > 64.0 / 1.0) {
      want.push_back(f / 8.0);
      ++n_divided;
    } else {
      const double smooth = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      want.push_back((1 - smooth) * f / 8.0 + smooth * f);
      ++n_blended;
    }
  }
  EXPECT_EQ(n_kept, 2);
  EXPECT_EQ(n_blended, 3);
  EXPECT_EQ(n_divided, 11);
  ExpectClose(RopeInvFreq(r, 32), want, 2e-6);
  EXPECT_EQ(RopeAttentionScale(r), 1.0f);
}

std::vector<double> YarnFreqs(double theta, int dim, double factor, double orig, double beta_fast,
                              double beta_slow, bool truncate) {
  auto correction = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = correction(beta_fast), high = correction(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) {
    const double extrapolated = std::pow(theta, -2.0 * i / dim);
    const double interpolated = extrapolated / factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    // ramp 0 (high-frequency dims): extrapolate; ramp 1: interpolate.
    out.push_back(interpolated * ramp + extrapolated * (1 - ramp));
  }
  return out;
}

TEST(RopeInvFreq, Yarn) {
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.theta = 10000.0;
  r.factor = 4.0;
  r.original_max_position = 64;
  r.attention_factor = 0.1 * std::log(4.0) + 1.0;
  const std::vector<float> got = RopeInvFreq(r, 32);
  const std::vector<double> want = YarnFreqs(10000.0, 32, 4.0, 64.0, 32.0, 1.0, true);
  ExpectClose(got, want, 2e-6);
  // The ramp really blends: the first dims are untouched, the last divided by the factor.
  EXPECT_FLOAT_EQ(got[0], 1.0f);
  EXPECT_NEAR(got[15], std::pow(10000.0, -30.0 / 32) / 4.0, 1e-9);
  EXPECT_FLOAT_EQ(RopeAttentionScale(r), static_cast<float>(0.1 * std::log(4.0) + 1.0));

  r.truncate = false;
  r.beta_fast = 16.0;
  r.beta_slow = 2.0;
  r.original_max_position = 4096;
  r.theta = 1e6;
  ExpectClose(RopeInvFreq(r, 128), YarnFreqs(1e6, 128, 4.0, 4096.0, 16.0, 2.0, false), 2e-6);
}

// ---- Golden fixtures (tools/make_fixtures.py) ---------------------------------------------------

#ifdef KESTREL_SOURCE_DIR
// Every fixture directory parses, its weights open, and RopeInvFreq / RopeAttentionScale equal
// the inv_freq and attention_scaling transformers computed for it (recorded in reference.json).
TEST(GoldenFixtures, ConfigWeightsAndRopeMatchTransformers) {
  const fs::path root = fs::path(KESTREL_SOURCE_DIR) / "tests" / "data" / "models";
  std::vector<fs::path> dirs;
  if (fs::is_directory(root)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (fs::exists(entry.path() / "reference.json")) dirs.push_back(entry.path());
    }
  }
  if (dirs.empty()) GTEST_SKIP() << "no fixtures in " << root << " (run tools/make_fixtures.py)";
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.string());
    auto config = LoadModelConfig(dir.string());
    ASSERT_TRUE(config.ok()) << config.status().message();
    auto weights = WeightStore::Open(dir.string());
    ASSERT_TRUE(weights.ok()) << weights.status().message();
    EXPECT_TRUE(weights
                    ->Get(config->weight_prefix + "embed_tokens.weight",
                          {config->vocab_size, config->hidden_size})
                    .ok());
    auto reference = ReadJsonFile((dir / "reference.json").string());
    ASSERT_TRUE(reference.ok()) << reference.status().message();
    // The hybrid fixtures (tools/make_hybrid_fixtures.py) record no RoPE tables; their RoPE is
    // checked through the logits (tests/model/fixtures_test.cpp).
    if (!reference->contains("inv_freq")) continue;
    const json& want = (*reference)["inv_freq"];
    const std::vector<float> got = RopeInvFreq(*config);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Both are float32 computed the same way; allow one ulp for powf differences.
      const float w = want[i].get<float>();
      EXPECT_NEAR(got[i], w, std::fabs(w) * 1.2e-7f) << "inv_freq[" << i << "]";
    }
    EXPECT_FLOAT_EQ(RopeAttentionScale(*config), (*reference)["attention_scaling"].get<float>());
  }
}
#endif

}  // namespace
}  // namespace kestrel
