// kestrel bench --device cuda: prefill and batched decode on the GPU, as JSON, each figure also a
// fraction of the ceilings measured in the same run (device-to-device copy bandwidth, cuBLASLt
// bf16 GEMM peak), with a per-stage breakdown (attention, GEMM/matvec, other) from CUDA events.
//
// Decode at batch B and context C: sequence 0 is prefilled with C random tokens and its KV
// blocks are copied to the other B-1 sequences (each has its own blocks, so every sequence's K/V
// is read from its own memory); then steps of B tokens run with greedy sampling on the device,
// the way the engine runs them (CUDA graphs per batch bucket). Bytes per step = the weights once
// + B x (the mean context of the timed steps) x KV bytes per token.
#include "cli/bench_cuda.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#ifdef KESTREL_HAS_CUDA
#include "backends/cuda/attention.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/roofline.h"
#endif
#include "cli/bench_engine.h"
#include "cli/bench_util.h"
#include "cli/common.h"

namespace kestrel::cli {

#ifdef KESTREL_HAS_CUDA

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Host-side batch of `rows` sequences, sequence s owning blocks [s * nb, (s + 1) * nb).
// Recurrent-state models: sequence s keeps its state in slot s.
struct BenchBatch {
  std::vector<int32_t> tokens, positions, slots, seq_starts, context_lens, block_tables, logits;
  std::vector<int32_t> state_slots;
  int32_t nb = 0;

  // Models without recurrent layers take no state slots.
  Batch View(const Model& model) const {
    Batch b;
    b.token_ids = tokens;
    b.positions = positions;
    b.slot_mapping = slots;
    b.seq_starts = seq_starts;
    b.context_lens = context_lens;
    b.block_tables = block_tables;
    b.max_blocks_per_seq = nb;
    b.logits_indices = logits;
    if (model.cache_spec().state_bytes_per_slot() > 0) b.state_slots = state_slots;
    return b;
  }
};

// One prefill of `n` tokens at positions [start, start + n) of sequence 0 (logits of the last).
BenchBatch PrefillBatch(std::vector<int32_t> ids, int32_t start, int32_t nb, int32_t bs) {
  BenchBatch b;
  const int32_t n = static_cast<int32_t>(ids.size());
  b.nb = nb;
  b.tokens = std::move(ids);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = start + i;
    b.positions.push_back(p);
    b.slots.push_back((p / bs) * bs + p % bs);  // blocks 0..nb-1 in order
  }
  b.seq_starts = {0, n};
  b.context_lens = {start + n};
  for (int32_t j = 0; j < nb; ++j) b.block_tables.push_back(j);
  b.logits = {n - 1};
  b.state_slots = {0};
  return b;
}

// One decode step: token `tokens[s]` of every sequence at position `pos`.
void FillDecodeBatch(BenchBatch& b, int32_t rows, int32_t pos, int32_t nb, int32_t bs) {
  b.nb = nb;
  b.positions.assign(static_cast<size_t>(rows), pos);
  b.slots.resize(static_cast<size_t>(rows));
  b.seq_starts.resize(static_cast<size_t>(rows) + 1);
  b.context_lens.assign(static_cast<size_t>(rows), pos + 1);
  b.block_tables.resize(static_cast<size_t>(rows) * nb);
  b.logits.resize(static_cast<size_t>(rows));
  b.state_slots.resize(static_cast<size_t>(rows));
  for (int32_t s = 0; s < rows; ++s) {
    b.state_slots[static_cast<size_t>(s)] = s;
    const int32_t block = s * nb + pos / bs;
    b.slots[s] = block * bs + pos % bs;
    b.seq_starts[s] = s;
    b.logits[s] = s;
    for (int32_t j = 0; j < nb; ++j) b.block_tables[static_cast<size_t>(s) * nb + j] = s * nb + j;
  }
  b.seq_starts[rows] = rows;
}

json Breakdown(const ForwardStats& st) {
  const double total = st.attention_s + st.recurrent_s + st.matmul_s + st.moe_s + st.other_s;
  if (total <= 0) return json::object();
  return {{"attention", st.attention_s / total},
          {"recurrent", st.recurrent_s / total},
          {"gemm", st.matmul_s / total},
          {"moe", st.moe_s / total},
          {"other", st.other_s / total},
          {"ms_per_forward", 1e3 * total / std::max<int64_t>(1, st.n_forwards)}};
}

}  // namespace

int RunCudaBench(const CudaBenchOptions& o, LoadedModel& loaded) {
  Model& model = *loaded.model;
  const ModelConfig& cfg = model.config();
  const int32_t bs = model.block_size_tokens();
  const int32_t n_blocks = model.n_kv_blocks();
  const FlopModel flops = Flops(cfg);

  std::fprintf(stderr, "kestrel bench: measuring the roofline (copy bandwidth, GEMM peak)\n");
  Result<cuda::Roofline> roof = cuda::MeasureRoofline();
  if (!roof.ok()) return Fail(roof.status());
  json out;
  out["model"] = loaded.dir;
  out["device"] = "cuda";
  out["n_parameters"] = model.n_parameters();
  out["decode_weight_bytes"] = model.decode_weight_bytes();
  out["weight_formats"] = model.weight_formats();
  out["kv_cache_dtype"] = model.kv_cache_dtype();
  out["kv_bytes_per_token"] = model.kv_bytes_per_token();
  out["kv_capacity_tokens"] = int64_t{n_blocks} * bs;
  out["graphs"] = !o.no_graphs;
  out["pdl"] = cuda::PdlEnabled();
  out["decode_attention"] = cuda::DecodeAttentionVariantName(cuda::DecodeAttentionVariant());
  out["gemv"] = cuda::SkinnyVariantName(cuda::DefaultSkinnyVariant());
  out["roofline"] = {{"copy_gb_per_s", roof->copy_gb_per_s},
                     {"gemm_tflop_per_s", roof->gemm_tflop_per_s},
                     {"copy_bytes", roof->copy_bytes},
                     {"gemm_size", roof->gemm_size}};
  model.set_use_graphs(!o.no_graphs);
  std::mt19937_64 rng(1234);

  // ---- Prefill: one sequence of n tokens from an empty cache.
  json prefill = json::array();
  for (int64_t n64 : o.prefill_tokens) {
    const int32_t n = static_cast<int32_t>(n64);
    const int32_t nb = (n + bs - 1) / bs;
    if (nb > n_blocks) {
      prefill.push_back({{"tokens", n}, {"skipped", "exceeds the KV capacity"}});
      continue;
    }
    std::vector<double> secs;
    std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
    for (int r = 0; r < o.repeats + 1; ++r) {  // the first run warms up (GEMM heuristics)
      const BenchBatch b = PrefillBatch(RandomIds(n, cfg.vocab_size, rng), 0, nb, bs);
      const Clock::time_point t0 = Clock::now();
      model.Forward(b.View(model), logits.data());
      if (r > 0) secs.push_back(Seconds(t0));
    }
    const double s = Median(secs);
    const double fl =
        2.0 * flops.layer_macs * n + 2.0 * flops.head_macs + flops.AttentionFlops(n, 0);
    const double tflops = fl / s / 1e12;
    json row = {{"tokens", n},
                {"ms", 1e3 * s},
                {"tok_per_s", n / s},
                {"tflop_per_s", tflops},
                {"fraction_of_gemm_peak", tflops / roof->gemm_tflop_per_s}};
    if (o.profile) {
      model.ResetStats();
      model.set_profiling(true);
      const BenchBatch b = PrefillBatch(RandomIds(n, cfg.vocab_size, rng), 0, nb, bs);
      model.Forward(b.View(model), logits.data());
      model.set_profiling(false);
      row["breakdown"] = Breakdown(model.stats());
    }
    std::fprintf(stderr, "prefill %6d tokens: %8.2f ms  %9.0f tok/s  %.3f of GEMM peak\n", n,
                 1e3 * s, n / s, tflops / roof->gemm_tflop_per_s);
    prefill.push_back(row);
  }
  out["prefill"] = prefill;

  // ---- Decode: B sequences at context C.
  json decode = json::array();
  const int32_t steps = o.decode_tokens;
  std::vector<SamplingParams> greedy(1);
  greedy[0].temperature = 0;
  for (int64_t c64 : o.decode_contexts) {
    const int32_t ctx = static_cast<int32_t>(c64);
    const int32_t nb = (ctx + steps + 2 + bs - 1) / bs;
    bool prefilled = false;
    int32_t copied_rows = 1;  // sequences holding a copy of sequence 0's context
    for (int64_t b64 : o.batch_sizes) {
      const int32_t rows = static_cast<int32_t>(b64);
      if (int64_t{rows} * nb > n_blocks) {
        decode.push_back(
            {{"batch", rows},
             {"context", ctx},
             {"skipped", "needs " + std::to_string(int64_t{rows} * nb * bs) +
                             " KV tokens, capacity " + std::to_string(int64_t{n_blocks} * bs)}});
        continue;
      }
      if (!prefilled) {  // sequence 0's context, in chunks of up to 8192 tokens
        std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
        for (int32_t start = 0; start < ctx; start += 8192) {
          const int32_t n = std::min(8192, ctx - start);
          const BenchBatch b = PrefillBatch(RandomIds(n, cfg.vocab_size, rng), start, nb, bs);
          model.Forward(b.View(model), logits.data());
        }
        prefilled = true;
      }
      // Sequences 1..rows-1 get copies of sequence 0's blocks (those not copied yet).
      for (int32_t s = copied_rows; s < rows; ++s) model.CopyKvBlocks(0, s * nb, nb);
      copied_rows = std::max(copied_rows, rows);

      std::vector<Sampler> samplers;
      samplers.reserve(static_cast<size_t>(rows));
      for (int32_t s = 0; s < rows; ++s) samplers.emplace_back(greedy[0], cfg.vocab_size);
      std::vector<Sampler*> sampler_ptrs;
      for (Sampler& s : samplers) sampler_ptrs.push_back(&s);
      std::vector<SampleResult> results(static_cast<size_t>(rows));
      BenchBatch b;
      b.tokens = RandomIds(rows, cfg.vocab_size, rng);
      auto step = [&](int32_t pos) {
        FillDecodeBatch(b, rows, pos, nb, bs);
        model.Forward(b.View(model), nullptr);
        model.SampleLastLogits(sampler_ptrs, results);
        for (int32_t s = 0; s < rows; ++s) b.tokens[s] = results[s].token;
      };
      std::vector<double> rates;
      for (int r = 0; r < o.repeats; ++r) {
        step(ctx);  // warm-up: graph capture for this bucket on the first repeat
        const Clock::time_point t0 = Clock::now();
        for (int32_t i = 1; i <= steps; ++i) step(ctx + i);
        rates.push_back(Seconds(t0) / steps);
      }
      const double step_s = Median(rates);
      const double mean_ctx = ctx + 1 + (steps + 1) / 2.0;
      // Profiled steps (no graphs, stage events): the breakdown, and for MoE models the weight
      // bytes the steps read, counting only the experts their tokens were routed to.
      json breakdown;
      double weight_bytes = static_cast<double>(model.decode_weight_bytes());
      if (o.profile || cfg.has_moe()) {
        model.ResetStats();
        model.set_profiling(true);
        for (int32_t i = 1; i <= 4; ++i) step(ctx + i);
        model.set_profiling(false);
        const ForwardStats& st = model.stats();
        breakdown = Breakdown(st);
        if (cfg.has_moe() && st.n_forwards > 0) {
          // Less the embedding rows beyond one per step (counted by the runner).
          weight_bytes = static_cast<double>(st.weight_bytes_read) / st.n_forwards -
                         (rows - 1.0) * cfg.hidden_size * 2.0;
        }
      }
      // Weights, the K/V of the attention layers, and each sequence's recurrent state read
      // and written.
      const double bytes =
          weight_bytes + rows * mean_ctx * static_cast<double>(model.kv_bytes_per_token()) +
          rows * 2.0 * static_cast<double>(model.cache_spec().state_bytes_per_slot());
      const double gbs = bytes / step_s / 1e9;
      const double fl = rows * (2.0 * (flops.layer_macs + flops.head_macs) +
                                flops.AttentionFlops(1, mean_ctx - 1));
      json row = {{"batch", rows},
                  {"context", ctx},
                  {"tok_per_s", rows / step_s},
                  {"ms_per_step", 1e3 * step_s},
                  {"gb_per_s", gbs},
                  {"fraction_of_copy_bw", gbs / roof->copy_gb_per_s},
                  {"tflop_per_s", fl / step_s / 1e12},
                  {"fraction_of_gemm_peak", fl / step_s / 1e12 / roof->gemm_tflop_per_s}};
      if (cfg.has_moe()) row["weight_bytes_per_step"] = weight_bytes;
      if (o.profile) row["breakdown"] = breakdown;
      std::fprintf(stderr,
                   "decode batch %4d ctx %6d: %8.3f ms/step %9.1f tok/s  %7.0f GB/s  %.3f of "
                   "copy bw\n",
                   rows, ctx, 1e3 * step_s, rows / step_s, gbs, gbs / roof->copy_gb_per_s);
      decode.push_back(row);
    }
  }
  out["decode"] = decode;
  // The engine benchmarks share the model (`model` stays valid).
  std::shared_ptr<Model> shared = std::move(loaded.model);
  if (!o.prefix_hit_tokens.empty()) {
    out["prefix_hit"] = BenchPrefixHit(shared, o.prefix_hit_tokens, o.repeats, rng());
  }
  if (!o.engine_batch_sizes.empty()) {
    out["engine_decode"] = BenchEngineDecode(std::move(shared), o.engine_batch_sizes,
                                             /*new_tokens=*/128, o.repeats, rng());
  }
  WriteLine(out.dump(2));
  return 0;
}

#else

int RunCudaBench(const CudaBenchOptions&, LoadedModel&) {
  return Fail("--device cuda: this build of Kestrel has no CUDA backend");
}

#endif

}  // namespace kestrel::cli
