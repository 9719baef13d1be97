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

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

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
  double partial_rotary_factor = 1.0;      // only 1.0 is accepted
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // d_model
  int64_t intermediate_size = 0;  // SwiGLU width
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
