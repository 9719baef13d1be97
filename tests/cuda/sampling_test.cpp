// GPU sampling (backends/cuda/sampling.h) against the CPU Sampler: for the same logits, params
// and sampler state, the GPU must choose exactly the CPU's token at every step, and report the
// same top-logprob ids with log-probabilities within 1e-5.
//
// Each sequence has two CPU Samplers with the same seed and history: `cpu` runs Sample (the
// reference); `twin` supplies the GPU row (NextR53, penalty state) and Accepts the GPU's token, so
// both stay in step as long as the tokens agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/sampling.h"
#include "cuda/cuda_test_util.h"
#include "models/gpu_sampling_rows.h"
#include "sampling/sampler.h"

namespace kestrel::cuda {
namespace {

using testing::Download;
using testing::Poisoned;
using testing::Upload;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kTop = kGpuMaxTopLogprobs;

// Host side of one GpuSample call, filled by AppendGpuSamplingRow: the mapping from a Sampler's
// state to a GPU row that the engine uses too.
using HostBatch = GpuSamplingHostBatch;

struct GpuResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprob;
  std::vector<int32_t> top_ids;  // [n_rows, kTop]
  std::vector<float> top_logprobs;
};

// Uploads the batch (logits: [n_rows, vocab]), runs GpuSample, downloads the outputs. *ms gets
// the kernel time.
GpuResult RunGpu(const HostBatch& hb, const std::vector<float>& logits, int32_t vocab,
                 float* ms = nullptr) {
  const int32_t n_rows = static_cast<int32_t>(hb.rows.size());
  // Empty arrays still get a device buffer (one element), so no pointer is null.
  auto upload = [](auto v) {
    if (v.empty()) v.resize(1);
    return Upload(v);
  };
  DeviceBuffer d_logits = Upload(logits);
  DeviceBuffer d_rows = Upload(hb.rows);
  DeviceBuffer d_rep = upload(hb.repetition_ids);
  DeviceBuffer d_cids = upload(hb.count_ids);
  DeviceBuffer d_cvals = upload(hb.count_values);
  DeviceBuffer d_bids = upload(hb.bias_ids);
  DeviceBuffer d_bvals = upload(hb.bias_values);
  DeviceBuffer d_tokens = Poisoned<int32_t>(static_cast<size_t>(n_rows));
  DeviceBuffer d_lp = Poisoned<float>(static_cast<size_t>(n_rows));
  DeviceBuffer d_top_ids = Poisoned<int32_t>(static_cast<size_t>(n_rows) * kTop);
  DeviceBuffer d_top_lp = Poisoned<float>(static_cast<size_t>(n_rows) * kTop);
  const size_t ws_bytes = GpuSamplingWorkspaceBytes(n_rows, vocab);
  auto ws = DeviceBuffer::Allocate(ws_bytes, "sampling workspace");
  KCHECK(ws.ok());
  DeviceBuffer d_ws = std::move(ws).value();

  GpuSamplingBatch b{};
  b.logits = d_logits.as<float>();
  b.n_rows = n_rows;
  b.vocab = vocab;
  b.rows = d_rows.as<GpuSamplingRow>();
  b.repetition_ids = d_rep.as<int32_t>();
  b.count_ids = d_cids.as<int32_t>();
  b.count_values = d_cvals.as<int32_t>();
  b.bias_ids = d_bids.as<int32_t>();
  b.bias_values = d_bvals.as<float>();
  b.out_tokens = d_tokens.as<int32_t>();
  b.out_logprob = d_lp.as<float>();
  b.out_top_ids = d_top_ids.as<int32_t>();
  b.out_top_logprobs = d_top_lp.as<float>();
  // As the model sets it: the many-blocks argmax when every row is plain greedy.
  b.greedy_only = std::all_of(hb.rows.begin(), hb.rows.end(), IsPlainGreedy);

  cudaEvent_t start, stop;
  KCUDA_CHECK(cudaEventCreate(&start));
  KCUDA_CHECK(cudaEventCreate(&stop));
  KCUDA_CHECK(cudaEventRecord(start, nullptr));
  GpuSample(b, d_ws.get(), d_ws.size_bytes(), nullptr);
  KCUDA_CHECK(cudaEventRecord(stop, nullptr));
  KCUDA_CHECK(cudaEventSynchronize(stop));
  if (ms != nullptr) KCUDA_CHECK(cudaEventElapsedTime(ms, start, stop));
  KCUDA_CHECK(cudaEventDestroy(start));
  KCUDA_CHECK(cudaEventDestroy(stop));

  GpuResult r;
  r.tokens = Download<int32_t>(d_tokens, static_cast<size_t>(n_rows));
  r.logprob = Download<float>(d_lp, static_cast<size_t>(n_rows));
  r.top_ids = Download<int32_t>(d_top_ids, static_cast<size_t>(n_rows) * kTop);
  r.top_logprobs = Download<float>(d_top_lp, static_cast<size_t>(n_rows) * kTop);
  return r;
}

// Within 1e-5, or (where one float ulp is already more than that, |lp| >= 64) adjacent floats:
// the log-sum is a double summed in another order, which can move the final rounding by one ulp.
bool LogprobClose(float gpu, float cpu) {
  if (gpu == cpu) return true;  // includes both -inf
  if (!std::isfinite(gpu) || !std::isfinite(cpu)) return false;
  if (std::fabs(static_cast<double>(gpu) - cpu) <= 1e-5) return true;
  const int64_t ulps = std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(gpu)) -
                                static_cast<int64_t>(std::bit_cast<int32_t>(cpu)));
  return std::fabs(cpu) >= 64.0f && ulps <= 1;
}

std::string Describe(const SamplingParams& p) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "T=%g top_k=%d top_p=%g min_p=%g rep=%g pres=%g freq=%g n_bias=%zu logprobs=%d "
                "n_top=%d mode=%s seed=%llu",
                p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
                p.frequency_penalty, p.logit_bias.size(), p.logprobs ? 1 : 0, p.n_top_logprobs,
                p.logprob_mode == LogprobMode::kRaw ? "raw" : "processed",
                static_cast<unsigned long long>(p.seed));
  return buf;
}

// One sequence under test.
struct Sequence {
  SamplingParams params;
  std::unique_ptr<Sampler> cpu, twin;

  Sequence(const SamplingParams& p, int32_t vocab, const std::vector<int32_t>& prompt,
           const std::vector<int32_t>& history)
      : params(p),
        cpu(std::make_unique<Sampler>(p, vocab)),
        twin(std::make_unique<Sampler>(p, vocab)) {
    for (Sampler* s : {cpu.get(), twin.get()}) {
      s->AddPromptTokens(prompt);
      for (int32_t t : history) s->Accept(t);
    }
  }
};

// Logits for each step: rows of a fixed pool (several scales, ties, -inf, NaN, +inf), rotated by a
// random offset, scaled, and with a few random edits, so every step differs at little cost.
class LogitSource {
 public:
  LogitSource(int32_t vocab, uint64_t seed) : vocab_(vocab), rng_(seed) {
    const size_t v = static_cast<size_t>(vocab);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float scales[] = {0.02f, 0.3f, 1.0f, 2.0f, 3.0f, 5.0f, 8.0f, 15.0f};
    for (float scale : scales) {
      std::vector<float> row(v);
      for (float& x : row) x = normal(rng_) * scale;
      pool_.push_back(row);
      // The same with ties (values on a grid) and some banned tokens.
      for (float& x : row) {
        x = std::round(x * 4.0f / scale) * scale / 4.0f;
        if (rng_() % 20 == 0) x = -kInf;
      }
      pool_.push_back(row);
    }
    // Peaked: one dominant token (greedy-like distributions).
    std::vector<float> peaked(v);
    for (float& x : peaked) x = normal(rng_);
    peaked[rng_() % v] = 40.0f;
    pool_.push_back(peaked);
    // Mostly banned.
    std::vector<float> banned(v, -kInf);
    for (int i = 0; i < 5; ++i) banned[rng_() % v] = normal(rng_);
    pool_.push_back(banned);
  }

  void Fill(float* out /*[vocab]*/) {
    const size_t v = static_cast<size_t>(vocab_);
    const uint64_t pick = rng_() % 64;
    if (pick == 0) {  // everything NaN or -inf: token 0
      for (size_t i = 0; i < v; ++i) out[i] = rng_() % 2 ? kNaN : -kInf;
      return;
    }
    const std::vector<float>& base = pool_[rng_() % pool_.size()];
    const size_t offset = rng_() % v;
    const float mults[] = {1.0f, 1.0f, 0.5f, 1.7f, -1.0f};
    const float mult = mults[rng_() % 5];
    for (size_t i = 0; i < v - offset; ++i) out[i] = base[i + offset] * mult;
    for (size_t i = v - offset; i < v; ++i) out[i] = base[i + offset - v] * mult;
    const int n_edits = static_cast<int>(rng_() % 4);
    for (int e = 0; e < n_edits; ++e) {
      const size_t i = rng_() % v;
      switch (rng_() % 6) {
        case 0:
          out[i] = kNaN;
          break;
        case 1:
          out[i] = kInf;
          break;
        case 2:
          out[i] = -kInf;
          break;
        case 3:
          out[i] = -0.0f;
          break;
        default: {  // a tie for the maximum
          const float m = *std::max_element(out, out + v, [](float a, float b) {
            return std::isnan(b) ? false : std::isnan(a) || a < b;
          });
          out[i] = m;
          break;
        }
      }
    }
  }

 private:
  int32_t vocab_;
  std::mt19937_64 rng_;
  std::vector<std::vector<float>> pool_;
};

SamplingParams RandomParams(std::mt19937_64& rng, int32_t vocab) {
  auto pick = [&rng](std::initializer_list<float> v) { return v.begin()[rng() % v.size()]; };
  SamplingParams p;
  p.temperature = pick({0.0f, 0.3f, 0.7f, 1.0f, 1.5f});
  p.top_k = static_cast<int32_t>(pick({0, 0, 1, 20, 5000}));
  p.top_p = pick({1.0f, 1.0f, 0.9f, 0.5f});
  p.min_p = pick({0.0f, 0.0f, 0.05f});
  p.repetition_penalty = pick({1.0f, 1.0f, 1.3f, 0.8f});
  p.presence_penalty = pick({0.0f, 0.0f, -1.0f, 0.5f, 2.0f});
  p.frequency_penalty = pick({0.0f, 0.0f, -1.0f, 0.3f, 2.0f});
  if (rng() % 2) {
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      int32_t id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      if (i > 0 && rng() % 3 == 0) id = p.logit_bias[rng() % p.logit_bias.size()].first;
      float bias = std::uniform_real_distribution<float>(-5.0f, 5.0f)(rng);
      if (rng() % 6 == 0) bias = -kInf;
      if (rng() % 20 == 0) bias = 3e38f;  // overflows to +inf: sanitised to the largest float
      p.logit_bias.emplace_back(id, bias);
    }
  }
  p.seed = rng();
  if (rng() % 2) {
    p.logprobs = true;
    p.n_top_logprobs = static_cast<int32_t>(pick({0, 5, 20}));
    p.logprob_mode = rng() % 2 ? LogprobMode::kRaw : LogprobMode::kProcessed;
  }
  return p;
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int32_t vocab, size_t max_n) {
  std::vector<int32_t> t(rng() % (max_n + 1));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// f(0), ..., f(n - 1) on all cores (the CPU samplers' scratch is thread-local).
void ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  const size_t n_threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < n_threads; ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) f(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Runs n_steps steps of every sequence, one GpuSample call per step, comparing with the CPU.
// Returns the number of mismatches (the first few are reported in detail).
int RunAgainstCpu(int32_t vocab, std::vector<Sequence>& seqs, int n_steps, LogitSource& source) {
  const size_t v = static_cast<size_t>(vocab);
  const size_t n_rows = seqs.size();
  int n_bad = 0;
  auto report = [&n_bad](const std::string& what) {
    if (++n_bad <= 20) ADD_FAILURE() << what;
  };
  std::vector<float> logits(n_rows * v);
  for (int step = 0; step < n_steps; ++step) {
    HostBatch hb;
    std::vector<SampleResult> ref(n_rows);
    for (size_t r = 0; r < n_rows; ++r) {
      source.Fill(logits.data() + r * v);
      AppendGpuSamplingRow(*seqs[r].twin, &hb);
    }
    ParallelFor(n_rows, [&](size_t r) {
      std::vector<float> z(logits.begin() + r * v, logits.begin() + (r + 1) * v);
      ref[r] = seqs[r].cpu->Sample(z);
    });
    const GpuResult g = RunGpu(hb, logits, vocab);
    for (size_t r = 0; r < n_rows; ++r) {
      const SamplingParams& p = seqs[r].params;
      const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                                " step " + std::to_string(step) + " (" + Describe(p) + "): ";
      const int32_t token = g.tokens[r];
      if (token != ref[r].token) {
        report(where + "token " + std::to_string(token) + ", CPU " + std::to_string(ref[r].token));
      }
      // Keep the twin in step with the CPU even after a mismatch (one report per fault).
      seqs[r].twin->Accept(token == ref[r].token ? token : ref[r].token);
      const int32_t n_top = p.logprobs ? std::min(p.n_top_logprobs, vocab) : 0;
      if (p.logprobs && !LogprobClose(g.logprob[r], ref[r].logprob)) {
        report(where + "logprob " + std::to_string(g.logprob[r]) + ", CPU " +
               std::to_string(ref[r].logprob));
      }
      if (!p.logprobs && g.logprob[r] != 0.0f) report(where + "logprob written without logprobs");
      if (static_cast<int32_t>(ref[r].top.size()) != n_top) {
        report(where + "CPU top list has " + std::to_string(ref[r].top.size()) + " entries");
        continue;
      }
      for (int j = 0; j < kTop; ++j) {
        const int32_t id = g.top_ids[r * kTop + j];
        const float lp = g.top_logprobs[r * kTop + j];
        if (j >= n_top) {
          if (id != -1 || lp != 0.0f) report(where + "top entry " + std::to_string(j) + " set");
          continue;
        }
        if (id != ref[r].top[j].token) {
          report(where + "top " + std::to_string(j) + " id " + std::to_string(id) + ", CPU " +
                 std::to_string(ref[r].top[j].token));
        } else if (!LogprobClose(lp, ref[r].top[j].logprob)) {
          report(where + "top " + std::to_string(j) + " logprob " + std::to_string(lp) + ", CPU " +
                 std::to_string(ref[r].top[j].logprob));
        }
      }
    }
  }
  return n_bad;
}

std::vector<Sequence> RandomSequences(int32_t vocab, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < n; ++i) {
    const SamplingParams p = RandomParams(rng, vocab);
    KCHECK(ValidateSamplingParams(p, vocab).ok());
    seqs.emplace_back(p, vocab, RandomTokens(rng, vocab, 300), RandomTokens(rng, vocab, 40));
  }
  return seqs;
}

// The weight bands of the CPU's top-p are std::exp of -4, -12, -24 (a host check: no GPU needed).
TEST(GpuSamplingTest, BandCutsMatchCpu) {
  const float cuts[] = {std::exp(-4.0f), std::exp(-12.0f), std::exp(-24.0f)};
  for (int j = 0; j < 3; ++j) EXPECT_EQ(std::bit_cast<uint32_t>(cuts[j]), kTopPBandCutBits[j]);
}

// 64 sequences with random parameters in each GpuSample call, 200 steps, three vocabulary sizes.
TEST(GpuSamplingTest, MatchesCpuSamplerOnRandomRows) {
  KESTREL_REQUIRE_CUDA();
  for (int32_t vocab : {100, 8003, 151936}) {
    std::vector<Sequence> seqs = RandomSequences(vocab, 64, 1000 + static_cast<uint64_t>(vocab));
    LogitSource source(vocab, 7 + static_cast<uint64_t>(vocab));
    EXPECT_EQ(RunAgainstCpu(vocab, seqs, 200, source), 0) << "vocab " << vocab;
  }
}

// Batches where every row is plain greedy take GreedyPartialKernel + GreedyFinishKernel (several
// blocks per row): the same token as the CPU (first maximum after sanitising NaN and +inf, token
// 0 when the row is all NaN / -inf), no log-probabilities written. One row with a penalty that
// applies sends the batch down the general path (checked too).
TEST(GpuSamplingTest, GreedyOnlyBatchesMatchCpu) {
  KESTREL_REQUIRE_CUDA();
  for (int32_t vocab : {100, 8003, 151936}) {
    for (bool mixed : {false, true}) {
      std::mt19937_64 rng(5 + static_cast<uint64_t>(vocab));
      std::vector<Sequence> seqs;
      for (int i = 0; i < 64; ++i) {
        SamplingParams p;
        p.temperature = 0.0f;
        p.seed = rng();
        if (mixed && i == 17) p.repetition_penalty = 1.3f;
        KCHECK(ValidateSamplingParams(p, vocab).ok());
        seqs.emplace_back(p, vocab, RandomTokens(rng, vocab, 50), RandomTokens(rng, vocab, 5));
      }
      HostBatch probe;
      for (Sequence& s : seqs) {
        Sampler copy(s.params, vocab);
        copy.AddPromptTokens(std::vector<int32_t>{1, 2});
        AppendGpuSamplingRow(copy, &probe);
      }
      ASSERT_EQ(std::all_of(probe.rows.begin(), probe.rows.end(), IsPlainGreedy), !mixed);
      LogitSource source(vocab, 21 + static_cast<uint64_t>(vocab));
      EXPECT_EQ(RunAgainstCpu(vocab, seqs, 30, source), 0)
          << "vocab " << vocab << (mixed ? " mixed" : " plain");
    }
  }
}

// Hand-picked parameter sets: each path of the sampler, and the numeric edge cases.
TEST(GpuSamplingTest, MatchesCpuSamplerOnEdgeCases) {
  KESTREL_REQUIRE_CUDA();
  for (int32_t vocab : {100, 151936}) {
    std::vector<SamplingParams> ps;
    auto add = [&ps](auto mutate) {
      SamplingParams p;
      p.seed = 11 + ps.size();
      p.logprobs = true;
      p.n_top_logprobs = 20;
      mutate(p);
      ps.push_back(p);
    };
    add([](SamplingParams& p) { p.temperature = 0.0f; });
    add([](SamplingParams& p) { p.temperature = 1.0f; });  // the API default
    add([](SamplingParams& p) { p.top_k = 1; });           // == greedy
    add([](SamplingParams& p) { p.top_k = 50, p.top_p = 0.9f; });
    add([](SamplingParams& p) { p.top_k = 50, p.top_p = 0.9f, p.min_p = 0.1f; });
    add([](SamplingParams& p) { p.top_p = 0.95f; });
    add([](SamplingParams& p) { p.top_p = 1e-30f; });  // the top token only
    add([](SamplingParams& p) { p.top_p = 0.999999f, p.temperature = 3.0f; });
    add([](SamplingParams& p) { p.min_p = 0.2f; });
    add([](SamplingParams& p) { p.min_p = 1.0f; });  // top token and ties
    add([](SamplingParams& p) { p.min_p = 1e-20f, p.temperature = 0.2f; });
    add([](SamplingParams& p) { p.temperature = 1e-45f; });  // 1/T = inf: greedy
    add([](SamplingParams& p) { p.temperature = 1e-30f; });  // huge 1/T
    add([](SamplingParams& p) { p.temperature = 3e38f; });   // tiny 1/T: flat
    add([](SamplingParams& p) { p.top_k = 5000, p.top_p = 0.5f, p.temperature = 2.0f; });
    add([](SamplingParams& p) { p.repetition_penalty = 0.01f, p.top_p = 0.8f; });  // overflow
    add([](SamplingParams& p) {
      p.logit_bias = {{3, 3e38f}, {3, 3e38f}, {3, -kInf}, {7, -kInf}, {9, 2.5f}, {9, -1.0f}};
      p.logprob_mode = LogprobMode::kProcessed;
    });
    add([](SamplingParams& p) {
      p.frequency_penalty = 2.0f, p.presence_penalty = -2.0f, p.repetition_penalty = 1.3f;
      p.logprob_mode = LogprobMode::kProcessed;
    });
    add([](SamplingParams& p) {
      p.frequency_penalty = -2.0f, p.presence_penalty = 2.0f, p.top_k = 20, p.top_p = 0.7f;
    });
    add([](SamplingParams& p) { p.logprobs = false, p.n_top_logprobs = 0, p.top_p = 0.5f; });
    std::mt19937_64 rng(99);
    std::vector<Sequence> seqs;
    for (const SamplingParams& p : ps) {
      KCHECK(ValidateSamplingParams(p, vocab).ok());
      seqs.emplace_back(p, vocab, RandomTokens(rng, vocab, 200), RandomTokens(rng, vocab, 30));
    }
    LogitSource source(vocab, 5);
    EXPECT_EQ(RunAgainstCpu(vocab, seqs, 60, source), 0) << "vocab " << vocab;
  }
}

// The cost of one call for 64 rows of Qwen3's vocabulary, per parameter set (printed, not
// checked): the lead's budget is about 100 us for a 152k row.
TEST(GpuSamplingTest, Timing) {
  KESTREL_REQUIRE_CUDA();
  constexpr int32_t kVocab = 151936;
  constexpr size_t kRows = 64;
  struct Config {
    const char* name;
    void (*mutate)(SamplingParams&);
  };
  const Config configs[] = {
      {"greedy", [](SamplingParams& p) { p.temperature = 0.0f; }},
      {"T=1", [](SamplingParams&) {}},
      {"T=0.7 top_k=50 top_p=0.9",
       [](SamplingParams& p) { p.temperature = 0.7f, p.top_k = 50, p.top_p = 0.9f; }},
      {"T=1 top_p=0.9", [](SamplingParams& p) { p.top_p = 0.9f; }},
      {"T=1 min_p=0.05", [](SamplingParams& p) { p.min_p = 0.05f; }},
      {"T=1 logprobs n_top=20",
       [](SamplingParams& p) { p.logprobs = true, p.n_top_logprobs = 20; }},
  };
  LogitSource source(kVocab, 3);
  std::vector<float> logits(kRows * kVocab);
  for (size_t r = 0; r < kRows; ++r) source.Fill(logits.data() + r * kVocab);
  for (const Config& c : configs) {
    SamplingParams p;
    c.mutate(p);
    HostBatch hb;
    std::vector<std::unique_ptr<Sampler>> samplers;
    for (size_t r = 0; r < kRows; ++r) {
      samplers.push_back(std::make_unique<Sampler>(p, kVocab));
      AppendGpuSamplingRow(*samplers.back(), &hb);
    }
    float best_ms = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
      float ms = 0.0f;
      RunGpu(hb, logits, kVocab, &ms);
      best_ms = std::min(best_ms, ms);
    }
    std::printf("[ timing ] GpuSample %zu rows x %d: %-26s %8.1f us per call\n", kRows, kVocab,
                c.name, best_ms * 1000.0f);
  }
}

}  // namespace
}  // namespace kestrel::cuda
