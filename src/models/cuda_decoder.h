// The decoder's math on one CUDA GPU: what the layers compute, over device pointers the runner
// (cuda_runner.h) hands it. The runner owns every allocation (weights, activations, KV pool,
// batch metadata), the stream, graphs, sampling and profiling; this file only lays its tensors
// out inside them and launches the kernels of one step.
//
// Numerics (DESIGN.md): bf16 weights (or the quantized formats of cuda_weight_plan.h for the
// linear layers) and bf16 GEMM inputs with f32 accumulation; the residual
// stream, norms, RoPE and softmax in f32; the KV cache in bf16. One step:
//   embed -> n_layers x [add+RMSNorm -> fused q|k|v GEMM -> (+bias, QK-norm, RoPE, KV write)
//   -> paged attention -> o_proj GEMM -> add+RMSNorm -> fused gate|up GEMM -> SiLU*up -> down GEMM]
//   -> add -> gather+RMSNorm of the logits rows -> LM head GEMM.
// Biases are added inside the kernel that consumes each GEMM's output, so every GEMM is plain.
//
// Layers supported here: softmax attention (GQA, q/k/v biases, QK-norm, sliding windows; the
// gated attention of Qwen3.5 with partial RoPE and (1 + w) norms) and Gated DeltaNet layers
// (Qwen3.5's separate in_proj_qkv / z / b / a, backends/cuda/deltanet.h, the delta rule in its
// recurrent form for prefill and decode alike; Qwen3-Next's fused in_proj_qkvz / in_proj_ba are
// re-laid into the same q|k|v|z|b|a rows at upload), each followed by a dense SwiGLU MLP or a
// mixture of experts (backends/cuda/moe.h): Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Qwen3.5,
// Qwen3.5-MoE, Qwen3-Next.
//
// A MoE channel mixer:  [router | shared-expert gate] GEMM -> shared expert (gate|up GEMM ->
//   SiLU*up -> down GEMM) -> softmax top-k + counting sort by expert -> grouped gate|up GEMM over
//   the routed experts only -> SiLU*up -> grouped down GEMM -> weighted sum per token
//   (+ sigmoid(gate) * shared). Decode-sized steps compute SiLU*up in the grouped gate|up
//   kernel; when the shared expert has the routed experts' shape it rides along as one of them
//   in steps of up to 8 tokens, and larger steps take its gate|up and the router as one GEMM.
//
// A hybrid step:  [attention layer as above, with q|gate split and sigmoid(gate) * attention]
//   or [add+RMSNorm -> fused in_proj GEMM (qkv | z | b | a) -> causal conv + SiLU (window from
//   the sequence's state slot) -> q/k L2 norm, gates -> gated delta rule (state slot) -> gated
//   RMSNorm * SiLU(z) -> out_proj GEMM], then the MLP.
#pragma once

#ifdef KESTREL_HAS_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <memory>
#include <vector>

#include "backends/cuda/device_buffer.h"
#include "backends/cuda/kv_cache.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/moe.h"
#include "core/status.h"
#include "core/tensor.h"
#include "models/config.h"
#include "models/cuda_weight_plan.h"
#include "models/weights.h"

namespace kestrel {

// Batch metadata as the kernels read it, at fixed offsets of one int32 device array.
struct DeviceBatchView {
  const int32_t* token_ids = nullptr;      // [n_tokens]
  const int32_t* positions = nullptr;      // [n_tokens]
  const int32_t* slot_mapping = nullptr;   // [n_tokens]
  const int32_t* seq_starts = nullptr;     // [n_seqs + 1]
  const int32_t* context_lens = nullptr;   // [n_seqs]
  const int32_t* block_tables = nullptr;   // [n_seqs, max_blocks_per_seq]
  const int32_t* logits_rows = nullptr;    // [n_logits]
  const int32_t* sampled_rows = nullptr;   // [n_tokens] (Batch::sampled_rows) or null
  const int32_t* state_slots = nullptr;    // [n_seqs] recurrent-state models, else null
  const int32_t* snapshot_slot = nullptr;  // [n_tokens] state snapshot after the row, or -1
  int32_t n_tokens = 0, n_seqs = 0, n_logits = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t max_query_len = 0, max_context_len = 0;
};

// Stage timing the runner collects into ForwardStats (CUDA events; no-op unless profiling).
enum class CudaStage { kAttention, kRecurrent, kMatmul, kMoe, kOther };
class CudaStageMarks {
 public:
  virtual ~CudaStageMarks() = default;
  virtual void Mark(CudaStage s) = 0;
};

// The paged KV pool of the attention layers (cuda::KvCacheType: bf16, or e4m3 / int8 codes with
// an f32 scale per (token, kv head) row): per attention layer K then V, each
// [n_blocks + 1, n_kv_heads, block_size, head_dim] elements from `base`, and for the quantized
// types the scales of every cache after all the data, each [n_blocks + 1, n_kv_heads,
// block_size] from `scale_base`. Block n_blocks is reserved for the padding rows of graph
// buckets (never handed out).
struct CudaKvPool {
  uint8_t* base = nullptr;
  int64_t bytes_per_cache = 0;  // (n_blocks + 1) * block_size * n_kv_heads * head_dim * element
  float* scale_base = nullptr;  // quantized types only
  int64_t rows_per_cache = 0;   // (n_blocks + 1) * block_size * n_kv_heads
  cuda::KvCacheType type = cuda::KvCacheType::kBf16;
  int32_t block_size = 16;
  int32_t n_blocks = 0;
  // Cache c = 2 * attention_index (K) or 2 * attention_index + 1 (V).
  uint8_t* data(int64_t c) const { return base + c * bytes_per_cache; }
  float* scales(int64_t c) const {
    return scale_base == nullptr ? nullptr : scale_base + c * rows_per_cache;
  }
  cuda::KvCacheOut layer(int64_t attention_index) const {
    return {data(2 * attention_index), data(2 * attention_index + 1), scales(2 * attention_index),
            scales(2 * attention_index + 1), type};
  }
};

// The recurrent state slots (models/cache_spec.h), f32: slot s holds every recurrent layer's conv
// window then delta-rule state; one slot past n_slots is reserved for graph padding rows.
struct CudaStatePool {
  float* base = nullptr;
  int64_t slot_floats = 0;
  int64_t layer_floats = 0;
  int64_t conv_floats = 0;
};

class CudaDecoder {
 public:
  // Decode rows the attention kernel's split-K workspace is sized for; larger pure-decode
  // batches take the prefill kernel, which needs none.
  static constexpr int32_t kMaxDecodeAttentionRows = 256;
  // Steps with a sequence of at least this many rows, and at most kChunkedDeltaRuleMaxSeqs
  // sequences, take the chunked delta rule.
  static constexpr int32_t kChunkedDeltaRuleMinRows = 32;
  static constexpr int32_t kChunkedDeltaRuleMaxSeqs = 64;
  // MoE steps of at least this many tokens run the expert GEMMs as MoeGroupedGemm (tiles of 128
  // rows of an expert); fewer take MoeLinear (weights streamed once per 64 rows).
  static constexpr int32_t kMoeGemmMinTokens = 128;

  // Unsupported (one line, naming the layer and what it lacks) for layers this file does not
  // run, or weights other than BF16.
  static Result<std::unique_ptr<CudaDecoder>> Create(const ModelConfig& config,
                                                     const DecoderWeights& weights);

  // Batch-invariant mode (`--deterministic`): attention takes the prefill kernel for every
  // batch, decode rows included, so a row's result depends on its own sequence only (the decode
  // kernel's split-K order and the mixed batch's prefill kernel differ in the last bits). The
  // runner pairs it with LinearEngine::set_batch_invariant and refuses the layers that have no
  // batch-invariant form here (recurrent, MoE).
  void set_batch_invariant(bool on) { batch_invariant_ = on; }

  // Weights: the runner collects the placement of every tensor, uploads them, then hands the
  // base address back.
  void PlanWeights(CudaWeightPlan* plan);
  void BindWeights(const uint8_t* base);
  // RoPE tables and other small constants (after BindWeights).
  Status UploadConstants();

  // Widths the activation layout needs beyond the config.
  struct LayoutDims {
    int64_t q_dim, fused_width, mlp_inter, router_width, n_moe_layers;
    bool gated, recurrent, moe_shared_slot;
  };

  // Activations for n_tokens rows, logits for n_logits rows, attention over contexts up to
  // max_context tokens: bytes to allocate and their layout inside one allocation.
  size_t ActivationBytes(int32_t n_tokens, int32_t n_logits, int32_t max_context) const;
  void BindActivations(uint8_t* base, int32_t n_tokens, int32_t n_logits, int32_t max_context);
  float* logits() const { return logits_; }  // [n_logits capacity, vocab] f32

  // Everything from the embedding to the LM head logits of the first `lm_head_rows` of
  // v.logits_rows (into logits()).
  void Forward(const DeviceBatchView& v, int32_t lm_head_rows, const CudaKvPool& kv,
               const CudaStatePool& state, cudaStream_t stream, cuda::LinearEngine* linear,
               CudaStageMarks* marks);
  // The final norm + LM head of `rows` further logits rows (after Forward, same batch).
  void LmHead(const int32_t* logits_rows, int32_t rows, cudaStream_t stream,
              cuda::LinearEngine* linear, CudaStageMarks* marks);

  int64_t n_attention_layers() const { return n_attention_layers_; }
  int64_t n_recurrent_layers() const { return n_recurrent_layers_; }
  // MoE layers, the bytes of one routed expert (gate, up and down), and per MoE layer the
  // number of experts the last Forward routed rows to (device array, [n_moe_layers]).
  int64_t n_moe_layers() const { return n_moe_layers_; }
  int64_t moe_expert_bytes() const;
  // Experts a token's rows go through in a MoE layer of a step of n tokens: top_k, + 1 when the
  // shared expert runs as one of them (UseSharedSlot).
  int64_t moe_picks(int32_t n_tokens) const {
    return c_.moe.top_k + (UseSharedSlot(n_tokens) ? 1 : 0);
  }
  // Whether the LM head is the (bf16) embedding table itself (tied, unquantized).
  bool head_is_embedding() const {
    return head_plan_.size() == 1 && head_plan_[0].data == embed_off_;
  }
  const int32_t* moe_active_log() const { return moe_active_log_; }

 private:
  // Device pointers of one layer's weights (bf16, inside the runner's weight allocation).
  struct LayerWeights {
    const __nv_bfloat16* input_norm = nullptr;  // (hidden)
    cuda::Weight qkv;         // (q_dim + 2*kv_dim, hidden): q|k|v
    const __nv_bfloat16* qkv_bias = nullptr;    // (q_dim + 2*kv_dim) or null
    const __nv_bfloat16* q_norm = nullptr;      // (head_dim) or null
    const __nv_bfloat16* k_norm = nullptr;      // (head_dim) or null
    cuda::Weight o_proj;      // (hidden, q_dim)
    const __nv_bfloat16* o_bias = nullptr;      // (hidden) or null
    const __nv_bfloat16* post_norm = nullptr;   // (hidden)
    cuda::Weight gate_up;     // (2*intermediate, hidden): gate|up
    const __nv_bfloat16* gate_bias = nullptr;   // (intermediate) or null
    const __nv_bfloat16* up_bias = nullptr;     // (intermediate) or null
    cuda::Weight down;        // (hidden, intermediate)
    const __nv_bfloat16* down_bias = nullptr;   // (hidden) or null
    int32_t sliding_window = 0;
    int64_t attention_index = 0;  // its K/V caches in the pool
    // Gated DeltaNet layers: in_proj (conv_dim + value_dim + 2*nv, hidden) = qkv|z|b|a, out_proj
    // (hidden, value_dim) bf16; f32 constants in small_.
    bool recurrent = false;
    int64_t recurrent_index = 0;
    cuda::Weight in_proj;
    cuda::Weight out_proj;
    const float* conv_w = nullptr;     // [conv_dim, K]
    const float* neg_exp_a = nullptr;  // [nv] -exp(A_log)
    const float* dt_bias = nullptr;    // [nv]
    const float* gdn_norm = nullptr;   // [dv]
    // MoE layers: router (n_experts (+1 shared-expert gate row), hidden); the experts one after
    // the other, gate|up (n_experts, 2*moe_inter, hidden) and down (n_experts, hidden,
    // moe_inter), the shared expert as expert n_experts when it has their shape
    // (moe_shared_slot_; the router's rows then follow its gate|up, in bf16); its gate|up
    // (2*shared_inter, hidden) and down (those of the slot, or its own).
    bool moe = false;
    int64_t moe_index = 0;
    cuda::Weight router;
    const __nv_bfloat16* experts_gate_up = nullptr;
    const __nv_bfloat16* experts_down = nullptr;
    cuda::Weight shared_gate_up;
    cuda::Weight shared_down;
    // With the shared slot: [shared gate|up (2*moe_inter) | router | shared gate] rows, bf16.
    cuda::Weight shared_router;
  };
  struct LayerOffsets {
    static constexpr size_t kNone = CudaWeightPlan::kNone;
    size_t input_norm = kNone, qkv_bias = kNone, q_norm = kNone, k_norm = kNone, o_bias = kNone,
           post_norm = kNone, gate_bias = kNone, up_bias = kNone, down_bias = kNone,
           experts_gate_up = kNone, experts_down = kNone;
    // Float offsets in small_host_.
    size_t conv_w = 0, neg_exp_a = 0, dt_bias = 0, gdn_norm = 0;
    // Linear weights in their device formats.
    CudaWeightPlan::Linear qkv, o_proj, gate_up, down, in_proj, out_proj, router, shared_gate_up,
        shared_down;
  };

  CudaDecoder(const ModelConfig& config, const DecoderWeights& weights);
  void Layer(int64_t layer, const DeviceBatchView& v, const CudaKvPool& kv,
             const CudaStatePool& state, cudaStream_t stream, cuda::LinearEngine* linear,
             CudaStageMarks* marks);
  void Attention(const LayerWeights& w, const DeviceBatchView& v, const CudaKvPool& kv,
                 cudaStream_t stream, cuda::LinearEngine* linear, CudaStageMarks* marks);
  void DeltaNet(const LayerWeights& w, const DeviceBatchView& v, const CudaStatePool& state,
                cudaStream_t stream, cuda::LinearEngine* linear, CudaStageMarks* marks);
  LayoutDims layout_dims() const;
  void Moe(const LayerWeights& w, const DeviceBatchView& v, cudaStream_t stream,
           cuda::LinearEngine* linear, CudaStageMarks* marks);
  // Qwen3-Next's fused projections as row slices in q|k|v|z|b|a order (for PlanWeights).
  std::vector<const TensorView*> FusedDeltaNetRows(const DeltaNetWeights& g);

  const ModelConfig& c_;
  const DecoderWeights& w_;  // host views (the runner keeps the checkpoint mapped)
  int64_t q_dim_ = 0, kv_dim_ = 0;
  int64_t qkv_width_ = 0;  // fused attention projection: (gated ? 2 : 1) * q_dim + 2 * kv_dim
  int64_t gdn_width_ = 0;  // fused Gated DeltaNet projection: conv_dim + value_dim + 2 * nv
  int64_t n_attention_layers_ = 0, n_recurrent_layers_ = 0, n_moe_layers_ = 0;
  int64_t router_width_ = 0;       // n_experts (+1 with a shared expert: its gate's logit)
  int64_t mlp_inter_ = 0;          // the widest dense / shared-expert MLP (gate_up_, act_)
  // The shared expert has the routed experts' shape and is stored as expert n_experts: steps of
  // up to moe_slot_max_tokens_ tokens run it with the routed ones (MoeRoute's shared slot: three
  // launches fewer per MoE layer), larger steps as its own GEMMs on the same matrices.
  bool moe_shared_slot_ = false;
  int32_t moe_slot_max_tokens_ = 8;
  bool UseSharedSlot(int32_t n_tokens) const {
    return moe_shared_slot_ && n_tokens <= moe_slot_max_tokens_;
  }
  std::deque<TensorView> slices_;  // row views that weight-plan pieces point at
  float norm_offset_ = 0.0f;       // 1 for (1 + w) norms
  std::vector<float> small_host_;  // f32 constants of the recurrent layers, uploaded to small_
  cuda::DeviceBuffer small_;

  size_t embed_off_ = 0, norm_off_ = 0;
  CudaWeightPlan::Linear head_plan_;
  std::vector<LayerOffsets> offsets_;
  const __nv_bfloat16* embed_ = nullptr;       // (vocab, hidden)
  const __nv_bfloat16* final_norm_ = nullptr;  // (hidden)
  cuda::Weight lm_head_;                       // (vocab, hidden); the embedding when tied
  std::vector<LayerWeights> layers_;
  cuda::DeviceBuffer inv_freq_;  // [rotary_dim/2] f32
  float rope_attention_scale_ = 1.0f;
  float attention_scale_ = 1.0f;
  bool batch_invariant_ = false;

  // Activations (inside the runner's allocation).
  float* x_ = nullptr;                // [n, hidden] residual stream
  __nv_bfloat16* xn_ = nullptr;       // [n, hidden] normalised block input (GEMM input)
  float* qkv_ = nullptr;              // [n, max(qkv_width, gdn_width)] fused projection output
  __nv_bfloat16* q_ = nullptr;        // [n, n_heads, head_dim] rotated queries
  __nv_bfloat16* attn_ = nullptr;     // [n, n_heads, head_dim] attention output
  float* tmp_ = nullptr;              // [n, hidden] o_proj / out_proj / down_proj output
  float* gate_up_ = nullptr;          // [n, 2*intermediate]
  __nv_bfloat16* act_ = nullptr;      // [n, intermediate] silu(gate)*up
  __nv_bfloat16* x_final_ = nullptr;  // [n_logits, hidden] final-normed logits rows
  float* logits_ = nullptr;           // [n_logits, vocab]
  void* attention_workspace_ = nullptr;
  size_t attention_workspace_bytes_ = 0;
  // Gated attention and Gated DeltaNet (only when the model has such layers).
  float* gate_ = nullptr;             // [n, q_dim] output gate
  float* conv_out_ = nullptr;         // [n, conv_dim]
  float* dq_ = nullptr;               // [n, key_dim] normalised queries
  float* dk_ = nullptr;               // [n, key_dim] normalised keys
  float* beta_ = nullptr;             // [n, nv]
  float* g_ = nullptr;                // [n, nv]
  float* core_ = nullptr;             // [n, value_dim] delta-rule output
  __nv_bfloat16* gdn_out_ = nullptr;  // [n, value_dim] gated norm output (out_proj input)
  float* delta_workspace_ = nullptr;  // the chunked delta rule's per-chunk data
  // MoE (only when the model has MoE layers).
  float* router_ = nullptr;              // [n, router_width]
  cuda::MoeRouting routing_;             // [n * top_k] pairs, [n_experts (+1)] per expert
  float* expert_gate_up_ = nullptr;      // [n * top_k, 2 * moe_inter] permuted rows
  __nv_bfloat16* expert_act_ = nullptr;  // [n * top_k, moe_inter]
  float* expert_out_ = nullptr;          // [n * top_k, hidden]
  float* shared_out_ = nullptr;          // [n, hidden]
  int32_t* moe_active_log_ = nullptr;    // [n_moe_layers]
};

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
