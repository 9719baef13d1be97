// A loaded causal LM as the engine drives it: a forward pass over a flattened Batch
// (models/batch.h), sampling where the logits are, and the caches its layers keep.
// One implementation per backend, the *runner* (cpu_runner.h, cuda_runner.h): weight binding
// or upload, activation buffers, batch staging, graphs, sampling, KV and state allocation,
// profiling. What the layers compute lives in the backend's decoder (cpu_decoder.h,
// cuda_decoder.h) over the architecture-neutral weights of models/weights.h, which each
// architecture file (arch_*.cpp) binds from its checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "models/batch.h"
#include "models/cache_spec.h"
#include "models/config.h"
#include "sampling/sampler.h"

namespace kestrel {

enum class CpuKernels {
  kAuto,       // AVX2/FMA/F16C fast paths when the CPU has them, else reference
  kReference,  // plain scalar loops: the numerical reference for every fast path and CUDA
};

enum class Device {
  kCpu,
  kCuda,
};

// "cpu" / "cuda".
const char* DeviceName(Device d);
// Whether a usable GPU is present (false in builds without the CUDA backend).
bool CudaDeviceAvailable();
// Ok when CUDA device `ordinal` can be used; else why not (no driver, driver older than the
// runtime, no such device, compute capability below this build's, or no CUDA backend built).
Status CudaDeviceStatus(int ordinal = 0);

struct ModelLoadOptions {
  Device device = Device::kCpu;
  int cuda_device = 0;  // ordinal, for Device::kCuda
  // CUDA: bytes of GPU memory for the KV pool. 0 = 90 % of what is free after the weights and
  // activation buffers. Ignored when kv_cache_tokens > 0 (an explicit capacity wins).
  int64_t kv_cache_bytes = 0;
  // CUDA: token rows one Forward is prepared for at load (activation buffers, graphs); larger
  // batches grow the buffers once.
  int32_t max_batch_tokens = 2048;
  bool show_progress = false;  // upload progress bar and capacity line on stderr
  CpuKernels kernels = CpuKernels::kAuto;
  int32_t block_size_tokens = 16;
  // Capacity of the paged KV pool in tokens (n_kv_blocks * block_size_tokens, rounded up to whole
  // blocks). 0 = min(max_position_embeddings, 32768), further capped so the pool stays within
  // kDefaultKvBudgetBytes; pass an explicit value for more.
  int64_t kv_cache_tokens = 0;
  int n_threads = 0;            // 0 = all cores (KESTREL_THREADS overrides)
  // Recurrent-state models: slots for live sequences (at least the engine's max_num_seqs), and
  // bytes for prefix-cache state snapshots beside them (< 0: kDefaultStateSnapshotBytes; 0: no
  // snapshots, so no prefix caching of such models).
  int32_t max_num_seqs = 64;
  int64_t state_snapshot_bytes = -1;
  // CPU: round to bf16 what the CUDA path keeps in bf16 (every GEMM input, the rotated queries,
  // the K/V cache entries), everything else unchanged. For checking the GPU path against the CPU
  // with the same roundings: a mixture-of-experts router reacts to a bf16 rounding of its input
  // by picking another expert wherever two are nearly tied, so the f32 CPU is no close reference
  // for the GPU there (tests/cuda/model_cuda_test.cpp).
  bool bf16_activations = false;
  // CPU, block-quantized weights (GGUF Q8_0/Q4_K/Q5_K/Q6_K): multiply int8-quantized activations
  // in integer dot products, as llama.cpp does (cpu::OpContext::int8_activations). false: f32
  // activations against the exactly dequantized weights (slower; equal bit for bit to the model
  // with those weights stored in f32).
  bool int8_activations = true;
  // CUDA, FP8 block-quantized checkpoints: prefill-sized GEMMs as W8A8 on the FP8 tensor cores
  // (activations quantized per token and 128 columns, as the checkpoints' reference code does)
  // instead of bf16 tiles of the dequantized weights. Faster; not the float32 reference's bits.
  bool fp8_activations = false;
  // Batch-invariant mode: a sequence's logits are the same bits whatever else is in the batch
  // (CPU: cpu::OpContext::batch_invariant; the reference kernels always are; CUDA: not yet).
  bool deterministic = false;
  // The KV cache's element type: kAuto is f32 on the CPU and bf16 on CUDA; kInt8 stores each
  // (token, kv head) row as int8 codes with an f32 scale (CPU: cpu::KvRows, a quarter of the
  // f32 bytes; CUDA: cuda::KvCacheType, about half of the bf16 bytes), kFp8 (CUDA) as e4m3 codes
  // with an f32 scale.
  enum class KvCacheDType { kAuto, kF32, kBf16, kInt8, kFp8 };
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
};

inline constexpr int64_t kDefaultStateSnapshotBytes = int64_t{1} << 30;
// Snapshot slots at least (when the budget allows one), at most.
inline constexpr int64_t kMaxStateSnapshots = 4096;

inline constexpr int64_t kDefaultKvCacheTokensCap = 32768;
inline constexpr int64_t kDefaultKvBudgetBytes = int64_t{4} << 30;

// Where the time of Forward goes, accumulated over calls until ResetStats(); for `kestrel bench`.
struct ForwardStats {
  double attention_s = 0;         // K/V writes + paged attention
  double recurrent_s = 0;         // Gated DeltaNet: conv, gates, delta rule, gated norm
  double matmul_s = 0;            // linear layers (CPU: experts included), LM head included
  double moe_s = 0;               // CUDA: routing, the routed experts' GEMMs, their weighted sum
  double other_s = 0;             // embedding, norms, RoPE, SiLU, adds, gathers, CPU routing
  int64_t weight_bytes_read = 0;  // weight bytes the linear layers and the embedding gather read
                                  // (MoE layers: only the experts the tokens were routed to)
  int64_t state_bytes = 0;        // recurrent state read + written (decode roofline)
  int64_t n_forwards = 0;
  int64_t n_tokens = 0;
  // The stage times of the decode steps alone (every sequence one token), so that a benchmark
  // can tell a request's decode from its prefill without subtracting two noisy runs.
  struct Stages {
    double attention_s = 0, recurrent_s = 0, matmul_s = 0, moe_s = 0, other_s = 0;
    int64_t n_forwards = 0;
  } decode;
};

// Adds what a forward added to the stage times of `stats` since `before` to stats->decode, when
// that forward was a decode step.
inline void NoteDecodeStep(const ForwardStats& before, bool decode_step, ForwardStats* stats) {
  if (!decode_step) return;
  ForwardStats::Stages& d = stats->decode;
  d.attention_s += stats->attention_s - before.attention_s;
  d.recurrent_s += stats->recurrent_s - before.recurrent_s;
  d.matmul_s += stats->matmul_s - before.matmul_s;
  d.moe_s += stats->moe_s - before.moe_s;
  d.other_s += stats->other_s - before.other_s;
  d.n_forwards += 1;
}

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
  // The caches the layers keep (attention: paged KV; recurrent: per-slot state).
  virtual const CacheSpec& cache_spec() const = 0;
  int64_t kv_bytes_per_token() const { return cache_spec().kv_bytes_per_token(); }
  // State slots (recurrent-state models; 0 otherwise): Batch::state_slots and the slots of
  // StateCopy / StateSnapshot index them. The engine gives the first max_num_seqs to live
  // sequences and uses the rest for prefix-cache snapshots.
  virtual int32_t n_state_slots() const { return 0; }
  // What the checkpoint holds that the model does not run (vision tower, MTP head), one line
  // each, for `info` and the load log.
  virtual const std::vector<std::string>& load_notes() const {
    static const std::vector<std::string> kNone;
    return kNone;
  }

  // Runs the batch: applies its state copies, writes K/V of every token at its slot (attention
  // layers) and advances each sequence's recurrent state in its slot (recurrent layers), takes
  // its state snapshots, and computes the logits of the rows in batch.logits_indices. With `logits`, copies them out as f32 [n_logits, vocab_size] row-major
  // and returns when they are there. With nullptr they stay with the model (on the GPU for CUDA)
  // for LaunchSampling, and Forward may return before the device is done: every later call on
  // the model is ordered after it.
  virtual void Forward(const Batch& batch, float* logits) = 0;

  // Sampling where the logits are, in two halves. After Forward(batch, nullptr):
  //   LaunchSampling(samplers)  starts choosing the token of logits row i with samplers[i] (the
  //                             token Sampler::Sample would choose from those logits; each
  //                             sampler takes this step's random draw now) and may return before
  //                             the tokens exist;
  //   FinishSampling(results)   waits for them, fills results[i] and leaves samplers[i] having
  //                             Accepted its token.
  // Only token ids and requested log-probabilities cross to the host. Between the two the caller
  // may enqueue the next Forward, taking token ids from this sampling (Batch::sampled_rows):
  // the engine plans and launches step N+1 while the device still runs step N. The samplers
  // must stay alive, and unused by the caller, until FinishSampling.
  virtual void LaunchSampling(std::span<Sampler* const> samplers) = 0;
  virtual void FinishSampling(std::span<SampleResult> results) = 0;
  void SampleLastLogits(std::span<Sampler* const> samplers, std::span<SampleResult> results) {
    LaunchSampling(samplers);
    FinishSampling(results);
  }

  virtual const ForwardStats& stats() const = 0;
  virtual void ResetStats() = 0;
  // "reference" or "avx2": the CPU kernel set Load resolved CpuKernels to; "cuda" on the GPU.
  virtual std::string kernels_name() const = 0;
  virtual Device device() const { return Device::kCpu; }
  // Bytes the forward reads per generated token besides the KV cache (weights of every layer,
  // the LM head and one embedding row): the decode roofline's numerator.
  virtual int64_t decode_weight_bytes() const { return weight_bytes(); }
  // The formats the linear layers run in on this device ("bf16", "bf16+fp8-block128", ...);
  // empty where the backend keeps the checkpoint's dtypes as they are (CPU).
  virtual std::string weight_formats() const { return ""; }
  // The KV cache's element type (--kv-cache-dtype as resolved): "f32" or "int8" on the CPU,
  // "bf16", "fp8" or "int8" on CUDA.
  virtual const char* kv_cache_dtype() const = 0;

  // Benchmark switches: per-stage timing (CUDA: events, one sync per Forward) and decode
  // through captured graphs. The CPU model always times its stages and has no graphs.
  virtual void set_profiling(bool on) { (void)on; }
  // Copies the K/V of n_blocks consecutive physical blocks starting at src_first onto those at
  // dst_first, in every layer (a fork of a context; the benchmark fills many sequences with one
  // prefill this way). Ranges must not overlap.
  virtual void CopyKvBlocks(int32_t src_first, int32_t dst_first, int32_t n_blocks) {
    (void)src_first;
    (void)dst_first;
    (void)n_blocks;
    KCHECK_MSG(false, "this model cannot copy KV blocks");
  }
  virtual void set_use_graphs(bool on) { (void)on; }
};

}  // namespace kestrel
