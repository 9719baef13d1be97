// Verbs about one model: logits (the CPU path's logits for given ids) and info.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "core/gguf.h"
#include "engine/engine.h"
#include "models/cache_spec.h"
#include "models/safetensors.h"
#include "models/score.h"
#include "models/weights.h"

namespace kestrel::cli {
namespace {

using nlohmann::json;

Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      return InvalidArgument("--ids: '" + item + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("--ids: no token ids given");
  return ids;
}

int ArgMax(const float* row, int64_t n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

struct LogitsFlags {
  LoadFlags load;
  std::string ids;
  int32_t greedy = 0;
};

int RunLogits(LogitsFlags f) {
  Result<std::vector<int32_t>> ids = ParseIds(f.ids);
  if (!ids.ok()) return Fail(ids.status());
  if (f.greedy < 0) return Fail("--greedy must be >= 0");
  f.load.need_tokenizer = false;
  f.load.kv_cache_tokens = static_cast<int64_t>(ids->size()) + f.greedy;
  Result<LoadedModel> loaded = LoadModelForCli(f.load);
  if (!loaded.ok()) return Fail(loaded.status());
  const int64_t vocab = loaded->model->config().vocab_size;
  Result<std::vector<float>> logits = ScorePrompt(*loaded->model, *ids);
  if (!logits.ok()) return Fail(logits.status());
  json argmax = json::array();
  for (size_t i = 0; i < ids->size(); ++i) argmax.push_back(ArgMax(&(*logits)[i * vocab], vocab));
  const float* last = &(*logits)[(ids->size() - 1) * vocab];
  json out;
  out["last_logits"] = std::vector<float>(last, last + vocab);
  out["argmax"] = argmax;
  json greedy = json::array();
  if (f.greedy > 0) {
    // The continuation runs on the Engine, like every generation.
    EngineRequest req;
    req.prompt_ids = *ids;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = f.greedy;
    req.ignore_eos = true;
    EngineConfig config;
    config.max_num_seqs = 1;
    config.async_scheduling = false;
    Engine engine(std::move(loaded->model), nullptr, {}, config);
    Result<std::shared_ptr<RequestHandle>> handle = engine.Submit(std::move(req));
    if (!handle.ok()) return Fail(handle.status());
    engine.Start();
    RequestOutput event;
    do {
      while (!(*handle)->Next(&event, std::chrono::milliseconds(1000))) {
      }
      for (int32_t t : event.token_ids) greedy.push_back(t);
      if (event.finished && !event.error.ok()) return Fail(event.error);
    } while (!event.finished);
  }
  out["greedy"] = greedy;
  WriteLine(DumpJson(out));
  return 0;
}

const char* LayerTypeName(LayerType t) {
  return t == LayerType::kAttention ? "full_attention" : "linear_attention";
}

int RunInfo(const std::string& model_flag) {
  std::string dir = ResolveModelDir(model_flag);
  if (Status s = CheckModelDir(dir); !s.ok()) return Fail(s);
  Result<ModelConfig> cfg = LoadModelConfig(dir);
  if (!cfg.ok()) return Fail(cfg.status());
  Result<WeightStore> weights = WeightStore::Open(dir);
  if (!weights.ok()) return Fail(weights.status());
  int64_t n_params = 0;
  std::map<std::string, int64_t> dtypes, dtype_bytes;
  for (const auto& [name, t] : weights->tensors()) {
    n_params += t.numel();
    dtypes[std::string(DTypeName(t.dtype))] += t.numel();
    dtype_bytes[std::string(DTypeName(t.dtype))] += static_cast<int64_t>(t.size_bytes());
  }
  // Binding checks every tensor (and refuses unknown ones) without reading the weights.
  Result<DecoderWeights> bound = BindDecoderWeights(*cfg, *weights);
  if (!bound.ok()) return Fail(bound.status());
  // f32 K and V of the attention layers, and f32 recurrent state, on the CPU path.
  const CacheSpec spec = MakeCacheSpec(*cfg, sizeof(float));
  json out;
  out["model_dir"] = dir;
  out["architecture"] = cfg->architecture_class;
  out["parameters"] = n_params;
  out["decoder_parameters"] = bound->n_parameters;
  out["format"] = IsGgufFile(dir) ? "gguf" : "safetensors";
  // Checkpoint-level quantization (GGUF files show theirs per tensor in dtypes).
  if (cfg->fp8_block_rows > 0) {
    out["quantization"] = {{"method", "fp8"}, {"block", {cfg->fp8_block_rows, cfg->fp8_block_cols}}};
  } else if (cfg->mlx.group_size > 0) {
    out["quantization"] = {{"method", "mlx"}, {"bits", cfg->mlx.bits}, {"group_size", cfg->mlx.group_size}};
  } else if (!cfg->int4_method.empty()) {
    out["quantization"] = {{"method", cfg->int4_method}, {"bits", 4}, {"group_size", cfg->int4_group_size}};
  }
  // Packed words count several parameters each: the binder's count is the logical one.
  if (cfg->mlx.group_size > 0 || !cfg->int4_method.empty()) out["parameters"] = bound->n_parameters;
  out["dtypes"] = dtypes;  // parameters per dtype
  out["dtype_bytes"] = dtype_bytes;
  out["weight_bytes"] = weights->total_bytes();
  out["files"] = weights->files();
  out["context_length"] = cfg->max_position_embeddings;
  out["vocab_size"] = cfg->vocab_size;
  out["hidden_size"] = cfg->hidden_size;
  out["layers"] = cfg->n_layers;
  out["heads"] = cfg->n_heads;
  out["kv_heads"] = cfg->n_kv_heads;
  out["head_dim"] = cfg->head_dim;
  out["tied_embeddings"] = cfg->tie_word_embeddings;
  json types = json::array();
  for (LayerType t : cfg->layer_types) types.push_back(LayerTypeName(t));
  out["layer_types"] = types;
  out["attention_layers"] = spec.n_attention_layers;
  out["recurrent_layers"] = spec.n_recurrent_layers;
  if (spec.has_recurrent_state()) {
    const LinearAttentionConfig& l = cfg->linear;
    out["linear_attention"] = {{"key_heads", l.n_key_heads},
                               {"value_heads", l.n_value_heads},
                               {"key_head_dim", l.key_head_dim},
                               {"value_head_dim", l.value_head_dim},
                               {"conv_kernel", l.conv_kernel}};
  }
  if (cfg->has_moe()) {
    int64_t n_moe = 0;
    for (bool b : cfg->layer_moe) n_moe += b ? 1 : 0;
    out["moe"] = {{"layers", n_moe},
                  {"experts", cfg->moe.n_experts},
                  {"experts_per_token", cfg->moe.top_k},
                  {"expert_intermediate_size", cfg->moe.expert_intermediate},
                  {"shared_expert_intermediate_size", cfg->moe.shared_expert_intermediate},
                  {"norm_topk_prob", cfg->moe.norm_topk_prob}};
  }
  out["partial_rotary_factor"] = cfg->rope.partial_rotary_factor;
  out["kv_bytes_per_token_f32"] = spec.kv_bytes_per_token();
  out["state_bytes_per_sequence_f32"] = spec.state_bytes_per_slot();
  // Default prefix-cache snapshot budget of `serve` (--state-cache) and what it holds.
  if (spec.has_recurrent_state()) {
    out["state_snapshot_budget_bytes"] = kDefaultStateSnapshotBytes;
    out["state_snapshots_in_budget"] =
        std::min(kDefaultStateSnapshotBytes / spec.state_bytes_per_slot(), kMaxStateSnapshots);
  }
  out["memory_bytes_full_context"] = static_cast<int64_t>(weights->total_bytes()) +
                                     spec.kv_bytes_per_token() * cfg->max_position_embeddings +
                                     spec.state_bytes_per_slot();
  out["mtp_layers"] = bound->mtp ? static_cast<int64_t>(bound->mtp->layers.size()) : 0;
  out["notes"] = bound->notes;
  WriteLine(out.dump(2));
  return 0;
}

}  // namespace

void RegisterLogits(CLI::App& app, int& exit_code) {
  static LogitsFlags f;
  auto* cmd = app.add_subcommand("logits", "Print CPU logits of the last position as JSON");
  cmd->add_option("--model", f.load.model_dir, "Model directory");
  cmd->add_option("--device", f.load.device, kDeviceHelp)->capture_default_str();
  cmd->add_option("--ids", f.ids, "Comma-separated token ids")->required();
  cmd->add_option("--greedy", f.greedy, "Also continue greedily for N tokens");
  cmd->add_flag("--reference", f.load.reference_kernels, "Use the scalar reference kernels");
  cmd->add_flag("--f32-activations", f.load.f32_activations, kF32ActivationsHelp);
  cmd->add_flag("--deterministic", f.load.deterministic, kDeterministicHelp);
  cmd->add_option("--kv-cache-dtype", f.load.kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->callback([&exit_code] { exit_code = RunLogits(f); });
}

void RegisterInfo(CLI::App& app, int& exit_code) {
  static std::string model;
  auto* cmd = app.add_subcommand("info", "Architecture, parameters, dtypes, context, memory");
  cmd->add_option("--model", model, "Model directory");
  cmd->callback([&exit_code] { exit_code = RunInfo(model); });
}

}  // namespace kestrel::cli
