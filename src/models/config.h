// Model hyper-parameters from a Hugging Face model directory (config.json,
// generation_config.json). Both RoPE spellings are accepted: rope_theta + rope_scaling
// (published checkpoints) and rope_parameters (transformers >= 5).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/status.h"

namespace kestrel {

enum class Architecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kQwen3Moe,    // Qwen3 attention with mixture-of-experts MLPs
  kQwen3Next,   // hybrid Gated DeltaNet / gated attention, MoE with a shared expert
  kQwen3_5,     // hybrid, dense MLPs (also the text part of Qwen3_5ForConditionalGeneration)
  kQwen3_5Moe,  // hybrid, MoE with a shared expert
};

std::string ArchitectureName(Architecture a);  // the HF class name, e.g. "Qwen3ForCausalLM"
std::string SupportedArchitecturesList();      // "LlamaForCausalLM, MistralForCausalLM, ..."

enum class RopeType { kDefault, kLinear, kLlama3, kYarn };

// Every field is resolved at parse time to the value transformers (>= 5) uses, so RopeInvFreq
// (models/rope.h) needs nothing else: defaults filled in, factor/original length/attention factor
// derived where the file leaves them out.
struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                     // linear, llama3, yarn
  double low_freq_factor = 1.0;            // llama3
  double high_freq_factor = 4.0;           // llama3
  int64_t original_max_position = 0;       // llama3, yarn (original_max_position_embeddings)
  double beta_fast = 32.0;                 // yarn
  double beta_slow = 1.0;                  // yarn
  std::optional<double> mscale;            // yarn (as given; already folded into attention_factor)
  std::optional<double> mscale_all_dim;    // yarn (as given; already folded into attention_factor)
  std::optional<double> attention_factor;  // yarn: always set after parsing (given or derived)
  bool truncate = true;                    // yarn: floor/ceil the correction range
  double partial_rotary_factor = 1.0;      // rotary_dim = int(head_dim * factor), in (0, 1]
  // GGUF files of Llama 3.1+ carry the llama3 scaling as one divisor per frequency (the
  // "rope_freqs" tensor) instead of its parameters: inv_freq[i] = default inv_freq[i] / f[i].
  std::vector<float> freq_factors;
};

// How a layer mixes tokens.
enum class LayerType : uint8_t {
  kAttention,        // softmax attention over the paged KV cache ("full_attention")
  kLinearAttention,  // Gated DeltaNet: causal conv1d + gated delta rule over a recurrent state
};

// Gated DeltaNet sizes (Qwen3-Next / Qwen3.5 "linear_*" fields).
struct LinearAttentionConfig {
  int64_t n_key_heads = 0;    // query/key heads
  int64_t n_value_heads = 0;  // value heads, a multiple of n_key_heads: value head h reads key
                              // head h / (n_value_heads / n_key_heads)
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
  int64_t conv_kernel = 0;  // causal depthwise conv1d width
  // Weights fused per key head (Qwen3-Next in_proj_qkvz / in_proj_ba) instead of separate
  // in_proj_qkv / in_proj_z / in_proj_b / in_proj_a (Qwen3.5).
  bool fused_projections = false;

  int64_t key_dim() const { return n_key_heads * key_head_dim; }
  int64_t value_dim() const { return n_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels of q|k|v
  // Recurrent state of one sequence in one layer, f32 elements.
  int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_dim(); }
  int64_t ssm_state_floats() const { return n_value_heads * key_head_dim * value_head_dim; }
};

// Mixture-of-experts MLP (top-k softmax router, optional shared expert).
struct MoeConfig {
  int64_t n_experts = 0;  // 0: no MoE layer
  int64_t top_k = 0;
  int64_t expert_intermediate = 0;         // moe_intermediate_size
  int64_t shared_expert_intermediate = 0;  // 0: no shared expert
  bool norm_topk_prob = false;             // renormalise the top-k probabilities to sum 1
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string architecture_class;  // the class named in config.json (e.g. a multimodal wrapper)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // d_model
  int64_t intermediate_size = 0;  // SwiGLU width of the dense MLPs (0: every layer is MoE)
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (GQA)
  int64_t head_dim = 0;    // may differ from hidden_size / n_heads (Qwen3)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;      // q/k/v biases (Qwen2 always; Llama/Qwen3 attention_bias)
  bool attention_out_bias = false;  // o_proj bias (Llama/Qwen3 attention_bias; never Qwen2/Mistral)
  bool mlp_bias = false;            // gate/up/down biases (Llama mlp_bias)
  bool qk_norm = false;             // per-head RMSNorm on q and k (Qwen3)
  bool tie_word_embeddings = false;
  // Sliding-window attention as transformers applies it: a query at position i sees keys at
  // positions j with i - sliding_window < j <= i, in the layers flagged in layer_sliding.
  // Unset when no layer slides (Mistral with "sliding_window": null, Qwen without
  // use_sliding_window).
  std::optional<int64_t> sliding_window;
  std::vector<bool> layer_sliding;   // [n_layers]
  DType torch_dtype = DType::kBF16;  // "dtype" (transformers >= 5) or "torch_dtype"; informative
  RopeConfig rope;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // from config.json; generation_config may add more

  // Hybrid and MoE models (Qwen3-Next, Qwen3.5, Qwen3-MoE). Dense models: every layer is
  // kAttention with a dense MLP.
  std::vector<LayerType> layer_types;  // [n_layers]
  std::vector<bool> layer_moe;         // [n_layers] the MLP of this layer is MoE
  LinearAttentionConfig linear;        // when any layer is kLinearAttention
  MoeConfig moe;                       // when any layer is MoE
  // Qwen3-Next / Qwen3.5 conventions: RMSNorm weights are stored zero-centred (the norm
  // multiplies by 1 + w), and q_proj also emits a per-head output gate (attention output *
  // sigmoid(gate) before o_proj).
  bool norm_weight_offset = false;
  bool attention_output_gate = false;
  // Where the decoder's tensors live: "model." or, for multimodal wrappers,
  // "model.language_model." (lm_head.weight stays at the top level).
  std::string weight_prefix = "model.";
  int64_t n_mtp_layers = 0;  // multi-token-prediction layers declared (mtp_num_hidden_layers)
  // quantization_config of block-quantized FP8 checkpoints (quant_method "fp8", e4m3 weights with
  // a weight_scale_inv per weight_block_size block); 0 when the checkpoint is not FP8.
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  // MLX affine quantization ("quantization": {"group_size", "bits"} plus per-module overrides
  // {"<module path>": {"group_size", "bits"} or false for a module left unquantized}).
  struct MlxQuant {
    int64_t group_size = 0;  // 0: not an MLX-quantized checkpoint
    int64_t bits = 0;
    std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> overrides;  // path -> (gs, bits)
  } mlx;
  // AWQ (GEMM packing) and GPTQ int4 checkpoints: "awq" or "gptq" with their group size; both
  // are repacked at load into the MLX 4-bit layout (w = scale * q + bias, bias = -scale * zero).
  std::string int4_method;
  int64_t int4_group_size = 0;

  int64_t n_layers_of(LayerType t) const;
  bool has_moe() const;
};

// Parses config.json text; `path` only names the file in errors. Keys the file leaves out take
// transformers' per-architecture defaults (e.g. Mistral num_key_value_heads 8, Qwen3 head_dim 128);
// an explicit null means "derive" (num_key_value_heads = heads, head_dim = hidden / heads).
// The five size fields (vocab, hidden, intermediate, layers, heads) are required.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& path);
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);

// generation_config.json (optional file): EOS ids and default sampling parameters.
struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<bool> do_sample;
};
Result<GenerationDefaults> ParseGenerationDefaults(const nlohmann::json& j,
                                                   const std::string& path);
// A missing generation_config.json gives empty defaults; a malformed one is an error.
Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model_dir);

std::string RopeTypeName(RopeType t);  // "default", "linear", "llama3", "yarn"

}  // namespace kestrel
