// Loading what the model verbs share: the model, its tokenizer, EOS ids and sampling defaults.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "models/config.h"
#include "models/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::cli {

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // absent when the directory has no tokenizer.json
  GenerationDefaults defaults;
  std::vector<int32_t> eos_ids;  // config.json + generation_config.json + tokenizer eos_token
};

struct LoadFlags {
  std::string model_dir;
  std::string device = "auto";  // auto (cuda when a GPU is present, else cpu), cpu, cuda
  bool need_tokenizer = true;
  bool reference_kernels = false;
  bool f32_activations = false;  // CPU, quantized weights: ModelLoadOptions::int8_activations off
  bool fp8_activations = false;  // CUDA, FP8 checkpoints: ModelLoadOptions::fp8_activations
  bool deterministic = false;    // ModelLoadOptions::deterministic
  std::string kv_cache_dtype = "auto";  // ModelLoadOptions::kv_cache_dtype (ParseKvCacheDType)
  int64_t kv_cache_tokens = 8192;  // KV pool capacity (capped at the context length)
  int n_threads = 0;
  int32_t max_num_seqs = 1;          // recurrent-state models: live state slots
  int64_t state_snapshot_bytes = 0;  // recurrent-state models: prefix-cache snapshots
};

Result<LoadedModel> LoadModelForCli(const LoadFlags& flags);

// --device: "cpu", "cuda", or "auto" (cuda when this build has CUDA and a GPU is visible). An
// explicit "cuda" never falls back: without a GPU the load fails with the reason.
Result<Device> ResolveDevice(const std::string& flag);
// --kv-cache-dtype: auto, f32 (CPU), bf16, int8, fp8 (CUDA).
Result<ModelLoadOptions::KvCacheDType> ParseKvCacheDType(const std::string& flag);
inline constexpr const char* kKvCacheDTypeHelp =
    "KV cache element type: auto (f32 on the CPU, bf16 on CUDA), f32 (CPU), bf16 (half f32's "
    "bytes on the CPU), int8 (int8 codes with a scale per token and head) or fp8 (CUDA: e4m3 "
    "codes with a scale per token and head)";
inline constexpr const char* kFp8ActivationsHelp =
    "CUDA, FP8 checkpoints: run prefill GEMMs as W8A8 on the FP8 tensor cores (activations "
    "quantized per token and 128 columns, as the checkpoint's reference code); faster, not exact";
inline constexpr const char* kF32ActivationsHelp =
    "Quantized (GGUF) weights: multiply f32 activations by the exactly dequantized weights instead of int8 ones (slower; equals the dequantized model bit for bit)";
inline constexpr const char* kDeterministicHelp =
    "Batch-invariant kernels: a request's logits do not depend on what else is batched with it (CPU; CUDA for dense bf16 models; slower prefill)";
inline constexpr const char* kDeviceHelp =
    "cpu, cuda, or auto (cuda when a GPU is present)";

// Sampling parameters from generation_config.json (when do_sample is not false), else greedy.
SamplingParams DefaultSampling(const GenerationDefaults& d);

}  // namespace kestrel::cli
