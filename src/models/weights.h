// The weights of a decoder-only model, backend-neutral: views into the memory-mapped safetensors
// (file dtype, never copied), grouped by the blocks a layer is made of. One layer reads
//   x += is_attention ? Attention(x) : GatedDeltaNet(x);   x += is_moe ? Moe(x) : Mlp(x)
// Each architecture file (arch_*.cpp) maps its checkpoint's tensor names onto these structs;
// the backends (cpu_decoder.cpp, cuda_decoder.cpp) compute the blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/large_array.h"
#include "core/status.h"
#include "core/tensor.h"
#include "models/config.h"
#include "models/safetensors.h"

namespace kestrel {

// Softmax attention over the paged KV cache.
struct AttentionWeights {
  // (n_heads*head_dim, hidden); with an output gate (n_heads*2*head_dim, hidden), each head's
  // rows being [query (head_dim) | gate (head_dim)].
  TensorView q_proj, q_bias;
  TensorView k_proj, k_bias;   // (n_kv_heads*head_dim, hidden), (n_kv_heads*head_dim)
  TensorView v_proj, v_bias;   // (n_kv_heads*head_dim, hidden), (n_kv_heads*head_dim)
  TensorView q_norm, k_norm;   // (head_dim): per-head RMSNorm before RoPE (Qwen3 family)
  TensorView o_proj, o_bias;   // (hidden, n_heads*head_dim), (hidden)
  int64_t sliding_window = 0;  // 0: full causal attention
};

// Gated DeltaNet (linear attention with a recurrent state). With nk key heads of dk, nv value
// heads of dv, r = nv / nk and conv_dim = 2*nk*dk + nv*dv, either (Qwen3.5)
//   in_proj_qkv (conv_dim, hidden): rows q (nk*dk) | k (nk*dk) | v (nv*dv)
//   in_proj_z   (nv*dv, hidden);  in_proj_b, in_proj_a (nv, hidden)
// or, fused per key head (Qwen3-Next),
//   in_proj_qkvz (nk*(2*dk + 2*r*dv), hidden): for each key head g, rows q_g | k_g | v_g | z_g
//                 (v_g, z_g: its r value heads)
//   in_proj_ba   (nk*2*r, hidden): for each key head g, b of its r value heads | a of them
struct DeltaNetWeights {
  TensorView in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;
  TensorView in_proj_qkvz, in_proj_ba;
  TensorView conv1d;    // (conv_dim, 1, kernel): depthwise causal conv over q|k|v channels
  TensorView a_log;     // (nv): decay rate, g = -exp(A_log) * softplus(a + dt_bias)
  TensorView dt_bias;   // (nv)
  TensorView norm;      // (dv): gated RMSNorm weight (plain, not 1 + w)
  TensorView out_proj;  // (hidden, nv*dv)
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)).
struct MlpWeights {
  TensorView gate_proj, gate_bias;  // (intermediate, hidden), (intermediate)
  TensorView up_proj, up_bias;      // (intermediate, hidden), (intermediate)
  TensorView down_proj, down_bias;  // (hidden, intermediate), (hidden)
  bool empty() const { return gate_proj.empty(); }
};

// Mixture of experts: softmax router over n_experts, top-k experts per token (weights
// renormalised when norm_topk_prob), plus an optional shared expert scaled by
// sigmoid(shared_expert_gate . x).
struct MoeWeights {
  TensorView router;                // (n_experts, hidden)
  std::vector<MlpWeights> experts;  // [n_experts], each (moe_intermediate, hidden) / (hidden, ...)
  MlpWeights shared_expert;         // empty when the model has none
  TensorView shared_expert_gate;    // (1, hidden), empty when none
};

struct DecoderLayerWeights {
  LayerType type = LayerType::kAttention;
  bool moe = false;
  TensorView input_norm;  // (hidden)
  TensorView post_norm;   // (hidden) before the MLP
  AttentionWeights attn;  // when type == kAttention
  DeltaNetWeights gdn;    // when type == kLinearAttention
  MlpWeights mlp;         // when !moe
  MoeWeights moe_w;       // when moe
};

// Multi-token-prediction head (Qwen3-Next / Qwen3.5 "mtp.*"), kept for speculative decoding:
//   h' = fc([norm_e(embed(t)) ; norm_h(h)]) -> layers -> norm -> LM head.
struct MtpWeights {
  TensorView fc;                                         // (hidden, 2*hidden)
  TensorView pre_fc_norm_embedding, pre_fc_norm_hidden;  // (hidden)
  std::vector<DecoderLayerWeights> layers;               // full-attention layers
  TensorView norm;                                       // (hidden)
  int64_t n_parameters = 0;
};

struct DecoderWeights {
  TensorView embed;       // (vocab, hidden)
  TensorView final_norm;  // (hidden)
  TensorView lm_head;     // (vocab, hidden); the embedding when tied
  std::vector<DecoderLayerWeights> layers;
  std::optional<MtpWeights> mtp;
  int64_t n_parameters = 0;  // of the decoder (tied embeddings once; MTP and skipped parts not)
  int64_t n_bytes = 0;
  std::vector<std::vector<float>> owned_scales;  // FP8 / MLX / int4 scales converted at bind time
  std::vector<std::vector<uint8_t>> owned_bytes;  // AWQ / GPTQ codes repacked at bind time
  LargeArray<uint8_t> packed_rows;  // CPU: the block weights' rows interleaved by 8, one arena
  // What the checkpoint holds that the decoder does not run, one line each (the vision tower of
  // a multimodal checkpoint, MTP heads), for `info` and the load log.
  std::vector<std::string> notes;
};

// Binds tensors of one WeightStore by name, checking shape and dtype (F32/F16/BF16), counting
// each tensor's parameters and bytes once, and remembering what was used so that a tensor the
// architecture does not know is an error instead of being silently ignored.
class WeightBinder {
 public:
  explicit WeightBinder(const WeightStore& store) : store_(store) {}
  // FP8 block-quantized checkpoints: an F8_E4M3 "<x>.weight" takes its scales from
  // "<x>.weight_scale_inv" ([ceil(rows / block_rows), ceil(cols / block_cols)], F32 or BF16).
  void set_fp8_blocks(int64_t rows, int64_t cols) {
    fp8_block_rows_ = rows;
    fp8_block_cols_ = cols;
  }
  // MLX affine-quantized checkpoints: a U32 "<x>.weight" with "<x>.scales" and "<x>.biases".
  void set_mlx(const ModelConfig::MlxQuant* mlx) { mlx_ = mlx; }
  // AWQ / GPTQ int4: "<x>.qweight" + "<x>.qzeros" + "<x>.scales" (+ "<x>.g_idx") instead of
  // "<x>.weight", repacked at bind time into a kMlxQ4 view.
  void set_int4(const std::string& method, int64_t group_size) {
    int4_method_ = method;
    int4_group_size_ = group_size;
  }
  std::vector<std::vector<uint8_t>> TakeOwnedBytes() { return std::move(owned_bytes_); }
  // Scales converted to f32 at bind time (BF16 files); the views point into them.
  std::vector<std::vector<float>> TakeOwnedScales() { return std::move(owned_scales_); }

  bool Has(const std::string& name) const {
    return store_.Has(name) || (!int4_method_.empty() && name.ends_with(".weight") &&
                                store_.Has(name.substr(0, name.size() - 7) + ".qweight"));
  }
  // The tensor with exactly this shape.
  Status Get(const std::string& name, std::vector<int64_t> shape, TensorView* out);
  // Like Get when present; an empty view when absent.
  Status GetOptional(const std::string& name, std::vector<int64_t> shape, TensorView* out);
  // Known tensors this model does not run (counted in no total), with a note for the log.
  void Skip(const std::string& prefix, const std::string& note);
  // Tensors and parameters under a name prefix.
  std::pair<int64_t, int64_t> CountPrefix(const std::string& prefix) const;
  // InvalidArgument naming (up to 8 of) the tensors neither bound nor skipped.
  Status CheckAllUsed(const std::string& architecture) const;

  // Totals of what was bound since construction or the last Reset of the counters.
  int64_t n_parameters() const { return n_parameters_; }
  int64_t n_bytes() const { return n_bytes_; }
  const std::vector<std::string>& notes() const { return notes_; }
  // Copies of the binder's state, to bind something optional and roll back on failure.
  struct Mark {
    std::set<std::string> used;
    int64_t n_parameters, n_bytes;
  };
  Mark Save() const { return {used_, n_parameters_, n_bytes_}; }
  void Restore(Mark m) {
    used_ = std::move(m.used);
    n_parameters_ = m.n_parameters;
    n_bytes_ = m.n_bytes;
  }

 private:
  const WeightStore& store_;
  std::set<std::string> used_;
  std::vector<std::string> skipped_prefixes_;
  std::vector<std::string> notes_;
  int64_t n_parameters_ = 0;
  int64_t n_bytes_ = 0;
  int64_t fp8_block_rows_ = 0, fp8_block_cols_ = 0;
  const ModelConfig::MlxQuant* mlx_ = nullptr;
  std::string int4_method_;
  int64_t int4_group_size_ = 0;
  std::vector<std::vector<uint8_t>> owned_bytes_;
  Status GetInt4(const std::string& base, const std::vector<int64_t>& shape, TensorView* out);
  Status GetMlx(const std::string& name, const std::vector<int64_t>& shape, const TensorView& packed,
                TensorView* out);
  // A copy of an F32/F16/BF16 tensor as f32, owned by the binder; its data.
  Result<const float*> OwnedF32(const std::string& name, std::vector<int64_t> shape);
  std::vector<std::vector<float>> owned_scales_;
};

// Rows [row_begin, row_begin + n_rows) of matrix `index` of a 3-D tensor [n, rows, cols], as a
// 2-D view (fused expert weights).
TensorView SliceMatrixRows(const TensorView& t, int64_t index, int64_t row_begin, int64_t n_rows);

// Binds every tensor of the architecture's checkpoint layout (arch_*.cpp), then checks that
// nothing is left over.
Result<DecoderWeights> BindDecoderWeights(const ModelConfig& config, const WeightStore& store);

// Checks shared by every backend before a decoder is built (sizes, head grouping, rotary
// dimension, block size, KV capacity).
struct ModelLoadOptions;
Status ValidateDecoderConfig(const ModelConfig& config, const ModelLoadOptions& options);

namespace arch {
// Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE (arch_llama.cpp).
Status BindLlamaFamily(const ModelConfig& c, WeightBinder& b, DecoderWeights* w);
// Qwen3-Next, Qwen3.5, Qwen3.5-MoE (arch_qwen3_next.cpp).
Status BindQwen3NextFamily(const ModelConfig& c, WeightBinder& b, DecoderWeights* w);
// The embedding, final norm and LM head (the embedding when tied) under root ("model.", ...).
Status BindEmbeddingsAndHead(const ModelConfig& c, WeightBinder& b, const std::string& root,
                             DecoderWeights* w);
// Pieces both use: SwiGLU MLP at prefix ("<p>gate_proj.weight", ...) and the MoE block.
Status BindMlp(WeightBinder& b, const std::string& prefix, int64_t hidden, int64_t intermediate,
               bool bias, MlpWeights* out);
Status BindMoe(const ModelConfig& c, WeightBinder& b, const std::string& prefix, MoeWeights* out);
// Attention at prefix ("<p>q_proj.weight", ...): biases, QK-norm and the output gate as the
// config says.
Status BindAttention(const ModelConfig& c, WeightBinder& b, const std::string& prefix,
                     AttentionWeights* out);
}  // namespace arch

}  // namespace kestrel
