// The CUDA runner (see cuda_runner.h).
#ifdef KESTREL_HAS_CUDA

#include "models/cuda_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/deltanet.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/pdl.cuh"
#include "core/check.h"
#include "models/batch_check.h"
#include "models/cpu_runner.h"
#include "models/gpu_sampling_rows.h"

namespace kestrel {
namespace {

constexpr int32_t kMaxGraphRows = 256;     // decode batches above this run eagerly
constexpr int32_t kMinGraphContext = 256;  // smallest context bucket of a decode graph
constexpr int32_t kMinLogitsRows = kMaxGraphRows;
constexpr int32_t kMaxLogitsRows = 1024;  // logits rows one step keeps on the device

int32_t NextPow2(int32_t n) {
  int32_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// Host -> device copies of mmapped weights through two pinned staging chunks, so the copy engine
// runs while the CPU fills the next chunk (pageable cudaMemcpy from an mmap runs at a few GB/s).
class WeightUploader {
 public:
  WeightUploader(cudaStream_t stream, int64_t total_bytes, bool show_progress)
      : stream_(stream), total_(total_bytes), progress_(show_progress) {}
  ~WeightUploader() {
    for (cudaEvent_t e : done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  Status Init() {
    for (int i = 0; i < 2; ++i) {
      KASSIGN(chunks_[i], cuda::PinnedBuffer::Allocate(kChunkBytes, "the weight upload"));
      KCUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    t0_ = std::chrono::steady_clock::now();
    return Status::Ok();
  }

  void Copy(const void* src, size_t bytes, void* dst) {
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    while (bytes > 0) {
      const size_t n = std::min(bytes, kChunkBytes);
      KCUDA_CHECK(cudaEventSynchronize(done_[cur_]));  // the chunk's previous copy finished
      std::memcpy(chunks_[cur_].get(), s, n);
      KCUDA_CHECK(cudaMemcpyAsync(d, chunks_[cur_].get(), n, cudaMemcpyHostToDevice, stream_));
      KCUDA_CHECK(cudaEventRecord(done_[cur_], stream_));
      cur_ ^= 1;
      s += n;
      d += n;
      bytes -= n;
      done_bytes_ += static_cast<int64_t>(n);
      Report(false);
    }
  }

  void Finish() {
    KCUDA_CHECK(cudaStreamSynchronize(stream_));
    Report(true);
  }

 private:
  static constexpr size_t kChunkBytes = size_t{32} << 20;

  void Report(bool last) {
    if (!progress_) return;
    const int pct = total_ > 0 ? static_cast<int>(100 * done_bytes_ / total_) : 100;
    if (!last && pct == last_pct_) return;
    last_pct_ = pct;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const bool tty = isatty(STDERR_FILENO) != 0;
    if (!tty && !last && pct % 25 != 0) return;
    constexpr int kWidth = 30;
    char bar[kWidth + 1];
    for (int i = 0; i < kWidth; ++i) bar[i] = i < pct * kWidth / 100 ? '#' : '.';
    bar[kWidth] = 0;
    std::fprintf(stderr, "%skestrel: uploading weights [%s] %3d%% %s / %s  %.1f s%s",
                 tty ? "\r" : "", bar, pct, cuda::FormatBytes(done_bytes_).c_str(),
                 cuda::FormatBytes(total_).c_str(), s, tty && !last ? "" : "\n");
    std::fflush(stderr);
  }

  cudaStream_t stream_;
  int64_t total_;
  bool progress_;
  cuda::PinnedBuffer chunks_[2];
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int cur_ = 0;
  int64_t done_bytes_ = 0;
  int last_pct_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

CudaRunner::CudaRunner(ModelConfig config, WeightStore store, DecoderWeights weights)
    : config_(std::move(config)), store_(std::move(store)), weights_host_(std::move(weights)) {}

CudaRunner::~CudaRunner() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  DropGraphs();
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  for (cudaEvent_t e : {profile_start_, sampling_done_, meta_uploaded_[0], meta_uploaded_[1]}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaRunner::DropGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

int64_t CudaRunner::decode_weight_bytes() const {
  // Every weight is read once per step except the embedding table, of which one row is, and
  // the routed experts, of which a one-token step reads top_k per MoE layer.
  // weight_bytes_ is what the device holds: the embedding table is bf16 there, and it is the
  // LM head too when tied in bf16 (a quantized tied head is a separate, quantized copy).
  const int64_t row = config_.hidden_size * 2;
  const int64_t embed = config_.vocab_size * row;
  return (decoder_->head_is_embedding() ? weight_bytes_ + row : weight_bytes_ - embed + row) -
         decoder_->n_moe_layers() * (config_.moe.n_experts - config_.moe.top_k) *
             decoder_->moe_expert_bytes();
}

Status CudaRunner::Upload(bool show_progress) {
  CudaWeightPlan plan;
  decoder_->PlanWeights(&plan);
  KASSIGN(weights_, cuda::DeviceBuffer::Allocate(plan.total_bytes(), "the model weights"));
  WeightUploader up(stream_, static_cast<int64_t>(plan.total_bytes()), show_progress);
  KTRY(up.Init());
  auto* base = weights_.as<uint8_t>();
  for (const CudaWeightPlan::Piece& p : plan.pieces()) {
    up.Copy(p.data, p.bytes, base + p.offset);
  }
  plan.ArrangeOnDevice(base, stream_);
  up.Finish();
  decoder_->BindWeights(base);
  n_parameters_ = weights_host_.n_parameters;
  weight_bytes_ = static_cast<int64_t>(plan.total_bytes());
  weight_formats_ = plan.formats();
  return decoder_->UploadConstants();
}

Status CudaRunner::EnsureActivations(int32_t n_tokens) {
  if (n_tokens <= capacity_tokens_) return Status::Ok();
  const int32_t n_logits = std::max(kMinLogitsRows, std::min(n_tokens, kMaxLogitsRows));
  const size_t bytes = decoder_->ActivationBytes(n_tokens, n_logits, attention_workspace_context_);
  // Queued work may still use the old buffers (Forward returns before the device is done).
  KCUDA_CHECK(cudaStreamSynchronize(stream_));
  DropGraphs();  // graphs hold the old addresses
  activations_.Reset();
  KASSIGN(activations_,
          cuda::DeviceBuffer::Allocate(
              bytes, "activation buffers for " + std::to_string(n_tokens) + " tokens per step"));
  decoder_->BindActivations(activations_.as<uint8_t>(), n_tokens, n_logits,
                            attention_workspace_context_);
  logits_ = decoder_->logits();
  capacity_tokens_ = n_tokens;
  logits_capacity_ = n_logits;
  return Status::Ok();
}

Status CudaRunner::EnsureMetadata(size_t n_ints) {
  if (n_ints <= meta_capacity_ints_) return Status::Ok();
  const size_t cap = std::max(n_ints, meta_capacity_ints_ * 2);
  KCUDA_CHECK(cudaStreamSynchronize(stream_));  // queued uploads may still read the old ones
  DropGraphs();
  meta_device_.Reset();
  for (cuda::PinnedBuffer& h : meta_host_) {
    h.Reset();
    KASSIGN(h, cuda::PinnedBuffer::Allocate(cap * 4, "batch metadata"));
  }
  KASSIGN(meta_device_, cuda::DeviceBuffer::Allocate(cap * 4, "batch metadata"));
  meta_capacity_ints_ = cap;
  return Status::Ok();
}

Status CudaRunner::AllocateState(const ModelLoadOptions& options) {
  if (!cache_spec_.has_recurrent_state()) return Status::Ok();
  n_state_slots_ = ResolveStateSlots(cache_spec_, options);
  state_pool_.layer_floats = cache_spec_.state_floats_per_layer();
  state_pool_.conv_floats = cache_spec_.conv_state_floats;
  state_pool_.slot_floats = cache_spec_.n_recurrent_layers * state_pool_.layer_floats;
  // One slot past the pool for padding rows of graph buckets and warm-up runs.
  const size_t bytes = size_t(n_state_slots_ + 1) * size_t(state_pool_.slot_floats) * 4;
  KASSIGN(state_, cuda::DeviceBuffer::Allocate(
                      bytes, "recurrent state (" + std::to_string(n_state_slots_) + " slots)"));
  KCUDA_CHECK(cudaMemset(state_.get(), 0, bytes));
  state_pool_.base = state_.as<float>();
  return Status::Ok();
}

Status CudaRunner::AllocateKv(const ModelLoadOptions& options, bool show_progress) {
  const ModelConfig& c = config_;
  block_size_ = options.block_size_tokens;
  if (block_size_ % 16 != 0) {
    return InvalidArgument("--device cuda needs a KV block size that is a multiple of 16, got " +
                           std::to_string(block_size_));
  }
  const int64_t per_token = kv_bytes_per_token();
  int64_t tokens = options.kv_cache_tokens;
  if (tokens <= 0) {
    size_t free_b = 0, total_b = 0;
    KCUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    int64_t budget = options.kv_cache_bytes;
    if (budget <= 0) {
      // 90 % of what is free now, keeping 1 GiB for cuBLASLt, graphs and growth of the
      // activation buffers.
      budget = static_cast<int64_t>(0.9 * static_cast<double>(free_b)) - (int64_t{1} << 30);
    }
    if (budget > static_cast<int64_t>(free_b)) {
      return ResourceExhausted("the KV cache budget of " + cuda::FormatBytes(budget) +
                               " exceeds the " + cuda::FormatBytes(static_cast<int64_t>(free_b)) +
                               " of GPU memory free after the weights");
    }
    tokens = budget / per_token;
    if (tokens < block_size_) {
      return ResourceExhausted("not enough GPU memory for a KV cache: " +
                               cuda::FormatBytes(static_cast<int64_t>(free_b)) +
                               " free after the weights, one token needs " +
                               cuda::FormatBytes(per_token));
    }
  }
  const int64_t n_blocks = (tokens + block_size_ - 1) / block_size_;
  if ((n_blocks + 1) * block_size_ > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("KV cache of " + std::to_string(tokens) +
                           " tokens exceeds the 2^31 slot limit");
  }
  n_blocks_ = static_cast<int32_t>(n_blocks);
  n_slots_ = n_blocks * block_size_;
  const int64_t bytes = (n_blocks + 1) * block_size_ * per_token;
  KASSIGN(kv_,
          cuda::DeviceBuffer::Allocate(static_cast<size_t>(bytes),
                                       "the KV cache (" + std::to_string(n_slots_) + " tokens)"));
  const int64_t n_caches = 2 * cache_spec_.n_attention_layers;
  kv_pool_.type = kv_type_;
  kv_pool_.base = kv_.as<uint8_t>();
  kv_pool_.rows_per_cache = (n_blocks + 1) * block_size_ * c.n_kv_heads;
  kv_pool_.bytes_per_cache =
      kv_pool_.rows_per_cache * c.head_dim * cuda::KvCacheElementBytes(kv_type_);
  if (cuda::KvCacheQuantized(kv_type_)) {
    kv_pool_.scale_base = reinterpret_cast<float*>(kv_pool_.base + n_caches * kv_pool_.bytes_per_cache);
  }
  kv_pool_.block_size = block_size_;
  kv_pool_.n_blocks = n_blocks_;
  // The reserved block (past the pool) is what padding rows of decode graphs attend to.
  const size_t block_bytes = size_t(kv_pool_.bytes_per_cache / (n_blocks + 1));
  const size_t block_scale_bytes = size_t(kv_pool_.rows_per_cache / (n_blocks + 1)) * sizeof(float);
  for (int64_t i = 0; i < n_caches; ++i) {
    KCUDA_CHECK(cudaMemset(kv_pool_.data(i) + n_blocks * block_bytes, 0, block_bytes));
    if (float* scales = kv_pool_.scales(i); scales != nullptr) {
      KCUDA_CHECK(cudaMemset(reinterpret_cast<uint8_t*>(scales) + n_blocks * block_scale_bytes, 0,
                             block_scale_bytes));
    }
  }
  if (show_progress) {
    std::fprintf(stderr, "kestrel: KV cache on %s: %s for %lld tokens (%d blocks of %d, %s)\n",
                 device_.name.c_str(), cuda::FormatBytes(bytes).c_str(),
                 static_cast<long long>(n_slots_), n_blocks_, block_size_,
                 cuda::KvCacheTypeName(kv_type_));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadCudaModel(ModelConfig config, WeightStore store,
                                             const ModelLoadOptions& options) {
  KTRY(ValidateDecoderConfig(config, options));
  KASSIGN(DecoderWeights w, BindDecoderWeights(config, store));
  // Kernel-variant overrides for tuning runs (names or indices; see attention.h / linear.h).
  if (const char* env = std::getenv("KESTREL_DECODE_ATTENTION_VARIANT"); env != nullptr) {
    for (int v = 0; v < cuda::DecodeAttentionVariantCount(); ++v) {
      if (std::string(env) == cuda::DecodeAttentionVariantName(v) ||
          std::string(env) == std::to_string(v)) {
        cuda::SetDecodeAttentionVariant(v);
      }
    }
  }
  using KvDType = ModelLoadOptions::KvCacheDType;
  if (options.kv_cache_dtype == KvDType::kF32) {
    return Unsupported("--kv-cache-dtype f32 is for --device cpu; the CUDA KV cache is bf16, fp8 "
                       "or int8");
  }
  const cuda::KvCacheType kv_type = options.kv_cache_dtype == KvDType::kFp8    ? cuda::KvCacheType::kFp8
                                    : options.kv_cache_dtype == KvDType::kInt8 ? cuda::KvCacheType::kInt8
                                                                               : cuda::KvCacheType::kBf16;
  std::unique_ptr<CudaRunner> m(new CudaRunner(std::move(config), std::move(store), std::move(w)));
  // Layers this backend cannot run are refused before the device is touched.
  KASSIGN(m->decoder_, CudaDecoder::Create(m->config_, m->weights_host_));
  if (options.deterministic &&
      (m->config_.n_layers_of(LayerType::kLinearAttention) > 0 || m->config_.has_moe())) {
    // The chunked delta rule's sums follow the prefill chunk boundaries, and the MoE kernels
    // change with the tokens routed to each expert.
    return Unsupported("--deterministic on CUDA runs dense attention models; this one has " +
                       std::string(m->config_.has_moe() ? "MoE" : "Gated DeltaNet") +
                       " layers (use --device cpu)");
  }
  KASSIGN(m->device_, cuda::OpenDevice(options.cuda_device));
  const cuda::DeviceInfo& dev = m->device_;
  m->kv_type_ = kv_type;
  m->cache_spec_ = MakeCacheSpec(m->config_, cuda::KvCacheElementBytes(kv_type));
  if (cuda::KvCacheQuantized(kv_type)) m->cache_spec_.kv_row_scale_bytes = sizeof(float);
  KCUDA_CHECK(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
  if (options.show_progress) {
    std::fprintf(stderr, "kestrel: device %s\n", cuda::DescribeDevice(dev).c_str());
  }
  const int64_t need = m->weights_host_.n_bytes;
  if (need > dev.free_bytes) {
    return ResourceExhausted("the model's weights need " + cuda::FormatBytes(need) +
                             " of GPU memory, " + cuda::FormatBytes(dev.free_bytes) + " free on " +
                             dev.name);
  }
  KTRY(m->Upload(options.show_progress));
  // Quantized linear weights at prefill-sized m go through bf16 tiles of 64 MiB.
  KASSIGN(m->linear_, cuda::LinearEngine::Create(
                          32 << 20, m->weight_formats_ == "bf16" ? 0 : size_t{64} << 20));
  m->linear_->set_fp8_activations(options.fp8_activations);
  if (options.deterministic) {
    if (m->weight_formats_ != "bf16") {
      return Unsupported("--deterministic on CUDA takes bf16/f16/f32 checkpoints; these weights "
                         "are " + m->weight_formats_ + " (use --device cpu)");
    }
    m->linear_->set_batch_invariant(true);
    m->decoder_->set_batch_invariant(true);
  }

  // Activations before the KV pool, so the default KV budget is what is left after them.
  const ModelConfig& c = m->config_;
  m->attention_workspace_context_ = static_cast<int32_t>(std::min<int64_t>(
      c.max_position_embeddings > 0 ? c.max_position_embeddings : 32768, 1 << 20));
  KTRY(m->EnsureActivations(std::max<int32_t>(options.max_batch_tokens, kMaxGraphRows)));
  KTRY(m->AllocateState(options));
  KTRY(m->AllocateKv(options, options.show_progress));
  KCUDA_CHECK(cudaEventCreate(&m->profile_start_));
  KCUDA_CHECK(cudaEventCreateWithFlags(&m->sampling_done_, cudaEventDisableTiming));
  for (cudaEvent_t& e : m->meta_uploaded_) {
    KCUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  KASSIGN(m->sampled_tokens_,
          cuda::DeviceBuffer::Allocate(kMaxLogitsRows * sizeof(int32_t), "the sampled tokens"));
  return std::unique_ptr<Model>(std::move(m));
}

DeviceBatchView CudaRunner::StageBatch(const Batch& b, int32_t n_rows, int32_t stride,
                                       int32_t max_context_len, bool graph, bool warmup) {
  const int32_t n = b.n_tokens();
  const int32_t n_seqs = b.n_seqs();
  // A decode graph bucket: one token per (padded) sequence and logits for every row, device
  // row i = token i (the caller's logits_indices are applied when copying out).
  const int32_t rows = graph ? n_rows : n;
  const int32_t seqs = graph ? n_rows : n_seqs;
  const int32_t n_logits = graph ? n_rows : static_cast<int32_t>(b.logits_indices.size());
  // Offsets: token_ids, positions, slots [rows]; seq_starts [seqs+1]; context_lens [seqs];
  // block_tables [seqs, stride]; logits rows [n_logits]; sampled rows [rows] when the batch has
  // them (last, so the graph-visible layout of a bucket never changes).
  const bool has_sampled = !b.sampled_rows.empty();
  const size_t o_tok = 0, o_pos = o_tok + rows, o_slot = o_pos + rows, o_start = o_slot + rows;
  const size_t o_ctx = o_start + seqs + 1, o_bt = o_ctx + seqs;
  const size_t o_lg = o_bt + static_cast<size_t>(seqs) * stride;
  // Recurrent-state models: state slot per sequence, snapshot slot per row, then the state
  // copies (eager steps only).
  const bool has_state = n_state_slots_ > 0;
  const size_t o_sslot = o_lg + n_logits;
  const size_t o_snap = o_sslot + (has_state ? seqs : 0);
  const size_t o_src = o_snap + (has_state ? rows : 0);
  const size_t o_copy = o_src + (has_sampled ? rows : 0);
  const size_t n_copies = graph ? 0 : b.state_copies.size();
  const size_t total = o_copy + 2 * n_copies;
  const Status st = EnsureMetadata(total);
  KCHECK_MSG(st.ok(), st.message().c_str());
  // The staging buffer used two steps ago: its upload must have been done.
  const int buf = meta_next_;
  meta_next_ ^= 1;
  KCUDA_CHECK(cudaEventSynchronize(meta_uploaded_[buf]));
  int32_t* h = meta_host_[buf].as<int32_t>();
  // Padding rows of a graph bucket attend to position 0 of the reserved block (zeros) and
  // write no K/V (slot -1).
  const int32_t dummy_block = n_blocks_;
  for (int32_t t = 0; t < rows; ++t) {
    const bool real = t < n;
    h[o_tok + t] = real ? b.token_ids[t] : 0;
    h[o_pos + t] = real ? b.positions[t] : 0;
    h[o_slot + t] = real ? b.slot_mapping[t] : -1;
  }
  for (int32_t s = 0; s <= seqs; ++s) {
    h[o_start + s] = s <= n_seqs ? b.seq_starts[s] : s;
  }
  for (int32_t s = 0; s < seqs; ++s) {
    const bool real = s < n_seqs;
    h[o_ctx + s] = real ? b.context_lens[s] : 1;
    int32_t* row = h + o_bt + static_cast<size_t>(s) * stride;
    const int32_t n_copy = real ? std::min(stride, b.max_blocks_per_seq) : 0;
    for (int32_t j = 0; j < n_copy; ++j) {
      const int32_t blk = b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + j];
      row[j] = blk < 0 ? dummy_block : blk;
    }
    for (int32_t j = n_copy; j < stride; ++j) row[j] = dummy_block;
  }
  for (int32_t i = 0; i < n_logits; ++i) {
    h[o_lg + i] = graph ? i : b.logits_indices[i];
  }
  if (has_state) {
    // Padding sequences (and a graph's warm-up run, which must not advance any real state) use
    // the reserved slot past the pool.
    const int32_t dummy_slot = n_state_slots_;
    for (int32_t s = 0; s < seqs; ++s) {
      h[o_sslot + s] = s < n_seqs && !warmup ? b.state_slots[static_cast<size_t>(s)] : dummy_slot;
    }
    for (int32_t t = 0; t < rows; ++t) h[o_snap + t] = -1;
    if (!warmup) {
      for (const StateSnapshot& sn : b.state_snapshots) h[o_snap + sn.row] = sn.dst_slot;
    }
  }
  if (has_sampled) {
    for (int32_t t = 0; t < rows; ++t) h[o_src + t] = t < n ? b.sampled_rows[t] : -1;
  }
  for (size_t i = 0; i < n_copies; ++i) {
    h[o_copy + i] = b.state_copies[i].src_slot;
    h[o_copy + n_copies + i] = b.state_copies[i].dst_slot;
  }
  int32_t max_q = 0;
  for (int32_t s = 0; s < n_seqs; ++s)
    max_q = std::max(max_q, b.seq_starts[s + 1] - b.seq_starts[s]);
  KCUDA_CHECK(cudaMemcpyAsync(meta_device_.get(), h, total * 4, cudaMemcpyHostToDevice, stream_));
  KCUDA_CHECK(cudaEventRecord(meta_uploaded_[buf], stream_));
  const int32_t* d = meta_device_.as<int32_t>();
  DeviceBatchView v;
  v.token_ids = d + o_tok;
  v.positions = d + o_pos;
  v.slot_mapping = d + o_slot;
  v.seq_starts = d + o_start;
  v.context_lens = d + o_ctx;
  v.block_tables = d + o_bt;
  v.logits_rows = d + o_lg;
  v.sampled_rows = has_sampled ? d + o_src : nullptr;
  v.state_slots = has_state ? d + o_sslot : nullptr;
  v.snapshot_slot = has_state ? d + o_snap : nullptr;
  state_copy_src_ = d + o_copy;
  state_copy_dst_ = d + o_copy + n_copies;
  n_state_copies_ = static_cast<int32_t>(n_copies);
  v.n_tokens = rows;
  v.n_seqs = seqs;
  v.n_logits = n_logits;
  v.max_blocks_per_seq = stride;
  v.max_query_len = std::max(max_q, 1);
  v.max_context_len = max_context_len;
  return v;
}

void CudaRunner::LaunchSampling(std::span<Sampler* const> samplers) {
  const int32_t n = static_cast<int32_t>(samplers.size());
  KCHECK_MSG(!sampling_pending_, "LaunchSampling twice without FinishSampling");
  KCHECK_MSG(n == last_n_logits_,
             "LaunchSampling needs one sampler per logits row of the last Forward (called with "
             "logits == nullptr)");
  KCHECK(n <= kMaxLogitsRows);
  pending_samplers_.assign(samplers.begin(), samplers.end());
  sampling_pending_ = true;
  n_sampled_rows_ = n;
  last_n_logits_ = 0;  // each Forward's logits are sampled once
  if (n == 0) return;
  const int32_t vocab = static_cast<int32_t>(config_.vocab_size);
  constexpr int32_t kTop = cuda::kGpuMaxTopLogprobs;

  // Rows, then the variable-length penalty and bias arrays, all from the samplers' state.
  GpuSamplingHostBatch& hb = sampling_batch_;
  hb.Clear();
  for (Sampler* sm : samplers) AppendGpuSamplingRow(*sm, &hb);
  // One int32 array: repetition ids | count ids | count values | bias ids.
  std::vector<int32_t>& ints = sampling_ints_;
  ints.clear();
  for (const std::vector<int32_t>* part :
       {&hb.repetition_ids, &hb.count_ids, &hb.count_values, &hb.bias_ids}) {
    ints.insert(ints.end(), part->begin(), part->end());
  }
  const std::vector<cuda::GpuSamplingRow>& rows = hb.rows;
  const std::vector<float>& floats = hb.bias_values;

  // One pinned staging area and one device area: inputs, then outputs. The tokens go to
  // sampled_tokens_ (read by the next Forward) and are copied out with the rest.
  const size_t rows_bytes = CudaWeightPlan::AlignUp(rows.size() * sizeof(cuda::GpuSamplingRow));
  const size_t ints_bytes = CudaWeightPlan::AlignUp((ints.size() + 1) * 4);
  const size_t floats_bytes = CudaWeightPlan::AlignUp((floats.size() + 1) * 4);
  const size_t in_bytes = rows_bytes + ints_bytes + floats_bytes;
  const size_t tokens_bytes = CudaWeightPlan::AlignUp(size_t(n) * 4);
  const size_t top_ids_bytes = CudaWeightPlan::AlignUp(size_t(n) * kTop * 4);
  const size_t floats_out = size_t(n) * (1 + kTop);  // logprob, top logprobs
  const size_t out_bytes = tokens_bytes + top_ids_bytes + CudaWeightPlan::AlignUp(floats_out * 4);
  if (in_bytes + out_bytes > sampling_io_bytes_) {
    const size_t cap = std::max(in_bytes + out_bytes, 2 * sampling_io_bytes_);
    // The previous sampling's copies are done (FinishSampling waited for them); the device
    // buffers may still be read by queued work.
    KCUDA_CHECK(cudaStreamSynchronize(stream_));
    sampling_io_.Reset();
    sampling_host_.Reset();
    Result<cuda::DeviceBuffer> d = cuda::DeviceBuffer::Allocate(cap, "sampling buffers");
    KCHECK_MSG(d.ok(), d.status().message().c_str());
    sampling_io_ = std::move(d).value();
    Result<cuda::PinnedBuffer> h = cuda::PinnedBuffer::Allocate(cap, "sampling buffers");
    KCHECK_MSG(h.ok(), h.status().message().c_str());
    sampling_host_ = std::move(h).value();
    sampling_io_bytes_ = cap;
  }
  if (sampling_workspace_.size_bytes() < cuda::GpuSamplingWorkspaceBytes(logits_capacity_, vocab)) {
    KCUDA_CHECK(cudaStreamSynchronize(stream_));
    sampling_workspace_.Reset();
    Result<cuda::DeviceBuffer> w = cuda::DeviceBuffer::Allocate(
        cuda::GpuSamplingWorkspaceBytes(logits_capacity_, vocab), "the sampling workspace");
    KCHECK_MSG(w.ok(), w.status().message().c_str());
    sampling_workspace_ = std::move(w).value();
  }
  auto* h = sampling_host_.as<uint8_t>();
  std::memcpy(h, rows.data(), rows.size() * sizeof(cuda::GpuSamplingRow));
  std::memcpy(h + rows_bytes, ints.data(), ints.size() * 4);
  std::memcpy(h + rows_bytes + ints_bytes, floats.data(), floats.size() * 4);
  auto* d = sampling_io_.as<uint8_t>();
  KCUDA_CHECK(cudaMemcpyAsync(d, h, in_bytes, cudaMemcpyHostToDevice, stream_));

  const auto* d_ints = reinterpret_cast<const int32_t*>(d + rows_bytes);
  cuda::GpuSamplingBatch b{};
  b.logits = logits_;
  b.n_rows = n;
  b.vocab = vocab;
  b.rows = reinterpret_cast<const cuda::GpuSamplingRow*>(d);
  b.repetition_ids = d_ints;
  b.count_ids = b.repetition_ids + hb.repetition_ids.size();
  b.count_values = b.count_ids + hb.count_ids.size();
  b.bias_ids = b.count_values + hb.count_values.size();
  b.bias_values = reinterpret_cast<const float*>(d + rows_bytes + ints_bytes);
  uint8_t* d_out = d + in_bytes;
  b.out_tokens = sampled_tokens_.as<int32_t>();
  b.out_top_ids = reinterpret_cast<int32_t*>(d_out + tokens_bytes);
  b.out_logprob = reinterpret_cast<float*>(d_out + tokens_bytes + top_ids_bytes);
  b.out_top_logprobs = b.out_logprob + n;
  b.greedy_only = std::all_of(rows.begin(), rows.end(), cuda::IsPlainGreedy);
  cuda::GpuSample(b, sampling_workspace_.get(), sampling_workspace_.size_bytes(), stream_);
  // Tokens into the first slot of the output area, so one copy brings everything back.
  KCUDA_CHECK(
      cudaMemcpyAsync(d_out, b.out_tokens, size_t(n) * 4, cudaMemcpyDeviceToDevice, stream_));
  KCUDA_CHECK(cudaMemcpyAsync(h + in_bytes, d_out, out_bytes, cudaMemcpyDeviceToHost, stream_));
  KCUDA_CHECK(cudaEventRecord(sampling_done_, stream_));
  // Where FinishSampling finds each output on the host.
  const uint8_t* h_out = h + in_bytes;
  sampling_out_.tokens = reinterpret_cast<const int32_t*>(h_out);
  sampling_out_.top_ids = reinterpret_cast<const int32_t*>(h_out + tokens_bytes);
  sampling_out_.logprob = reinterpret_cast<const float*>(h_out + tokens_bytes + top_ids_bytes);
  sampling_out_.top_logprobs = sampling_out_.logprob + n;
}

void CudaRunner::FinishSampling(std::span<SampleResult> results) {
  KCHECK_MSG(sampling_pending_, "FinishSampling without LaunchSampling");
  const int32_t n = static_cast<int32_t>(pending_samplers_.size());
  KCHECK(results.size() == pending_samplers_.size());
  sampling_pending_ = false;
  if (n == 0) return;
  constexpr int32_t kTop = cuda::kGpuMaxTopLogprobs;
  const int32_t vocab = static_cast<int32_t>(config_.vocab_size);
  KCUDA_CHECK(cudaEventSynchronize(sampling_done_));
  const int32_t* tokens = sampling_out_.tokens;
  const int32_t* top_ids = sampling_out_.top_ids;
  const float* logprob = sampling_out_.logprob;
  const float* top_lp = sampling_out_.top_logprobs;
  for (int32_t i = 0; i < n; ++i) {
    SampleResult& r = results[i];
    r.token = tokens[i];
    r.logprob = logprob[i];
    r.top.clear();
    Sampler* sampler = pending_samplers_[static_cast<size_t>(i)];
    const SamplingParams& p = sampler->params();
    if (p.logprobs) {
      const int32_t n_top = std::min(p.n_top_logprobs, vocab);
      for (int32_t j = 0; j < n_top; ++j) {
        r.top.push_back({top_ids[i * kTop + j], top_lp[i * kTop + j]});
      }
    }
    sampler->Accept(r.token);
  }
  pending_samplers_.clear();
}

void CudaRunner::CopyKvBlocks(int32_t src_first, int32_t dst_first, int32_t n_blocks) {
  KCHECK(n_blocks >= 0 && src_first >= 0 && dst_first >= 0);
  KCHECK(src_first + n_blocks <= n_blocks_ && dst_first + n_blocks <= n_blocks_);
  KCHECK(src_first + n_blocks <= dst_first || dst_first + n_blocks <= src_first);
  // Data, and for a quantized cache the row scales, of every K and V cache.
  const size_t block_bytes = size_t(kv_pool_.bytes_per_cache / (n_blocks_ + 1));
  const size_t block_scale_bytes = size_t(kv_pool_.rows_per_cache / (n_blocks_ + 1)) * sizeof(float);
  auto copy = [&](uint8_t* base, size_t bytes) {
    KCUDA_CHECK(cudaMemcpyAsync(base + dst_first * bytes, base + src_first * bytes,
                                n_blocks * bytes, cudaMemcpyDeviceToDevice, stream_));
  };
  for (int64_t i = 0; i < 2 * cache_spec_.n_attention_layers; ++i) {
    copy(kv_pool_.data(i), block_bytes);
    if (float* scales = kv_pool_.scales(i); scales != nullptr) {
      copy(reinterpret_cast<uint8_t*>(scales), block_scale_bytes);
    }
  }
  KCUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaRunner::Mark(CudaStage s) {
  if (!profiling_) return;
  if (marks_.size() >= event_pool_.size()) {
    cudaEvent_t e;
    KCUDA_CHECK(cudaEventCreate(&e));
    event_pool_.push_back(e);
  }
  cudaEvent_t e = event_pool_[marks_.size()];
  KCUDA_CHECK(cudaEventRecord(e, stream_));
  marks_.push_back({s, e});
}

void CudaRunner::CollectProfile() {
  if (!profiling_) return;
  KCUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaEvent_t prev = profile_start_;
  for (const auto& [stage, e] : marks_) {
    float ms = 0;
    KCUDA_CHECK(cudaEventElapsedTime(&ms, prev, e));
    const double s = ms * 1e-3;
    switch (stage) {
      case CudaStage::kAttention:
        stats_.attention_s += s;
        break;
      case CudaStage::kRecurrent:
        stats_.recurrent_s += s;
        break;
      case CudaStage::kMatmul:
        stats_.matmul_s += s;
        break;
      case CudaStage::kMoe:
        stats_.moe_s += s;
        break;
      case CudaStage::kOther:
        stats_.other_s += s;
        break;
    }
    prev = e;
  }
  marks_.clear();
}

void CudaRunner::RunForward(const DeviceBatchView& v) {
  // The first logits_capacity_ rows; Forward runs the LM head again for any further chunk.
  decoder_->Forward(v, std::min(v.n_logits, logits_capacity_), kv_pool_, state_pool_, stream_,
                    linear_.get(), this);
}

void CudaRunner::Forward(const Batch& batch, float* logits) {
  CheckBatch(batch, BatchLimits{config_.vocab_size, n_slots_, n_blocks_, block_size_,
                                n_sampled_rows_, n_state_slots_});
  const ModelConfig& c = config_;
  const int32_t n = batch.n_tokens();
  const int32_t n_seqs = batch.n_seqs();
  const int32_t n_logits = static_cast<int32_t>(batch.logits_indices.size());
  const ForwardStats before = stats_;
  int32_t max_ctx = 0;
  for (int32_t len : batch.context_lens) max_ctx = std::max(max_ctx, len);
  KCHECK_MSG(max_ctx <= attention_workspace_context_,
             "context longer than the model's max_position_embeddings");
  const Status st = EnsureActivations(n);
  KCHECK_MSG(st.ok(), st.message().c_str());
  // Per-stage event timing measures each stage alone: no programmatic overlap across marks.
  std::optional<cuda::ScopedPdlOff> no_pdl;
  if (profiling_) no_pdl.emplace();
  if (profiling_) KCUDA_CHECK(cudaEventRecord(profile_start_, stream_));
  // Tokens the last sampling left on the device, into this step's token ids (in place, before
  // the embedding reads them).
  auto resolve_sampled = [&](const DeviceBatchView& v) {
    if (v.sampled_rows == nullptr) return;
    cuda::ResolveSampledTokens(meta_device_.as<int32_t>(), v.sampled_rows,
                               sampled_tokens_.as<int32_t>(), n, stream_);
  };

  const bool decode = n == n_seqs;
  // Graphs: pure decode, every row wants logits, in token order (device row i = token i).
  bool identity_logits = n_logits == n;
  for (int32_t i = 0; identity_logits && i < n_logits; ++i) {
    identity_logits = batch.logits_indices[i] == i;
  }
  const bool graph = use_graphs_ && !profiling_ && decode && n <= kMaxGraphRows &&
                     identity_logits && batch.state_copies.empty();
  if (graph) {
    const int32_t rows = NextPow2(n);
    // Context bucket: a power of two (>= kMinGraphContext), capped at the longest context the
    // attention workspace was sized for (max_ctx never exceeds it).
    const int32_t ctx =
        std::min(std::max(NextPow2(max_ctx), kMinGraphContext), attention_workspace_context_);
    const int32_t stride = (ctx + block_size_ - 1) / block_size_;
    // The rows past n are padding: their logits are computed and ignored.
    auto it = graphs_.find({rows, ctx});
    if (it == graphs_.end() && n_state_slots_ > 0) {
      // A recurrent step cannot run twice (it advances the state): the eager warm-up runs on
      // the reserved state slot (its K/V writes are rewritten by the graph), then the captured
      // graph runs the step.
      const DeviceBatchView w = StageBatch(batch, rows, stride, ctx, /*graph=*/true, true);
      resolve_sampled(w);
      RunForward(w);
    }
    const DeviceBatchView v = StageBatch(batch, rows, stride, ctx, /*graph=*/true);
    resolve_sampled(v);
    if (it == graphs_.end()) {
      // First step of this bucket: run it eagerly (which also makes the GEMM engine choose and
      // cache its algorithms outside any capture), then capture the same work for later steps.
      if (n_state_slots_ == 0) RunForward(v);
      cudaGraph_t g;
      KCUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      RunForward(v);
      KCUDA_CHECK(cudaStreamEndCapture(stream_, &g));
      cudaGraphExec_t exec;
      KCUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      KCUDA_CHECK(cudaGraphDestroy(g));
      graphs_.emplace(std::make_pair(rows, ctx), exec);
      if (n_state_slots_ > 0) KCUDA_CHECK(cudaGraphLaunch(exec, stream_));
    } else {
      KCUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    }
    last_n_logits_ = n_logits;
  } else {
    const int32_t stride = batch.max_blocks_per_seq;
    const DeviceBatchView v = StageBatch(batch, n, stride, std::max(max_ctx, 1), /*graph=*/false);
    resolve_sampled(v);
    // Prefix-cache restores: whole slots, before any layer runs.
    cuda::CopyStateSlots(state_pool_.base, state_pool_.slot_floats, state_copy_src_,
                         state_copy_dst_, n_state_copies_, stream_);
    RunForward(v);
    last_n_logits_ = std::min(n_logits, logits_capacity_);
    // More logits rows than one LM-head chunk (e.g. `kestrel logits` over a long prompt):
    // the extra chunks run after the first one was copied out.
    if (n_logits > logits_capacity_ && logits != nullptr) {
      KCUDA_CHECK(cudaMemcpyAsync(logits, logits_, size_t(logits_capacity_) * c.vocab_size * 4,
                                  cudaMemcpyDeviceToHost, stream_));
      for (int32_t r0 = logits_capacity_; r0 < n_logits; r0 += logits_capacity_) {
        const int32_t rows = std::min(logits_capacity_, n_logits - r0);
        decoder_->LmHead(v.logits_rows + r0, rows, stream_, linear_.get(), this);
        KCUDA_CHECK(cudaMemcpyAsync(logits + int64_t{r0} * c.vocab_size, logits_,
                                    size_t(rows) * c.vocab_size * 4, cudaMemcpyDeviceToHost,
                                    stream_));
      }
      KCUDA_CHECK(cudaStreamSynchronize(stream_));
      logits = nullptr;  // copied
      last_n_logits_ = 0;
    } else {
      KCHECK_MSG(n_logits <= logits_capacity_ || logits != nullptr,
                 "more logits rows than the device sampler holds in one step");
    }
  }
  // Device row i holds the logits of the caller's row i (logits_indices[i]).
  if (logits != nullptr) {
    KCUDA_CHECK(cudaMemcpyAsync(logits, logits_, size_t(last_n_logits_) * c.vocab_size * 4,
                                cudaMemcpyDeviceToHost, stream_));
    KCUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Bytes for the roofline: every layer's weights once, plus the embedding rows gathered; in
  // MoE layers the experts the step routed rows to (counted on the device; read back when
  // profiling, else the one-token figure).
  int64_t weight_bytes = decode_weight_bytes();
  if (profiling_ && decoder_->n_moe_layers() > 0) {
    std::vector<int32_t> active(static_cast<size_t>(decoder_->n_moe_layers()));
    KCUDA_CHECK(cudaMemcpyAsync(active.data(), decoder_->moe_active_log(), active.size() * 4,
                                cudaMemcpyDeviceToHost, stream_));
    KCUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int32_t a : active)
      weight_bytes += (a - decoder_->moe_picks(n)) * decoder_->moe_expert_bytes();
  }
  CollectProfile();  // synchronises when profiling
  NoteDecodeStep(before, n == n_seqs, &stats_);
  stats_.weight_bytes_read += weight_bytes + (int64_t{n} - 1) * c.hidden_size * 2;
  stats_.state_bytes += 2 * int64_t{n_seqs} * cache_spec_.state_bytes_per_slot();
  stats_.n_forwards += 1;
  stats_.n_tokens += n;
}

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
