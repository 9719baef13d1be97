// The CLI checked from outside: exit codes, one-line errors, JSON-lines protocols.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "run_process.h"

namespace kestrel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSource = KESTREL_SOURCE_DIR;
const std::string kQwen3Tok = kSource + "/tests/data/npm/qwen3";
const std::string kQwen3Fixture = kSource + "/tests/data/models/qwen3";

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::vector<json> JsonLines(const std::string& s) {
  std::vector<json> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kestrel_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

TEST(Cli, NoVerbIsAOneLineErrorWithExit2) {
  ProcessResult r = RunKestrel({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("kestrel: error:"), std::string::npos);
}

TEST(Cli, UnknownFlagIsAOneLineError) {
  ProcessResult r = RunKestrel({"generate", "--prompt", "x", "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, BadFlagValueIsAOneLineError) {
  ProcessResult r = RunKestrel({"generate", "--prompt", "x", "--max-tokens", "many"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
}

TEST(Cli, NegativePrefillCapIsAOneLineError) {
  ProcessResult r = RunKestrel({"serve", "--max-prefill-beside-decodes", "-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--max-prefill-beside-decodes must be >= 0"), std::string::npos) << r.err;
}

TEST(Cli, UnknownDeviceIsAOneLineError) {
  for (const char* verb : {"generate", "logits", "bench", "serve"}) {
    std::vector<std::string> args{verb, "--device", "gpu"};
    if (std::string(verb) == "generate") args.insert(args.end(), {"--prompt", "x"});
    if (std::string(verb) == "logits") args.insert(args.end(), {"--ids", "1,2"});
    ProcessResult r = RunKestrel(args);
    EXPECT_EQ(r.exit_code, 1) << verb;
    EXPECT_EQ(CountLines(r.err), 1) << verb << ": " << r.err;
    EXPECT_NE(r.err.find("--device must be cpu, cuda or auto"), std::string::npos) << r.err;
  }
}

// --device cuda never falls back to the CPU: without a usable GPU (or without the CUDA backend in
// this build) it fails with one line saying why.
TEST(Cli, CudaWithoutAGpuSaysWhyAndDoesNotFallBack) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "this machine has a GPU";
  for (const char* verb : {"generate", "bench", "serve"}) {
    std::vector<std::string> args{verb, "--device", "cuda"};
    if (std::string(verb) == "generate") args.insert(args.end(), {"--prompt", "x"});
    ProcessResult r = RunKestrel(args);
    EXPECT_EQ(r.exit_code, 1) << verb;
    EXPECT_EQ(CountLines(r.err), 1) << verb << ": " << r.err;
    EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << verb;
  }
}

TEST(Cli, MissingModelDirectory) {
  ProcessResult r = RunKestrel({"generate", "--model", "/nonexistent/model", "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, MalformedConfigNamesTheFile) {
  fs::path dir = TempDir("badcfg");
  WriteFile(dir / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"], ");
  ProcessResult r = RunKestrel({"info", "--model", dir.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  fs::remove_all(dir);
}

TEST(Cli, UnsupportedArchitectureListsSupportedOnes) {
  fs::path dir = TempDir("badarch");
  WriteFile(dir / "config.json", R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10})");
  ProcessResult r = RunKestrel({"info", "--model", dir.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("GPT2LMHeadModel"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Qwen3ForCausalLM"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(Cli, TokenizeAndDecodeRoundTrip) {
  ProcessResult enc = RunKestrel({"tokenize", "--model", kQwen3Tok},
                                 "{\"text\": \"Hello, world! def f(x):\\n\\treturn x\"}\n"
                                 "{\"text\": \"<|im_start|>user\\nhé 你好<|im_end|>\"}\n");
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  std::vector<json> lines = JsonLines(enc.out);
  ASSERT_EQ(lines.size(), 2u);
  // <|im_start|> is matched as one special token in the text.
  EXPECT_EQ(lines[1]["ids"][0], 151644);
  std::string dec_in;
  for (const json& l : lines) dec_in += json{{"ids", l["ids"]}}.dump() + "\n";
  ProcessResult dec = RunKestrel({"tokenize", "--model", kQwen3Tok, "--decode"}, dec_in);
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  std::vector<json> texts = JsonLines(dec.out);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0]["text"], "Hello, world! def f(x):\n\treturn x");
  EXPECT_EQ(texts[1]["text"], "<|im_start|>user\nhé 你好<|im_end|>");
}

TEST(Cli, TokenizeAnswersEveryLineAndFlagsBadOnes) {
  ProcessResult r = RunKestrel({"tokenize", "--model", kQwen3Tok},
                               "{\"text\": \"a\"}\nnot json\n{\"txt\": 1}\n{\"text\": \"b\"}\n");
  EXPECT_EQ(r.exit_code, 1);
  std::vector<json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_TRUE(lines[0].contains("ids"));
  EXPECT_TRUE(lines[1].contains("error"));
  EXPECT_TRUE(lines[2].contains("error"));
  EXPECT_TRUE(lines[3].contains("ids"));
}

TEST(Cli, DecodeRejectsIdsOutsideTheVocabulary) {
  ProcessResult r = RunKestrel({"tokenize", "--model", kQwen3Tok, "--decode"},
                               "{\"ids\": [9999999]}\n{\"ids\": [-1]}\n");
  EXPECT_EQ(r.exit_code, 1);
  std::vector<json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].contains("error"));
  EXPECT_TRUE(lines[1].contains("error"));
}

TEST(Cli, RenderChatQwen3) {
  json req = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
              {"tools", nullptr},
              {"add_generation_prompt", true},
              {"kwargs", {{"enable_thinking", false}}}};
  ProcessResult r = RunKestrel({"render-chat", "--model", kQwen3Tok}, req.dump() + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["rendered"],
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(Cli, RenderChatReportsTemplateErrorsPerLine) {
  // A line with the wrong shape gets an error; the next line is still answered.
  json bad = {{"messages", "not a list"}};
  json good = {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
               {"add_generation_prompt", false}};
  ProcessResult r =
      RunKestrel({"render-chat", "--model", kQwen3Tok}, bad.dump() + "\n" + good.dump() + "\n");
  EXPECT_EQ(r.exit_code, 1);
  std::vector<json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].contains("error"));
  EXPECT_EQ(lines[1]["rendered"], "<|im_start|>user\nx<|im_end|>\n");
}

TEST(Cli, LogitsMatchTheTransformersReference) {
  std::ifstream ref_file(kQwen3Fixture + "/reference.json");
  ASSERT_TRUE(ref_file) << "missing fixture " << kQwen3Fixture << " (tools/make_fixtures.py)";
  json ref = json::parse(ref_file);
  std::vector<int> prompt = ref["prompts"][0];
  std::string ids;
  for (int id : prompt) {
    if (!ids.empty()) ids.push_back(',');
    ids.append(std::to_string(id));
  }
  ProcessResult r = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", ids, "--greedy", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["argmax"], ref["argmax"][0]);
  std::vector<int> greedy = out["greedy"];
  std::vector<int> ref_greedy = ref["greedy"][0];
  ref_greedy.resize(8);
  EXPECT_EQ(greedy, ref_greedy);
  EXPECT_EQ(out["last_logits"].size(), static_cast<size_t>(ref["logits_shape"][0][1]));
}

TEST(Cli, LogitsRejectsBadIds) {
  ProcessResult r = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", "1,x,3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  ProcessResult r2 = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", "99999999"});
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_EQ(CountLines(r2.err), 1) << r2.err;
}

TEST(Cli, InfoDescribesTheModel) {
  ProcessResult r = RunKestrel({"info", "--model", kQwen3Fixture});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["architecture"], "Qwen3ForCausalLM");
  EXPECT_GT(out["parameters"].get<int64_t>(), 0);
}

// A GGUF file (written by tools/make_gguf.py from the embedded model, Q4_K_M mix) in place of a
// model directory: info shows the format and bytes per type, generate and logits run, and a
// truncated file is one line of error.
TEST(Cli, GgufFileIsAModel) {
  fs::path dir = TempDir("gguf");
  const std::string gguf = (dir / "tiny.gguf").string();
  const std::string cmd = "/usr/bin/python3 " + kSource + "/tools/make_gguf.py --model " + kSource +
                          "/models/kestrel-tiny --type q4_k_m --out " + gguf;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ProcessResult info = RunKestrel({"info", "--model", gguf});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  json out = json::parse(info.out);
  EXPECT_EQ(out["format"], "gguf");
  EXPECT_GT(out["dtype_bytes"]["Q4_K"].get<int64_t>(), 0);
  EXPECT_GT(out["dtype_bytes"]["Q6_K"].get<int64_t>(), 0);
  EXPECT_EQ(out["parameters"], json::parse(RunKestrel({"info", "--model", kSource + "/models/kestrel-tiny"}).out)["parameters"]);

  ProcessResult gen = RunKestrel({"generate", "--model", gguf, "--device", "cpu", "--chat", "--prompt",
                                  "Hello", "--max-tokens", "8"});
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_FALSE(gen.out.empty());

  // bench counts the multiply-adds from the shapes: the quantized file's prefill does the work
  // of the bf16 model's (flops = gflop_per_s * seconds), whatever its bytes.
  auto prefill_flops = [](const std::string& model) {
    ProcessResult r = RunKestrel({"bench", "--model", model, "--device", "cpu", "--prefill", "8",
                                  "--decode-context", "8", "--decode-tokens", "2", "--repeats", "1",
                                  "--threads", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json p = json::parse(r.out)["prefill"][0];
    EXPECT_GT(p["gflop_per_s"].get<double>(), 0) << r.out;
    return p["gflop_per_s"].get<double>() * p["seconds"].get<double>();
  };
  const double bf16_flops = prefill_flops(kSource + "/models/kestrel-tiny");
  EXPECT_NEAR(prefill_flops(gguf), bf16_flops, 1e-9 * bf16_flops);

  fs::resize_file(gguf, fs::file_size(gguf) - 1000);
  ProcessResult bad = RunKestrel({"logits", "--model", gguf, "--device", "cpu", "--ids", "1,2"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(CountLines(bad.err), 1) << bad.err;
  EXPECT_NE(bad.err.find("tiny.gguf"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

TEST(Cli, NegativeThreadCountsAreAOneLineError) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"serve"}, {"generate", "--prompt", "x"}, {"bench"}}) {
    const std::string verb = args[0];
    for (const char* a : {"--model", kQwen3Fixture.c_str(), "--threads", "-3"}) args.push_back(a);
    ProcessResult r = RunKestrel(args);
    EXPECT_EQ(r.exit_code, 1) << verb << ": " << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  }
}

TEST(Cli, KvCacheDTypeInt8AndBf16RunAndOthersAreOneLineErrors) {
  ProcessResult ok = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", "1,2,3,4,5",
                                 "--greedy", "4", "--kv-cache-dtype", "int8"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out)["greedy"].size(), 4u);
  ProcessResult bf16 = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", "1,2,3,4,5",
                                   "--greedy", "4", "--kv-cache-dtype", "bf16"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_EQ(json::parse(bf16.out)["greedy"].size(), 4u);
  for (const char* bad : {"fp8", "int4", "f16"}) {
    ProcessResult r = RunKestrel({"logits", "--model", kQwen3Fixture, "--ids", "1,2",
                                  "--kv-cache-dtype", bad});
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("kv-cache-dtype"), std::string::npos) << r.err;
  }
}

TEST(Cli, BenchBeyondTheContextIsAOneLineError) {
  ProcessResult r = RunKestrel({"bench", "--model", kQwen3Fixture, "--device", "cpu",
                                "--decode-context", "1000000"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

TEST(Cli, InfoDescribesAHybridModel) {
  ProcessResult r = RunKestrel({"info", "--model", kSource + "/tests/data/models/qwen3_5_vl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["architecture"], "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(out["layer_types"],
            json({"linear_attention", "linear_attention", "linear_attention", "full_attention"}));
  EXPECT_EQ(out["attention_layers"], 1);
  EXPECT_EQ(out["recurrent_layers"], 3);
  const json& l = out["linear_attention"];
  const int64_t conv_dim = 2 * l["key_heads"].get<int64_t>() * l["key_head_dim"].get<int64_t>() +
                           l["value_heads"].get<int64_t>() * l["value_head_dim"].get<int64_t>();
  const int64_t per_layer =
      (l["conv_kernel"].get<int64_t>() - 1) * conv_dim + l["value_heads"].get<int64_t>() *
                                                            l["key_head_dim"].get<int64_t>() *
                                                            l["value_head_dim"].get<int64_t>();
  EXPECT_EQ(out["state_bytes_per_sequence_f32"], 3 * per_layer * 4);
  EXPECT_LE(out["state_snapshots_in_budget"].get<int64_t>(), 4096);
  // Weights + the KV of one full context + one sequence's state.
  EXPECT_EQ(out["memory_bytes_full_context"].get<int64_t>(),
            out["weight_bytes"].get<int64_t>() +
                out["context_length"].get<int64_t>() * out["kv_bytes_per_token_f32"].get<int64_t>() +
                out["state_bytes_per_sequence_f32"].get<int64_t>());
  bool vision_note = false;
  for (const json& n : out["notes"]) vision_note |= n.get<std::string>().find("vision") != std::string::npos;
  EXPECT_TRUE(vision_note) << r.out;
}

TEST(Cli, TruncatedWeightsAreAOneLineError) {
  fs::path dir = TempDir("trunc");
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(kQwen3Fixture + "/" + f, dir / f);
  }
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  ProcessResult r = RunKestrel({"logits", "--model", dir.string(), "--ids", "1,2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  fs::remove_all(dir);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The verbs end to end against the goldens: every corpus line through `tokenize`, every chat
// case through `render-chat` (the JSON-lines path keeps the key order the input was written in).
TEST(Cli, TokenizeVerbMatchesHfGoldens) {
  for (std::string name : {"qwen3", "llama3"}) {
    std::string corpus = ReadAll(kSource + "/tests/data/tokenizer/corpus.jsonl");
    std::vector<json> golden = JsonLines(ReadAll(kSource + "/tests/data/tokenizer/golden_" + name + ".jsonl"));
    ProcessResult r = RunKestrel({"tokenize", "--model", kSource + "/tests/data/npm/" + name}, corpus);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<json> out = JsonLines(r.out);
    ASSERT_EQ(out.size(), golden.size());
    int mismatches = 0;
    for (size_t i = 0; i < out.size(); ++i) mismatches += out[i]["ids"] != golden[i]["ids"];
    EXPECT_EQ(mismatches, 0) << name;
  }
}

TEST(Cli, RenderChatVerbMatchesTransformersGoldens) {
  for (std::string name : {"qwen3", "llama3"}) {
    std::string cases = ReadAll(kSource + "/tests/data/chat/cases.jsonl");
    std::vector<json> golden = JsonLines(ReadAll(kSource + "/tests/data/chat/golden_" + name + ".jsonl"));
    ProcessResult r = RunKestrel({"render-chat", "--model", kSource + "/tests/data/npm/" + name}, cases);
    std::vector<json> out = JsonLines(r.out);
    ASSERT_EQ(out.size(), golden.size()) << r.err;
    int mismatches = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (golden[i].contains("rendered")) {
        mismatches += !out[i].contains("rendered") || out[i]["rendered"] != golden[i]["rendered"];
      } else {
        mismatches += !out[i].contains("error");
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

}  // namespace
}  // namespace kestrel::testing
