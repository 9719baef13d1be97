// Test helpers for the model layer:
//  * TinyModelSpec / WriteTinyModel: a small random model directory (config.json +
//    model.safetensors) written from C++, so forward tests need no fixtures;
//  * NaiveForward: an independent dense implementation (plain loops in double, no paging, no
//    kernels of the engine) giving the logits of every position of one sequence;
//  * SeqRunner: a minimal scheduler that drives Model::Forward with flattened multi-sequence
//    batches through its own block allocator (block ids in any order); on recurrent-state
//    models sequence i keeps its state in slot i.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/model.h"

namespace kestrel::testing {

struct TinyModelSpec {
  std::string architecture = "LlamaForCausalLM";  // or Mistral / Qwen2 / Qwen3ForCausalLM
  int64_t vocab = 101;
  int64_t hidden = 48;
  int64_t intermediate = 72;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 12;  // may differ from hidden / n_heads
  int64_t max_position = 256;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  bool attention_bias = false;  // Qwen2 has q/k/v biases regardless
  std::optional<int64_t> sliding_window;  // Mistral
  DType dtype = DType::kBF16;
  uint32_t seed = 1;
  // For load-error tests: a tensor left out of the file, and one written with an extra row.
  std::string omit_tensor;
  std::string grow_tensor;

  bool qk_norm() const { return architecture == "Qwen3ForCausalLM"; }
  bool qkv_bias() const { return architecture == "Qwen2ForCausalLM" || attention_bias; }
  bool o_bias() const {
    return attention_bias && architecture != "Qwen2ForCausalLM" &&
           architecture != "MistralForCausalLM";
  }
};

// Tensor name -> values (after rounding to spec.dtype), row-major.
using TensorMap = std::map<std::string, std::vector<float>>;

// Writes config.json and model.safetensors into `dir` (created if needed); returns the weights.
TensorMap WriteTinyModel(const std::string& dir, const TinyModelSpec& spec);

// Writes a safetensors file holding `tensors` (name -> (shape, values)) in `dtype`.
struct TensorToWrite {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
void WriteSafetensors(const std::string& path, const std::map<std::string, TensorToWrite>& tensors,
                      DType dtype);

// Logits [tokens.size(), vocab] of every position, computed densely in double.
std::vector<std::vector<double>> NaiveForward(const TinyModelSpec& spec, const TensorMap& w,
                                              const std::vector<int32_t>& tokens);

// A fresh empty directory under the system temp dir.
std::string MakeTempDir(const std::string& tag);

// Every physical KV block of the model, last first (so block ids differ from sequence order).
std::vector<int32_t> ReversedBlocks(const Model& m);

// Drives Forward with several sequences at once; each Step entry takes the next n tokens of a
// sequence (prompt first, then appended tokens) and returns the logits of each of those tokens.
class SeqRunner {
 public:
  // free_blocks: the physical block ids to hand out, in order.
  SeqRunner(Model* model, std::vector<int32_t> free_blocks);

  int AddSequence(std::vector<int32_t> tokens);
  void Append(int seq, int32_t token) { seqs_[static_cast<size_t>(seq)].tokens.push_back(token); }
  int64_t n_computed(int seq) const { return seqs_[static_cast<size_t>(seq)].n_computed; }
  int64_t n_tokens(int seq) const {
    return static_cast<int64_t>(seqs_[static_cast<size_t>(seq)].tokens.size());
  }

  struct Work {
    int seq;
    int64_t n_tokens;
  };
  // Result [entry][token][vocab].
  std::vector<std::vector<std::vector<float>>> Step(const std::vector<Work>& work);

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t n_computed = 0;
    std::vector<int32_t> blocks;
  };
  Model* model_;
  std::vector<int32_t> free_blocks_;
  size_t next_free_ = 0;
  std::vector<Seq> seqs_;
};

// Row-wise comparison helpers.
int32_t Argmax(const std::vector<float>& row);
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);
double Range(const std::vector<float>& row);
// The largest value minus the second largest.
double TopMargin(const std::vector<float>& row);

}  // namespace kestrel::testing
