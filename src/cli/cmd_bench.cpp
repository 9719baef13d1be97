// kestrel bench: prefill and decode speed of one model on the CPU, printed as JSON next to the
// machine's own limits measured in the same run (read bandwidth, FMA peak), so each figure is
// also a fraction of its roofline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_cuda.h"
#include "cli/bench_engine.h"
#include "cli/bench_util.h"
#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "core/memory_bandwidth.h"
#include "engine/generator.h"
#include "models/safetensors.h"

namespace kestrel::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchFlags {
  LoadFlags load;
  std::vector<int64_t> prefill_tokens;   // default: 128,512 (cpu); 128,512,2048,8192 (cuda)
  std::vector<int64_t> decode_contexts;  // default: 128,1024 (cpu); 128,2048,8192 (cuda)
  std::vector<int64_t> batch_sizes;      // cuda; default 1,2,4,...,256
  std::vector<int64_t> engine_batches;   // default 1,64 (cuda), none (cpu); 0 = none
  bool no_graphs = false;
  bool no_profile = false;
  int32_t decode_tokens = 32;
  int repeats = 3;
};

// Bytes one decode step must read: every weight once, except that the embedding gather
// reads a single row (unless the LM head is tied to it), plus the K/V of the context.
struct ByteModel {
  int64_t weight_bytes_per_token = 0;
  int64_t matmul_params = 0;  // multiply-adds per token in the linear layers
};

Result<ByteModel> CountBytes(const std::string& dir, const ModelConfig& cfg) {
  KASSIGN(WeightStore ws, WeightStore::Open(dir));
  ByteModel b;
  for (const auto& [name, t] : ws.tensors()) {
    bool is_embed = name == "model.embed_tokens.weight";
    if (is_embed && !cfg.tie_word_embeddings) continue;
    b.weight_bytes_per_token += static_cast<int64_t>(t.size_bytes());
    if (t.n_dims == 2) b.matmul_params += t.numel();
  }
  return b;
}

int RunBench(BenchFlags f) {
  Result<Device> device = ResolveDevice(f.load.device);
  if (!device.ok()) return Fail(device.status());
  std::vector<int64_t> engine_batches;  // without the 0s
  for (int64_t v : f.engine_batches) {
    if (v < 0 || v > 1024) return Fail("--engine-batch values must be in [0, 1024]");
    if (v > 0) engine_batches.push_back(v);
  }
  if (*device == Device::kCuda) {
    CudaBenchOptions o;
    o.prefill_tokens = f.prefill_tokens.empty() ? std::vector<int64_t>{128, 512, 2048, 8192}
                                                : f.prefill_tokens;
    o.decode_contexts = f.decode_contexts.empty() ? std::vector<int64_t>{128, 2048, 8192}
                                                  : f.decode_contexts;
    o.batch_sizes = f.batch_sizes.empty()
                        ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256}
                        : f.batch_sizes;
    for (int64_t v : o.prefill_tokens) {
      if (v < 1 || v > (int64_t{1} << 20)) return Fail("--prefill values must be in [1, 2^20]");
    }
    for (int64_t v : o.decode_contexts) {
      if (v < 1 || v > (int64_t{1} << 20)) return Fail("--decode-context values must be in [1, 2^20]");
    }
    for (int64_t v : o.batch_sizes) {
      if (v < 1 || v > 4096) return Fail("--batch values must be in [1, 4096]");
    }
    o.engine_batch_sizes = engine_batches.empty() && f.engine_batches.empty()
                               ? std::vector<int64_t>{1, 64}
                               : engine_batches;
    o.decode_tokens = f.decode_tokens;
    o.repeats = f.repeats;
    o.no_graphs = f.no_graphs;
    o.profile = !f.no_profile;
    f.load.kv_cache_tokens = 0;  // the GPU's memory budget decides
    f.load.need_tokenizer = false;
    Result<LoadedModel> loaded = LoadModelForCli(f.load);
    if (!loaded.ok()) return Fail(loaded.status());
    return RunCudaBench(o, *loaded);
  }
  if (f.prefill_tokens.empty()) f.prefill_tokens = {128, 512};
  if (f.decode_contexts.empty()) f.decode_contexts = {128, 1024};
  int64_t max_ctx = 0;
  for (int64_t n : f.prefill_tokens) max_ctx = std::max(max_ctx, n + 1);
  for (int64_t n : f.decode_contexts) max_ctx = std::max(max_ctx, n + f.decode_tokens);
  for (int64_t b : engine_batches) max_ctx = std::max(max_ctx, b * (32 + f.decode_tokens));
  f.load.kv_cache_tokens = max_ctx;
  f.load.need_tokenizer = false;
  Result<LoadedModel> loaded = LoadModelForCli(f.load);
  if (!loaded.ok()) return Fail(loaded.status());
  Model& model = *loaded->model;
  const ModelConfig& cfg = model.config();
  Result<ByteModel> bytes = CountBytes(loaded->dir, cfg);
  if (!bytes.ok()) return Fail(bytes.status());

  ThreadPool pool(f.load.n_threads);
  json out;
  out["model"] = loaded->dir;
  out["device"] = "cpu";
  out["threads"] = pool.n_threads();
  out["kernels"] = f.load.reference_kernels ? "reference" : "auto";
  out["weight_bytes_per_token"] = bytes->weight_bytes_per_token;
  MachineLimits limits;
  limits.read_gb_per_s = MeasureReadBandwidth(pool, int64_t{1} << 30, 5);
  limits.fma_gflop_per_s = MeasureFmaPeak(pool, 3);
  out["roofline"] = {{"read_gb_per_s", limits.read_gb_per_s},
                     {"fma_gflop_per_s", limits.fma_gflop_per_s}};

  Generator gen(&model, nullptr);
  const int64_t attn_dim = cfg.n_heads * cfg.head_dim;
  json prefill = json::array();
  for (int64_t n : f.prefill_tokens) {
    std::vector<double> secs;
    for (int r = 0; r < f.repeats; ++r) {
      GenerationRequest req;
      std::mt19937_64 rng(static_cast<uint64_t>(1234 + r));
      req.prompt_ids = RandomIds(n, cfg.vocab_size, rng);
      req.sampling.temperature = 0;
      req.max_new_tokens = 1;
      req.ignore_eos = true;
      req.prefill_chunk_tokens = static_cast<int32_t>(n);
      Result<GenerationResult> res = gen.Run(req, [](const GenerationEvent&) { return true; });
      if (!res.ok()) return Fail(res.status());
      secs.push_back(res->prefill_seconds);
    }
    double s = Median(secs);
    // 2 flops per multiply-add: linear layers (LM head only for the last row) + causal attention.
    double flops = 2.0 * static_cast<double>(bytes->matmul_params - cfg.vocab_size * cfg.hidden_size) * n +
                   2.0 * cfg.vocab_size * cfg.hidden_size +
                   2.0 * 2.0 * cfg.n_layers * attn_dim * (static_cast<double>(n) * (n + 1) / 2);
    double gflops = flops / s / 1e9;
    prefill.push_back({{"tokens", n},
                       {"seconds", s},
                       {"tok_per_s", n / s},
                       {"gflop_per_s", gflops},
                       {"fraction_of_fma_peak", limits.fma_gflop_per_s > 0 ? gflops / limits.fma_gflop_per_s : 0}});
  }
  out["prefill"] = prefill;

  json decode = json::array();
  for (int64_t ctx : f.decode_contexts) {
    std::vector<double> rates;
    for (int r = 0; r < f.repeats; ++r) {
      GenerationRequest req;
      std::mt19937_64 rng(static_cast<uint64_t>(99 + r));
      req.prompt_ids = RandomIds(ctx, cfg.vocab_size, rng);
      req.sampling.temperature = 0;
      req.max_new_tokens = f.decode_tokens;
      req.ignore_eos = true;
      std::vector<Clock::time_point> stamps;
      Result<GenerationResult> res = gen.Run(req, [&](const GenerationEvent&) {
        stamps.push_back(Clock::now());
        return true;
      });
      if (!res.ok()) return Fail(res.status());
      double s = std::chrono::duration<double>(stamps.back() - stamps.front()).count();
      rates.push_back((stamps.size() - 1) / s);
    }
    double tok_s = Median(rates);
    // Mean context over the measured steps.
    double mean_ctx = ctx + f.decode_tokens / 2.0;
    double bytes_per_step = bytes->weight_bytes_per_token + model.kv_bytes_per_token() * mean_ctx;
    double gbs = bytes_per_step * tok_s / 1e9;
    decode.push_back({{"context", ctx},
                      {"tokens", f.decode_tokens},
                      {"tok_per_s", tok_s},
                      {"ms_per_token", 1e3 / tok_s},
                      {"gb_per_s", gbs},
                      {"fraction_of_read_bw", gbs / limits.read_gb_per_s}});
  }
  out["decode"] = decode;
  if (!engine_batches.empty()) {
    // Last: the engine takes the model.
    out["engine_decode"] = BenchEngineDecode(std::move(loaded->model), engine_batches,
                                             f.decode_tokens, f.repeats, 4321);
  }
  WriteLine(out.dump(2));
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& app, int& exit_code) {
  static BenchFlags f;
  auto* cmd = app.add_subcommand("bench", "Prefill/decode speed as JSON, with measured rooflines");
  cmd->add_option("--model", f.load.model_dir, "Model directory");
  cmd->add_option("--device", f.load.device, kDeviceHelp)->capture_default_str();
  cmd->add_option("--batch", f.batch_sizes, "Decode batch sizes (cuda)")->delimiter(',');
  cmd->add_option("--engine-batch", f.engine_batches,
                  "Serving-engine decode batch sizes, async scheduling off and on "
                  "(default 1,64 on cuda, none on cpu; 0: none)")
      ->delimiter(',');
  cmd->add_flag("--no-graphs", f.no_graphs, "Decode without CUDA graphs (cuda)");
  cmd->add_flag("--no-profile", f.no_profile, "Skip the per-stage breakdown runs (cuda)");
  cmd->add_option("--prefill", f.prefill_tokens, "Prompt lengths to prefill")->delimiter(',');
  cmd->add_option("--decode-context", f.decode_contexts, "Context lengths to decode at")
      ->delimiter(',');
  cmd->add_option("--decode-tokens", f.decode_tokens, "Tokens per decode measurement");
  cmd->add_option("--repeats", f.repeats, "Repeats per figure (median reported)");
  cmd->add_flag("--reference", f.load.reference_kernels, "Use the scalar reference kernels");
  cmd->add_option("--threads", f.load.n_threads, "CPU threads (default: all cores)");
  cmd->callback([&exit_code] {
    if (f.repeats < 1 || f.decode_tokens < 2) {
      exit_code = Fail("--repeats must be >= 1 and --decode-tokens >= 2");
      return;
    }
    exit_code = RunBench(f);
  });
}

}  // namespace kestrel::cli
