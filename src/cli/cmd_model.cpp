// Verbs about one model: logits (the CPU path's logits for given ids) and info.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "engine/generator.h"
#include "models/safetensors.h"

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
  Model& model = *loaded->model;
  const int64_t vocab = model.config().vocab_size;
  Generator gen(&model, nullptr);
  Result<std::vector<float>> logits = gen.AllLogits(*ids);
  if (!logits.ok()) return Fail(logits.status());
  json argmax = json::array();
  for (size_t i = 0; i < ids->size(); ++i) argmax.push_back(ArgMax(&(*logits)[i * vocab], vocab));
  const float* last = &(*logits)[(ids->size() - 1) * vocab];
  json out;
  out["last_logits"] = std::vector<float>(last, last + vocab);
  out["argmax"] = argmax;
  json greedy = json::array();
  if (f.greedy > 0) {
    GenerationRequest req;
    req.prompt_ids = *ids;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = f.greedy;
    req.ignore_eos = true;
    Result<GenerationResult> r = gen.Run(req, [](const GenerationEvent&) { return true; });
    if (!r.ok()) return Fail(r.status());
    greedy = r->tokens;
  }
  out["greedy"] = greedy;
  WriteLine(DumpJson(out));
  return 0;
}

int RunInfo(const std::string& model_flag) {
  std::string dir = ResolveModelDir(model_flag);
  if (Status s = CheckModelDir(dir); !s.ok()) return Fail(s);
  Result<ModelConfig> cfg = LoadModelConfig(dir);
  if (!cfg.ok()) return Fail(cfg.status());
  Result<WeightStore> weights = WeightStore::Open(dir);
  if (!weights.ok()) return Fail(weights.status());
  int64_t n_params = 0;
  std::map<std::string, int64_t> dtypes;
  for (const auto& [name, t] : weights->tensors()) {
    n_params += t.numel();
    dtypes[std::string(DTypeName(t.dtype))] += t.numel();
  }
  // f32 K and V per layer on the CPU path.
  int64_t kv_bytes_per_token = 2 * cfg->n_layers * cfg->n_kv_heads * cfg->head_dim * 4;
  json out;
  out["model_dir"] = dir;
  out["architecture"] = ArchitectureName(cfg->arch);
  out["parameters"] = n_params;
  out["dtypes"] = dtypes;
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
  out["kv_bytes_per_token_f32"] = kv_bytes_per_token;
  out["memory_bytes_full_context"] =
      weights->total_bytes() + kv_bytes_per_token * cfg->max_position_embeddings;
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
  cmd->callback([&exit_code] { exit_code = RunLogits(f); });
}

void RegisterInfo(CLI::App& app, int& exit_code) {
  static std::string model;
  auto* cmd = app.add_subcommand("info", "Architecture, parameters, dtypes, context, memory");
  cmd->add_option("--model", model, "Model directory");
  cmd->callback([&exit_code] { exit_code = RunInfo(model); });
}

}  // namespace kestrel::cli
