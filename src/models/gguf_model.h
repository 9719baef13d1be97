// A GGUF file as a model: its metadata as the config.json / generation_config.json fields
// Kestrel reads, and its tensors under their Hugging Face names (WeightStore::OpenGguf), so that
// everything after loading (binding, both backends, the engine) is the same for a directory and
// a .gguf file. The tokenizer and chat template come from the same file (tokenizer/tokenizer.h).
//
// Architectures: general.architecture "llama" (Llama, Mistral), "qwen2", "qwen3", "qwen3moe",
// and the hybrids "qwen3next" (Qwen3-Next), "qwen35" and "qwen35moe" (Qwen3.5 dense and MoE).
// Tensor types: F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, IQ4_XS (others are refused, naming the tensor).
// What llama.cpp's converter changed is undone at load: Llama's q/k rows are un-permuted back to
// the rotate-half layout; the llama3 RoPE scaling arrives as per-frequency divisors
// (rope_freqs, RopeConfig::freq_factors). For the hybrids: the 1 + w RMSNorm weights become w,
// A = -exp(A_log) becomes A_log again, the squeezed conv1d gets its middle axis back, Qwen3-Next's
// attn_qkv + attn_gate are merged back into in_proj_qkvz, Qwen3.5's value heads go back from the
// tiled order to the grouped one, and the MTP head (the nextn blocks after the decoder's) is
// named mtp.* again.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/gguf.h"
#include "core/status.h"
#include "models/config.h"

namespace kestrel {

// The config.json equivalent of a GGUF file's metadata (parsed by ParseModelConfig).
Result<nlohmann::json> GgufConfigJson(const GgufFile& g);
// The whole config, rope_freqs included.
Result<ModelConfig> LoadGgufConfig(const GgufFile& g);
// EOS / BOS ids from the tokenizer metadata (GGUF stores no sampling defaults Kestrel reads).
Result<GenerationDefaults> GgufGenerationDefaults(const GgufFile& g);

}  // namespace kestrel
