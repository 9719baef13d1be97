#include "cli/model_setup.h"

#include <algorithm>

#include "cli/common.h"
#include "core/mapped_file.h"

namespace kestrel::cli {

Result<Device> ResolveDevice(const std::string& flag) {
  if (flag == "cpu") return Device::kCpu;
  if (flag == "cuda") {
    // Checked here, before any model file is read, so the reason is the only line printed.
    KTRY(CudaDeviceStatus());
    return Device::kCuda;
  }
  if (flag == "auto") return CudaDeviceAvailable() ? Device::kCuda : Device::kCpu;
  return InvalidArgument("--device must be cpu, cuda or auto, got '" + flag + "'");
}

Result<ModelLoadOptions::KvCacheDType> ParseKvCacheDType(const std::string& flag) {
  using D = ModelLoadOptions::KvCacheDType;
  if (flag == "auto") return D::kAuto;
  if (flag == "f32") return D::kF32;
  if (flag == "bf16") return D::kBf16;
  if (flag == "int8") return D::kInt8;
  if (flag == "fp8") return D::kFp8;
  return InvalidArgument("--kv-cache-dtype must be auto, f32, bf16, int8 or fp8, not '" + flag +
                         "'");
}

Result<LoadedModel> LoadModelForCli(const LoadFlags& flags) {
  if (flags.n_threads < 0) {
    return InvalidArgument("--threads must be >= 0 (0: all cores), got " +
                           std::to_string(flags.n_threads));
  }
  KASSIGN(Device device, ResolveDevice(flags.device));
  LoadedModel m;
  m.dir = ResolveModelDir(flags.model_dir);
  KTRY(CheckModelDir(m.dir));
  KASSIGN(m.defaults, LoadGenerationDefaults(m.dir));
  if (flags.need_tokenizer || FileExists(m.dir + "/tokenizer.json")) {
    KASSIGN(Tokenizer tok, Tokenizer::FromDirectory(m.dir));
    m.tokenizer.emplace(std::move(tok));
  }
  ModelLoadOptions options;
  options.device = device;
  options.show_progress = device == Device::kCuda;
  options.kernels = flags.reference_kernels ? CpuKernels::kReference : CpuKernels::kAuto;
  options.int8_activations = !flags.f32_activations;
  options.fp8_activations = flags.fp8_activations;
  options.deterministic = flags.deterministic;
  KASSIGN(options.kv_cache_dtype, ParseKvCacheDType(flags.kv_cache_dtype));
  KASSIGN(ModelConfig cfg, LoadModelConfig(m.dir));
  options.kv_cache_tokens = flags.kv_cache_tokens;
  if (cfg.max_position_embeddings > 0) {
    options.kv_cache_tokens = std::min(options.kv_cache_tokens, cfg.max_position_embeddings);
  }
  options.n_threads = flags.n_threads;
  options.max_num_seqs = flags.max_num_seqs;
  options.state_snapshot_bytes = flags.state_snapshot_bytes;
  KASSIGN(m.model, Model::Load(m.dir, options));

  auto add_eos = [&m](int32_t id) {
    if (std::find(m.eos_ids.begin(), m.eos_ids.end(), id) == m.eos_ids.end()) {
      m.eos_ids.push_back(id);
    }
  };
  for (int32_t id : m.model->config().eos_token_ids) add_eos(id);
  for (int32_t id : m.defaults.eos_token_ids) add_eos(id);
  if (m.tokenizer && !m.tokenizer->eos_token().empty()) {
    if (auto id = m.tokenizer->TokenToId(m.tokenizer->eos_token())) add_eos(*id);
  }
  return m;
}

SamplingParams DefaultSampling(const GenerationDefaults& d) {
  SamplingParams p;
  if (!d.do_sample.value_or(false)) {
    p.temperature = 0.0f;  // transformers' rule: greedy unless do_sample is true
    return p;
  }
  p.temperature = d.temperature.value_or(1.0f);
  p.top_p = d.top_p.value_or(1.0f);
  p.top_k = d.top_k.value_or(0);
  p.min_p = d.min_p.value_or(0.0f);
  p.repetition_penalty = d.repetition_penalty.value_or(1.0f);
  return p;
}

}  // namespace kestrel::cli
