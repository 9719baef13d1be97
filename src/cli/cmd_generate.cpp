// kestrel generate: streams the completion of a prompt (raw or chat) to stdout; prefill and
// decode token counts and speeds go to stderr. The request runs on the same Engine the server
// uses (one sequence, synchronous scheduling), so validation, stop strings, EOS and text deltas
// are the server's.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "core/mapped_file.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"

namespace kestrel::cli {
namespace {

struct GenerateFlags {
  LoadFlags load;
  std::string prompt;
  std::string prompt_file;
  bool chat = false;
  std::string system;
  int32_t max_tokens = 256;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
};

// Tokens per prefill step (one chunk of the engine's token budget).
constexpr int32_t kPrefillChunkTokens = 512;

int RunGenerate(const GenerateFlags& f) {
  std::string prompt = f.prompt;
  if (!f.prompt_file.empty()) {
    Result<std::string> text = ReadFileToString(f.prompt_file);
    if (!text.ok()) return Fail(text.status());
    prompt = *text;
  }
  if (f.max_tokens < 1) return Fail("--max-tokens must be at least 1");
  Result<LoadedModel> loaded = LoadModelForCli(f.load);
  if (!loaded.ok()) return Fail(loaded.status());
  LoadedModel& m = *loaded;

  std::vector<int32_t> ids;
  if (f.chat) {
    Result<ChatTemplate> tmpl = ChatTemplate::FromDirectory(m.dir);
    if (!tmpl.ok()) return Fail(tmpl.status());
    nlohmann::json messages = nlohmann::json::array();
    if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    Result<std::string> rendered =
        tmpl->Render(messages, nullptr, /*add_generation_prompt=*/true, nlohmann::json::object());
    if (!rendered.ok()) return Fail(rendered.status().With("chat template: "));
    ids = m.tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
  } else {
    ids = m.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  }

  EngineRequest req;
  req.prompt_ids = std::move(ids);
  req.sampling = DefaultSampling(m.defaults);
  if (f.temperature) req.sampling.temperature = *f.temperature;
  if (f.top_p) req.sampling.top_p = *f.top_p;
  if (f.top_k) req.sampling.top_k = *f.top_k;
  if (f.min_p) req.sampling.min_p = *f.min_p;
  req.sampling.seed = f.seed ? *f.seed : std::random_device{}();
  if (Status s = ValidateSamplingParams(req.sampling); !s.ok()) return Fail(s);
  req.max_new_tokens = f.max_tokens;
  req.ignore_eos = f.ignore_eos;
  const int32_t n_prompt = static_cast<int32_t>(req.prompt_ids.size());

  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_batched_tokens = kPrefillChunkTokens;
  config.async_scheduling = false;  // one sequence: nothing to overlap
  Engine engine(std::move(m.model), &*m.tokenizer, m.eos_ids, config);
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::shared_ptr<RequestHandle>> handle = engine.Submit(std::move(req));
  if (!handle.ok()) return Fail(handle.status());
  engine.Start();

  auto first_token_time = std::chrono::steady_clock::time_point{};
  int32_t n_generated = 0;
  RequestOutput event;
  FinishReason finish = FinishReason::kLength;
  for (;;) {
    if (!(*handle)->Next(&event, std::chrono::milliseconds(1000))) continue;
    if (!event.token_ids.empty() && n_generated == 0) {
      first_token_time = std::chrono::steady_clock::now();
    }
    n_generated += static_cast<int32_t>(event.token_ids.size());
    std::fwrite(event.text.data(), 1, event.text.size(), stdout);
    std::fflush(stdout);
    if (event.finished) {
      finish = event.finish_reason;
      if (!event.error.ok()) return Fail(event.error);
      break;
    }
  }
  engine.Shutdown(/*cancel_running=*/false);
  const auto t1 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(first_token_time - t0).count();
  const double decode_s = std::chrono::duration<double>(t1 - first_token_time).count();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  // The first token comes from the prefill's logits.
  const int32_t n_decode_forwards = n_generated - 1;
  std::fprintf(stderr,
               "prefill: %d tokens in %.3f s (%.1f tok/s), %d cached\n"
               "decode: %d tokens in %.3f s (%.1f tok/s), finish: %s\n",
               n_prompt, prefill_s, prefill_s > 0 ? n_prompt / prefill_s : 0.0,
               event.usage.cached_tokens, n_generated, decode_s,
               n_decode_forwards > 0 && decode_s > 0 ? n_decode_forwards / decode_s : 0.0,
               FinishReasonName(finish));
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int& exit_code) {
  static GenerateFlags f;
  auto* cmd = app.add_subcommand("generate", "Stream a completion of a prompt to stdout");
  cmd->add_option("--model", f.load.model_dir, "Model directory");
  cmd->add_option("--device", f.load.device, kDeviceHelp)->capture_default_str();
  auto* p = cmd->add_option("--prompt", f.prompt, "Prompt text");
  auto* pf = cmd->add_option("--prompt-file", f.prompt_file, "File holding the prompt");
  p->excludes(pf);
  cmd->add_flag("--chat", f.chat, "Render the prompt as a user turn with the chat template");
  cmd->add_option("--system", f.system, "System message (with --chat)");
  cmd->add_option("--max-tokens", f.max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", f.temperature, "0 = greedy (default: generation_config.json)");
  cmd->add_option("--top-p", f.top_p, "Nucleus sampling mass");
  cmd->add_option("--top-k", f.top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", f.min_p, "Drop tokens below min-p x the top probability");
  cmd->add_option("--seed", f.seed, "Seed of the sampling RNG");
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--reference", f.load.reference_kernels, "Use the scalar reference kernels");
  cmd->add_flag("--f32-activations", f.load.f32_activations, kF32ActivationsHelp);
  cmd->add_flag("--fp8-activations", f.load.fp8_activations, kFp8ActivationsHelp);
  cmd->add_flag("--deterministic", f.load.deterministic, kDeterministicHelp);
  cmd->add_option("--kv-cache-dtype", f.load.kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->add_option("--threads", f.load.n_threads, "CPU threads (default: all cores)");
  cmd->add_option("--ctx-size", f.load.kv_cache_tokens, "KV cache capacity in tokens")
      ->capture_default_str();
  cmd->callback([&exit_code] {
    if (f.prompt.empty() && f.prompt_file.empty()) {
      exit_code = Fail("generate needs --prompt TEXT or --prompt-file F");
      return;
    }
    exit_code = RunGenerate(f);
  });
}

}  // namespace kestrel::cli
