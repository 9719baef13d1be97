// The decoder's math on the CPU: embedding, then every layer as
//   x += is_attention ? Attention(norm(x)) : DeltaNet(norm(x));   x += is_moe ? Moe(..) : Mlp(..)
// then the final norm of the rows whose logits are wanted. All activations are f32; weights stay
// in their file dtype and are converted inside the kernels (backends/cpu/ops.h, deltanet.h).
// The runner (cpu_runner.h) owns the caches and everything around the forward.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <vector>

#include "backends/cpu/deltanet.h"
#include "backends/cpu/ops.h"
#include "core/large_array.h"
#include "models/batch.h"
#include "models/cache_spec.h"
#include "models/config.h"
#include "models/model.h"
#include "models/weights.h"

namespace kestrel {

// The caches of the CPU path, allocated by the runner from the model's CacheSpec.
//   kv     per attention layer K then V, each [n_blocks, n_kv_heads, block_size, head_dim] f32
//          (cpu::KvLayout); pages are touched only when a slot is first written
//   state  per slot, per recurrent layer: conv window [kernel-1, conv_dim] then delta-rule state
//          [n_value_heads, key_head_dim, value_head_dim], f32; a slot is one contiguous range
struct CpuCaches {
  CacheSpec spec;
  cpu::KvLayout kv_layout;
  // How K/V rows are stored: f32 in kv; int8 codes in kv_q with a scale per row in kv_scale;
  // the values rounded to bf16 in kv_bf16. Only the one in use is allocated.
  enum class KvStorage { kF32, kBf16, kInt8 };
  KvStorage kv_storage = KvStorage::kF32;
  LargeArray<float> kv;               // per attention layer K then V
  LargeArray<int8_t> kv_q;            // per attention layer K then V codes
  std::unique_ptr<float[]> kv_scale;  // per attention layer K then V, one scale per row
  LargeArray<uint16_t> kv_bf16;       // per attention layer K then V
  int32_t n_state_slots = 0;
  std::unique_ptr<float[]> state;

  int64_t kv_floats_per_layer() const {
    return kv_layout.n_slots() * spec.n_kv_heads * spec.head_dim;
  }
  int64_t kv_rows_per_layer() const { return kv_layout.n_slots() * spec.n_kv_heads; }
  // Layer `attention_index`'s K (which 0) or V (1) cache in either storage.
  cpu::KvRowsOut rows(int64_t attention_index, int which) {
    const int64_t i = 2 * attention_index + which;
    switch (kv_storage) {
      case KvStorage::kF32:
        return {kv.get() + i * kv_floats_per_layer(), nullptr, nullptr};
      case KvStorage::kBf16:
        return {nullptr, nullptr, nullptr, kv_bf16.get() + i * kv_floats_per_layer()};
      case KvStorage::kInt8:
        return {nullptr, kv_q.get() + i * kv_floats_per_layer(),
                kv_scale.get() + i * kv_rows_per_layer()};
    }
    return {};
  }
  int64_t state_floats_per_slot() const {
    return spec.n_recurrent_layers * spec.state_floats_per_layer();
  }
  float* slot(int32_t s) { return state.get() + int64_t{s} * state_floats_per_slot(); }
  float* conv_window(int32_t s, int64_t recurrent_index) {
    return slot(s) + recurrent_index * spec.state_floats_per_layer();
  }
  float* ssm(int32_t s, int64_t recurrent_index) {
    return conv_window(s, recurrent_index) + spec.conv_state_floats;
  }
};

class CpuDecoder {
 public:
  CpuDecoder(const ModelConfig& config, const DecoderWeights& weights, const cpu::OpContext& ops,
             CpuCaches* caches, ForwardStats* stats);

  // hidden [n_logits, hidden_size]: the final-normed residual stream of the rows in
  // batch.logits_indices (token ids already resolved; state copies already applied).
  void Forward(const Batch& batch, float* hidden);
  // Sizes the scratch for contexts up to max_context tokens now, so that Forward allocates
  // nothing for them.
  void Reserve(int64_t n_tokens, int64_t max_context);
  // ModelLoadOptions::bf16_activations.
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

 private:
  void Layer(int64_t layer, const Batch& batch);
  void Attention(int64_t layer, const Batch& batch);                      // xn -> tmp
  void DeltaNet(int64_t layer, const Batch& batch);                       // xn -> tmp
  // in, out [n, hidden]; expert: an MoE expert's (bf16_activations rounds its weights whatever
  // their type, as CUDA holds them in bf16).
  void Mlp(const MlpWeights& w, int64_t n, const float* in, float* out, bool expert = false);
  void Moe(int64_t layer, int64_t n);                                     // xn -> tmp
  void Norm(const float* x, int64_t n, const TensorView& w, float* y);
  void LinearTimed(int64_t m_rows, std::initializer_list<cpu::LinearJob> jobs,
                   bool round_quantized = false);
  void EnsureScratch(int64_t n_tokens, int64_t max_context);

  const ModelConfig& c_;
  const DecoderWeights& w_;
  cpu::OpContext ops_;
  CpuCaches* caches_;
  ForwardStats* stats_;
  float norm_offset_ = 0.0f;  // 1 for zero-centred RMSNorm weights
  bool bf16_activations_ = false;
  std::vector<float> rounded_[cpu::kMaxLinearGroup];  // bf16-rounded GEMM inputs
  // bf16_activations: f32 / f16 weights (linear layers, norms) rounded to bf16, as the CUDA
  // weight plan places them, and with round_quantized (the MoE experts') weights of any type
  // (made on first use, keyed by the weight's view). Bf16Weight returns w itself without
  // bf16_activations.
  struct RoundedWeight {
    std::vector<float> values;
    TensorView view;
  };
  std::map<const TensorView*, RoundedWeight> rounded_weights_;
  const TensorView* Bf16Weight(const TensorView* w, bool round_quantized = false);
  std::vector<int64_t> cache_index_;  // [n_layers] index among layers of the same type
  std::vector<float> inv_freq_;       // [rotary_dim/2]
  float rope_attention_scale_ = 1.0f;
  float attention_scale_ = 1.0f;  // 1/sqrt(head_dim), as f32
  cpu::DeltaShape delta_shape_{};

  // Activations, sized by the largest batch seen (or Reserve), never shrunk.
  struct Scratch {
    int64_t capacity_tokens = 0;
    int64_t capacity_context = 0;
    std::vector<float> x;                   // [n, hidden] residual stream
    std::vector<float> xn;                  // [n, hidden] normalised block input
    std::vector<float> tmp;                 // [n, hidden] block output
    std::vector<float> q;                   // [n, n_heads, head_dim]
    std::vector<float> qg;                  // [n, n_heads, 2*head_dim] gated q_proj output
    std::vector<float> gate;                // [n, n_heads*head_dim] attention output gate
    std::vector<float> k, v;                // [n, n_kv_heads, head_dim]
    std::vector<float> attn;                // [n, n_heads, head_dim]
    std::vector<float> rope_cos, rope_sin;  // [n, rotary_dim/2]
    std::vector<float> scores;              // attention scratch
    std::vector<float> mlp_gate, mlp_up;    // [n, max intermediate]
    // Gated DeltaNet
    std::vector<float> mixed;       // [n, 2*key_dim + 2*value_dim] fused projection output
    std::vector<float> qkv;         // [n, conv_dim] conv input: q | k | v per token
    std::vector<float> conv;        // [n, conv_dim] conv output
    std::vector<float> z;           // [n, value_dim]
    std::vector<float> ba;          // [n, 2*n_value_heads] b | a (fused layout: per key head)
    std::vector<float> beta, g;     // [n, n_value_heads]
    std::vector<float> dq, dk, dv;  // [n, nk, dk], [n, nk, dk], [n, nv, dv] (one sequence)
    std::vector<float> core;        // [n, n_value_heads, value_head_dim]
    std::vector<float> delta;       // chunked delta-rule scratch
    // MoE
    std::vector<float> router;          // [n, n_experts]
    std::vector<int32_t> topk_ids;      // [n, top_k]
    std::vector<float> topk_w;          // [n, top_k]
    std::vector<int32_t> expert_rows;   // [n * top_k] token rows grouped by expert
    std::vector<float> expert_row_w;    // [n * top_k]
    std::vector<int32_t> expert_begin;  // [n_experts + 1]
    std::vector<int32_t> expert_fill;   // [n_experts]
    std::vector<int32_t> order;         // [n_experts] experts by probability
    std::vector<float> gathered;        // [n, hidden]
    std::vector<float> expert_out;      // [n, hidden]
    std::vector<float> shared_out;      // [n, hidden]
    std::vector<float> shared_gate;     // [n]
  } s_;
};

}  // namespace kestrel
