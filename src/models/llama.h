// The dense decoder shared by Llama, Mistral, Qwen2 and Qwen3 on the CPU:
//   embed -> n_layers x [RMSNorm -> q/k/v (+bias) -> (Qwen3: per-head RMSNorm of q, k) -> RoPE
//   -> write K/V to the paged pool -> causal GQA attention through the block table -> o_proj
//   -> residual -> RMSNorm -> down(silu(gate(x)) * up(x)) -> residual] -> RMSNorm -> LM head.
// All activations are f32; weights stay in their file dtype and are converted inside kernels.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "core/thread_pool.h"
#include "models/config.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace kestrel {

// Builds the model over the tensors of `store` (which it keeps, so the mmaps stay alive).
// Every tensor the forward needs is checked for presence and shape here.
Result<std::unique_ptr<Model>> LoadDenseDecoder(ModelConfig config, WeightStore store,
                                                const ModelLoadOptions& options);

// KV capacity in tokens that Load uses for these options (see ModelLoadOptions).
int64_t ResolveKvCacheTokens(const ModelConfig& config, const ModelLoadOptions& options);

namespace detail {

// Views of one decoder layer's weights (file dtype); empty views for absent biases / norms.
struct DecoderLayerWeights {
  TensorView input_norm;      // (hidden)
  TensorView q_proj, q_bias;  // (n_heads*head_dim, hidden), (n_heads*head_dim)
  TensorView k_proj, k_bias;  // (n_kv_heads*head_dim, hidden), (n_kv_heads*head_dim)
  TensorView v_proj, v_bias;  // (n_kv_heads*head_dim, hidden), (n_kv_heads*head_dim)
  TensorView q_norm, k_norm;  // (head_dim) Qwen3 only
  TensorView o_proj, o_bias;  // (hidden, n_heads*head_dim), (hidden)
  TensorView post_norm;       // (hidden)
  TensorView gate_proj, gate_bias;  // (intermediate, hidden), (intermediate)
  TensorView up_proj, up_bias;      // (intermediate, hidden), (intermediate)
  TensorView down_proj, down_bias;  // (hidden, intermediate), (hidden)
  int64_t sliding_window = 0;       // 0: full causal attention in this layer
};

// Every tensor of a dense decoder, bound and shape-checked (views into the WeightStore's mmaps).
// Shared by the CPU forward and the CUDA upload.
struct DenseDecoderWeights {
  TensorView embed;       // (vocab, hidden)
  TensorView final_norm;  // (hidden)
  TensorView lm_head;     // (vocab, hidden); the embedding when tied
  std::vector<DecoderLayerWeights> layers;
  int64_t n_parameters = 0;  // tied embeddings counted once
  int64_t n_bytes = 0;
};

// Binds every tensor the forward needs, checking presence, shape and dtype (F32/F16/BF16).
Result<DenseDecoderWeights> BindDenseDecoderWeights(const ModelConfig& c, const WeightStore& store);

// Checks shared by every backend before a dense decoder is built (sizes, rotary dimension,
// block size, KV capacity).
Status ValidateDenseDecoderConfig(const ModelConfig& config, const ModelLoadOptions& options);

// KCHECKs the internal consistency of a batch (a bug in the scheduler if it fails): spans sized
// as documented in batch.h, positions inside each context, slots and blocks inside the pool,
// sampled_rows below n_sampled_rows (the rows of the model's last LaunchSampling).
void CheckBatch(const Batch& b, int64_t vocab_size, int64_t n_slots, int32_t n_blocks,
                int32_t block_size, int32_t n_sampled_rows);

// Activation buffers for up to `capacity_tokens` tokens per Forward. Sized on the first call
// and grown only when a larger batch (or longer context, for attention scores) arrives, so a
// steady stream of batches allocates nothing.
struct ForwardScratch {
  int64_t capacity_tokens = 0;
  int64_t capacity_context = 0;
  std::vector<float> x;        // [n, hidden] residual stream
  std::vector<float> xn;       // [n, hidden] normalised input of a block
  std::vector<float> tmp;      // [n, hidden] o_proj / down_proj output
  std::vector<float> q;        // [n, n_heads, head_dim]
  std::vector<float> k;        // [n, n_kv_heads, head_dim]
  std::vector<float> v;        // [n, n_kv_heads, head_dim]
  std::vector<float> attn;     // [n, n_heads, head_dim]
  std::vector<float> gate;     // [n, intermediate]
  std::vector<float> up;       // [n, intermediate]
  std::vector<float> rope_cos; // [n, rotary_dim/2]
  std::vector<float> rope_sin; // [n, rotary_dim/2]
  std::vector<float> scores;   // attention scratch (per-thread score rows)
};

}  // namespace detail

class DenseDecoder final : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  int64_t n_parameters() const override { return n_parameters_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  int64_t kv_bytes_per_token() const override;
  void Forward(const Batch& batch, float* logits) override;
  // On the CPU both halves run in LaunchSampling (Sampler::Sample on the kept logits).
  void LaunchSampling(std::span<Sampler* const> samplers) override;
  void FinishSampling(std::span<SampleResult> results) override;
  const ForwardStats& stats() const override { return stats_; }
  void ResetStats() override { stats_ = ForwardStats{}; }
  std::string kernels_name() const override;

 private:
  friend Result<std::unique_ptr<Model>> LoadDenseDecoder(ModelConfig, WeightStore,
                                                         const ModelLoadOptions&);
  DenseDecoder(ModelConfig config, WeightStore store);

  Status BindWeights();
  void EnsureScratch(int64_t n_tokens, int64_t max_context);
  void Layer(int64_t layer, const Batch& batch);
  // Runs the jobs as one parallel region (cpu::LinearGroup) and accounts time and bytes.
  void LinearTimed(int64_t m_rows, std::initializer_list<cpu::LinearJob> jobs);
  float* k_cache(int64_t layer) { return kv_.get() + (2 * layer) * n_slots_ * kv_dim_; }
  float* v_cache(int64_t layer) { return kv_.get() + (2 * layer + 1) * n_slots_ * kv_dim_; }

  ModelConfig config_;
  WeightStore store_;
  cpu::OpContext ops_;
  std::unique_ptr<ThreadPool> pool_;

  TensorView embed_;       // (vocab, hidden)
  TensorView final_norm_;  // (hidden)
  TensorView lm_head_;     // (vocab, hidden); the embedding when tied
  std::vector<detail::DecoderLayerWeights> layers_;
  int64_t n_parameters_ = 0;
  int64_t weight_bytes_ = 0;

  std::vector<float> inv_freq_;  // [rotary_dim/2]
  float rope_attention_scale_ = 1.0f;
  float attention_scale_ = 1.0f;  // 1/sqrt(head_dim), as f32

  // Paged K/V: one allocation, per layer K then V, each [n_blocks, n_kv_heads, block_size,
  // head_dim] f32 (cpu::KvLayout). Pages are touched only when a slot is first written.
  int32_t block_size_ = 16;
  int32_t n_blocks_ = 0;
  int64_t n_slots_ = 0;
  int64_t kv_dim_ = 0;  // n_kv_heads * head_dim
  std::unique_ptr<float[]> kv_;

  detail::ForwardScratch scratch_;
  ForwardStats stats_;

  // Forward(batch, nullptr) keeps its logits here for LaunchSampling.
  std::vector<float> kept_logits_;  // [n_kept_logits_, vocab]
  int32_t n_kept_logits_ = 0;
  std::vector<SampleResult> sampled_;         // the last LaunchSampling's results, by row
  std::vector<int32_t> sampled_tokens_;       // their tokens (Batch::sampled_rows reads them)
  std::vector<int32_t> resolved_token_ids_;   // a batch's token ids with sampled rows filled in
  bool sampling_pending_ = false;
};

}  // namespace kestrel
