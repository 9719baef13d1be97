// kestrel bench: prefill and decode speed of one model on the CPU, printed as JSON next to the
// machine's own limits measured in the same run (read bandwidth, FMA peak), so each figure is
// also a fraction of its roofline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "cli/bench_cuda.h"
#include "cli/bench_engine.h"
#include "cli/bench_util.h"
#include "cli/common.h"
#include "cli/model_setup.h"
#include "cli/verbs.h"
#include "core/memory_bandwidth.h"
#include "engine/engine.h"
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
  std::vector<int64_t> prefix_hit_tokens;  // cuda: TTFT cold vs a prefix-cache hit; default none
  bool no_graphs = false;
  bool no_profile = false;
  int32_t decode_tokens = 32;
  int repeats = 3;
};

// One request on an engine: the arrival time of each token (the first is the prefill's).
std::vector<Clock::time_point> RunOne(Engine& engine, EngineRequest req, Clock::time_point* t0) {
  *t0 = Clock::now();
  Result<std::shared_ptr<RequestHandle>> h = engine.Submit(std::move(req));
  KCHECK_MSG(h.ok(), h.status().message().c_str());
  std::vector<Clock::time_point> stamps;
  RequestOutput ev;
  do {
    while (!(*h)->Next(&ev, std::chrono::milliseconds(1000))) {
    }
    stamps.insert(stamps.end(), ev.token_ids.size(), Clock::now());
  } while (!ev.finished);
  return stamps;
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
    for (int64_t v : f.prefix_hit_tokens) {
      if (v < 32 || v > (int64_t{1} << 20)) return Fail("--prefix-hit values must be in [32, 2^20]");
    }
    o.prefix_hit_tokens = f.prefix_hit_tokens;
    // A hybrid model's prefix hits need state snapshots: the serve default budget.
    if (!f.prefix_hit_tokens.empty()) f.load.state_snapshot_bytes = kDefaultStateSnapshotBytes;
    o.profile = !f.no_profile;
    f.load.kv_cache_tokens = 0;  // the GPU's memory budget decides
    f.load.need_tokenizer = false;
    // Recurrent-state models: a live state slot for every decode row.
    int64_t most_rows = 1;
    for (int64_t b : o.batch_sizes) most_rows = std::max(most_rows, b);
    for (int64_t b : o.engine_batch_sizes) most_rows = std::max(most_rows, b);
    f.load.max_num_seqs = static_cast<int32_t>(most_rows);
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
  f.load.max_num_seqs = static_cast<int32_t>(
      std::max<int64_t>(1, engine_batches.empty() ? 1 : *std::max_element(engine_batches.begin(),
                                                                           engine_batches.end())));
  Result<LoadedModel> loaded = LoadModelForCli(f.load);
  if (!loaded.ok()) return Fail(loaded.status());
  std::shared_ptr<Model> model = std::move(loaded->model);
  const ModelConfig& cfg = model->config();
  if (cfg.max_position_embeddings > 0 && max_ctx > cfg.max_position_embeddings) {
    return Fail(InvalidArgument("the longest --prefill / --decode-context plus --decode-tokens (" +
                                std::to_string(max_ctx) + " tokens) exceeds the model's context of " +
                                std::to_string(cfg.max_position_embeddings)));
  }
  const CacheSpec& spec = model->cache_spec();
  // Bytes one decode step must read besides the K/V of the context: every weight once (MoE
  // layers: the routed experts only), one embedding row, and the recurrent state read and
  // written; and the multiply-adds per token of the linear layers.
  const int64_t weight_bytes = model->decode_weight_bytes();
  const int64_t state_bytes = 2 * spec.state_bytes_per_slot();
  const FlopModel flop_model = Flops(cfg);  // from the shapes: quantized weights count the same

  ThreadPool pool(f.load.n_threads);
  json out;
  out["model"] = loaded->dir;
  out["architecture"] = cfg.architecture_class;
  out["device"] = "cpu";
  out["threads"] = pool.n_threads();
  out["kernels"] = model->kernels_name();
  // Which build of the integer kernels (GGUF blocks against int8 activations) ran: same bits.
  if (model->kernels_name() == cpu::KernelSetName(cpu::KernelSet::kAvx2)) {
    out["int8_dot"] = cpu::Int8DotIsaName(cpu::Int8DotIsaInUse());
    // And the float products of the attention and the packed (prefill) kernel: 512-bit
    // registers or AVX2 (same bits).
    out["float_isa"] = cpu::Avx512ByDefault() ? "avx512" : "avx2";
  }
  out["weight_bytes_per_token"] = weight_bytes;
  out["state_bytes_per_token"] = state_bytes;
  out["kv_cache_dtype"] = model->kv_cache_dtype();
  out["kv_bytes_per_context_token"] = spec.kv_bytes_per_token();
  MachineLimits limits;
  limits.read_gb_per_s = MeasureReadBandwidth(pool, int64_t{1} << 30, 5);
  limits.fma_gflop_per_s = MeasureFmaPeak(pool, 3);
  out["roofline"] = {{"read_gb_per_s", limits.read_gb_per_s},
                     {"fma_gflop_per_s", limits.fma_gflop_per_s}};

  // One sequence on the serving engine, synchronous steps, no prefix cache (every prompt is
  // computed).
  auto make_engine = [&](int32_t step_tokens) {
    EngineConfig config;
    config.max_num_seqs = 1;
    config.max_batched_tokens = step_tokens;
    config.prefix_caching = false;
    config.async_scheduling = false;
    auto engine = std::make_unique<Engine>(model, nullptr, std::vector<int32_t>{}, config);
    engine->Start();
    return engine;
  };
  const double delta_flops_per_token =  // the recurrent form: decay, S^T k, update, S^T q
      8.0 * static_cast<double>(spec.n_recurrent_layers * cfg.linear.n_value_heads *
                                cfg.linear.key_head_dim * cfg.linear.value_head_dim);
  json prefill = json::array();
  for (int64_t n : f.prefill_tokens) {
    std::unique_ptr<Engine> engine = make_engine(static_cast<int32_t>(n));
    std::vector<double> secs;
    ForwardStats stats{};
    for (int r = 0; r < f.repeats; ++r) {
      EngineRequest req;
      std::mt19937_64 rng(static_cast<uint64_t>(1234 + r));
      req.prompt_ids = RandomIds(n, cfg.vocab_size, rng);
      req.sampling.temperature = 0;
      req.max_new_tokens = 1;
      req.ignore_eos = true;
      Clock::time_point t0;
      model->ResetStats();
      std::vector<Clock::time_point> stamps = RunOne(*engine, std::move(req), &t0);
      secs.push_back(std::chrono::duration<double>(stamps.front() - t0).count());
      stats = model->stats();
    }
    engine->Shutdown(false);
    const double s = Median(secs);
    // 2 flops per multiply-add: linear layers (LM head only for the last row), causal attention
    // in the attention layers, the delta rule in the recurrent ones.
    const double tokens = static_cast<double>(n);
    const double flops = 2.0 * flop_model.layer_macs * tokens + 2.0 * flop_model.head_macs +
                         flop_model.AttentionFlops(tokens, 0) + delta_flops_per_token * tokens;
    const double gflops = flops / s / 1e9;
    prefill.push_back(
        {{"tokens", n},
         {"seconds", s},
         {"tok_per_s", n / s},
         {"gflop_per_s", gflops},
         {"fraction_of_fma_peak", limits.fma_gflop_per_s > 0 ? gflops / limits.fma_gflop_per_s : 0},
         {"stages_s",
          {{"matmul", stats.matmul_s},
           {"attention", stats.attention_s},
           {"recurrent", stats.recurrent_s},
           {"other", stats.other_s}}}});
  }
  out["prefill"] = prefill;

  json decode = json::array();
  for (int64_t ctx : f.decode_contexts) {
    std::unique_ptr<Engine> engine = make_engine(static_cast<int32_t>(std::min<int64_t>(ctx, 2048)));
    std::vector<double> rates;
    for (int r = 0; r < f.repeats; ++r) {
      EngineRequest req;
      std::mt19937_64 rng(static_cast<uint64_t>(99 + r));
      req.prompt_ids = RandomIds(ctx, cfg.vocab_size, rng);
      req.sampling.temperature = 0;
      req.max_new_tokens = f.decode_tokens;
      req.ignore_eos = true;
      Clock::time_point t0;
      model->ResetStats();
      std::vector<Clock::time_point> stamps = RunOne(*engine, std::move(req), &t0);
      const double s = std::chrono::duration<double>(stamps.back() - stamps.front()).count();
      rates.push_back(static_cast<double>(stamps.size() - 1) / s);
    }
    engine->Shutdown(false);
    // The last request's decode steps (ForwardStats::decode: its prefill left out).
    const ForwardStats::Stages d = model->stats().decode;
    auto per_step = [&](double total) {
      return d.n_forwards > 0 ? total / static_cast<double>(d.n_forwards) : 0.0;
    };
    const double tok_s = Median(rates);
    // Mean context over the measured steps.
    const double mean_ctx = static_cast<double>(ctx) + f.decode_tokens / 2.0;
    const double bytes_per_step = static_cast<double>(weight_bytes + state_bytes) +
                                  static_cast<double>(spec.kv_bytes_per_token()) * mean_ctx;
    const double gbs = bytes_per_step * tok_s / 1e9;
    decode.push_back({{"context", ctx},
                      {"tokens", f.decode_tokens},
                      {"tok_per_s", tok_s},
                      {"ms_per_token", 1e3 / tok_s},
                      {"bytes_per_token", bytes_per_step},
                      {"gb_per_s", gbs},
                      {"fraction_of_read_bw", gbs / limits.read_gb_per_s},
                      {"stages_ms_per_token",
                       {{"matmul", 1e3 * per_step(d.matmul_s)},
                        {"attention", 1e3 * per_step(d.attention_s)},
                        {"recurrent", 1e3 * per_step(d.recurrent_s)},
                        {"other", 1e3 * per_step(d.other_s)}}}});
  }
  out["decode"] = decode;
  if (!engine_batches.empty()) {
    // Last: the engine takes the model.
    out["engine_decode"] =
        BenchEngineDecode(std::move(model), engine_batches, f.decode_tokens, f.repeats, 4321);
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
  cmd->add_option("--prefix-hit", f.prefix_hit_tokens,
                  "Prompt lengths: time to first token cold and after a prefix-cache hit (cuda)")
      ->delimiter(',');
  cmd->add_option("--repeats", f.repeats, "Repeats per figure (median reported)");
  cmd->add_flag("--reference", f.load.reference_kernels, "Use the scalar reference kernels");
  cmd->add_flag("--f32-activations", f.load.f32_activations, kF32ActivationsHelp);
  cmd->add_flag("--fp8-activations", f.load.fp8_activations, kFp8ActivationsHelp);
  cmd->add_flag("--deterministic", f.load.deterministic, kDeterministicHelp);
  cmd->add_option("--kv-cache-dtype", f.load.kv_cache_dtype, kKvCacheDTypeHelp);
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
