// The CPU runner: the Model the engine drives on the CPU. It owns what every architecture needs
// (the mmapped weights and their binding, the thread pool and kernel choice, the KV pool of the
// attention layers and the state slots of the recurrent ones, batch checks, the LM head, the
// logits kept for sampling, timing); the layers' math is CpuDecoder's (cpu_decoder.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "models/cpu_decoder.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "models/weights.h"

namespace kestrel {

// Binds the checkpoint (keeping the WeightStore so the mmaps stay alive), sizes the caches and
// builds the CPU model.
Result<std::unique_ptr<Model>> LoadCpuModel(ModelConfig config, WeightStore store,
                                            const ModelLoadOptions& options);

// KV capacity in tokens that Load uses for these options (see ModelLoadOptions).
int64_t ResolveKvCacheTokens(const ModelConfig& config, const ModelLoadOptions& options);
// State slots for these options: max_num_seqs live ones plus the snapshots the budget holds.
int32_t ResolveStateSlots(const CacheSpec& spec, const ModelLoadOptions& options);

class CpuRunner final : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  int64_t n_parameters() const override { return weights_.n_parameters; }
  int64_t weight_bytes() const override { return weights_.n_bytes; }
  int32_t block_size_tokens() const override { return caches_.kv_layout.block_size_tokens; }
  int32_t n_kv_blocks() const override { return static_cast<int32_t>(caches_.kv_layout.n_blocks); }
  const CacheSpec& cache_spec() const override { return caches_.spec; }
  const char* kv_cache_dtype() const override {
    switch (caches_.kv_storage) {
      case CpuCaches::KvStorage::kF32:
        return "f32";
      case CpuCaches::KvStorage::kBf16:
        return "bf16";
      case CpuCaches::KvStorage::kInt8:
        return "int8";
    }
    return "?";
  }
  // The caches as they are (tests and reports read K/V rows from here).
  const CpuCaches& caches() const { return caches_; }
  int32_t n_state_slots() const override { return caches_.n_state_slots; }
  const std::vector<std::string>& load_notes() const override { return weights_.notes; }
  int64_t decode_weight_bytes() const override;
  void Forward(const Batch& batch, float* logits) override;
  // On the CPU both halves run in LaunchSampling (Sampler::Sample on the kept logits).
  void LaunchSampling(std::span<Sampler* const> samplers) override;
  void FinishSampling(std::span<SampleResult> results) override;
  const ForwardStats& stats() const override { return stats_; }
  void ResetStats() override { stats_ = ForwardStats{}; }
  std::string kernels_name() const override;
  void CopyKvBlocks(int32_t src_first, int32_t dst_first, int32_t n_blocks) override;

 private:
  friend Result<std::unique_ptr<Model>> LoadCpuModel(ModelConfig, WeightStore,
                                                     const ModelLoadOptions&);
  CpuRunner(ModelConfig config, WeightStore store, DecoderWeights weights);
  Status AllocateCaches(const ModelLoadOptions& options);

  ModelConfig config_;
  WeightStore store_;
  DecoderWeights weights_;
  std::unique_ptr<ThreadPool> pool_;
  cpu::OpContext ops_;
  CpuCaches caches_;
  ForwardStats stats_;
  std::unique_ptr<CpuDecoder> decoder_;

  std::vector<float> hidden_;  // [n_logits, hidden] final-normed rows for the LM head
  // Forward(batch, nullptr) keeps its logits here for LaunchSampling.
  std::vector<float> kept_logits_;  // [n_kept_logits_, vocab]
  int32_t n_kept_logits_ = 0;
  std::vector<SampleResult> sampled_;        // the last LaunchSampling's results, by row
  std::vector<int32_t> sampled_tokens_;      // their tokens (Batch::sampled_rows reads them)
  std::vector<int32_t> resolved_token_ids_;  // a batch's token ids with sampled rows filled in
  bool sampling_pending_ = false;
};

}  // namespace kestrel
