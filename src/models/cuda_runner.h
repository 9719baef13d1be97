// The CUDA runner: the Model the engine drives on one GPU. It owns what every architecture needs
// there: the stream, the one weight allocation and its pinned-staged upload, the activation
// allocation (laid out by the decoder), the paged KV pool of the attention layers, batch
// metadata staging (double-buffered pinned memory), the decode graphs, device sampling, and
// per-stage profiling. What the layers compute is CudaDecoder's (cuda_decoder.h); the weights it
// reads are bound from the checkpoint by the same architecture files as on the CPU (weights.h).
//
// Decode steps (one token per sequence) replay CUDA graphs captured per (batch bucket, context
// bucket); padding rows of a bucket write their K/V into one reserved block past the pool.
#pragma once

#ifdef KESTREL_HAS_CUDA

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/sampling.h"
#include "models/cuda_decoder.h"
#include "models/gpu_sampling_rows.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "models/weights.h"

namespace kestrel {

// Binds the checkpoint (keeping the WeightStore mapped), uploads it and sizes the caches.
Result<std::unique_ptr<Model>> LoadCudaModel(ModelConfig config, WeightStore store,
                                             const ModelLoadOptions& options);

class CudaRunner final : public Model, private CudaStageMarks {
 public:
  ~CudaRunner() override;

  const ModelConfig& config() const override { return config_; }
  int64_t n_parameters() const override { return n_parameters_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  // The device formats of the linear weights, e.g. "bf16" or "bf16+fp8-block128".
  std::string weight_formats() const override { return weight_formats_; }
  const char* kv_cache_dtype() const override { return cuda::KvCacheTypeName(kv_type_); }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  const CacheSpec& cache_spec() const override { return cache_spec_; }
  int32_t n_state_slots() const override { return n_state_slots_; }
  const std::vector<std::string>& load_notes() const override { return weights_host_.notes; }
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
  friend Result<std::unique_ptr<Model>> LoadCudaModel(ModelConfig, WeightStore,
                                                      const ModelLoadOptions&);
  CudaRunner(ModelConfig config, WeightStore store, DecoderWeights weights);

  Status Upload(bool show_progress);
  Status AllocateKv(const ModelLoadOptions& options, bool show_progress);
  Status AllocateState(const ModelLoadOptions& options);
  Status EnsureActivations(int32_t n_tokens);
  Status EnsureMetadata(size_t n_ints);
  // Packs the batch into pinned memory (padded to n_seqs_padded decode rows when > n_seqs) and
  // uploads it; returns the device view. warmup: every sequence's state slot is the reserved
  // one and no snapshot is taken (a graph bucket's eager first run of a recurrent model).
  DeviceBatchView StageBatch(const Batch& b, int32_t n_rows_padded, int32_t max_blocks_stride,
                             int32_t max_context_len, bool graph, bool warmup = false);
  // The decoder's forward with the first min(n_logits, logits_capacity_) LM-head rows.
  void RunForward(const DeviceBatchView& v);
  // Event-pair timing of a stage when profiling (no-op otherwise).
  void Mark(CudaStage s) override;
  void CollectProfile();

  ModelConfig config_;
  cuda::DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LinearEngine> linear_;

  WeightStore store_;            // the checkpoint, mapped while weights_host_ views it
  DecoderWeights weights_host_;  // host views of every tensor (file dtype)
  std::unique_ptr<CudaDecoder> decoder_;
  cuda::DeviceBuffer weights_;  // every weight, bf16, laid out by the decoder's plan
  CacheSpec cache_spec_;
  int64_t n_parameters_ = 0;
  int64_t weight_bytes_ = 0;            // on the device (quantized formats as placed)
  std::string weight_formats_ = "bf16";  // CudaWeightPlan::formats()

  // Paged KV of the attention layers (cuda_decoder.h: CudaKvPool), plus one reserved block.
  int32_t block_size_ = 16;
  int32_t n_blocks_ = 0;
  int64_t n_slots_ = 0;
  cuda::DeviceBuffer kv_;
  CudaKvPool kv_pool_;
  cuda::KvCacheType kv_type_ = cuda::KvCacheType::kBf16;  // --kv-cache-dtype

  // Recurrent state slots (hybrid models), f32, plus one reserved slot; the last staged batch's
  // state copies (device arrays inside the metadata).
  int32_t n_state_slots_ = 0;
  cuda::DeviceBuffer state_;
  CudaStatePool state_pool_;
  const int32_t* state_copy_src_ = nullptr;
  const int32_t* state_copy_dst_ = nullptr;
  int32_t n_state_copies_ = 0;

  // Activations for up to capacity_tokens_ rows (logits for up to logits_capacity_ rows).
  int32_t capacity_tokens_ = 0;
  int32_t logits_capacity_ = 0;
  cuda::DeviceBuffer activations_;  // the decoder's layout (CudaDecoder::BindActivations)
  float* logits_ = nullptr;         // [logits_capacity, vocab], inside activations_
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
    const int32_t* tokens = nullptr;      // [n]
    const int32_t* top_ids = nullptr;     // [n, kGpuMaxTopLogprobs]
    const float* logprob = nullptr;       // [n]
    const float* top_logprobs = nullptr;  // [n, kGpuMaxTopLogprobs]
  } sampling_out_;
  cuda::DeviceBuffer sampling_workspace_;
  cuda::DeviceBuffer sampling_io_;
  cuda::PinnedBuffer sampling_host_;
  size_t sampling_io_bytes_ = 0;
  GpuSamplingHostBatch sampling_batch_;
  std::vector<int32_t> sampling_ints_;

  bool profiling_ = false;
  std::vector<std::pair<CudaStage, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> event_pool_;
  cudaEvent_t profile_start_ = nullptr;

  ForwardStats stats_;
};

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
