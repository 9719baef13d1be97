// Quantized checkpoints as models: GGUF files (tools/make_gguf.py: the ggml block formats, the
// llama.cpp naming and tensor transforms (Llama's q/k permutation, the hybrid Qwen layouts), the
// tokenizer metadata), FP8 block (make_fp8.py), MLX affine (make_mlx.py) and AWQ / GPTQ int4
// (make_int4.py) checkpoints, all written at test time in numpy from the committed fixtures, each
// with the same model's dequantized weights beside it as an f32 safetensors directory. The quantized model must give exactly the logits of that
// directory (itself the ordinary load path, checked against transformers by the fixture tests),
// a GGUF file must tokenize exactly like the tokenizer.json it came from and render the same chat
// template, and broken files are refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/ops.h"
#include "core/gguf.h"
#include "core/quant_blocks.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "tiny_model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
const std::string kSource = KESTREL_SOURCE_DIR;

// One converted model: the .gguf and its dequantized reference directory.
struct Converted {
  std::string gguf, reference;
};

class QuantizedCheckpoints : public ::testing::Test {
 public:
  static const Converted& Get(const std::string& name) { return models_->at(name); }

 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("gguf"));
    models_ = new std::map<std::string, Converted>();
    struct Job {
      std::string name, model, type, tokenizer, pre;
    };
    const std::string tiny = kSource + "/models/kestrel-tiny";
    const std::string fx = kSource + "/tests/data/models/";
    const std::vector<Job> jobs = {
        {"tiny_q8_0", tiny, "q8_0", "", "qwen2"},
        {"tiny_q4_k", tiny, "q4_k", "", "qwen2"},
        {"tiny_q6_k", tiny, "q6_k", "", "qwen2"},
        {"tiny_q4_k_m", tiny, "q4_k_m", "", "qwen2"},
        {"tiny_q5_k", tiny, "q5_k", "", "qwen2"},
        {"tiny_q5_k_m", tiny, "q5_k_m", "", "qwen2"},
        {"tiny_q4_0", tiny, "q4_0", "", "qwen2"},
        {"tiny_q4_1", tiny, "q4_1", "", "qwen2"},
        {"tiny_q5_0", tiny, "q5_0", "", "qwen2"},
        {"tiny_q5_1", tiny, "q5_1", "", "qwen2"},
        {"qwen3_moe_q4_0", fx + "qwen3_moe", "q4_0", "", "qwen2"},
        // The low-bit K formats and the non-linear 4-bit ones; the 64-wide fixtures' rows are
        // not whole 256-blocks, so IQ4_XS files of them hold IQ4_NL (as llama.cpp writes them).
        {"tiny_q2_k", tiny, "q2_k", "", "qwen2"},
        {"tiny_q3_k", tiny, "q3_k", "", "qwen2"},
        {"tiny_q3_k_m", tiny, "q3_k_m", "", "qwen2"},
        {"tiny_iq4_nl", tiny, "iq4_nl", "", "qwen2"},
        {"tiny_iq4_xs", tiny, "iq4_xs", "", "qwen2"},
        {"qwen3_moe_iq4_xs", fx + "qwen3_moe", "iq4_xs", "", "qwen2"},
        {"qwen3_5_iq4_xs", fx + "qwen3_5", "iq4_xs", "", "qwen35"},
        {"tiny_f16", tiny, "f16", "", "qwen2"},
        {"tiny_bf16", tiny, "bf16", "", "qwen2"},
        {"llama3_q8_0", fx + "llama3", "q8_0", kSource + "/tests/data/npm/llama3", "llama-bpe"},
        {"mistral_q8_0", fx + "mistral", "q8_0", "", "llama-bpe"},
        {"qwen2_q8_0", fx + "qwen2", "q8_0", "", "qwen2"},
        {"qwen3_q8_0", fx + "qwen3", "q8_0", kSource + "/tests/data/npm/qwen3", "qwen2"},
        {"qwen3_moe_q8_0", fx + "qwen3_moe", "q8_0", "", "qwen2"},
        // The hybrid architectures (qwen35, qwen35moe, qwen3next: llama.cpp's value-head tiling,
        // split projections, 1 + w norms, -exp(A_log), the MTP head as a nextn block).
        {"qwen3_5_q8_0", fx + "qwen3_5", "q8_0", "", "qwen35"},
        {"qwen3_5_f16", fx + "qwen3_5", "f16", "", "qwen35"},
        {"qwen3_5_bf16", fx + "qwen3_5", "bf16", "", "qwen35"},
        {"qwen3_5_moe_q8_0", fx + "qwen3_5_moe", "q8_0", "", "qwen35"},
        {"qwen3_5_moe_bf16", fx + "qwen3_5_moe", "bf16", "", "qwen35"},
        {"qwen3_next_q8_0", fx + "qwen3_next", "q8_0", "", "qwen2"},
        {"qwen3_next_bf16", fx + "qwen3_next", "bf16", "", "qwen2"},
    };
    // Safetensors checkpoints beside the GGUF files: FP8 blocks (make_fp8.py); MLX affine
    // (make_mlx.py: 4-bit with one module overridden to 8, 8-bit, and fixtures whose 96-wide down
    // projections stay bf16); AWQ and GPTQ int4 (make_int4.py, one GPTQ with an act-order g_idx).
    struct Writer {
      std::string name, tool, model, flags;
    };
    const std::vector<Writer> writers = {
        {"fp8_tiny", "make_fp8.py", tiny, ""},
        {"fp8_qwen3", "make_fp8.py", fx + "qwen3", ""},
        {"fp8_qwen3_moe", "make_fp8.py", fx + "qwen3_moe", ""},
        {"fp8_llama3", "make_fp8.py", fx + "llama3", ""},
        {"mlx4_tiny", "make_mlx.py", tiny, "--bits 4 --override model.layers.0.mlp.down_proj=8"},
        {"mlx8_tiny", "make_mlx.py", tiny, "--bits 8"},
        {"mlx4_qwen3", "make_mlx.py", fx + "qwen3", "--bits 4"},
        {"mlx4_qwen3_moe", "make_mlx.py", fx + "qwen3_moe", "--bits 4 --group-size 32"},
        {"mlx4_llama3", "make_mlx.py", fx + "llama3", "--bits 4"},
        {"awq_tiny", "make_int4.py", tiny, "--format awq"},
        {"gptq_tiny", "make_int4.py", tiny, "--format gptq"},
        {"awq_qwen3", "make_int4.py", fx + "qwen3", "--format awq --group-size 32"},
        {"gptq_qwen3_moe", "make_int4.py", fx + "qwen3_moe", "--format gptq --group-size 32"},
        {"gptq_act_order", "make_int4.py", tiny, "--format gptq --act-order-g-idx"},
        {"gptq_uneven_g_idx", "make_int4.py", tiny,
         "--format gptq --act-order-g-idx --uneven-g-idx"},
        {"gptq_act_order_mixed", "make_int4.py", tiny,
         "--format gptq --act-order-g-idx --perm-per-tensor"},
        {"gptq_act_order_moe", "make_int4.py", fx + "qwen3_moe",
         "--format gptq --act-order-g-idx --group-size 32"},
    };
    for (const Writer& w : writers) {
      Converted c{*dir_ + "/" + w.name, *dir_ + "/" + w.name + "_ref"};
      const std::string cmd = "/usr/bin/python3 " + kSource + "/tools/" + w.tool + " --model " +
                              w.model + " " + w.flags + " --out " + c.gguf + " --dequantized-out " +
                              c.reference;
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      (*models_)[w.name] = c;
    }
    for (const Job& j : jobs) {
      Converted c{*dir_ + "/" + j.name + ".gguf", *dir_ + "/" + j.name + "_ref"};
      std::string cmd = "/usr/bin/python3 " + kSource + "/tools/make_gguf.py --model " + j.model +
                        " --type " + j.type + " --pre " + j.pre + " --out " + c.gguf +
                        " --dequantized-out " + c.reference;
      if (!j.tokenizer.empty()) cmd += " --tokenizer " + j.tokenizer;
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " (needs Debian's python3-numpy)";
      (*models_)[j.name] = c;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete models_;
  }

  static std::string* dir_;
  static std::map<std::string, Converted>* models_;
};
std::string* QuantizedCheckpoints::dir_ = nullptr;
std::map<std::string, Converted>* QuantizedCheckpoints::models_ = nullptr;

const std::vector<int32_t> kPrompt = {1, 7, 42, 300, 5, 77, 12, 250, 3, 400, 9, 64, 128, 255, 31, 2, 100};

// Logits [tokens][vocab] of every position of kPrompt (ids taken modulo the vocabulary).
std::vector<std::vector<float>> AllLogits(const std::string& path, CpuKernels kernels,
                                          bool int8_activations = true) {
  ModelLoadOptions opts;
  opts.kernels = kernels;
  opts.int8_activations = int8_activations;
  opts.kv_cache_tokens = 256;
  Result<std::unique_ptr<Model>> model = Model::Load(path, opts);
  EXPECT_TRUE(model.ok()) << path << ": " << model.status().message();
  if (!model.ok()) return {};
  std::vector<int32_t> blocks((*model)->n_kv_blocks());
  for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
  testing::SeqRunner runner(model->get(), blocks);
  std::vector<int32_t> prompt;
  for (int32_t t : kPrompt) prompt.push_back(t % static_cast<int32_t>((*model)->config().vocab_size));
  const int seq = runner.AddSequence(prompt);
  return runner.Step({{seq, static_cast<int64_t>(prompt.size())}})[0];
}

bool SameBits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

std::vector<CpuKernels> KernelSets() {
  std::vector<CpuKernels> k = {CpuKernels::kReference};
  if (cpu::CpuHasAvx2Fma()) k.push_back(CpuKernels::kAuto);
  return k;
}

// Each converted model gives its dequantized directory's logits bit for bit in every kernel set.
void ExpectEqualsDequantized(std::initializer_list<const char*> names, bool int8_activations = true) {
  for (const char* name : names) {
    for (CpuKernels k : KernelSets()) {
      const auto q = AllLogits(QuantizedCheckpoints::Get(name).gguf, k, int8_activations);
      const auto ref = AllLogits(QuantizedCheckpoints::Get(name).reference, k);
      ASSERT_FALSE(q.empty()) << name;
      EXPECT_TRUE(SameBits(q, ref)) << name << (k == CpuKernels::kReference ? " reference" : " avx2");
    }
  }
}

// max |logit - bf16| / range over kPrompt against the bf16 embedded model, printed, then
// returned.
double ErrorAgainstBf16(const std::string& path, const std::string& label, bool int8_activations = true) {
  const auto bf16 = AllLogits(kSource + "/models/kestrel-tiny", CpuKernels::kAuto);
  const auto q = AllLogits(path, CpuKernels::kAuto, int8_activations);
  double worst = 0;
  int same_argmax = 0;
  for (size_t t = 0; t < q.size(); ++t) {
    worst = std::max(worst, testing::MaxAbsDiff(q[t], bf16[t]) / testing::Range(bf16[t]));
    same_argmax += testing::Argmax(q[t]) == testing::Argmax(bf16[t]);
  }
  std::printf("[ info     ] %-28s max |logit - bf16| / range = %.4f, argmax equal at %d of %zu\n",
              label.c_str(), worst, same_argmax, q.size());
  return worst;
}

const char* const kBitExactModels[] = {
    "tiny_q8_0",        "tiny_q4_k",        "tiny_q5_k",       "tiny_q6_k",
    "tiny_q4_k_m",      "tiny_q5_k_m",      "tiny_f16",        "tiny_bf16",
    "mistral_q8_0",     "qwen2_q8_0",       "qwen3_q8_0",      "qwen3_moe_q8_0",
    "qwen3_5_q8_0",     "qwen3_5_f16",      "qwen3_5_bf16",    "qwen3_5_moe_q8_0",
    "qwen3_5_moe_bf16", "qwen3_next_q8_0",  "qwen3_next_bf16", "tiny_q4_0",
    "tiny_q4_1",        "tiny_q5_0",        "tiny_q5_1",       "qwen3_moe_q4_0",
    "tiny_q2_k",        "tiny_q3_k",        "tiny_q3_k_m",     "tiny_iq4_nl",
    "tiny_iq4_xs",      "qwen3_moe_iq4_xs", "qwen3_5_iq4_xs"};

// FP8 block-quantized safetensors checkpoints (e4m3 weights, f32 scale per 128 x 128 block, the
// layout of Qwen's *-FP8 releases): the CPU dequantizes in the kernels, so the model is the
// dequantized model bit for bit, in both kernel sets; partial blocks (64-wide fixtures), MoE
// experts and Llama's rotary layout included.
TEST_F(QuantizedCheckpoints, Fp8CheckpointsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized({"fp8_tiny", "fp8_qwen3", "fp8_qwen3_moe", "fp8_llama3"});
  EXPECT_LE(ErrorAgainstBf16(Get("fp8_tiny").gguf, "fp8 (e4m3, 128x128 blocks)"), 0.1);
}

// MLX affine quantization (uint32-packed 4- or 8-bit codes, bf16 scale and bias per group,
// per-module overrides): dequantized in the kernels, so the model is its dequantized copy bit for
// bit in both kernel sets; the embedding and LM head are quantized too.
TEST_F(QuantizedCheckpoints, MlxCheckpointsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized({"mlx4_tiny", "mlx8_tiny", "mlx4_qwen3", "mlx4_qwen3_moe", "mlx4_llama3"});
  EXPECT_LE(ErrorAgainstBf16(Get("mlx4_tiny").gguf, "mlx 4-bit, group 64"), 0.3);
  EXPECT_LE(ErrorAgainstBf16(Get("mlx8_tiny").gguf, "mlx 8-bit, group 64"), 0.05);
}

// AWQ and GPTQ int4: repacked at load into the affine 4-bit layout with bias = -(scale * zero),
// which equals (q - zero) * scale exactly (both products are exact), so the model is its
// dequantized copy bit for bit in both kernel sets. A g_idx whose groups are not all group-size
// long (no act-order checkpoint writes one, but the format allows it) is dequantized to f32 at
// load: bit for bit too, at f32's size.
TEST_F(QuantizedCheckpoints, AwqAndGptqCheckpointsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized(
      {"awq_tiny", "gptq_tiny", "awq_qwen3", "gptq_qwen3_moe", "gptq_uneven_g_idx"});
  EXPECT_LE(ErrorAgainstBf16(Get("awq_tiny").gguf, "int4 (AWQ/GPTQ), group 128"), 0.3);
}

int64_t WeightBytes(const std::string& path) {
  Result<std::unique_ptr<Model>> model = Model::Load(path, ModelLoadOptions{});
  EXPECT_TRUE(model.ok()) << path << ": " << model.status().message();
  return model.ok() ? (*model)->weight_bytes() : 0;
}

// GPTQ act-order (desc_act: g_idx groups over a permuted order of the inputs) stays 4-bit: the
// columns are stored group by group and the AVX2 kernels gather x in that order, so its size is
// the plain GPTQ model's and its logits are the dequantized copy's up to the order of the f32
// sums (the reference kernels, which dequantize rows back in the inputs' order, bit for bit).
TEST_F(QuantizedCheckpoints, GptqActOrderStaysInt4) {
  const int64_t plain = WeightBytes(Get("gptq_tiny").gguf);
  const int64_t act_order = WeightBytes(Get("gptq_act_order").gguf);
  const int64_t uneven = WeightBytes(Get("gptq_uneven_g_idx").gguf);
  ASSERT_GT(plain, 0);
  EXPECT_EQ(act_order, plain);  // codes, zeros and scales as published
  EXPECT_GT(uneven, 4 * plain);  // held as f32
  // The tiny model, the same with every matrix in its own input order, and the MoE fixture
  // (experts too) at group 32.
  for (const char* name : {"gptq_act_order", "gptq_act_order_mixed", "gptq_act_order_moe"}) {
    SCOPED_TRACE(name);
    const std::string& q = Get(name).gguf;
    const std::string& ref = Get(name).reference;
    EXPECT_TRUE(
        SameBits(AllLogits(q, CpuKernels::kReference), AllLogits(ref, CpuKernels::kReference)));
    if (!cpu::CpuHasAvx2Fma()) continue;  // the reference kernels were checked
    const auto got = AllLogits(q, CpuKernels::kAuto);
    const auto want = AllLogits(ref, CpuKernels::kAuto);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_FALSE(got.empty());
    double worst = 0;
    for (size_t t = 0; t < got.size(); ++t) {
      worst = std::max(worst, testing::MaxAbsDiff(got[t], want[t]) / testing::Range(want[t]));
      EXPECT_EQ(testing::Argmax(got[t]), testing::Argmax(want[t])) << "position " << t;
    }
    std::printf("[ info     ] %-22s (avx2) max |logit - dequantized| / range = %.3g\n", name,
                worst);
    EXPECT_LE(worst, 1e-5);
  }
}

TEST_F(QuantizedCheckpoints, OtherQuantizationMethodsAreRefusedByName) {
  const std::string dir = testing::MakeTempDir("awq");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kSource + "/models/kestrel-tiny/config.json"));
  cfg["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  std::ofstream(dir + "/config.json") << cfg.dump();
  fs::copy_file(kSource + "/models/kestrel-tiny/model.safetensors", dir + "/model.safetensors");
  Result<std::unique_ptr<Model>> m = Model::Load(dir, ModelLoadOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("'bitsandbytes'"), std::string::npos) << m.status().message();
  fs::remove_all(dir);
}

// f32 activations: the GGUF model is the dequantized model, bit for bit.
TEST_F(QuantizedCheckpoints, F32ActivationsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized({"tiny_q8_0", "tiny_q4_k", "tiny_q5_k", "tiny_q6_k", "tiny_q4_k_m",
                           "tiny_q5_k_m", "tiny_f16", "tiny_bf16", "mistral_q8_0", "qwen2_q8_0",
                           "qwen3_q8_0", "qwen3_moe_q8_0"},
                          /*int8_activations=*/false);
}

// The legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1: what many published GGUF files hold):
// with f32 activations the model is its dequantized copy bit for bit in both kernel sets (the
// dense tiny model and the Qwen3-MoE fixture, experts too). Q4_1 and Q5_1 have no integer
// kernels, so they are bit for bit with int8 activations (the default) too; Q4_0 and Q5_0 take
// Q8_0's integer path then (Int8ActivationsStayCloseToTheDequantizedWeights). Their error
// against bf16 on the trained tiny model, measured with f32 activations: Q4_0 0.187, Q4_1 0.142,
// Q5_0 0.073, Q5_1 0.077 (bounded at about 1.5x).
TEST_F(QuantizedCheckpoints, LegacyBlockFormatsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized({"tiny_q4_0", "tiny_q4_1", "tiny_q5_0", "tiny_q5_1", "qwen3_moe_q4_0"},
                          /*int8_activations=*/false);
  ExpectEqualsDequantized({"tiny_q4_1", "tiny_q5_1"});
  const std::map<std::string, double> bound = {
      {"tiny_q4_0", 0.28}, {"tiny_q4_1", 0.21}, {"tiny_q5_0", 0.11}, {"tiny_q5_1", 0.115}};
  for (const auto& [name, limit] : bound) {
    EXPECT_LE(ErrorAgainstBf16(Get(name).gguf, name, /*int8_activations=*/false), limit);
  }
}

// Q2_K, Q3_K (alone and in a Q3_K_M-style mix with Q4_K and Q6_K), IQ4_NL and IQ4_XS: with f32
// activations the model is its dequantized copy bit for bit in both kernel sets (the dense tiny
// model and the Qwen3-MoE fixture's experts in IQ4_NL; the Qwen3.5 hybrid with the other hybrid
// files below); with int8 activations they take their integer kernels
// (Int8ActivationsStayCloseToTheDequantizedWeights). Their error against bf16 on the trained
// tiny model with f32 activations (measured: Q2_K 0.528, Q3_K 0.342, Q3_K_M 0.178, IQ4_NL
// 0.166, IQ4_XS 0.158; bounded at about 1.5x).
TEST_F(QuantizedCheckpoints, LowBitKAndIq4FormatsEqualTheDequantizedWeightsBitForBit) {
  ExpectEqualsDequantized(
      {"tiny_q2_k", "tiny_q3_k", "tiny_q3_k_m", "tiny_iq4_nl", "tiny_iq4_xs", "qwen3_moe_iq4_xs"},
      /*int8_activations=*/false);
  const std::map<std::string, double> bound = {{"tiny_q2_k", 0.8},
                                               {"tiny_q3_k", 0.5},
                                               {"tiny_q3_k_m", 0.28},
                                               {"tiny_iq4_nl", 0.25},
                                               {"tiny_iq4_xs", 0.24}};
  for (const auto& [name, limit] : bound) {
    EXPECT_LE(ErrorAgainstBf16(Get(name).gguf, name, /*int8_activations=*/false), limit);
  }
}

const char* const kHybridModels[] = {"qwen3_5_q8_0",     "qwen3_5_f16",      "qwen3_5_bf16",
                                     "qwen3_5_moe_q8_0", "qwen3_5_moe_bf16", "qwen3_next_q8_0",
                                     "qwen3_next_bf16",  "qwen3_5_iq4_xs"};

// Qwen3.5, Qwen3.5-MoE and Qwen3-Next files as llama.cpp's converter writes them: with f32
// activations every position's logits equal the dequantized model's bit for bit, in both kernel
// sets, and greedy decoding (one token at a time, through the recurrent state) gives the same
// tokens and the same logits at every step.
TEST_F(QuantizedCheckpoints, HybridGgufModelsEqualTheDequantizedWeightsBitForBit) {
  for (const char* name : kHybridModels) {
    for (CpuKernels k : KernelSets()) {
      const auto q = AllLogits(Get(name).gguf, k, /*int8_activations=*/false);
      const auto ref = AllLogits(Get(name).reference, k);
      ASSERT_FALSE(q.empty()) << name;
      EXPECT_TRUE(SameBits(q, ref))
          << name << (k == CpuKernels::kReference ? " reference" : " avx2");
    }
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<std::vector<float>>> logits;
    for (const std::string& path : {Get(name).gguf, Get(name).reference}) {
      ModelLoadOptions opts;
      opts.int8_activations = false;
      opts.kv_cache_tokens = 256;
      Result<std::unique_ptr<Model>> model = Model::Load(path, opts);
      ASSERT_TRUE(model.ok()) << path << ": " << model.status().message();
      std::vector<int32_t> blocks((*model)->n_kv_blocks());
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
      testing::SeqRunner runner(model->get(), blocks);
      const int seq = runner.AddSequence({1, 7, 42, 200, 5});
      std::vector<float> last = runner.Step({{seq, 5}})[0].back();
      tokens.emplace_back();
      logits.emplace_back();
      for (int step = 0; step < 12; ++step) {
        tokens.back().push_back(testing::Argmax(last));
        runner.Append(seq, tokens.back().back());
        last = runner.Step({{seq, 1}})[0][0];
        logits.back().push_back(last);
      }
    }
    EXPECT_EQ(tokens[0], tokens[1]) << name;
    EXPECT_TRUE(SameBits(logits[0], logits[1])) << name << " decode";
  }
}

// Stored in the checkpoint's own type (bf16) nothing is rounded: every tensor the checkpoint
// holds comes back from the GGUF file under its own name with its own values, bit for bit (the
// value-head order, the split projections, 1 + w and -exp(A_log) all undone; the MTP head
// included; fused experts compared with their per-expert views).
TEST_F(QuantizedCheckpoints, HybridGgufTensorsAreTheCheckpointsOwn) {
  const std::string fx = kSource + "/tests/data/models/";
  for (const auto& [name, dir] :
       std::vector<std::pair<std::string, std::string>>{{"qwen3_5_bf16", "qwen3_5"},
                                                        {"qwen3_5_moe_bf16", "qwen3_5_moe"},
                                                        {"qwen3_next_bf16", "qwen3_next"}}) {
    Result<WeightStore> ckpt = WeightStore::Open(fx + dir);
    Result<WeightStore> gguf = WeightStore::OpenGguf(Get(name).gguf);
    ASSERT_TRUE(ckpt.ok() && gguf.ok()) << name;
    auto values = [](const TensorView& v, int64_t begin, int64_t n) {
      std::vector<float> out(static_cast<size_t>(n));
      const int64_t elem = static_cast<int64_t>(DTypeSize(v.dtype));
      quant::DequantizeRow(v.dtype, static_cast<const uint8_t*>(v.data) + begin * elem, n,
                           out.data());
      return out;
    };
    auto all = [&](const TensorView& v) { return values(v, 0, v.numel()); };
    size_t matched = 0;
    for (const auto& [tensor, view] : ckpt->tensors()) {
      std::vector<std::pair<std::string, int64_t>> parts;  // GGUF name, offset into `view`
      if (tensor.ends_with("mlp.experts.gate_up_proj") ||
          tensor.ends_with("mlp.experts.down_proj")) {
        const std::string p = tensor.substr(0, tensor.rfind('.') + 1);  // <layer>.mlp.experts.
        const int64_t matrix = view.shape[1] * view.shape[2];
        for (int64_t e = 0; e < view.shape[0]; ++e) {
          const std::string ep = p + std::to_string(e) + ".";
          if (tensor.ends_with("down_proj")) {
            parts.push_back({ep + "down_proj.weight", e * matrix});
          } else {
            parts.push_back({ep + "gate_proj.weight", e * matrix});
            parts.push_back({ep + "up_proj.weight", e * matrix + matrix / 2});
          }
        }
      } else {
        parts.push_back({tensor, 0});
      }
      for (const auto& [g, offset] : parts) {
        ASSERT_TRUE(gguf->Has(g)) << name << ": no " << g;
        const TensorView& x = gguf->tensors().at(g);
        const std::vector<float> a = all(x), b = values(view, offset, x.numel());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << name << ": " << g;
        ++matched;
      }
    }
    EXPECT_EQ(matched, gguf->tensors().size())
        << name << ": the GGUF holds tensors the checkpoint does not";
  }
}

// int8 activations (the default; the kernels themselves agree bit for bit across kernel sets,
// tests/kernels/quant_linear_test.cpp): the logits stay within the activations' quantization
// error of the dequantized model's, with the same argmax wherever the dequantized model's top two
// are further apart than that error. Measured worst (max |delta| / range): 0.018 Q8_0, 0.055
// Q4_K, 0.053 Q5_K, 0.055 Q6_K, 0.045 Q4_K_M, 0.041 Q5_K_M, 0.037 Q2_K, 0.052 Q3_K, 0.040
// Q3_K_M, 0.023 IQ4_NL, 0.050 IQ4_XS on the trained tiny model; 0.01 on the random fixtures.
// The hybrid fixtures drift further along the prompt (0.01 - 0.02 at the first position; worst
// 0.076 Qwen3.5, 0.068 Qwen3-Next, 0.18 Qwen3.5-MoE, 0.11 Qwen3.5 in IQ4_NL): the recurrent state
// carries each token's rounding into the next ones, and a near-tied router picks another expert.
// They are held to 0.25.
TEST_F(QuantizedCheckpoints, Int8ActivationsStayCloseToTheDequantizedWeights) {
  for (const char* name : kBitExactModels) {
    const bool hybrid = std::find_if(std::begin(kHybridModels), std::end(kHybridModels),
                                     [&](const char* h) { return std::strcmp(h, name) == 0; }) !=
                        std::end(kHybridModels);
    const auto ref = AllLogits(Get(name).reference, CpuKernels::kReference);
    const auto gguf = AllLogits(Get(name).gguf, CpuKernels::kReference);
    ASSERT_EQ(gguf.size(), ref.size());
    double worst = 0;
    for (size_t t = 0; t < gguf.size(); ++t) {
      const double rel = testing::MaxAbsDiff(gguf[t], ref[t]) / testing::Range(ref[t]);
      worst = std::max(worst, rel);
      std::vector<float> sorted = ref[t];
      std::sort(sorted.rbegin(), sorted.rend());
      const bool tied = sorted[0] - sorted[1] < 2 * rel * testing::Range(ref[t]);
      if (!tied) {
        EXPECT_EQ(testing::Argmax(gguf[t]), testing::Argmax(ref[t])) << name << " position " << t;
      }
    }
    std::printf("[ info     ] %-17s int8 activations: max |logit - f32| / range = %.4f\n", name,
                worst);
    EXPECT_LE(worst, hybrid ? 0.25 : 0.08) << name;
  }
}

// Llama 3's RoPE scaling arrives as llama.cpp's per-frequency divisors (rope_freqs): the
// frequencies differ from transformers' llama3 formula by float rounding only.
TEST_F(QuantizedCheckpoints, Llama3WithRopeFreqsMatchesWithinRounding) {
  for (CpuKernels k : KernelSets()) {
    const auto gguf = AllLogits(Get("llama3_q8_0").gguf, k, /*int8_activations=*/false);
    const auto ref = AllLogits(Get("llama3_q8_0").reference, k);
    ASSERT_EQ(gguf.size(), ref.size());
    for (size_t t = 0; t < gguf.size(); ++t) {
      EXPECT_LE(testing::MaxAbsDiff(gguf[t], ref[t]), 1e-5 * testing::Range(ref[t])) << "position " << t;
      EXPECT_EQ(testing::Argmax(gguf[t]), testing::Argmax(ref[t])) << "position " << t;
    }
  }
}

// What quantization costs on the trained tiny model: the logit error of each format against the
// bf16 checkpoint, as a fraction of the logit range, with f32 and with int8 activations (printed;
// bounded at about 1.5x what was measured, so a broken quantizer or kernel fails it, not the
// formats' own error). Measured (f32 / int8 activations): Q8_0 0.013 / 0.025, Q6_K 0.035 / 0.066,
// Q5_K_M 0.054 / 0.074, Q4_K_M 0.085 / 0.085, Q5_K 0.103 / 0.113, Q4_K 0.139 / 0.138.
TEST_F(QuantizedCheckpoints, QuantizationErrorAgainstBf16IsTheFormatsOwn) {
  const std::map<std::string, double> bound = {
      {"tiny_q8_0", 0.04}, {"tiny_q6_k", 0.1}, {"tiny_q4_k_m", 0.13}, {"tiny_q4_k", 0.21},
      {"tiny_q5_k", 0.17}, {"tiny_q5_k_m", 0.11}};
  for (const auto& [name, limit] : bound) {
    for (bool int8 : {false, true}) {
      EXPECT_LE(ErrorAgainstBf16(Get(name).gguf, name + (int8 ? " int8 activations" : " f32 activations"), int8),
                limit)
          << name;
    }
  }
}

std::vector<std::string> CorpusLines() {
  std::ifstream f(kSource + "/tests/data/tokenizer/corpus.jsonl");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return out;
}

// A directory holding only the tokenizer files of `src`.
std::string TokenizerDir(const std::string& src, const std::string& tag) {
  const std::string dir = testing::MakeTempDir(tag);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(src + "/" + f)) fs::copy_file(src + "/" + f, dir + "/" + f);
  }
  return dir;
}

TEST_F(QuantizedCheckpoints, TokenizerAndChatTemplateEqualTheTokenizerJsons) {
  const std::vector<std::string> corpus = CorpusLines();
  ASSERT_GT(corpus.size(), 1000u);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llama3_q8_0", kSource + "/tests/data/npm/llama3"},
      {"qwen3_q8_0", kSource + "/tests/data/npm/qwen3"},
      {"tiny_q4_k_m", kSource + "/models/kestrel-tiny"}};
  for (const auto& [name, src] : cases) {
    Result<Tokenizer> g = Tokenizer::FromDirectory(Get(name).gguf);
    Result<Tokenizer> h = Tokenizer::FromDirectory(TokenizerDir(src, "tok"));
    ASSERT_TRUE(g.ok()) << g.status().message();
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_EQ(g->vocab_size(), h->vocab_size()) << name;
    EXPECT_EQ(g->bos_token(), h->bos_token()) << name;
    EXPECT_EQ(g->eos_token(), h->eos_token()) << name;
    EXPECT_EQ(g->add_bos_token(), h->add_bos_token()) << name;
    int differ = 0;
    for (const std::string& text : corpus) {
      for (bool special : {false, true}) {
        const std::vector<int32_t> a = g->Encode(text, special), b = h->Encode(text, special);
        if (a != b && ++differ <= 3) ADD_FAILURE() << name << " encodes differently: " << text;
        if (!special && g->Decode(a) != h->Decode(b)) ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << name;

    Result<ChatTemplate> gt = ChatTemplate::FromDirectory(Get(name).gguf);
    Result<ChatTemplate> ht = ChatTemplate::FromDirectory(TokenizerDir(src, "tmpl"));
    ASSERT_EQ(gt.ok(), ht.ok()) << name;
    if (!ht.ok()) continue;
    const nlohmann::json messages = nlohmann::json::array(
        {{{"role", "system"}, {"content", "Be brief."}},
         {{"role", "user"}, {"content", "What is 2+2?"}},
         {{"role", "assistant"}, {"content", "4"}},
         {{"role", "user"}, {"content", "And 3+3?"}}});
    const nlohmann::json tools = nullptr, kwargs = nlohmann::json::object();
    Result<std::string> a = gt->Render(messages, tools, true, kwargs);
    Result<std::string> b = ht->Render(messages, tools, true, kwargs);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    EXPECT_EQ(*a, *b) << name;
  }
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A load opens its file several times; the header is parsed once, and again when the file was
// rewritten (same path and size, other header bytes).
TEST_F(QuantizedCheckpoints, AHeaderIsParsedOnceUntilTheFileChanges) {
  std::vector<uint8_t> bytes = ReadBytes(Get("qwen2_q8_0").gguf);
  const std::string path = *dir_ + "/reopened.gguf";
  WriteBytes(path, bytes);
  Result<GgufFile> a = GgufFile::Open(path);
  Result<GgufFile> b = GgufFile::Open(path);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(&a->header(), &b->header()) << "parsed twice";
  // The same size, one metadata string changed in place: a new header with the new value.
  const std::optional<std::string> arch = *a->String("general.architecture");
  ASSERT_EQ(arch, "qwen2");
  const std::string key = "general.architecture";
  auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end());
  const size_t value = static_cast<size_t>(at - bytes.begin()) + key.size() + 4 + 8;  // type, length
  ASSERT_EQ(std::string(bytes.begin() + value, bytes.begin() + value + 5), "qwen2");
  bytes[value + 4] = '3';
  WriteBytes(path, bytes);
  Result<GgufFile> c = GgufFile::Open(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_NE(&c->header(), &a->header());
  EXPECT_EQ(*c->String("general.architecture"), std::optional<std::string>("qwen3"));
  EXPECT_EQ(*a->String("general.architecture"), std::optional<std::string>("qwen2"));  // kept
}

TEST_F(QuantizedCheckpoints, BrokenFilesAreRefusedWithAReason) {
  const std::vector<uint8_t> good = ReadBytes(Get("qwen2_q8_0").gguf);  // no tokenizer: short header
  Result<GgufHeader> parsed = ParseGgufHeader(good.data(), good.size(), "x.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_LT(parsed->data_offset, 16384u);
  // Every truncation of the header (and some of the data) fails cleanly.
  for (size_t n = 0; n < parsed->data_offset + 4096 && n < good.size(); n += (n < parsed->data_offset ? 1 : 61)) {
    Result<GgufHeader> h = ParseGgufHeader(good.data(), n, "x.gguf");
    ASSERT_FALSE(h.ok()) << "prefix of " << n << " bytes";
    EXPECT_NE(h.status().message().find("x.gguf"), std::string::npos);
  }
  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  EXPECT_FALSE(ParseGgufHeader(bad.data(), bad.size(), "x.gguf").ok());
  bad = good;
  bad[4] = 9;  // version
  EXPECT_NE(ParseGgufHeader(bad.data(), bad.size(), "x.gguf").status().message().find("version"), std::string::npos);

  // A tensor of a type Kestrel does not read (IQ2_XXS in place of one of the embedded model's
  // Q8_0 matrices: 256-wide rows, a smaller extent): the load names the tensor and the type.
  const std::vector<uint8_t> tiny = ReadBytes(Get("tiny_q8_0").gguf);
  const std::string name = "blk.0.attn_q.weight";
  auto at = std::search(tiny.begin(), tiny.end(), name.begin(), name.end());
  ASSERT_NE(at, tiny.end());
  const size_t type_pos = static_cast<size_t>(at - tiny.begin()) + name.size() + 4 + 2 * 8;
  bad = tiny;
  uint32_t type = 0;
  std::memcpy(&type, bad.data() + type_pos, 4);
  ASSERT_EQ(type, 8u);  // Q8_0 as written
  type = 16;            // IQ2_XXS
  std::memcpy(bad.data() + type_pos, &type, 4);
  const std::string path = *dir_ + "/iq2_xxs.gguf";
  WriteBytes(path, bad);
  Result<std::unique_ptr<Model>> m = Model::Load(path, ModelLoadOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("is IQ2_XXS"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find(name), std::string::npos) << m.status().message();

  // Cut inside the tensor data: the header's extents no longer fit.
  bad = good;
  bad.resize(good.size() - 100);
  WriteBytes(path, bad);
  m = Model::Load(path, ModelLoadOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("past the end"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace kestrel
