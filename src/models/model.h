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
  int64_t kv_cache_tokens = 0;  // capacity of the paged KV pool; 0 = max_position_embeddings
  int n_threads = 0;            // 0 = all cores (KESTREL_THREADS overrides)
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
};

}  // namespace kestrel
