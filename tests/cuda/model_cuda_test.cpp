// The whole dense decoder on CUDA against the transformers fixtures (tests/data/models) and the
// kestrel-tiny goldens, plus batch and graph consistency of decode steps.
//
// Tolerance. The CUDA path rounds every GEMM input (normed activations, attention output,
// SiLU*up) and the KV cache to bf16 (8 significant bits, relative rounding error <= 2^-9), where
// the reference runs the same bf16 weights in f32 throughout. Each rounding perturbs a logit by
// about 2^-9 x (the logit's scale) at random sign; through 2 to 8 layers of these tiny models
// that stays within a few 1e-3 of the row's range. We accept max|delta| <= 2e-2 x range (about
// ten times the typical error, still far below the 1e-1 x range that a wrong kernel — a missing
// bias, a wrong RoPE pair, an off-by-one in the causal mask — produces), and require the argmax
// wherever the reference's top-2 margin exceeds twice that tolerance. Greedy continuations must
// be identical until the first step whose reference margin is below kMarginFloor, where a bf16
// engine may legitimately take the other token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/pdl.cuh"
#include "cuda/cuda_test_util.h"
#include "core/dtype.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "tiny_model.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kRangeTolerance = 2e-2;
// CUDA against the CPU run with the same bf16 roundings (ModelLoadOptions::bf16_activations):
// what is left is the order of f32 sums and ties at bf16 rounding boundaries.
constexpr double kEmulatedTolerance = 1e-2;
constexpr double kMoeTieShare = 0.05;
constexpr double kMoeTieTolerance = 0.1;
constexpr double kMarginFloor = 0.1;

std::unique_ptr<Model> LoadCuda(const std::string& dir, int64_t kv_tokens) {
  ModelLoadOptions opts;
  opts.device = Device::kCuda;
  opts.kv_cache_tokens = kv_tokens;
  Result<std::unique_ptr<Model>> m = Model::Load(dir, opts);
  KCHECK_MSG(m.ok(), m.status().message().c_str());
  return std::move(m).value();
}

TEST(CudaModel, FixturesMatchTransformers) {
  KESTREL_REQUIRE_CUDA();
  const fs::path root = fs::path(KESTREL_SOURCE_DIR) / "tests" / "data" / "models";
  int n_fixtures = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!fs::exists(entry.path() / "reference.json")) continue;
    const std::string dir = entry.path().string();
    SCOPED_TRACE(dir);
    Result<ModelConfig> config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().message();
    ++n_fixtures;
    std::ifstream ref_file(dir + "/reference.json");
    const json ref = json::parse(ref_file);
    const auto prompts = ref.at("prompts").get<std::vector<std::vector<int32_t>>>();
    const auto greedy = ref.at("greedy").get<std::vector<std::vector<int32_t>>>();
    std::ifstream bin(dir + "/logits.bin", std::ios::binary);
    ASSERT_TRUE(bin.good());
    bin.seekg(0, std::ios::end);
    const auto n_bytes = static_cast<size_t>(bin.tellg());
    bin.seekg(0);
    std::vector<float> golden(n_bytes / sizeof(float));
    bin.read(reinterpret_cast<char*>(golden.data()), static_cast<std::streamsize>(n_bytes));

    // The hybrid fixtures (random Gated DeltaNet layers, randomised norms) amplify the bf16
    // rounding of GEMM inputs: the CPU path with its GEMM inputs rounded to bf16 lands at
    // 0.049 of the range on them (measured), the dense fixtures at 0.004-0.006.
    //
    // MoE fixtures: the tiny random routers have nearly tied experts everywhere, and a bf16
    // rounding of the router's input picks the other expert of a near-tie. Measured on the CPU
    // with ModelLoadOptions::bf16_activations (the CUDA path's roundings, nothing else): 0.54 of
    // the range on qwen3_5_moe, 0.23 on qwen3_next, 0.056 on qwen3_moe, against 1e-5 in f32.
    // So against transformers these fixtures are reported, not asserted position by position;
    // the assertion for every fixture is against that CPU run with the same roundings
    // (kEmulatedTolerance), where a kernel bug shows: the dense and hybrid fixtures agree with it
    // to 0.0084 of the range at every position (measured). MoE fixtures still meet an occasional
    // router near-tie that the remaining f32-order differences tip (measured on the H200: 1, 5
    // and 8 of 331 positions beyond kEmulatedTolerance on qwen3_5_moe, qwen3_next, qwen3_moe, the
    // worst at 0.045); they may have up to kMoeTieShare of their positions beyond it, none beyond
    // kMoeTieTolerance, where a wrong expert weight or combine would move every position.
    const bool moe = config->has_moe();
    const double tolerance =
        config->n_layers_of(LayerType::kLinearAttention) > 0 || moe ? 6e-2 : kRangeTolerance;
    std::unique_ptr<Model> model = LoadCuda(dir, 512);
    ModelLoadOptions cpu_opts;
    cpu_opts.kv_cache_tokens = 512;
    cpu_opts.bf16_activations = true;
    Result<std::unique_ptr<Model>> emulated = Model::Load(dir, cpu_opts);
    ASSERT_TRUE(emulated.ok()) << emulated.status().message();
    const int64_t vocab = model->config().vocab_size;
    size_t offset = 0;
    double worst = 0, worst_emulated = 0;
    int n_exact = 0, n_near_ties = 0, n_outside = 0, n_positions = 0, n_ties = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE("prompt " + std::to_string(i));
      testing::SeqRunner runner(model.get(), testing::ReversedBlocks(*model));
      const int seq = runner.AddSequence(prompts[i]);
      const auto out = runner.Step({{seq, static_cast<int64_t>(prompts[i].size())}});
      testing::SeqRunner cpu_runner(emulated->get(), testing::ReversedBlocks(**emulated));
      const int cpu_seq = cpu_runner.AddSequence(prompts[i]);
      const auto cpu_out = cpu_runner.Step({{cpu_seq, static_cast<int64_t>(prompts[i].size())}});
      for (size_t p = 0; p < prompts[i].size(); ++p) {
        const std::vector<float> want(golden.begin() + offset + p * vocab,
                                      golden.begin() + offset + (p + 1) * vocab);
        const double range = testing::Range(want);
        const double diff = testing::MaxAbsDiff(out[0][p], want);
        worst = std::max(worst, diff / range);
        ++n_positions;
        if (diff > tolerance * range) ++n_outside;
        const double emulated_range = testing::Range(cpu_out[0][p]);
        const double emulated_diff = testing::MaxAbsDiff(out[0][p], cpu_out[0][p]);
        worst_emulated = std::max(worst_emulated, emulated_diff / emulated_range);
        if (emulated_diff > kEmulatedTolerance * emulated_range) ++n_ties;
        EXPECT_LE(emulated_diff, (moe ? kMoeTieTolerance : kEmulatedTolerance) * emulated_range)
            << "position " << p << " against the CPU with bf16 roundings";
        if (moe) continue;
        EXPECT_LE(diff, tolerance * range) << "position " << p;
        if (testing::TopMargin(want) > 2 * tolerance * range) {
          EXPECT_EQ(testing::Argmax(out[0][p]), testing::Argmax(want)) << "position " << p;
        }
      }
      offset += prompts[i].size() * vocab;
      // The reference's greedy continuation, fed back one token per step through the paged
      // cache (decode graphs): at every step our argmax must be the reference token, or the
      // reference token must be within the tolerance of our best logit (a near-tie that the
      // bf16 rounding may break either way; counted and printed).
      std::vector<float> last = out[0].back();
      for (size_t step = 0; step < greedy[i].size(); ++step) {
        const int32_t want = greedy[i][step];
        const int32_t got = testing::Argmax(last);
        const double range = testing::Range(last);
        if (got == want) {
          ++n_exact;
        } else {
          ++n_near_ties;
          EXPECT_LE(last[static_cast<size_t>(got)] - last[static_cast<size_t>(want)],
                    2 * tolerance * range)
              << "greedy step " << step << ": reference token " << want << " is not a near-tie";
        }
        if (step + 1 == greedy[i].size()) break;
        runner.Append(seq, want);
        last = runner.Step({{seq, 1}})[0][0];
      }
    }
    EXPECT_LE(n_ties, moe ? kMoeTieShare * n_positions : 0.0)
        << "positions beyond the tolerance against the CPU with bf16 roundings";
    std::printf(
        "cuda fixture %s: max |delta logit| / range = %.3g (%d of %d positions beyond %.3g), "
        "against the CPU with bf16 roundings %.3g (%d beyond %.3g); greedy steps %d exact, %d "
        "near-ties\n",
        dir.c_str(), worst, n_outside, n_positions, tolerance, worst_emulated, n_ties,
        kEmulatedTolerance, n_exact, n_near_ties);
  }
  EXPECT_GE(n_fixtures, 11);  // dense, Qwen3.5 hybrids, Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next
}

TEST(CudaModel, KestrelTinyGreedyMatchesTransformers) {
  KESTREL_REQUIRE_CUDA();
  const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
  std::ifstream f(dir + "/golden.json");
  const json golden = json::parse(f);
  std::unique_ptr<Model> model = LoadCuda(dir, 512);
  int n_steps = 0, n_exact = 0;
  for (const json& c : golden["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["output_ids"].get<std::vector<int32_t>>();
    const auto margins = c["output_margins"].get<std::vector<double>>();
    testing::SeqRunner runner(model.get(), testing::ReversedBlocks(*model));
    const int seq = runner.AddSequence(prompt);
    std::vector<float> last = runner.Step({{seq, static_cast<int64_t>(prompt.size())}})[0].back();
    // The reference continuation fed back token by token (decode graphs): where transformers'
    // own top-2 margin is at least kMarginFloor our argmax must equal its token; below that
    // the reference token must be within the tolerance of our best logit.
    for (size_t step = 0; step < want.size(); ++step) {
      const int32_t got = testing::Argmax(last);
      ++n_steps;
      if (got == want[step]) {
        ++n_exact;
      } else if (step < margins.size() && margins[step] >= kMarginFloor) {
        ADD_FAILURE() << "step " << step << ": argmax " << got << ", transformers " << want[step]
                      << " (its margin " << margins[step] << ")";
      } else {
        EXPECT_LE(last[static_cast<size_t>(got)] - last[static_cast<size_t>(want[step])],
                  2 * kRangeTolerance * testing::Range(last))
            << "step " << step;
      }
      if (step + 1 == want.size()) break;
      runner.Append(seq, want[step]);
      last = runner.Step({{seq, 1}})[0][0];
    }
  }
  std::printf("kestrel-tiny on cuda: %d of %d greedy steps pick transformers' token\n", n_exact,
              n_steps);
}

// The 254-token prompt of the hybrid fixtures prefilled in one step, and in two (64 + 190 rows,
// the state carried in the sequence's slot between them, the second step's attention over cached
// K/V; the first step's MoE layers on the decode kernels, the second's on the grouped GEMM): the
// logits of positions 64.. agree within the tolerance against the CPU twin (measured on the
// H200: bitwise equal for qwen3_5, qwen3_5_moe and qwen3_next).
TEST(CudaModel, HybridChunkedPrefillAgreesWithOneStep) {
  KESTREL_REQUIRE_CUDA();
  for (const char* name : {"qwen3_5", "qwen3_5_moe", "qwen3_next"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/" + name;
    std::ifstream ref_file(dir + "/reference.json");
    const auto prompt = json::parse(ref_file).at("prompts").back().get<std::vector<int32_t>>();
    const int64_t split = 64, n = static_cast<int64_t>(prompt.size());
    std::unique_ptr<Model> model = LoadCuda(dir, 1024);
    testing::SeqRunner one(model.get(), testing::ReversedBlocks(*model));
    const int a = one.AddSequence(prompt);
    const auto whole = one.Step({{a, n}})[0];
    testing::SeqRunner two(model.get(), testing::ReversedBlocks(*model));
    const int b = two.AddSequence(prompt);
    two.Step({{b, split}});
    const auto rest = two.Step({{b, n - split}})[0];
    double worst = 0;
    int beyond = 0;
    for (int64_t p = split; p < n; ++p) {
      const auto& want = whole[static_cast<size_t>(p)];
      const double d =
          testing::MaxAbsDiff(rest[static_cast<size_t>(p - split)], want) / testing::Range(want);
      worst = std::max(worst, d);
      beyond += d > kEmulatedTolerance;
    }
    std::printf(
        "cuda %s: prefill 64 + %lld vs %lld in one step: max |delta| / range %.3g, %d "
        "positions beyond %.3g\n",
        name, static_cast<long long>(n - split), static_cast<long long>(n), worst, beyond,
        kEmulatedTolerance);
    EXPECT_LE(worst, kEmulatedTolerance);
  }
}

// A copy of a MoE fixture whose shared expert keeps its first `inter` rows of gate and up and
// columns of down, its config saying so: a shared expert with the routed experts' shape.
std::string NarrowSharedExpert(const std::string& src, int64_t inter) {
  const std::string dst = testing::MakeTempDir("moe_shared_slot");
  Result<WeightStore> store = WeightStore::Open(src);
  KCHECK_MSG(store.ok(), store.status().message().c_str());
  std::map<std::string, testing::TensorToWrite> out;
  for (const auto& [name, t] : store->tensors()) {
    KCHECK(t.dtype == DType::kBF16);
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.n_dims);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      v[i] = Bf16ToF32(h);
    }
    if (name.find("shared_expert.gate_proj") != std::string::npos ||
        name.find("shared_expert.up_proj") != std::string::npos) {
      shape[0] = inter;
      v.resize(static_cast<size_t>(inter * shape[1]));
    } else if (name.find("shared_expert.down_proj") != std::string::npos) {
      std::vector<float> narrow;
      for (int64_t r = 0; r < shape[0]; ++r) {
        narrow.insert(narrow.end(), v.begin() + r * shape[1], v.begin() + r * shape[1] + inter);
      }
      shape[1] = inter;
      v = std::move(narrow);
    }
    out[name] = {shape, v};
  }
  testing::WriteSafetensors(dst + "/model.safetensors", out, DType::kBF16);
  std::ifstream in(src + "/config.json");
  json config = json::parse(in);
  KCHECK(config.contains("shared_expert_intermediate_size"));
  config["shared_expert_intermediate_size"] = inter;
  std::ofstream(dst + "/config.json") << config.dump(2);
  return dst;
}

// A shared expert of the routed experts' shape is stored as one more grouped expert: steps of up
// to 8 tokens run it as one (MoeRoute's shared slot; the 7-row prompt and the decode steps, in
// graphs), larger ones as its own GEMMs on the slot's matrices (70 rows on the decode kernels,
// 254 on the grouped GEMM). Against the CPU with the same bf16 roundings, with
// FixturesMatchTransformers' allowance for router near-ties.
TEST(CudaModel, MoeSharedExpertAsGroupedExpertMatchesCpu) {
  KESTREL_REQUIRE_CUDA();
  const std::string src = std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/qwen3_5_moe";
  std::ifstream ref_file(src + "/reference.json");
  const json ref = json::parse(ref_file);
  const auto prompts = ref.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto greedy = ref.at("greedy").get<std::vector<std::vector<int32_t>>>();
  const std::string dir = NarrowSharedExpert(src, 32);  // moe_intermediate_size
  std::unique_ptr<Model> model = LoadCuda(dir, 1024);
  ModelLoadOptions cpu_opts;
  cpu_opts.kv_cache_tokens = 1024;
  cpu_opts.bf16_activations = true;
  Result<std::unique_ptr<Model>> cpu = Model::Load(dir, cpu_opts);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  int n_positions = 0, n_ties = 0;
  double worst = 0;
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& want) {
    const double range = testing::Range(want);
    const double d = testing::MaxAbsDiff(got, want);
    worst = std::max(worst, d / range);
    ++n_positions;
    n_ties += d > kEmulatedTolerance * range;
    EXPECT_LE(d, kMoeTieTolerance * range) << "position " << n_positions;
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    testing::SeqRunner gpu_runner(model.get(), testing::ReversedBlocks(*model));
    testing::SeqRunner cpu_runner(cpu->get(), testing::ReversedBlocks(**cpu));
    const int a = gpu_runner.AddSequence(prompts[i]);
    const int b = cpu_runner.AddSequence(prompts[i]);
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    auto got = gpu_runner.Step({{a, n}})[0];
    auto want = cpu_runner.Step({{b, n}})[0];
    for (size_t p = 0; p < got.size(); ++p) compare(got[p], want[p]);
    for (size_t step = 0; step < 16 && step < greedy[i].size(); ++step) {
      gpu_runner.Append(a, greedy[i][step]);
      cpu_runner.Append(b, greedy[i][step]);
      compare(gpu_runner.Step({{a, 1}})[0][0], cpu_runner.Step({{b, 1}})[0][0]);
    }
  }
  EXPECT_LE(n_ties, kMoeTieShare * n_positions);
  std::printf(
      "cuda qwen3_5_moe, shared expert as grouped expert %lld: max |delta| / range against the "
      "CPU %.3g, %d of %d positions beyond %.3g\n",
      static_cast<long long>(model->config().moe.n_experts), worst, n_ties, n_positions,
      kEmulatedTolerance);
  fs::remove_all(dir);
}

// One sequence's greedy decode alone, inside a batch of 8 and inside a batch of 64 sequences
// (other prompts random): the tokens must be the same; the logits are reported (bitwise equality
// is what the kernels aim for: fixed split sizes in attention, per-row GEMM order independent of
// the batch up to the skinny-kernel limit; cuBLASLt above it may reorder).
TEST(CudaModel, GreedyTokensIndependentOfBatchSize) {
  KESTREL_REQUIRE_CUDA();
  const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
  std::unique_ptr<Model> model = LoadCuda(dir, 64 * 160 + 512);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0,
                                             static_cast<int32_t>(model->config().vocab_size) - 1);
  std::vector<int32_t> prompt(40);
  for (int32_t& t : prompt) t = tok(rng);
  constexpr int kSteps = 48;
  std::vector<std::vector<int32_t>> results;
  std::vector<std::vector<float>> last_logits;
  for (int batch : {1, 8, 64}) {
    testing::SeqRunner runner(model.get(), testing::ReversedBlocks(*model));
    std::vector<int> seqs;
    seqs.push_back(runner.AddSequence(prompt));
    for (int b = 1; b < batch; ++b) {
      std::vector<int32_t> other(static_cast<size_t>(20 + b % 37));
      for (int32_t& t : other) t = tok(rng);
      seqs.push_back(runner.AddSequence(other));
    }
    std::vector<testing::SeqRunner::Work> prefill;
    for (int s : seqs) prefill.push_back({s, runner.n_tokens(s)});
    auto out = runner.Step(prefill);
    std::vector<int32_t> generated;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<testing::SeqRunner::Work> work;
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int32_t next = testing::Argmax(out[i].back());
        if (i == 0) generated.push_back(next);
        runner.Append(seqs[i], next);
        work.push_back({seqs[i], 1});
      }
      if (step + 1 == kSteps) {
        last_logits.push_back(out[0].back());
        break;
      }
      out = runner.Step(work);
    }
    results.push_back(generated);
  }
  EXPECT_EQ(results[0], results[1]) << "batch 8 changed the tokens";
  EXPECT_EQ(results[0], results[2]) << "batch 64 changed the tokens";
  std::printf("batch invariance of the last logits: |b8 - b1| = %.3g, |b64 - b1| = %.3g\n",
              testing::MaxAbsDiff(last_logits[1], last_logits[0]),
              testing::MaxAbsDiff(last_logits[2], last_logits[0]));
}

// Decode steps replayed from CUDA graphs give bitwise the logits of the same steps run eagerly,
// and programmatic dependent launch (kernels starting while their predecessor drains, the GEMV
// prefetching its weights before it waits) changes no bit either: 1 row (the GEMV path) and 5
// rows (cuBLASLt, padded to the 8-row bucket), each run eager/graphs x PDL off/on.
TEST(CudaModel, GraphReplayAndPdlEqualEagerDecode) {
  KESTREL_REQUIRE_CUDA();
  const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
  const bool saved_pdl = cuda::PdlEnabled();
  for (int n_rows : {1, 5}) {
    std::vector<std::vector<float>> runs[4];
    for (int config = 0; config < 4; ++config) {
      const bool graphs = config / 2 == 1, pdl = config % 2 == 1;
      cuda::SetPdlEnabled(pdl);
      std::unique_ptr<Model> model = LoadCuda(dir, 4096);
      model->set_use_graphs(graphs);
      testing::SeqRunner runner(model.get(), testing::ReversedBlocks(*model));
      std::vector<int> seqs;
      for (int b = 0; b < n_rows; ++b) {
        std::vector<int32_t> p(static_cast<size_t>(30 + 7 * b));
        for (size_t i = 0; i < p.size(); ++i) {
          p[i] = static_cast<int32_t>((i * 131 + b * 17) % 8000);
        }
        seqs.push_back(runner.AddSequence(p));
      }
      std::vector<testing::SeqRunner::Work> prefill;
      for (int s : seqs) prefill.push_back({s, runner.n_tokens(s)});
      auto out = runner.Step(prefill);
      for (int step = 0; step < 20; ++step) {
        std::vector<testing::SeqRunner::Work> work;
        for (size_t i = 0; i < seqs.size(); ++i) {
          runner.Append(seqs[i], testing::Argmax(out[i].back()));
          work.push_back({seqs[i], 1});
        }
        out = runner.Step(work);
        for (const auto& rows : out) runs[config].push_back(rows.back());
      }
    }
    for (int config = 1; config < 4; ++config) {
      ASSERT_EQ(runs[0].size(), runs[config].size());
      for (size_t i = 0; i < runs[0].size(); ++i) {
        ASSERT_EQ(runs[0][i], runs[config][i])
            << n_rows << " rows, graphs " << config / 2 << " pdl " << config % 2 << ", row " << i;
      }
    }
  }
  cuda::SetPdlEnabled(saved_pdl);
}

// The CUDA logits of a long prompt against the CPU reference kernels on the same weights
// (kestrel-tiny, 8 layers): a check of every stage at a context where attention spans many
// blocks and the decode split-K path has several splits.
TEST(CudaModel, LongContextAgreesWithCpuReference) {
  KESTREL_REQUIRE_CUDA();
  const std::string dir = std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(1500);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 8000);
  ModelLoadOptions cpu_opts;
  cpu_opts.kernels = CpuKernels::kAuto;
  cpu_opts.kv_cache_tokens = 1600;
  Result<std::unique_ptr<Model>> cpu = Model::Load(dir, cpu_opts);
  ASSERT_TRUE(cpu.ok());
  std::unique_ptr<Model> gpu = LoadCuda(dir, 1600);
  std::vector<std::vector<float>> rows[2];
  for (int which = 0; which < 2; ++which) {
    Model* m = which == 0 ? cpu->get() : gpu.get();
    testing::SeqRunner runner(m, testing::ReversedBlocks(*m));
    const int seq = runner.AddSequence(prompt);
    auto out = runner.Step({{seq, 1400}});  // prefill chunk
    rows[which].push_back(out[0].back());
    out = runner.Step({{seq, 99}});  // second chunk over a cached prefix
    rows[which].push_back(out[0].back());
    out = runner.Step({{seq, 1}});  // one decode step at context 1500
    rows[which].push_back(out[0].back());
  }
  for (size_t i = 0; i < rows[0].size(); ++i) {
    const double range = testing::Range(rows[0][i]);
    const double diff = testing::MaxAbsDiff(rows[1][i], rows[0][i]);
    EXPECT_LE(diff, kRangeTolerance * range) << "row " << i;
    std::printf("long context row %zu: max |delta| / range = %.3g\n", i, diff / range);
  }
}

}  // namespace
}  // namespace kestrel
