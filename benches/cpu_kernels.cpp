// Microbenchmark of the CPU kernels, printed as JSON next to the machine's own limits measured in
// the same run (STREAM-like read bandwidth, f32 FMA peak):
//   matvec   decode-shaped Linear (1..4 token rows) on weights larger than L3: GB/s of weights
//   matmul   prefill-shaped Linear (many token rows): GFLOP/s
//   attention decode attention over a long context, per KV cache dtype: GB/s of K/V read
//             (and attention_prefill)
//   attention_prefill  a 2,048-token prefill chunk's attention, per KV cache dtype: GFLOP/s
//   model    with --model DIR: prefill and decode of a real model directory through Forward, with
//            the ForwardStats breakdown (attention / matmul / other) and GB/s of weights read
// Usage: bench_cpu_kernels [--threads N] [--quick]
//                          [--only matvec|matmul|attention|attention_prefill]
//        bench_cpu_kernels --model DIR [--threads N] [--prefill 128] [--decode 32] [--depth 0]
//                          [--reference]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/ops.h"
#include "core/dtype.h"
#include "core/memory_bandwidth.h"
#include "core/thread_pool.h"
#include "models/model.h"

namespace kestrel {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Best of `repeats` timed calls after one warm-up call: on a machine shared with other work the
// fastest run is the closest to the kernel's own speed. The roofline is taken the same way.
template <class Fn>
double BestSeconds(int repeats, Fn&& fn) {
  fn();  // warm-up (page faults, caches)
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Weights {
  std::vector<uint8_t> bytes;
  TensorView view;
};

Weights MakeWeights(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  const int64_t n = rows * cols;
  w.bytes.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kF32) {
      std::memcpy(w.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
    }
  }
  w.view.data = w.bytes.data();
  w.view.dtype = dtype;
  w.view.n_dims = 2;
  w.view.shape[0] = rows;
  w.view.shape[1] = cols;
  return w;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

json StatsJson(const ForwardStats& st, double seconds) {
  return {{"attention_s", st.attention_s},
          {"matmul_s", st.matmul_s},
          {"other_s", st.other_s},
          {"unaccounted_s", seconds - st.attention_s - st.matmul_s - st.other_s},
          {"weight_bytes_read", st.weight_bytes_read},
          {"weight_gb_per_s_in_matmul", st.matmul_s > 0 ? st.weight_bytes_read / st.matmul_s / 1e9 : 0}};
}

// One sequence through Forward: prefill of `prefill` tokens (best of 3), then `decode` tokens one
// per Forward after a context of `depth` tokens. Token ids are arbitrary (speed does not depend
// on them); block table = identity.
int RunModel(const std::string& dir, int n_threads, int64_t prefill, int64_t decode,
             int64_t depth, bool reference, double read_gbs, double fma_gflops) {
  ModelLoadOptions opts;
  opts.kernels = reference ? CpuKernels::kReference : CpuKernels::kAuto;
  opts.n_threads = n_threads;
  opts.kv_cache_tokens = std::max(prefill, depth + decode) + 16;
  Result<std::unique_ptr<Model>> loaded = Model::Load(dir, opts);
  if (!loaded.ok()) {
    std::fprintf(stderr, "bench_cpu_kernels: %s\n", loaded.status().message().c_str());
    return 1;
  }
  Model& model = **loaded;
  const ModelConfig& cfg = model.config();
  std::vector<int32_t> table(static_cast<size_t>(model.n_kv_blocks()));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  std::vector<int32_t> ids, positions, slots;
  // Runs positions [begin, begin + n) of the sequence; logits of the last row.
  auto forward = [&](int64_t begin, int64_t n) {
    ids.resize(static_cast<size_t>(n));
    positions.resize(ids.size());
    slots.resize(ids.size());
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>((begin + i) * 7919 % cfg.vocab_size);
      positions[i] = static_cast<int32_t>(begin + i);
      slots[i] = static_cast<int32_t>(begin + i);  // identity table: slot = position
    }
    const int32_t starts[2] = {0, static_cast<int32_t>(n)};
    const int32_t ctx_len = static_cast<int32_t>(begin + n);
    const int32_t last = static_cast<int32_t>(n - 1);
    Batch b;
    b.token_ids = ids;
    b.positions = positions;
    b.slot_mapping = slots;
    b.seq_starts = starts;
    b.context_lens = std::span<const int32_t>(&ctx_len, 1);
    b.block_tables = table;
    b.max_blocks_per_seq = static_cast<int32_t>(table.size());
    b.logits_indices = std::span<const int32_t>(&last, 1);
    model.Forward(b, logits.data());
  };

  json out;
  out["model"] = dir;
  out["kernels"] = model.kernels_name();
  out["threads"] = n_threads;
  out["weight_bytes"] = model.weight_bytes();
  out["roofline"] = {{"read_gb_per_s", read_gbs}, {"fma_gflop_per_s", fma_gflops}};
  // Multiply-adds per token in the linear layers (LM head counted once per forward).
  const int64_t q_dim = cfg.n_heads * cfg.head_dim, kv_dim = cfg.n_kv_heads * cfg.head_dim;
  const double layer_macs = static_cast<double>(cfg.hidden_size) * (2 * q_dim + 2 * kv_dim) +
                            3.0 * cfg.hidden_size * cfg.intermediate_size;
  if (prefill > 0) {
    forward(0, prefill);  // warm-up: page faults of the weights and scratch
    double best = 1e30;
    ForwardStats best_stats;
    for (int r = 0; r < 3; ++r) {
      model.ResetStats();
      const Clock::time_point t0 = Clock::now();
      forward(0, prefill);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s < best) {
        best = s;
        best_stats = model.stats();
      }
    }
    const double n = static_cast<double>(prefill);
    const double flops = 2.0 * (cfg.n_layers * layer_macs * n +
                                static_cast<double>(cfg.vocab_size) * cfg.hidden_size) +
                         4.0 * cfg.n_layers * q_dim * (n * (n + 1) / 2);
    out["prefill"] = {{"tokens", prefill},
                      {"seconds", best},
                      {"tok_per_s", n / best},
                      {"gflop_per_s", flops / best / 1e9},
                      {"fraction_of_fma_peak", flops / best / 1e9 / fma_gflops},
                      {"stats", StatsJson(best_stats, best)}};
  }
  if (decode > 0) {
    // A first pass over the same positions faults in the KV pages (a server touches each page
    // once in its life), then the timed pass.
    forward(0, std::max<int64_t>(depth, 1));
    for (int64_t i = 0; i < decode; ++i) forward(std::max<int64_t>(depth, 1) + i, 1);
    model.ResetStats();
    const Clock::time_point t0 = Clock::now();
    for (int64_t i = 0; i < decode; ++i) forward(std::max<int64_t>(depth, 1) + i, 1);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const ForwardStats& st = model.stats();
    const double kv_bytes = static_cast<double>(model.kv_bytes_per_token()) *
                            (static_cast<double>(std::max<int64_t>(depth, 1)) + decode / 2.0);
    const double bytes_per_token = static_cast<double>(st.weight_bytes_read) / decode + kv_bytes;
    out["decode"] = {{"depth", depth},
                     {"tokens", decode},
                     {"tok_per_s", decode / s},
                     {"ms_per_token", s / decode * 1e3},
                     {"bytes_per_token", bytes_per_token},
                     {"gb_per_s", bytes_per_token * decode / s / 1e9},
                     {"fraction_of_read_bw", bytes_per_token * decode / s / 1e9 / read_gbs},
                     {"stats", StatsJson(st, s)}};
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

int Main(int argc, char** argv) {
  int n_threads = 0;
  bool quick = false;
  std::string only, model_dir;
  int64_t prefill = 128, decode = 32, depth = 0;
  bool reference = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      n_threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      model_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--prefill") == 0 && i + 1 < argc) {
      prefill = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--decode") == 0 && i + 1 < argc) {
      decode = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--depth") == 0 && i + 1 < argc) {
      depth = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--reference") == 0) {
      reference = true;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_cpu_kernels [--threads N] [--quick] "
                   "[--only matvec|matmul|attention|attention_prefill] | --model DIR "
                   "[--prefill N] [--decode N] [--depth N] [--reference]\n");
      return 2;
    }
  }
  if (!cpu::CpuHasAvx2Fma()) {
    std::fprintf(stderr, "bench_cpu_kernels: this CPU lacks AVX2/FMA/F16C\n");
    return 1;
  }
  ThreadPool pool(n_threads);
  const cpu::OpContext fast{cpu::KernelSet::kAvx2, &pool};
  const int repeats = quick ? 3 : 10;
  std::mt19937 rng(42);

  json out;
  out["threads"] = pool.n_threads();
  double read_gbs = 0, fma_gflops = 0;
  for (int r = 0; r < (quick ? 1 : 3); ++r) {
    read_gbs = std::max(read_gbs, MeasureReadBandwidth(pool, int64_t{1} << 29, 3));
    fma_gflops = std::max(fma_gflops, MeasureFmaPeak(pool, 1));
  }
  if (!model_dir.empty()) {
    return RunModel(model_dir, pool.n_threads(), prefill, decode, depth, reference, read_gbs,
                    fma_gflops);
  }
  out["roofline"] = {{"read_gb_per_s", read_gbs}, {"fma_gflop_per_s", fma_gflops}};

  // Decode: weights streamed from DRAM (sizes above the 32 MB L3 of the machine this was tuned on).
  auto want = [&](const char* section) { return only.empty() || only == section; };
  json matvec = json::array();
  struct MatvecCase {
    DType dtype;
    int64_t rows, cols;
  };
  std::vector<MatvecCase> mv_cases = {{DType::kBF16, 4096, 4096},  {DType::kBF16, 16384, 4096},
                                      {DType::kF16, 16384, 4096},  {DType::kF32, 8192, 4096},
                                      {DType::kBF16, 4096, 14336}, {DType::kBF16, 151936, 1024}};
  if (quick) mv_cases.resize(2);
  if (!want("matvec")) mv_cases.clear();
  for (const MatvecCase& c : mv_cases) {
    Weights w = MakeWeights(c.dtype, c.rows, c.cols, rng);
    for (int64_t m : {int64_t{1}, int64_t{4}}) {
      std::vector<float> x = RandomFloats(m * c.cols, rng);
      std::vector<float> y(static_cast<size_t>(m * c.rows));
      const double s = BestSeconds(repeats, [&] {
        cpu::Linear(fast, x.data(), m, w.view, TensorView{}, y.data());
      });
      const double gbs = static_cast<double>(w.view.size_bytes()) / s / 1e9;
      matvec.push_back({{"dtype", std::string(DTypeName(c.dtype))},
                        {"shape", {c.rows, c.cols}},
                        {"mb", static_cast<double>(w.view.size_bytes()) / 1e6},
                        {"token_rows", m},
                        {"ms", s * 1e3},
                        {"gb_per_s", gbs},
                        {"fraction_of_read_bw", gbs / read_gbs}});
    }
  }
  out["matvec"] = matvec;

  // Prefill: weights reused across many token rows.
  json matmul = json::array();
  Weights w = MakeWeights(DType::kBF16, 4096, 4096, rng);
  std::vector<int64_t> ms = {8, 32, 128, 512};
  if (quick) ms = {128};
  if (!want("matmul")) ms.clear();
  for (int64_t m : ms) {
    std::vector<float> x = RandomFloats(m * 4096, rng);
    std::vector<float> y(static_cast<size_t>(m * 4096));
    const double s = BestSeconds(quick ? 2 : 3, [&] {
      cpu::Linear(fast, x.data(), m, w.view, TensorView{}, y.data());
    });
    const double gflops = 2.0 * m * 4096.0 * 4096.0 / s / 1e9;
    matmul.push_back({{"dtype", "BF16"},
                      {"shape", {4096, 4096}},
                      {"token_rows", m},
                      {"ms", s * 1e3},
                      {"gflop_per_s", gflops},
                      {"fraction_of_fma_peak", gflops / fma_gflops}});
  }
  out["matmul"] = matmul;

  // Decode attention: one token over a 4096-token context, Llama-3-8B head layout, for each KV
  // cache dtype. Enough layers of cache that one pass over them is at least 1 GiB of f32 rows
  // (larger than the L3 of a server part), each layer's blocks in a shuffled order as a pool
  // hands them out; the time is one layer's, the best of `repeats` passes over all layers.
  if (want("attention")) {
    cpu::AttentionShape shape;
    shape.n_heads = 32;
    shape.n_kv_heads = 8;
    shape.head_dim = 128;
    shape.scale = 1.0f / std::sqrt(128.0f);
    shape.block_size_tokens = 16;
    const int32_t ctx = 4096;
    shape.n_blocks = ctx / shape.block_size_tokens;
    const int64_t kv_dim = shape.n_kv_heads * shape.head_dim;
    const int64_t layer_values = int64_t{ctx} * kv_dim;
    const int64_t n_layers =
        quick ? 8 : ((int64_t{1} << 30) + 8 * layer_values - 1) / (8 * layer_values);
    std::vector<float> q = RandomFloats(shape.n_heads * shape.head_dim, rng);
    std::vector<float> o(q.size());
    std::vector<int32_t> table(ctx / 16);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), rng);
    const std::vector<int32_t> positions = {ctx - 1}, starts = {0, 1};
    cpu::AttentionBatch batch{positions, starts, table, static_cast<int32_t>(table.size())};
    std::vector<float> scratch(
        static_cast<size_t>(cpu::AttentionScratchFloats(fast, shape, ctx)));
    const std::vector<float> values = RandomFloats(layer_values, rng);
    json attention = json::array();
    for (const char* dtype : {"f32", "bf16", "int8"}) {
      const std::string d = dtype;
      const int64_t row_bytes = d == "f32" ? 4 * 128 : d == "bf16" ? 2 * 128 : 128 + 4;
      // [layer][k|v] caches: the same rows in every layer (their bytes are what is timed).
      std::vector<float> f32(d == "f32" ? 2 * n_layers * layer_values : 0);
      std::vector<uint16_t> bf16(d == "bf16" ? 2 * n_layers * layer_values : 0);
      std::vector<int8_t> codes(d == "int8" ? 2 * n_layers * layer_values : 0);
      std::vector<float> scales(d == "int8" ? 2 * n_layers * layer_values / 128 : 0);
      for (int64_t i = 0; i < 2 * n_layers * layer_values; ++i) {
        const float v = values[static_cast<size_t>(i % layer_values)];
        if (!f32.empty()) f32[i] = v;
        if (!bf16.empty()) bf16[i] = F32ToBf16(v);
        if (!codes.empty()) codes[i] = static_cast<int8_t>(std::clamp(v * 32.0f, -127.0f, 127.0f));
      }
      std::fill(scales.begin(), scales.end(), 1.0f / 32);
      auto rows = [&](int64_t c) {
        cpu::KvRows r;
        if (d == "f32") r.f32 = f32.data() + c * layer_values;
        if (d == "bf16") r.bf16 = bf16.data() + c * layer_values;
        if (d == "int8") {
          r.q = codes.data() + c * layer_values;
          r.scale = scales.data() + c * layer_values / 128;
        }
        return r;
      };
      const double s =
          BestSeconds(repeats,
                      [&] {
                        for (int64_t l = 0; l < n_layers; ++l) {
                          cpu::PagedAttention(fast, shape, batch, q.data(), rows(2 * l),
                                              rows(2 * l + 1), o.data(), scratch);
                        }
                      }) /
          static_cast<double>(n_layers);
      const double bytes = 2.0 * ctx * shape.n_kv_heads * static_cast<double>(row_bytes);
      attention.push_back({{"kv_dtype", d},
                           {"context", ctx},
                           {"layers_rotated", n_layers},
                           {"ms_per_layer", s * 1e3},
                           {"kv_gb_per_s", bytes / s / 1e9},
                           {"fraction_of_read_bw", bytes / s / 1e9 / read_gbs}});
    }
    out["attention_decode"] = attention;
  }
  // Prefill attention: one sequence's 2,048-token chunk over itself (causal), Qwen3-0.6B's head
  // layout (16 query / 8 KV heads of 128), per KV cache dtype: GFLOP/s of its products.
  if (want("attention") || want("attention_prefill")) {
    cpu::AttentionShape ps;
    ps.n_heads = 16;
    ps.n_kv_heads = 8;
    ps.head_dim = 128;
    ps.scale = 1.0f / std::sqrt(128.0f);
    ps.block_size_tokens = 16;
    const int64_t kv_dim = ps.n_kv_heads * ps.head_dim;
    const int32_t n = 2048;
    ps.n_blocks = n / ps.block_size_tokens;
    std::vector<float> pk = RandomFloats(int64_t{n} * kv_dim, rng);
    std::vector<float> pv = RandomFloats(int64_t{n} * kv_dim, rng);
    std::vector<float> pq = RandomFloats(int64_t{n} * ps.n_heads * ps.head_dim, rng);
    std::vector<float> po(pq.size());
    std::vector<int32_t> ptable(static_cast<size_t>(ps.n_blocks));
    for (size_t i = 0; i < ptable.size(); ++i) ptable[i] = static_cast<int32_t>(i);
    std::vector<int32_t> ppos(n);
    for (int32_t i = 0; i < n; ++i) ppos[i] = i;
    const std::vector<int32_t> pstarts = {0, n};
    cpu::AttentionBatch pbatch{ppos, pstarts, ptable, static_cast<int32_t>(ptable.size())};
    std::vector<float> pscratch(static_cast<size_t>(cpu::AttentionScratchFloats(fast, ps, n)));
    // The same pool as bf16 values and as int8 codes with a scale per row (WriteKv's).
    const cpu::KvLayout layout = ps.layout();
    std::vector<int32_t> slots(n);
    for (int32_t i = 0; i < n; ++i) slots[i] = i;
    std::vector<uint16_t> kb(pk.size()), vb(pv.size());
    std::vector<int8_t> kq(pk.size()), vq(pv.size());
    std::vector<float> ks(pk.size() / ps.head_dim), vs(pv.size() / ps.head_dim);
    cpu::WriteKv(pk.data(), pv.data(), slots, layout,
                 cpu::KvRowsOut{nullptr, nullptr, nullptr, kb.data()},
                 cpu::KvRowsOut{nullptr, nullptr, nullptr, vb.data()});
    cpu::WriteKv(pk.data(), pv.data(), slots, layout, cpu::KvRowsOut{nullptr, kq.data(), ks.data()},
                 cpu::KvRowsOut{nullptr, vq.data(), vs.data()});
    std::vector<float> kf(pk.size()), vf(pv.size());  // and as f32 rows
    cpu::WriteKv(pk.data(), pv.data(), slots, layout, cpu::KvRowsOut{kf.data()},
                 cpu::KvRowsOut{vf.data()});
    // q.k and p.v: 2 * 2 flops per (query head, key at or before the query, dim).
    const double flops = 4.0 * ps.n_heads * ps.head_dim * (double{n} * (n + 1) / 2);
    json prefill = json::array();
    for (const char* dtype : {"f32", "bf16", "int8"}) {
      const std::string d = dtype;
      cpu::KvRows k, v;
      if (d == "f32") k.f32 = kf.data(), v.f32 = vf.data();
      if (d == "bf16") k.bf16 = kb.data(), v.bf16 = vb.data();
      if (d == "int8") k.q = kq.data(), k.scale = ks.data(), v.q = vq.data(), v.scale = vs.data();
      const double sec = BestSeconds(quick ? 1 : 3, [&] {
        cpu::PagedAttention(fast, ps, pbatch, pq.data(), k, v, po.data(), pscratch);
      });
      prefill.push_back({{"kv_dtype", d},
                         {"tokens", n},
                         {"ms", sec * 1e3},
                         {"gflop_per_s", flops / sec / 1e9},
                         {"fraction_of_fma_peak", flops / sec / 1e9 / fma_gflops}});
    }
    out["attention_prefill"] = prefill;
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace kestrel

int main(int argc, char** argv) { return kestrel::Main(argc, argv); }
