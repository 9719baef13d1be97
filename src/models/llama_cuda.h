// The dense decoder (Llama, Mistral, Qwen2, Qwen3) on one CUDA GPU. Same model definition as the
// CPU path (weights bound by detail::BindDenseDecoderWeights, same batch, same KV bookkeeping);
// only the backend differs.
//
// Numerics (DESIGN.md): bf16 weights and bf16 GEMM inputs with f32 accumulation; the residual
// stream, norms, RoPE and softmax in f32; the KV cache in bf16. One step:
//   embed -> n_layers x [add+RMSNorm -> fused q|k|v GEMM -> (+bias, QK-norm, RoPE, KV write)
//   -> paged attention -> o_proj GEMM -> add+RMSNorm -> fused gate|up GEMM -> SiLU*up -> down GEMM]
//   -> add -> gather+RMSNorm of the logits rows -> LM head GEMM.
// Biases are added inside the kernel that consumes each GEMM's output, so every GEMM is plain.
//
// Decode steps (one token per sequence) replay CUDA graphs captured per (batch bucket, context
// bucket); padding rows of a bucket write their K/V into one reserved block past the pool.
#pragma once

#ifdef KESTREL_HAS_CUDA

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/sampling.h"
#include "models/gpu_sampling_rows.h"
#include "models/llama.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace kestrel {

Result<std::unique_ptr<Model>> LoadCudaDenseDecoder(ModelConfig config, WeightStore store,
                                                    const ModelLoadOptions& options);

namespace detail {

// Device pointers of one layer's weights (bf16, inside the one weight allocation).
struct CudaLayerWeights {
  const __nv_bfloat16* input_norm = nullptr;  // (hidden)
  const __nv_bfloat16* qkv = nullptr;         // (q_dim + 2*kv_dim, hidden): q_proj|k_proj|v_proj
  const __nv_bfloat16* qkv_bias = nullptr;    // (q_dim + 2*kv_dim) or null
  const __nv_bfloat16* q_norm = nullptr;      // (head_dim) or null
  const __nv_bfloat16* k_norm = nullptr;      // (head_dim) or null
  const __nv_bfloat16* o_proj = nullptr;      // (hidden, q_dim)
  const __nv_bfloat16* o_bias = nullptr;      // (hidden) or null
  const __nv_bfloat16* post_norm = nullptr;   // (hidden)
  const __nv_bfloat16* gate_up = nullptr;     // (2*intermediate, hidden): gate_proj|up_proj
  const __nv_bfloat16* gate_bias = nullptr;   // (intermediate) or null
  const __nv_bfloat16* up_bias = nullptr;     // (intermediate) or null
  const __nv_bfloat16* down = nullptr;        // (hidden, intermediate)
  const __nv_bfloat16* down_bias = nullptr;   // (hidden) or null
  int32_t sliding_window = 0;
};

// Batch metadata as the kernels read it, at fixed offsets of one int32 device array.
struct DeviceBatchView {
  const int32_t* token_ids = nullptr;     // [n_tokens]
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* slot_mapping = nullptr;  // [n_tokens]
  const int32_t* seq_starts = nullptr;    // [n_seqs + 1]
  const int32_t* context_lens = nullptr;  // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  const int32_t* logits_rows = nullptr;   // [n_logits]
  const int32_t* sampled_rows = nullptr;  // [n_tokens] (Batch::sampled_rows) or null
  int32_t n_tokens = 0, n_seqs = 0, n_logits = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t max_query_len = 0, max_context_len = 0;
};

}  // namespace detail

class CudaDenseDecoder final : public Model {
 public:
  ~CudaDenseDecoder() override;

  const ModelConfig& config() const override { return config_; }
  int64_t n_parameters() const override { return n_parameters_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  int64_t kv_bytes_per_token() const override;
  int64_t decode_weight_bytes() const override;
  // logits == nullptr keeps them on the device for LaunchSampling and returns once the step is
  // enqueued (no synchronisation).
  void Forward(const Batch& batch, float* logits) override;
  // GpuSample on the stream after the last Forward; its tokens stay in sampled_tokens_ for the
  // next Forward's Batch::sampled_rows, and come to the host with the log-probabilities in one
  // copy that FinishSampling waits for.
  void LaunchSampling(std::span<Sampler* const> samplers) override;
  void FinishSampling(std::span<SampleResult> results) override;
  const ForwardStats& stats() const override { return stats_; }
  void ResetStats() override { stats_ = ForwardStats{}; }
  std::string kernels_name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }

  void CopyKvBlocks(int32_t src_first, int32_t dst_first, int32_t n_blocks) override;
  // Per-stage timing with CUDA events (adds a synchronisation per Forward; for benchmarks).
  void set_profiling(bool on) override { profiling_ = on; }
  // Decode steps through captured CUDA graphs (on by default).
  void set_use_graphs(bool on) override { use_graphs_ = on; }
  const cuda::DeviceInfo& device_info() const { return device_; }

 private:
  friend Result<std::unique_ptr<Model>> LoadCudaDenseDecoder(ModelConfig, WeightStore,
                                                             const ModelLoadOptions&);
  explicit CudaDenseDecoder(ModelConfig config);

  Status Upload(const detail::DenseDecoderWeights& w, bool show_progress);
  Status AllocateKv(const ModelLoadOptions& options, bool show_progress);
  Status EnsureActivations(int32_t n_tokens);
  Status EnsureMetadata(size_t n_ints);
  // Packs the batch into pinned memory (padded to n_seqs_padded decode rows when > n_seqs) and
  // uploads it; returns the device view.
  detail::DeviceBatchView StageBatch(const Batch& b, int32_t n_rows_padded,
                                     int32_t max_blocks_stride, int32_t max_context_len,
                                     bool graph);
  // Everything from the embedding to the LM head logits of view.n_logits rows into logits_.
  void RunForward(const detail::DeviceBatchView& v);
  void RunLayer(int64_t layer, const detail::DeviceBatchView& v);
  void Linear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n,
              float* y);
  // Event-pair timing of a stage when profiling (no-op otherwise).
  enum class Stage { kAttention, kMatmul, kOther };
  void Mark(Stage s);
  void CollectProfile();

  ModelConfig config_;
  cuda::DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LinearEngine> linear_;

  cuda::DeviceBuffer weights_;                 // every weight, bf16, 256-byte aligned pieces
  const __nv_bfloat16* embed_ = nullptr;       // (vocab, hidden)
  const __nv_bfloat16* final_norm_ = nullptr;  // (hidden)
  const __nv_bfloat16* lm_head_ = nullptr;     // (vocab, hidden); the embedding when tied
  std::vector<detail::CudaLayerWeights> layers_;
  cuda::DeviceBuffer inv_freq_;  // [rotary_dim/2] f32
  float rope_attention_scale_ = 1.0f;
  float attention_scale_ = 1.0f;
  int64_t n_parameters_ = 0;
  int64_t weight_bytes_ = 0;

  // Paged KV, bf16: per layer K then V, each [n_blocks + 1, n_kv_heads, block_size, head_dim].
  // Block n_blocks_ is reserved for the padding rows of graph buckets (never handed out).
  int32_t block_size_ = 16;
  int32_t n_blocks_ = 0;
  int64_t n_slots_ = 0;
  int64_t kv_dim_ = 0;
  cuda::DeviceBuffer kv_;
  __nv_bfloat16* k_cache(int64_t layer) const;
  __nv_bfloat16* v_cache(int64_t layer) const;

  // Activations for up to capacity_tokens_ rows (logits for up to logits_capacity_ rows).
  int32_t capacity_tokens_ = 0;
  int32_t logits_capacity_ = 0;
  cuda::DeviceBuffer activations_;
  float* x_ = nullptr;                // [n, hidden] residual stream
  __nv_bfloat16* xn_ = nullptr;       // [n, hidden] normalised block input (GEMM input)
  float* qkv_ = nullptr;              // [n, q_dim + 2*kv_dim] fused projection output
  __nv_bfloat16* q_ = nullptr;        // [n, n_heads, head_dim] rotated queries
  __nv_bfloat16* attn_ = nullptr;     // [n, n_heads, head_dim] attention output
  float* tmp_ = nullptr;              // [n, hidden] o_proj / down_proj output
  float* gate_up_ = nullptr;          // [n, 2*intermediate]
  __nv_bfloat16* act_ = nullptr;      // [n, intermediate] silu(gate)*up
  __nv_bfloat16* x_final_ = nullptr;  // [n_logits, hidden] final-normed logits rows
  float* logits_ = nullptr;           // [logits_capacity, vocab]
  cuda::DeviceBuffer attention_workspace_;
  int32_t attention_workspace_context_ = 0;

  // Batch metadata (int32): two pinned staging buffers used in turn, so a step can be staged
  // while the previous step's upload is still queued (meta_uploaded_[i] marks when buffer i may
  // be refilled), and one device copy, overwritten in stream order.
  cuda::PinnedBuffer meta_host_[2];
  cudaEvent_t meta_uploaded_[2] = {nullptr, nullptr};
  int meta_next_ = 0;
  cuda::DeviceBuffer meta_device_;
  size_t meta_capacity_ints_ = 0;
  int32_t last_n_logits_ = 0;  // logits rows of the last Forward on the device (rows 0..n-1)

  // Decode graphs keyed by (rows bucket, context bucket).
  bool use_graphs_ = true;
  std::map<std::pair<int32_t, int32_t>, cudaGraphExec_t> graphs_;
  void DropGraphs();

  // Device sampling state. sampled_tokens_ [kMaxLogitsRows] int32 holds the last sampling's
  // tokens (its own allocation: never moved by a growing activation buffer).
  cuda::DeviceBuffer sampled_tokens_;
  int32_t n_sampled_rows_ = 0;
  std::vector<Sampler*> pending_samplers_;  // of the sampling in flight (empty: none)
  bool sampling_pending_ = false;
  cudaEvent_t sampling_done_ = nullptr;  // its outputs are on the host
  // The in-flight sampling's outputs in sampling_host_ (valid after sampling_done_).
  struct SamplingOutputs {
    const int32_t* tokens = nullptr;        // [n]
    const int32_t* top_ids = nullptr;       // [n, kGpuMaxTopLogprobs]
    const float* logprob = nullptr;         // [n]
    const float* top_logprobs = nullptr;    // [n, kGpuMaxTopLogprobs]
  } sampling_out_;
  cuda::DeviceBuffer sampling_workspace_;
  cuda::DeviceBuffer sampling_io_;
  cuda::PinnedBuffer sampling_host_;
  size_t sampling_io_bytes_ = 0;
  GpuSamplingHostBatch sampling_batch_;
  std::vector<int32_t> sampling_ints_;

  bool profiling_ = false;
  std::vector<std::pair<Stage, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> event_pool_;
  cudaEvent_t profile_start_ = nullptr;

  ForwardStats stats_;
};

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
