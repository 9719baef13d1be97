// kestrel serve: loads a model and serves the OpenAI-compatible HTTP API (src/server) until
// SIGINT/SIGTERM. Progress and the URL go to stderr. docs/server.md describes the API.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "engine/engine.h"
#include "models/config.h"
#include "models/model.h"
#include "server/http_server.h"
#include "server/response_json.h"
#include "server/shutdown.h"
#include "tokenizer/chat_template.h"

namespace kestrel::cli {
namespace {

constexpr double kDefaultKvGiB = 2.0;
constexpr int32_t kMaxCudaSequences = 1024;

struct ServeFlags {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string device = "auto";
  int32_t max_num_seqs = 64;
  int32_t max_batched_tokens = 2048;
  // Prompt tokens beside running decodes: unset = 768 on CUDA, the whole step on the CPU.
  std::optional<int32_t> max_prefill_beside_decodes;
  int32_t max_waiting = 128;
  std::optional<double> kv_memory_gib;
  double state_cache_gib = 1.0;
  int32_t block_size = 16;
  std::string api_key;
  bool no_prefix_cache = false;
  bool no_async_scheduling = false;
  bool protect_metrics = false;
  int header_timeout_s = 10;
  int n_threads = 0;
  std::string served_model_name;
  int shutdown_grace_s = 10;
  bool reference_kernels = false;
  bool f32_activations = false;
  bool fp8_activations = false;
  bool deterministic = false;
  std::string kv_cache_dtype = "auto";
  std::string tool_call_parser = "auto";  // auto (from the chat template) or a format name
  std::string reasoning_parser = "auto";  // auto, think, none
  int max_stored_responses = 1024;
};

void Log(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string Basename(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

Status CheckFlags(const ServeFlags& f) {
  KTRY(ResolveDevice(f.device).status());
  if (f.port < 0 || f.port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (f.max_num_seqs < 1) return InvalidArgument("--max-num-seqs must be at least 1");
  if (f.max_batched_tokens < 1) return InvalidArgument("--max-batched-tokens must be at least 1");
  if (f.max_prefill_beside_decodes && *f.max_prefill_beside_decodes < 0) {
    return InvalidArgument("--max-prefill-beside-decodes must be >= 0 (0: the whole step)");
  }
  if (f.max_waiting < 0) return InvalidArgument("--max-waiting must be >= 0");
  if (f.block_size < 1 || f.block_size > 1024) {
    return InvalidArgument("--block-size must be in [1, 1024]");
  }
  if (f.kv_memory_gib && !(*f.kv_memory_gib > 0.0 && std::isfinite(*f.kv_memory_gib))) {
    return InvalidArgument("--kv-memory must be a positive number of GiB");
  }
  if (f.shutdown_grace_s < 0) return InvalidArgument("--shutdown-grace must be >= 0");
  if (f.header_timeout_s < 1) return InvalidArgument("--header-timeout must be at least 1 s");
  if (f.n_threads < 0) {
    return InvalidArgument("--threads must be >= 0 (0: all cores), got " +
                           std::to_string(f.n_threads));
  }
  if (f.protect_metrics && f.api_key.empty() && std::getenv("KESTREL_API_KEY") == nullptr) {
    return InvalidArgument("--protect-metrics needs --api-key (or $KESTREL_API_KEY)");
  }
  if (!(f.state_cache_gib >= 0.0 && std::isfinite(f.state_cache_gib))) {
    return InvalidArgument("--state-cache must be a number of GiB >= 0");
  }
  server::ToolCallFormat format;
  if (f.tool_call_parser != "auto" && !server::ParseToolCallFormat(f.tool_call_parser, &format)) {
    return InvalidArgument(
        "--tool-call-parser must be auto, hermes, qwen3_coder, llama3_json or "
        "none, got '" +
        f.tool_call_parser + "'");
  }
  if (f.reasoning_parser != "auto" && f.reasoning_parser != "think" &&
      f.reasoning_parser != "none") {
    return InvalidArgument("--reasoning-parser must be auto, think or none, got '" +
                           f.reasoning_parser + "'");
  }
  if (f.max_stored_responses < 0) return InvalidArgument("--max-stored-responses must be >= 0");
  return Status::Ok();
}

// KV pool capacity in tokens (whole blocks) for the --kv-memory budget. Without the flag, the
// default budget is also capped at what max_num_seqs full contexts could use.
Result<int64_t> KvCacheTokens(const ServeFlags& f, const ModelConfig& cfg,
                              ModelLoadOptions::KvCacheDType kv_dtype) {
  // The CPU backend stores K and V of the attention layers in f32 (docs/architecture.md), or with
  // --kv-cache-dtype int8 as int8 codes plus an f32 scale per row.
  const bool int8 = kv_dtype == ModelLoadOptions::KvCacheDType::kInt8;
  CacheSpec spec = MakeCacheSpec(cfg, int8 ? 1 : sizeof(float));
  if (int8) spec.kv_row_scale_bytes = sizeof(float);
  const int64_t bytes_per_token = spec.kv_bytes_per_token();
  const double budget_bytes =
      f.kv_memory_gib.value_or(kDefaultKvGiB) * static_cast<double>(int64_t{1} << 30);
  double tokens =
      std::floor(budget_bytes / static_cast<double>(std::max<int64_t>(1, bytes_per_token)));
  if (!f.kv_memory_gib && cfg.max_position_embeddings > 0) {
    tokens = std::min(tokens, static_cast<double>(cfg.max_position_embeddings) * f.max_num_seqs);
  }
  tokens = std::min(tokens, static_cast<double>(std::numeric_limits<int32_t>::max() / 2));
  const int64_t blocks = static_cast<int64_t>(tokens) / f.block_size;
  if (blocks < 1) {
    return InvalidArgument("--kv-memory holds no KV block: one block of " +
                           std::to_string(f.block_size) + " tokens needs " +
                           HumanBytes(static_cast<double>(bytes_per_token * f.block_size)));
  }
  return blocks * f.block_size;
}

std::vector<int32_t> EosIds(const Model& model, const GenerationDefaults& defaults,
                            const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  auto add = [&ids](int32_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  for (int32_t id : model.config().eos_token_ids) add(id);
  for (int32_t id : defaults.eos_token_ids) add(id);
  if (!tokenizer.eos_token().empty()) {
    if (auto id = tokenizer.TokenToId(tokenizer.eos_token())) add(*id);
  }
  return ids;
}

int RunServe(ServeFlags f) {
  if (Status s = CheckFlags(f); !s.ok()) return Fail(s);
  if (f.api_key.empty()) {
    if (const char* env = std::getenv("KESTREL_API_KEY"); env != nullptr) f.api_key = env;
  }
  const std::string dir = ResolveModelDir(f.model_dir);
  if (Status s = CheckModelDir(dir); !s.ok()) return Fail(s);
  const auto t0 = std::chrono::steady_clock::now();

  Log("kestrel: [1/4] reading " + dir + " (config, tokenizer, chat template)");
  Result<ModelConfig> cfg = LoadModelConfig(dir);
  if (!cfg.ok()) return Fail(cfg.status());
  Result<GenerationDefaults> defaults = LoadGenerationDefaults(dir);
  if (!defaults.ok()) return Fail(defaults.status());
  Result<Tokenizer> tokenizer = Tokenizer::FromDirectory(dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::optional<ChatTemplate> chat_template;
  if (Result<ChatTemplate> t = ChatTemplate::FromDirectory(dir); t.ok()) {
    chat_template.emplace(std::move(t).value());
  } else {
    Log("kestrel: warning: no usable chat template (" + t.status().message() +
        "); /v1/chat/completions will answer 400");
  }

  Result<Device> device = ResolveDevice(f.device);
  if (!device.ok()) return Fail(device.status());
  ModelLoadOptions options;
  options.device = *device;
  options.kernels = f.reference_kernels ? CpuKernels::kReference : CpuKernels::kAuto;
  options.int8_activations = !f.f32_activations;
  options.fp8_activations = f.fp8_activations;
  options.deterministic = f.deterministic;
  Result<ModelLoadOptions::KvCacheDType> kv_dtype = ParseKvCacheDType(f.kv_cache_dtype);
  if (!kv_dtype.ok()) return Fail(kv_dtype.status());
  options.kv_cache_dtype = *kv_dtype;
  options.block_size_tokens = f.block_size;
  options.n_threads = f.n_threads;
  options.max_num_seqs = f.max_num_seqs;
  options.state_snapshot_bytes =
      f.no_prefix_cache ? 0 : static_cast<int64_t>(f.state_cache_gib * double(int64_t{1} << 30));
  if (*device == Device::kCuda) {
    // One step's logits rows stay on the GPU for sampling; the model holds up to 1024 of them.
    if (f.max_num_seqs > kMaxCudaSequences && f.max_batched_tokens > kMaxCudaSequences) {
      return Fail("--device cuda runs at most " + std::to_string(kMaxCudaSequences) +
                  " sequences per step: lower --max-num-seqs");
    }
    // The GPU's KV pool: --kv-memory GiB, else 90 % of the memory left after the weights.
    options.kv_cache_bytes =
        f.kv_memory_gib ? static_cast<int64_t>(*f.kv_memory_gib * double(int64_t{1} << 30)) : 0;
    options.max_batch_tokens = f.max_batched_tokens;
    options.show_progress = true;
  } else {
    Result<int64_t> kv_tokens = KvCacheTokens(f, *cfg, options.kv_cache_dtype);
    if (!kv_tokens.ok()) return Fail(kv_tokens.status());
    options.kv_cache_tokens = *kv_tokens;
  }
  Log("kestrel: [2/4] loading the weights (" + cfg->architecture_class + ") on " +
      DeviceName(*device));
  Result<std::unique_ptr<Model>> model = Model::Load(dir, options);
  if (!model.ok()) return Fail(model.status());
  const int64_t capacity =
      static_cast<int64_t>((*model)->n_kv_blocks()) * (*model)->block_size_tokens();
  Log("kestrel: [3/4] KV cache: " + std::to_string(capacity) + " tokens (" +
      std::to_string((*model)->n_kv_blocks()) + " blocks of " + std::to_string(f.block_size) +
      ", " + HumanBytes(static_cast<double>(capacity * (*model)->kv_bytes_per_token())) + "), " +
      (*model)->kernels_name() + " kernels");
  if (const CacheSpec& spec = (*model)->cache_spec(); spec.has_recurrent_state()) {
    const int32_t n_snapshots = (*model)->n_state_slots() - f.max_num_seqs;
    Log("kestrel:       recurrent state: " +
        HumanBytes(static_cast<double>(spec.state_bytes_per_slot())) + " per sequence (" +
        std::to_string(spec.n_recurrent_layers) + " Gated DeltaNet layers), " +
        std::to_string(f.max_num_seqs) + " live slots + " + std::to_string(n_snapshots) +
        " prefix-cache snapshots (" +
        HumanBytes(static_cast<double>(n_snapshots * spec.state_bytes_per_slot())) + ")");
  }
  for (const std::string& note : (*model)->load_notes()) Log("kestrel:       note: " + note);

  server::ServedModel served;
  served.id = f.served_model_name.empty() ? Basename(dir) : f.served_model_name;
  if (Basename(dir) != served.id) served.aliases.push_back(Basename(dir));
  served.created = server::UnixSeconds();
  const int64_t context =
      cfg->max_position_embeddings > 0 ? cfg->max_position_embeddings : capacity;
  served.context_tokens = std::min(context, capacity);
  served.vocab_size = static_cast<int32_t>((*model)->config().vocab_size);
  served.defaults = DefaultSampling(*defaults);

  EngineConfig engine_config;
  engine_config.max_num_seqs = f.max_num_seqs;
  engine_config.max_batched_tokens = f.max_batched_tokens;
  // On the H200 (random Qwen3-8B, 256 streams of 1,000 + 1,000 tokens) steps of 768 prompt
  // tokens beside the 256 decodes keep 99.6 % of the engine's inter-token gaps under 50 ms,
  // against 89 % with 1,024 or 1,792 of them, for 1-1.5 % less throughput
  // (docs/bench-serve.md). The CPU's steps are long whatever their size, so there the whole
  // budget goes to prompts.
  engine_config.max_prefill_tokens_beside_decodes =
      f.max_prefill_beside_decodes.value_or(*device == Device::kCuda ? 768 : 0);
  engine_config.max_waiting = f.max_waiting;
  engine_config.prefix_caching = !f.no_prefix_cache;
  engine_config.async_scheduling = !f.no_async_scheduling;
  std::vector<int32_t> eos_ids = EosIds(**model, *defaults, *tokenizer);
  Log("kestrel: [4/4] starting the engine (max " + std::to_string(f.max_num_seqs) + " sequences, " +
      std::to_string(f.max_batched_tokens) + " tokens per step" +
      (engine_config.max_prefill_tokens_beside_decodes > 0
           ? " (" + std::to_string(engine_config.max_prefill_tokens_beside_decodes) +
                 " of prompts beside decodes)"
           : std::string()) +
      ", prefix cache " +
      (f.no_prefix_cache ? "off" : "on") + ")");
  Engine engine(std::move(*model), &*tokenizer, std::move(eos_ids), engine_config);

  server::ServerOptions server_options;
  server_options.host = f.host;
  server_options.port = f.port;
  server_options.api_key = f.api_key;
  if (f.tool_call_parser != "auto") {
    server::ToolCallFormat format = server::ToolCallFormat::kNone;
    server::ParseToolCallFormat(f.tool_call_parser, &format);
    server_options.tool_call_format = format;
  }
  if (f.reasoning_parser != "auto") server_options.reasoning = f.reasoning_parser == "think";
  server_options.max_stored_responses = static_cast<size_t>(f.max_stored_responses);
  server_options.protect_metrics = f.protect_metrics;
  server_options.transport.head_timeout_s = f.header_timeout_s;
  // Every admitted or queued request holds a connection thread; the rest serve /health,
  // /metrics and idle keep-alive connections.
  server_options.n_http_threads = std::min(f.max_num_seqs + f.max_waiting + 16, 1024);
  server::HttpServer http(&engine, &*tokenizer, chat_template ? &*chat_template : nullptr, served,
                          server_options);
  const server::OutputFormats formats = http.output_formats();
  Log(std::string("kestrel: tool calls: ") + server::ToolCallFormatName(formats.tool_calls) +
      ", reasoning: " + (formats.reasoning ? "<think>" : "none") +
      (f.tool_call_parser == "auto" && f.reasoning_parser == "auto" ? " (from the chat template)"
                                                                    : ""));
  if (Status s = server::InstallShutdownSignals(); !s.ok()) return Fail(s);
  if (Status s = http.Bind(); !s.ok()) return Fail(s);
  engine.Start();

  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char ready[64];
  std::snprintf(ready, sizeof(ready), " (ready in %.1f s)", load_s);
  Log("kestrel: serving " + served.id + " at http://" + f.host + ":" + std::to_string(http.port()) +
      "/v1" + ready + (f.api_key.empty() ? "" : "; API key required"));

  server::ShutdownOptions shutdown;
  shutdown.grace = std::chrono::seconds(f.shutdown_grace_s);
  return server::ServeUntilShutdown(http, engine, shutdown, Log);
}

}  // namespace

void RegisterServe(CLI::App& app, int& exit_code) {
  static ServeFlags f;
  auto* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API");
  cmd->add_option("--model", f.model_dir, "Model directory");
  cmd->add_option("--host", f.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", f.port, "Port to listen on (0 = any free port)")->capture_default_str();
  cmd->add_option("--device", f.device, kDeviceHelp)->capture_default_str();
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "Sequences running at once")
      ->capture_default_str();
  cmd->add_option("--max-batched-tokens", f.max_batched_tokens,
                  "Tokens per engine step (prefill chunks + decodes)")
      ->capture_default_str();
  cmd->add_option("--max-prefill-beside-decodes", f.max_prefill_beside_decodes,
                  "Prompt tokens a step may add while sequences decode (0: the whole step; "
                  "default 768 on CUDA, 0 on the CPU)");
  cmd->add_option("--max-waiting", f.max_waiting,
                  "Requests queued beyond the running ones; more get HTTP 429")
      ->capture_default_str();
  cmd->add_option("--kv-memory", f.kv_memory_gib,
                  "KV cache budget in GiB (cpu default 2, capped at max-num-seqs full contexts; "
                  "cuda default 90% of the GPU memory left after the weights)");
  cmd->add_option("--block-size", f.block_size, "KV cache block size in tokens")
      ->capture_default_str();
  cmd->add_option("--state-cache", f.state_cache_gib,
                  "Hybrid models: GiB of recurrent-state snapshots for prefix caching")
      ->capture_default_str();
  cmd->add_option("--api-key", f.api_key,
                  "Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on /v1/* (default: "
                  "$KESTREL_API_KEY)");
  cmd->add_flag("--protect-metrics", f.protect_metrics,
                "With --api-key: /metrics needs the key too");
  cmd->add_option("--header-timeout", f.header_timeout_s,
                  "Seconds a request's whole head (request line + headers) may take to arrive")
      ->capture_default_str();
  cmd->add_option("--tool-call-parser", f.tool_call_parser,
                  "How the model writes tool calls: auto (read from the chat template), hermes, "
                  "qwen3_coder, llama3_json, none")
      ->capture_default_str();
  cmd->add_option(
         "--reasoning-parser", f.reasoning_parser,
         "Reasoning in <think>...</think>: auto (read from the chat template), think, none")
      ->capture_default_str();
  cmd->add_option("--max-stored-responses", f.max_stored_responses,
                  "/v1/responses kept in memory for previous_response_id (LRU)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", f.no_prefix_cache, "Disable prefix caching");
  cmd->add_flag("--no-async-scheduling", f.no_async_scheduling,
                "Wait for each step's tokens before planning the next (same tokens, slower)");
  cmd->add_option("--threads", f.n_threads, "CPU threads for the model (default: all cores)");
  cmd->add_option("--served-model-name", f.served_model_name,
                  "Model id shown by the API (default: the directory name)");
  cmd->add_option("--shutdown-grace", f.shutdown_grace_s,
                  "Seconds running requests may take to finish after SIGINT/SIGTERM")
      ->capture_default_str();
  cmd->add_flag("--reference", f.reference_kernels, "Use the scalar reference kernels");
  cmd->add_flag("--f32-activations", f.f32_activations, kF32ActivationsHelp);
  cmd->add_flag("--fp8-activations", f.fp8_activations, kFp8ActivationsHelp);
  cmd->add_flag("--deterministic", f.deterministic, kDeterministicHelp);
  cmd->add_option("--kv-cache-dtype", f.kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->callback([&exit_code] { exit_code = RunServe(f); });
}

}  // namespace kestrel::cli
