// The CPU runner (see cpu_runner.h).
#include "models/cpu_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "models/batch_check.h"

namespace kestrel {

namespace {

// How the CPU stores K/V rows for the KV dtype of `options` (auto: f32; fp8 is refused before).
CpuCaches::KvStorage KvStorageOf(const ModelLoadOptions& options) {
  using KvDType = ModelLoadOptions::KvCacheDType;
  using KvStorage = CpuCaches::KvStorage;
  return options.kv_cache_dtype == KvDType::kInt8   ? KvStorage::kInt8
         : options.kv_cache_dtype == KvDType::kBf16 ? KvStorage::kBf16
                                                    : KvStorage::kF32;
}

// The CPU caches' shape for the KV dtype of `options`: f32, bf16 or int8 elements (int8 with an
// f32 scale per row).
CacheSpec CpuCacheSpec(const ModelConfig& config, const ModelLoadOptions& options) {
  using KvStorage = CpuCaches::KvStorage;
  const KvStorage storage = KvStorageOf(options);
  CacheSpec spec = MakeCacheSpec(config, storage == KvStorage::kInt8   ? 1
                                         : storage == KvStorage::kBf16 ? 2
                                                                       : sizeof(float));
  if (storage == KvStorage::kInt8) spec.kv_row_scale_bytes = sizeof(float);
  return spec;
}

}  // namespace

int64_t ResolveKvCacheTokens(const ModelConfig& config, const ModelLoadOptions& options) {
  if (options.kv_cache_tokens > 0) return options.kv_cache_tokens;
  int64_t tokens = config.max_position_embeddings > 0 ? config.max_position_embeddings
                                                      : kDefaultKvCacheTokensCap;
  tokens = std::min(tokens, kDefaultKvCacheTokensCap);
  const int64_t bytes_per_token = CpuCacheSpec(config, options).kv_bytes_per_token();
  if (bytes_per_token > 0) tokens = std::min(tokens, kDefaultKvBudgetBytes / bytes_per_token);
  return std::max<int64_t>(tokens, options.block_size_tokens);
}

int32_t ResolveStateSlots(const CacheSpec& spec, const ModelLoadOptions& options) {
  if (!spec.has_recurrent_state()) return 0;
  const int64_t budget =
      options.state_snapshot_bytes < 0 ? kDefaultStateSnapshotBytes : options.state_snapshot_bytes;
  const int64_t snapshots = std::min(budget / spec.state_bytes_per_slot(), kMaxStateSnapshots);
  return static_cast<int32_t>(std::max<int64_t>(options.max_num_seqs, 1) + snapshots);
}

CpuRunner::CpuRunner(ModelConfig config, WeightStore store, DecoderWeights weights)
    : config_(std::move(config)), store_(std::move(store)), weights_(std::move(weights)) {}

std::string CpuRunner::kernels_name() const {
  return std::string(cpu::KernelSetName(ops_.kernels));
}

int64_t CpuRunner::decode_weight_bytes() const {
  // One embedding row instead of the table (unless tied: the LM head reads it whole), and in
  // MoE layers only top_k of the routed experts (one token's share).
  int64_t bytes = weights_.n_bytes;
  if (!config_.tie_word_embeddings) {
    bytes -= static_cast<int64_t>(weights_.embed.size_bytes());
    bytes += weights_.embed.row_bytes();
  }
  for (const DecoderLayerWeights& l : weights_.layers) {
    if (!l.moe || l.moe_w.experts.empty()) continue;
    const MlpWeights& e = l.moe_w.experts[0];
    const int64_t expert = static_cast<int64_t>(e.gate_proj.size_bytes() + e.up_proj.size_bytes() +
                                                e.down_proj.size_bytes());
    bytes -= (config_.moe.n_experts - config_.moe.top_k) * expert;
  }
  return bytes;
}

Status CpuRunner::AllocateCaches(const ModelLoadOptions& options) {
  const ModelConfig& c = config_;
  using KvDType = ModelLoadOptions::KvCacheDType;
  if (options.kv_cache_dtype == KvDType::kFp8) {
    return Unsupported(
        "--kv-cache-dtype fp8 is for --device cuda; the CPU stores f32, bf16 or int8");
  }
  using KvStorage = CpuCaches::KvStorage;
  caches_.kv_storage = KvStorageOf(options);
  caches_.spec = CpuCacheSpec(c, options);
  // KV pool: capacity rounded up to whole blocks.
  const int32_t block_size = options.block_size_tokens;
  const int64_t tokens = ResolveKvCacheTokens(c, options);
  const int64_t n_blocks = (tokens + block_size - 1) / block_size;
  if (n_blocks * block_size > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("KV cache of " + std::to_string(tokens) +
                           " tokens exceeds the 2^31 slot limit");
  }
  caches_.kv_layout = cpu::KvLayout{c.n_kv_heads, c.head_dim, block_size, n_blocks};
  const int64_t kv_floats = 2 * caches_.spec.n_attention_layers * caches_.kv_floats_per_layer();
  // Uninitialised on purpose: slots are written before they are read, and pages are backed only
  // where touched, so an unused capacity costs no memory. Huge pages where the kernel gives them
  // (AllocateLargeArray): a decode step's attention reads every row of a sequence's blocks.
  if (kv_floats > 0) {
    bool allocated = false;
    switch (caches_.kv_storage) {
      case KvStorage::kInt8:
        caches_.kv_q = AllocateLargeArray<int8_t>(static_cast<size_t>(kv_floats));
        caches_.kv_scale.reset(new (std::nothrow) float[static_cast<size_t>(
            2 * caches_.spec.n_attention_layers * caches_.kv_rows_per_layer())]);
        allocated = caches_.kv_q != nullptr && caches_.kv_scale != nullptr;
        break;
      case KvStorage::kBf16:
        caches_.kv_bf16 = AllocateLargeArray<uint16_t>(static_cast<size_t>(kv_floats));
        allocated = caches_.kv_bf16 != nullptr;
        break;
      case KvStorage::kF32:
        caches_.kv = AllocateLargeArray<float>(static_cast<size_t>(kv_floats));
        allocated = caches_.kv != nullptr;
        break;
    }
    if (!allocated) {
      return ResourceExhausted("cannot allocate the KV cache: " + std::to_string(tokens) +
                               " tokens x " + std::to_string(kv_bytes_per_token()) + " bytes");
    }
  }
  // State slots: zeroed where a sequence starts, copied from snapshots on a prefix-cache hit.
  caches_.n_state_slots = ResolveStateSlots(caches_.spec, options);
  const int64_t state_floats = int64_t{caches_.n_state_slots} * caches_.state_floats_per_slot();
  if (state_floats > 0) {
    caches_.state.reset(new (std::nothrow) float[static_cast<size_t>(state_floats)]);
    if (caches_.state == nullptr) {
      return ResourceExhausted("cannot allocate " + std::to_string(caches_.n_state_slots) +
                               " recurrent-state slots of " +
                               std::to_string(caches_.spec.state_bytes_per_slot()) + " bytes");
    }
  }
  return Status::Ok();
}

namespace {

// Every packable linear weight (the block formats of cpu::PackedBlockBytes: cpu::CanPackRows)
// gets the interleaved copy the AVX2 integer kernels read (cpu::PackRows: the same bits, 8 rows
// per pass over the activations), kept with the weights.
// The file's own blocks stay mapped for everything else (embedding rows, the reference kernels).
// KESTREL_CPU_PACKED_ROWS=0 keeps the row kernels (the same bits; for speed comparisons).
void PackBlockWeights(DecoderWeights* w) {
  if (const char* env = std::getenv("KESTREL_CPU_PACKED_ROWS"); env != nullptr) {
    if (std::string_view(env) == "0") return;
  }
  std::vector<TensorView*> views;
  auto add = [&](TensorView& v) {
    if (cpu::CanPackRows(v)) views.push_back(&v);
  };
  auto mlp = [&](MlpWeights& m) {
    add(m.gate_proj);
    add(m.up_proj);
    add(m.down_proj);
  };
  for (DecoderLayerWeights& l : w->layers) {
    for (TensorView* v : {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj,
                          &l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b,
                          &l.gdn.in_proj_a, &l.gdn.in_proj_qkvz, &l.gdn.in_proj_ba,
                          &l.gdn.out_proj}) {
      add(*v);
    }
    mlp(l.mlp);
    for (MlpWeights& e : l.moe_w.experts) mlp(e);
    mlp(l.moe_w.shared_expert);
  }
  add(w->lm_head);
  // One arena for all of them (64-byte aligned each), in huge pages where the kernel gives them:
  // a decode step streams every byte once. Without the memory, the row kernels stay.
  auto padded_bytes = [](const TensorView& v) { return (cpu::PackedRowsBytes(v) + 63) / 64 * 64; };
  int64_t total = 0;
  for (const TensorView* v : views) total += padded_bytes(*v);
  if (total == 0) return;
  w->packed_rows = AllocateLargeArray<uint8_t>(static_cast<size_t>(total));
  if (w->packed_rows == nullptr) return;
  uint8_t* at = w->packed_rows.get();
  for (TensorView* v : views) {
    cpu::PackRows(*v, at);
    v->cpu_packed = at;
    at += padded_bytes(*v);
  }
}

}  // namespace

Result<std::unique_ptr<Model>> LoadCpuModel(ModelConfig config, WeightStore store,
                                            const ModelLoadOptions& options) {
  KTRY(ValidateDecoderConfig(config, options));
  KASSIGN(DecoderWeights weights, BindDecoderWeights(config, store));
  std::unique_ptr<CpuRunner> m(
      new CpuRunner(std::move(config), std::move(store), std::move(weights)));
  const bool fast = options.kernels == CpuKernels::kAuto && cpu::CpuHasAvx2Fma();
  m->ops_.kernels = fast ? cpu::KernelSet::kAvx2 : cpu::KernelSet::kReference;
  m->pool_ = std::make_unique<ThreadPool>(options.n_threads);
  m->ops_.pool = m->pool_.get();
  m->ops_.int8_activations = options.int8_activations;
  m->ops_.batch_invariant = options.deterministic;
  if (fast && options.int8_activations) PackBlockWeights(&m->weights_);
  KTRY(m->AllocateCaches(options));
  m->decoder_ =
      std::make_unique<CpuDecoder>(m->config_, m->weights_, m->ops_, &m->caches_, &m->stats_);
  m->decoder_->set_bf16_activations(options.bf16_activations);
  // Attention score rows for the whole capacity now, so that a long context never allocates in
  // Forward; activation buffers are sized by the first batches.
  m->decoder_->Reserve(1, m->caches_.kv_layout.n_slots());
  return std::unique_ptr<Model>(std::move(m));
}

void CpuRunner::Forward(const Batch& in, float* logits) {
  CheckBatch(in, BatchLimits{config_.vocab_size, caches_.kv_layout.n_slots(),
                             static_cast<int32_t>(caches_.kv_layout.n_blocks),
                             caches_.kv_layout.block_size_tokens,
                             static_cast<int32_t>(sampled_tokens_.size()), caches_.n_state_slots});
  const ForwardStats before = stats_;
  // Tokens of the last sampling are known here already (LaunchSampling ran Sample).
  Batch batch = in;
  if (!in.sampled_rows.empty()) {
    resolved_token_ids_.assign(in.token_ids.begin(), in.token_ids.end());
    for (size_t t = 0; t < resolved_token_ids_.size(); ++t) {
      const int32_t row = in.sampled_rows[t];
      if (row >= 0) resolved_token_ids_[t] = sampled_tokens_[static_cast<size_t>(row)];
    }
    batch.token_ids = resolved_token_ids_;
    batch.sampled_rows = {};
  }
  // Prefix-cache restores: whole slots, before any layer runs.
  const int64_t slot_floats = caches_.state_floats_per_slot();
  for (const StateCopy& c : batch.state_copies) {
    std::memcpy(caches_.slot(c.dst_slot), caches_.slot(c.src_slot),
                static_cast<size_t>(slot_floats) * sizeof(float));
  }

  const ModelConfig& c = config_;
  const int64_t n_logits = static_cast<int64_t>(batch.logits_indices.size());
  if (static_cast<int64_t>(hidden_.size()) < n_logits * c.hidden_size) {
    hidden_.resize(static_cast<size_t>(n_logits * c.hidden_size));
  }
  decoder_->Forward(batch, hidden_.data());

  // LM head, only for the requested rows.
  if (logits == nullptr) {
    kept_logits_.resize(static_cast<size_t>(n_logits * c.vocab_size));
    logits = kept_logits_.data();
  }
  n_kept_logits_ = static_cast<int32_t>(n_logits);
  if (n_logits > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::Linear(ops_, hidden_.data(), n_logits, weights_.lm_head, TensorView{}, logits);
    stats_.matmul_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.weight_bytes_read += static_cast<int64_t>(weights_.lm_head.size_bytes());
  }
  NoteDecodeStep(before, batch.n_tokens() == batch.n_seqs(), &stats_);
  stats_.n_forwards += 1;
  stats_.n_tokens += batch.n_tokens();
}

void CpuRunner::LaunchSampling(std::span<Sampler* const> samplers) {
  KCHECK_MSG(!sampling_pending_, "LaunchSampling twice without FinishSampling");
  KCHECK_MSG(static_cast<int32_t>(samplers.size()) == n_kept_logits_,
             "LaunchSampling needs one sampler per logits row of the last Forward");
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  sampled_.resize(samplers.size());
  sampled_tokens_.resize(samplers.size());
  for (size_t i = 0; i < samplers.size(); ++i) {
    sampled_[i] = samplers[i]->Sample(std::span<float>(kept_logits_.data() + i * vocab, vocab));
    sampled_tokens_[i] = sampled_[i].token;
  }
  n_kept_logits_ = 0;  // each Forward's logits are sampled once
  sampling_pending_ = true;
}

void CpuRunner::FinishSampling(std::span<SampleResult> results) {
  KCHECK_MSG(sampling_pending_, "FinishSampling without LaunchSampling");
  KCHECK(results.size() == sampled_.size());
  for (size_t i = 0; i < results.size(); ++i) results[i] = std::move(sampled_[i]);
  sampling_pending_ = false;
}

void CpuRunner::CopyKvBlocks(int32_t src_first, int32_t dst_first, int32_t n_blocks) {
  const cpu::KvLayout& l = caches_.kv_layout;
  KCHECK(n_blocks >= 0 && src_first >= 0 && dst_first >= 0);
  KCHECK(src_first + n_blocks <= l.n_blocks && dst_first + n_blocks <= l.n_blocks);
  KCHECK(src_first + n_blocks <= dst_first || dst_first + n_blocks <= src_first);
  const int64_t block = l.floats_per_block();          // elements of one block
  const int64_t block_rows = block / l.head_dim;        // rows (and int8 scales) of one block
  for (int64_t i = 0; i < caches_.spec.n_attention_layers; ++i) {
    for (int which : {0, 1}) {
      const cpu::KvRowsOut c = caches_.rows(i, which);
      if (c.f32 != nullptr) {
        std::memcpy(c.f32 + dst_first * block, c.f32 + src_first * block,
                    static_cast<size_t>(n_blocks * block) * sizeof(float));
      } else {
        std::memcpy(c.q + dst_first * block, c.q + src_first * block,
                    static_cast<size_t>(n_blocks * block));
        std::memcpy(c.scale + dst_first * block_rows, c.scale + src_first * block_rows,
                    static_cast<size_t>(n_blocks * block_rows) * sizeof(float));
      }
    }
  }
}

}  // namespace kestrel
