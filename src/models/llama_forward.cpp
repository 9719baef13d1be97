// The dense decoder forward over a flattened multi-sequence batch (see llama.h for the outline).
#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "models/llama.h"

namespace kestrel {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class T>
void GrowTo(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

namespace detail {

void CheckBatch(const Batch& b, int64_t vocab_size, int64_t n_slots, int32_t n_blocks,
                int32_t block_size, int32_t n_sampled_rows) {
  const int32_t n = b.n_tokens();
  const int32_t n_seqs = b.n_seqs();
  KCHECK(n > 0 && n_seqs > 0);
  KCHECK(b.positions.size() == static_cast<size_t>(n));
  KCHECK(b.slot_mapping.size() == static_cast<size_t>(n));
  KCHECK(b.context_lens.size() == static_cast<size_t>(n_seqs));
  KCHECK(b.max_blocks_per_seq > 0);
  KCHECK(b.block_tables.size() == static_cast<size_t>(n_seqs) * b.max_blocks_per_seq);
  KCHECK(b.seq_starts[0] == 0 && b.seq_starts[n_seqs] == n);
  for (int32_t s = 0; s < n_seqs; ++s) {
    KCHECK(b.seq_starts[s] <= b.seq_starts[s + 1]);
    KCHECK(b.context_lens[s] <= static_cast<int64_t>(b.max_blocks_per_seq) * block_size);
    for (int32_t t = b.seq_starts[s]; t < b.seq_starts[s + 1]; ++t) {
      KCHECK(b.positions[t] >= 0 && b.positions[t] < b.context_lens[s]);
    }
  }
  KCHECK(b.sampled_rows.empty() || b.sampled_rows.size() == static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    if (!b.sampled_rows.empty() && b.sampled_rows[t] >= 0) {
      KCHECK_MSG(b.sampled_rows[t] < n_sampled_rows, "sampled row past the last sampling");
    } else {
      KCHECK(b.token_ids[t] >= 0 && b.token_ids[t] < vocab_size);
    }
    KCHECK(b.slot_mapping[t] >= 0 && b.slot_mapping[t] < n_slots);
  }
  for (int32_t block : b.block_tables) KCHECK(block >= -1 && block < n_blocks);
  for (int32_t row : b.logits_indices) KCHECK(row >= 0 && row < n);
}

}  // namespace detail

void DenseDecoder::EnsureScratch(int64_t n_tokens, int64_t max_context) {
  detail::ForwardScratch& s = scratch_;
  if (n_tokens > s.capacity_tokens) {
    const ModelConfig& c = config_;
    const int64_t q_dim = c.n_heads * c.head_dim;
    const int64_t n_half = static_cast<int64_t>(inv_freq_.size());
    GrowTo(s.x, n_tokens * c.hidden_size);
    GrowTo(s.xn, n_tokens * c.hidden_size);
    GrowTo(s.tmp, n_tokens * c.hidden_size);
    GrowTo(s.q, n_tokens * q_dim);
    GrowTo(s.k, n_tokens * kv_dim_);
    GrowTo(s.v, n_tokens * kv_dim_);
    GrowTo(s.attn, n_tokens * q_dim);
    GrowTo(s.gate, n_tokens * c.intermediate_size);
    GrowTo(s.up, n_tokens * c.intermediate_size);
    GrowTo(s.rope_cos, n_tokens * n_half);
    GrowTo(s.rope_sin, n_tokens * n_half);
    s.capacity_tokens = n_tokens;
  }
  if (max_context > s.capacity_context) {
    cpu::AttentionShape shape;
    shape.n_heads = config_.n_heads;
    shape.n_kv_heads = config_.n_kv_heads;
    shape.head_dim = config_.head_dim;
    GrowTo(s.scores, cpu::AttentionScratchFloats(ops_, shape, max_context));
    s.capacity_context = max_context;
  }
}

void DenseDecoder::LinearTimed(int64_t m_rows, std::initializer_list<cpu::LinearJob> jobs) {
  const Clock::time_point t0 = Clock::now();
  cpu::LinearGroup(ops_, m_rows, std::span<const cpu::LinearJob>(jobs.begin(), jobs.size()));
  stats_.matmul_s += SecondsSince(t0);
  for (const cpu::LinearJob& job : jobs) {
    stats_.weight_bytes_read += static_cast<int64_t>(
        job.w->size_bytes() + (job.bias != nullptr ? job.bias->size_bytes() : 0));
  }
}

void DenseDecoder::Layer(int64_t layer, const Batch& batch) {
  const ModelConfig& c = config_;
  const detail::DecoderLayerWeights& w = layers_[static_cast<size_t>(layer)];
  detail::ForwardScratch& s = scratch_;
  const int64_t n = batch.n_tokens();
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n_half = static_cast<int64_t>(inv_freq_.size());

  // Attention block: norm, projections, QK-norm, RoPE.
  Clock::time_point t0 = Clock::now();
  cpu::RmsNorm(s.x.data(), n, hidden, w.input_norm, eps, s.xn.data());
  stats_.other_s += SecondsSince(t0);
  LinearTimed(n, {{s.xn.data(), &w.q_proj, &w.q_bias, s.q.data()},    // [n, n_heads*head_dim]
                  {s.xn.data(), &w.k_proj, &w.k_bias, s.k.data()},    // [n, n_kv_heads*head_dim]
                  {s.xn.data(), &w.v_proj, &w.v_bias, s.v.data()}});  // [n, n_kv_heads*head_dim]
  t0 = Clock::now();
  if (c.qk_norm) {  // Qwen3: RMSNorm over head_dim of every head, before RoPE
    cpu::RmsNorm(s.q.data(), n * c.n_heads, c.head_dim, w.q_norm, eps, s.q.data());
    cpu::RmsNorm(s.k.data(), n * c.n_kv_heads, c.head_dim, w.k_norm, eps, s.k.data());
  }
  cpu::ApplyRope(s.q.data(), n, c.n_heads, c.head_dim, s.rope_cos.data(), s.rope_sin.data(),
                 n_half);
  cpu::ApplyRope(s.k.data(), n, c.n_kv_heads, c.head_dim, s.rope_cos.data(),
                 s.rope_sin.data(), n_half);
  stats_.other_s += SecondsSince(t0);

  // K/V into the paged pool, then attention of every token over its sequence's cache.
  t0 = Clock::now();
  const cpu::KvLayout layout{c.n_kv_heads, c.head_dim, block_size_, n_blocks_};
  cpu::WriteKv(s.k.data(), s.v.data(), batch.slot_mapping, layout, k_cache(layer),
               v_cache(layer));
  cpu::AttentionShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.scale = attention_scale_;
  shape.sliding_window = w.sliding_window;
  shape.block_size_tokens = block_size_;
  shape.n_blocks = n_blocks_;
  cpu::AttentionBatch ab{batch.positions, batch.seq_starts, batch.block_tables,
                         batch.max_blocks_per_seq};
  cpu::PagedAttention(ops_, shape, ab, s.q.data(), k_cache(layer), v_cache(layer),
                      s.attn.data(), s.scores);
  stats_.attention_s += SecondsSince(t0);

  // Output projection and residual.
  LinearTimed(n, {{s.attn.data(), &w.o_proj, &w.o_bias, s.tmp.data()}});  // [n, hidden]
  t0 = Clock::now();
  cpu::AddInPlace(s.x.data(), s.tmp.data(), n * hidden);
  cpu::RmsNorm(s.x.data(), n, hidden, w.post_norm, eps, s.xn.data());
  stats_.other_s += SecondsSince(t0);

  // SwiGLU MLP and residual.
  LinearTimed(n, {{s.xn.data(), &w.gate_proj, &w.gate_bias, s.gate.data()},  // [n, intermediate]
                  {s.xn.data(), &w.up_proj, &w.up_bias, s.up.data()}});       // [n, intermediate]
  t0 = Clock::now();
  cpu::SiluMul(ops_, s.gate.data(), s.up.data(), n * c.intermediate_size, s.gate.data());
  stats_.other_s += SecondsSince(t0);
  LinearTimed(n, {{s.gate.data(), &w.down_proj, &w.down_bias, s.tmp.data()}});  // [n, hidden]
  t0 = Clock::now();
  cpu::AddInPlace(s.x.data(), s.tmp.data(), n * hidden);
  stats_.other_s += SecondsSince(t0);
}

void DenseDecoder::Forward(const Batch& in, float* logits) {
  detail::CheckBatch(in, config_.vocab_size, n_slots_, n_blocks_, block_size_,
                     static_cast<int32_t>(sampled_tokens_.size()));
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
  const ModelConfig& c = config_;
  const int64_t n = batch.n_tokens();
  const int64_t hidden = c.hidden_size;
  int32_t max_pos = 0;
  for (int32_t p : batch.positions) max_pos = std::max(max_pos, p);
  EnsureScratch(n, int64_t{max_pos} + 1);
  detail::ForwardScratch& s = scratch_;

  // Token embeddings and the RoPE tables of this batch's positions.
  Clock::time_point t0 = Clock::now();
  cpu::EmbeddingGather(embed_, batch.token_ids, s.x.data());  // [n, hidden]
  stats_.weight_bytes_read += n * hidden * static_cast<int64_t>(DTypeSize(embed_.dtype));
  cpu::RopeTables(batch.positions, inv_freq_, rope_attention_scale_, s.rope_cos.data(),
                  s.rope_sin.data());
  stats_.other_s += SecondsSince(t0);

  for (int64_t layer = 0; layer < c.n_layers; ++layer) Layer(layer, batch);

  // Final norm and LM head, only for the requested rows.
  const int64_t n_logits = static_cast<int64_t>(batch.logits_indices.size());
  if (logits == nullptr) {
    kept_logits_.resize(static_cast<size_t>(n_logits * c.vocab_size));
    logits = kept_logits_.data();
  }
  n_kept_logits_ = static_cast<int32_t>(n_logits);
  if (n_logits > 0) {
    t0 = Clock::now();
    for (int64_t i = 0; i < n_logits; ++i) {
      const float* src = s.x.data() + int64_t{batch.logits_indices[i]} * hidden;
      std::copy(src, src + hidden, s.tmp.data() + i * hidden);
    }
    cpu::RmsNorm(s.tmp.data(), n_logits, hidden, final_norm_, static_cast<float>(c.rms_norm_eps),
                 s.xn.data());
    stats_.other_s += SecondsSince(t0);
    LinearTimed(n_logits, {{s.xn.data(), &lm_head_, nullptr, logits}});  // [n_logits, vocab]
  }
  stats_.n_forwards += 1;
  stats_.n_tokens += n;
}

void DenseDecoder::LaunchSampling(std::span<Sampler* const> samplers) {
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

void DenseDecoder::FinishSampling(std::span<SampleResult> results) {
  KCHECK_MSG(sampling_pending_, "FinishSampling without LaunchSampling");
  KCHECK(results.size() == sampled_.size());
  for (size_t i = 0; i < results.size(); ++i) results[i] = std::move(sampled_[i]);
  sampling_pending_ = false;
}

}  // namespace kestrel
