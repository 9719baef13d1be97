// A loaded causal LM and its forward pass over a flattened Batch (models/batch.h).
// One implementation per architecture family; Llama, Mistral, Qwen2 and Qwen3 share the
// dense decoder in llama.cpp (RMSNorm, RoPE, GQA, SwiGLU; Qwen2 adds q/k/v bias, Qwen3 QK-norm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "models/batch.h"
#include "models/config.h"

namespace kestrel {

enum class CpuKernels {
  kAuto,       // AVX2/FMA/F16C fast paths when the CPU has them, else reference
  kReference,  // plain scalar loops: the numerical reference for every fast path and CUDA
};

struct ModelLoadOptions {
  CpuKernels kernels = CpuKernels::kAuto;
  int32_t block_size_tokens = 16;
  // Capacity of the paged KV pool in tokens (n_kv_blocks * block_size_tokens, rounded up to whole
  // blocks). 0 = min(max_position_embeddings, 32768), further capped so the pool stays within
  // kDefaultKvBudgetBytes; pass an explicit value for more.
  int64_t kv_cache_tokens = 0;
  int n_threads = 0;            // 0 = all cores (KESTREL_THREADS overrides)
};

inline constexpr int64_t kDefaultKvCacheTokensCap = 32768;
inline constexpr int64_t kDefaultKvBudgetBytes = int64_t{4} << 30;

// Where the time of Forward goes, accumulated over calls until ResetStats(); for `kestrel bench`.
struct ForwardStats {
  double attention_s = 0;         // K/V writes + paged attention
  double matmul_s = 0;            // linear layers, LM head included
  double other_s = 0;             // embedding, norms, RoPE, SiLU, residual adds, gathers
  int64_t weight_bytes_read = 0;  // weight bytes the linear layers and the embedding gather read
  int64_t n_forwards = 0;
  int64_t n_tokens = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  static Result<std::unique_ptr<Model>> Load(const std::string& model_dir,
                                             const ModelLoadOptions& options);

  virtual const ModelConfig& config() const = 0;
  virtual int64_t n_parameters() const = 0;
  virtual int64_t weight_bytes() const = 0;
  virtual int32_t block_size_tokens() const = 0;
  virtual int32_t n_kv_blocks() const = 0;      // physical blocks in the KV pool
  virtual int64_t kv_bytes_per_token() const = 0;

  // Runs the batch: writes K/V of every token at its slot, then writes f32 logits
  // [batch.logits_indices.size(), vocab_size] row-major into `logits`.
  virtual void Forward(const Batch& batch, float* logits) = 0;

  virtual const ForwardStats& stats() const = 0;
  virtual void ResetStats() = 0;
  // "reference" or "avx2": the CPU kernel set Load resolved CpuKernels to.
  virtual std::string kernels_name() const = 0;
};

}  // namespace kestrel
