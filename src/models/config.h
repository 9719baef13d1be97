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

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                    // linear, llama3, yarn
  double low_freq_factor = 1.0;           // llama3
  double high_freq_factor = 4.0;          // llama3
  int64_t original_max_position = 0;      // llama3, yarn (original_max_position_embeddings)
  double beta_fast = 32.0;                // yarn
  double beta_slow = 1.0;                 // yarn
  std::optional<double> mscale;           // yarn
  std::optional<double> mscale_all_dim;   // yarn
  std::optional<double> attention_factor; // yarn; derived when absent
  bool truncate = true;                   // yarn (transformers >= 4.5x "truncate")
  double partial_rotary_factor = 1.0;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;         // d_model
  int64_t intermediate_size = 0;   // SwiGLU width
  int64_t n_layers = 0;
  int64_t n_heads = 0;             // query heads
  int64_t n_kv_heads = 0;          // key/value heads (GQA)
  int64_t head_dim = 0;            // may differ from hidden_size / n_heads (Qwen3)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;     // q/k/v biases (Qwen2)
  bool qk_norm = false;            // per-head RMSNorm on q and k (Qwen3)
  bool tie_word_embeddings = false;
  std::optional<int64_t> sliding_window;  // Mistral (recorded; refused if smaller than used ctx)
  DType torch_dtype = DType::kBF16;
  RopeConfig rope;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // from config.json; generation_config may add more
};

// Parses config.json text; `path` only names the file in errors.
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
Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model_dir);

}  // namespace kestrel
