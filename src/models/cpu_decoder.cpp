// The decoder forward on the CPU (see cpu_decoder.h for the outline).
#include "models/cpu_decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backends/cpu/deltanet.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "models/rope.h"

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

// Calls fn(a, b, dst_slot) over the rows [begin, end) of one sequence, split after every row that
// has a state snapshot (dst_slot its destination, else -1). `cursor` walks the batch's snapshots,
// which are sorted by row, across the sequences of the batch in order.
template <class Fn>
void ForEachSegment(std::span<const StateSnapshot> snaps, size_t& cursor, int64_t begin,
                    int64_t end, Fn&& fn) {
  for (int64_t a = begin; a < end;) {
    while (cursor < snaps.size() && snaps[cursor].row < a) ++cursor;
    if (cursor < snaps.size() && snaps[cursor].row < end) {
      const int64_t b = int64_t{snaps[cursor].row} + 1;
      fn(a, b, snaps[cursor].dst_slot);
      ++cursor;
      a = b;
    } else {
      fn(a, end, -1);
      a = end;
    }
  }
}

}  // namespace

CpuDecoder::CpuDecoder(const ModelConfig& config, const DecoderWeights& weights,
                       const cpu::OpContext& ops, CpuCaches* caches, ForwardStats* stats)
    : c_(config), w_(weights), ops_(ops), caches_(caches), stats_(stats) {
  norm_offset_ = c_.norm_weight_offset ? 1.0f : 0.0f;
  int64_t n_attention = 0, n_recurrent = 0;
  for (LayerType t : c_.layer_types) {
    cache_index_.push_back(t == LayerType::kAttention ? n_attention++ : n_recurrent++);
  }
  inv_freq_ = RopeInvFreq(c_);
  rope_attention_scale_ = RopeAttentionScale(c_);
  attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim)));
  delta_shape_ = {c_.linear.n_key_heads, c_.linear.n_value_heads, c_.linear.key_head_dim,
                  c_.linear.value_head_dim};
}

void CpuDecoder::Reserve(int64_t n_tokens, int64_t max_context) {
  EnsureScratch(n_tokens, max_context);
}

void CpuDecoder::EnsureScratch(int64_t n, int64_t max_context) {
  Scratch& s = s_;
  if (n > s.capacity_tokens) {
    const int64_t hidden = c_.hidden_size;
    const int64_t q_dim = c_.n_heads * c_.head_dim;
    const int64_t kv_dim = c_.n_kv_heads * c_.head_dim;
    const int64_t n_half = static_cast<int64_t>(inv_freq_.size());
    for (auto* v : {&s.x, &s.xn, &s.tmp, &s.gathered, &s.expert_out, &s.shared_out}) {
      GrowTo(*v, n * hidden);
    }
    GrowTo(s.q, n * q_dim);
    GrowTo(s.attn, n * q_dim);
    if (c_.attention_output_gate) {
      GrowTo(s.qg, n * 2 * q_dim);
      GrowTo(s.gate, n * q_dim);
    }
    GrowTo(s.k, n * kv_dim);
    GrowTo(s.v, n * kv_dim);
    GrowTo(s.rope_cos, n * n_half);
    GrowTo(s.rope_sin, n * n_half);
    const int64_t inter = std::max(
        {c_.intermediate_size, c_.moe.expert_intermediate, c_.moe.shared_expert_intermediate});
    GrowTo(s.mlp_gate, n * inter);
    GrowTo(s.mlp_up, n * inter);
    if (c_.n_layers_of(LayerType::kLinearAttention) > 0) {
      const LinearAttentionConfig& l = c_.linear;
      if (l.fused_projections) GrowTo(s.mixed, n * (2 * l.key_dim() + 2 * l.value_dim()));
      GrowTo(s.qkv, n * l.conv_dim());
      GrowTo(s.conv, n * l.conv_dim());
      GrowTo(s.z, n * l.value_dim());
      GrowTo(s.ba, n * 2 * l.n_value_heads);
      GrowTo(s.beta, n * l.n_value_heads);
      GrowTo(s.g, n * l.n_value_heads);
      GrowTo(s.dq, n * l.key_dim());
      GrowTo(s.dk, n * l.key_dim());
      GrowTo(s.dv, n * l.value_dim());
      GrowTo(s.core, n * l.value_dim());
      GrowTo(s.delta, cpu::DeltaChunkScratchFloats(ops_, delta_shape_));
    }
    if (c_.has_moe()) {
      const int64_t k = c_.moe.top_k;
      GrowTo(s.router, n * c_.moe.n_experts);
      GrowTo(s.topk_ids, n * k);
      GrowTo(s.topk_w, n * k);
      GrowTo(s.expert_rows, n * k);
      GrowTo(s.expert_row_w, n * k);
      GrowTo(s.expert_begin, c_.moe.n_experts + 1);
      GrowTo(s.expert_fill, c_.moe.n_experts);
      GrowTo(s.order, c_.moe.n_experts);
      GrowTo(s.shared_gate, n);
    }
    s.capacity_tokens = n;
  }
  if (max_context > s.capacity_context && c_.n_layers_of(LayerType::kAttention) > 0) {
    cpu::AttentionShape shape;
    shape.n_heads = c_.n_heads;
    shape.n_kv_heads = c_.n_kv_heads;
    shape.head_dim = c_.head_dim;
    GrowTo(s.scores, cpu::AttentionScratchFloats(ops_, shape, max_context));
    s.capacity_context = max_context;
  }
}

const TensorView* CpuDecoder::Bf16Weight(const TensorView* w, bool round_quantized) {
  if (!bf16_activations_ || w->dtype == DType::kBF16) return w;
  if (w->dtype != DType::kF32 && w->dtype != DType::kF16 && !round_quantized) return w;
  auto it = rounded_weights_.find(w);
  if (it == rounded_weights_.end()) {
    RoundedWeight r;
    r.values.resize(static_cast<size_t>(w->numel()));
    const int64_t cols = w->shape[w->n_dims - 1];
    const int64_t rows = w->numel() / cols;
    for (int64_t i = 0; i < rows; ++i) {
      if (w->n_dims == 2) {
        quant::DequantizeMatrixRow(*w, i, r.values.data() + i * cols);  // side scales too
      } else {
        quant::DequantizeRow(w->dtype, static_cast<const uint8_t*>(w->data) + i * w->row_bytes(),
                             cols, r.values.data() + i * cols);
      }
    }
    RoundToBf16(r.values.data(), w->numel());
    r.view = *w;  // the shape; plain f32 values, no side scales
    r.view.dtype = DType::kF32;
    r.view.data = r.values.data();
    r.view.block_scale = nullptr;
    r.view.group_bias = nullptr;
    r.view.input_perm = nullptr;  // DequantizeMatrixRow wrote the inputs' own order
    r.view.block_rows = r.view.block_cols = 0;
    it = rounded_weights_.emplace(w, std::move(r)).first;
  }
  return &it->second.view;
}

void CpuDecoder::LinearTimed(int64_t m_rows, std::initializer_list<cpu::LinearJob> jobs,
                             bool round_quantized) {
  const Clock::time_point t0 = Clock::now();
  if (bf16_activations_) {  // the same GEMMs over bf16-rounded copies of their inputs (and of
                            // the weights CUDA holds in bf16: Bf16Weight)
    cpu::LinearJob rounded[cpu::kMaxLinearGroup];
    KCHECK(jobs.size() <= cpu::kMaxLinearGroup);
    size_t j = 0;
    for (const cpu::LinearJob& job : jobs) {
      std::vector<float>& copy = rounded_[j];
      copy.assign(job.x, job.x + m_rows * job.w->shape[1]);
      RoundToBf16(copy.data(), static_cast<int64_t>(copy.size()));
      rounded[j] = job;
      rounded[j].w = Bf16Weight(job.w, round_quantized);
      rounded[j++].x = copy.data();
    }
    cpu::LinearGroup(ops_, m_rows, std::span<const cpu::LinearJob>(rounded, j));
  } else {
    cpu::LinearGroup(ops_, m_rows, std::span<const cpu::LinearJob>(jobs.begin(), jobs.size()));
  }
  stats_->matmul_s += SecondsSince(t0);
  for (const cpu::LinearJob& job : jobs) {
    stats_->weight_bytes_read += static_cast<int64_t>(
        job.w->size_bytes() + (job.bias != nullptr ? job.bias->size_bytes() : 0));
  }
}

void CpuDecoder::Norm(const float* x, int64_t n, const TensorView& w, float* y) {
  const TensorView& wr = *Bf16Weight(&w);  // CUDA: bf16 norm weights
  cpu::RmsNorm(x, n, wr.shape[0], wr, static_cast<float>(c_.rms_norm_eps), y, norm_offset_);
}

void CpuDecoder::Forward(const Batch& batch, float* hidden) {
  const int64_t n = batch.n_tokens();
  int32_t max_pos = 0;
  for (int32_t p : batch.positions) max_pos = std::max(max_pos, p);
  EnsureScratch(n, int64_t{max_pos} + 1);

  // Token embeddings and the RoPE tables of this batch's positions.
  Clock::time_point t0 = Clock::now();
  cpu::EmbeddingGather(w_.embed, batch.token_ids, s_.x.data());  // [n, hidden]
  // CUDA holds the embedding table in bf16 (a no-op for bf16 checkpoints).
  if (bf16_activations_) RoundToBf16(s_.x.data(), n * c_.hidden_size);
  stats_->weight_bytes_read += n * w_.embed.row_bytes();
  cpu::RopeTables(batch.positions, inv_freq_, rope_attention_scale_, s_.rope_cos.data(),
                  s_.rope_sin.data());
  stats_->other_s += SecondsSince(t0);

  for (int64_t layer = 0; layer < c_.n_layers; ++layer) Layer(layer, batch);

  // Final norm of the rows whose logits are wanted.
  t0 = Clock::now();
  const int64_t hidden_size = c_.hidden_size;
  const int64_t n_logits = static_cast<int64_t>(batch.logits_indices.size());
  for (int64_t i = 0; i < n_logits; ++i) {
    const float* src = s_.x.data() + int64_t{batch.logits_indices[i]} * hidden_size;
    std::copy(src, src + hidden_size, s_.tmp.data() + i * hidden_size);
  }
  Norm(s_.tmp.data(), n_logits, w_.final_norm, hidden);
  if (bf16_activations_) RoundToBf16(hidden, n_logits * hidden_size);  // the LM head's input
  stats_->other_s += SecondsSince(t0);
}

void CpuDecoder::Layer(int64_t layer, const Batch& batch) {
  const DecoderLayerWeights& w = w_.layers[static_cast<size_t>(layer)];
  const int64_t n = batch.n_tokens();
  const int64_t hidden = c_.hidden_size;
  // Token mixer: x += Attention(norm(x)) or DeltaNet(norm(x)).
  Clock::time_point t0 = Clock::now();
  Norm(s_.x.data(), n, w.input_norm, s_.xn.data());
  stats_->other_s += SecondsSince(t0);
  if (w.type == LayerType::kAttention) {
    Attention(layer, batch);
  } else {
    DeltaNet(layer, batch);
  }
  t0 = Clock::now();
  cpu::AddInPlace(s_.x.data(), s_.tmp.data(), n * hidden);
  Norm(s_.x.data(), n, w.post_norm, s_.xn.data());
  stats_->other_s += SecondsSince(t0);
  // Channel mixer: x += Moe(norm(x)) or Mlp(norm(x)).
  if (w.moe) {
    Moe(layer, n);
  } else {
    Mlp(w.mlp, n, s_.xn.data(), s_.tmp.data());
  }
  t0 = Clock::now();
  cpu::AddInPlace(s_.x.data(), s_.tmp.data(), n * hidden);
  stats_->other_s += SecondsSince(t0);
}

void CpuDecoder::Attention(int64_t layer, const Batch& batch) {
  const AttentionWeights& w = w_.layers[static_cast<size_t>(layer)].attn;
  const int64_t n = batch.n_tokens();
  const int64_t hd = c_.head_dim;
  const int64_t q_dim = c_.n_heads * hd;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int64_t n_half = static_cast<int64_t>(inv_freq_.size());
  Scratch& s = s_;

  // Projections; a gated q_proj emits [query | gate] per head.
  float* q_out = c_.attention_output_gate ? s.qg.data() : s.q.data();
  LinearTimed(n, {{s.xn.data(), &w.q_proj, &w.q_bias, q_out},         // [n, n_heads*head_dim(*2)]
                  {s.xn.data(), &w.k_proj, &w.k_bias, s.k.data()},    // [n, n_kv_heads*head_dim]
                  {s.xn.data(), &w.v_proj, &w.v_bias, s.v.data()}});  // [n, n_kv_heads*head_dim]
  Clock::time_point t0 = Clock::now();
  if (c_.attention_output_gate) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < c_.n_heads; ++h) {
        const float* src = s.qg.data() + (t * c_.n_heads + h) * 2 * hd;
        std::copy(src, src + hd, s.q.data() + (t * c_.n_heads + h) * hd);
        std::copy(src + hd, src + 2 * hd, s.gate.data() + (t * c_.n_heads + h) * hd);
      }
    }
  }
  if (c_.qk_norm) {  // RMSNorm over head_dim of every head, before RoPE
    const TensorView& qn = *Bf16Weight(&w.q_norm);
    const TensorView& kn = *Bf16Weight(&w.k_norm);
    cpu::RmsNorm(s.q.data(), n * c_.n_heads, hd, qn, eps, s.q.data(), norm_offset_);
    cpu::RmsNorm(s.k.data(), n * c_.n_kv_heads, hd, kn, eps, s.k.data(), norm_offset_);
  }
  cpu::ApplyRope(s.q.data(), n, c_.n_heads, hd, s.rope_cos.data(), s.rope_sin.data(), n_half);
  cpu::ApplyRope(s.k.data(), n, c_.n_kv_heads, hd, s.rope_cos.data(), s.rope_sin.data(), n_half);
  if (bf16_activations_) {  // the CUDA path's bf16 queries and K/V cache
    RoundToBf16(s.q.data(), n * q_dim);
    RoundToBf16(s.k.data(), n * c_.n_kv_heads * hd);
    RoundToBf16(s.v.data(), n * c_.n_kv_heads * hd);
  }
  stats_->other_s += SecondsSince(t0);

  // K/V into the paged pool, then attention of every token over its sequence's cache.
  t0 = Clock::now();
  const int64_t index = cache_index_[static_cast<size_t>(layer)];
  const cpu::KvRowsOut k_cache = caches_->rows(index, 0);
  const cpu::KvRowsOut v_cache = caches_->rows(index, 1);
  cpu::WriteKv(s.k.data(), s.v.data(), batch.slot_mapping, caches_->kv_layout, k_cache, v_cache);
  cpu::AttentionShape shape;
  shape.n_heads = c_.n_heads;
  shape.n_kv_heads = c_.n_kv_heads;
  shape.head_dim = hd;
  shape.scale = attention_scale_;
  shape.sliding_window = w.sliding_window;
  shape.block_size_tokens = caches_->kv_layout.block_size_tokens;
  shape.n_blocks = caches_->kv_layout.n_blocks;
  cpu::AttentionBatch ab{batch.positions, batch.seq_starts, batch.block_tables,
                         batch.max_blocks_per_seq};
  cpu::PagedAttention(
      ops_, shape, ab, s.q.data(), cpu::KvRows{k_cache.f32, k_cache.q, k_cache.scale, k_cache.bf16},
      cpu::KvRows{v_cache.f32, v_cache.q, v_cache.scale, v_cache.bf16}, s.attn.data(), s.scores);
  if (c_.attention_output_gate) cpu::SigmoidGateInPlace(s.attn.data(), s.gate.data(), n * q_dim);
  stats_->attention_s += SecondsSince(t0);

  LinearTimed(n, {{s.attn.data(), &w.o_proj, &w.o_bias, s.tmp.data()}});  // [n, hidden]
}

// Gated DeltaNet over the batch. Projections, norms and out_proj run on all tokens at once; the
// conv and the delta rule run per sequence from its slot's state, split where the batch asks
// for state snapshots (block boundaries inside a chunk).
void CpuDecoder::DeltaNet(int64_t layer, const Batch& batch) {
  const DeltaNetWeights& w = w_.layers[static_cast<size_t>(layer)].gdn;
  const LinearAttentionConfig& l = c_.linear;
  const int64_t n = batch.n_tokens();
  const int64_t nk = l.n_key_heads, nv = l.n_value_heads;
  const int64_t dk = l.key_head_dim, dv = l.value_head_dim;
  const int64_t key_dim = l.key_dim(), value_dim = l.value_dim(), conv_dim = l.conv_dim();
  const int64_t group = nv / nk;
  Scratch& s = s_;

  // Projections into q|k|v (the conv's input), z, b, a.
  float* qkv = s.qkv.data();  // [n, conv_dim]
  if (!l.fused_projections) {
    LinearTimed(n, {{s.xn.data(), &w.in_proj_qkv, nullptr, qkv},          // [n, conv_dim]
                    {s.xn.data(), &w.in_proj_z, nullptr, s.z.data()},     // [n, value_dim]
                    {s.xn.data(), &w.in_proj_b, nullptr, s.beta.data()},  // [n, nv] b
                    {s.xn.data(), &w.in_proj_a, nullptr, s.g.data()}});   // [n, nv] a
  } else {
    LinearTimed(n, {{s.xn.data(), &w.in_proj_qkvz, nullptr, s.mixed.data()},  // [n, 2kd + 2vd]
                    {s.xn.data(), &w.in_proj_ba, nullptr, s.ba.data()}});     // [n, 2nv]
    // Per key head gk: q_gk | k_gk | v_gk (its value heads) | z_gk, and b_gk | a_gk.
    const Clock::time_point t0 = Clock::now();
    const int64_t per_group = 2 * dk + 2 * group * dv;
    for (int64_t t = 0; t < n; ++t) {
      const float* src = s.mixed.data() + t * nk * per_group;
      float* dst = qkv + t * conv_dim;
      for (int64_t gk = 0; gk < nk; ++gk) {
        const float* p = src + gk * per_group;
        const int64_t vg = gk * group * dv;  // first value element of the group
        std::copy(p, p + dk, dst + gk * dk);
        std::copy(p + dk, p + 2 * dk, dst + key_dim + gk * dk);
        std::copy(p + 2 * dk, p + 2 * dk + group * dv, dst + 2 * key_dim + vg);
        std::copy(p + 2 * dk + group * dv, p + per_group, s.z.data() + t * value_dim + vg);
        const float* bap = s.ba.data() + t * 2 * nv + gk * 2 * group;
        std::copy(bap, bap + group, s.beta.data() + t * nv + gk * group);
        std::copy(bap + group, bap + 2 * group, s.g.data() + t * nv + gk * group);
      }
    }
    stats_->other_s += SecondsSince(t0);
  }

  const Clock::time_point t0 = Clock::now();
  const int64_t index = cache_index_[static_cast<size_t>(layer)];
  const int64_t conv_floats = caches_->spec.conv_state_floats;
  const int64_t ssm_floats = caches_->spec.ssm_state_floats;
  // Pass 1, per sequence: the causal conv from its window (zero at position 0), snapshots of
  // the window where asked.
  size_t cursor = 0;
  for (int32_t sq = 0; sq < batch.n_seqs(); ++sq) {
    const int32_t slot = batch.state_slots[static_cast<size_t>(sq)];
    const int64_t begin = batch.seq_starts[sq], end = batch.seq_starts[sq + 1];
    if (begin == end) continue;
    float* window = caches_->conv_window(slot, index);
    if (batch.positions[begin] == 0) {
      std::fill(window, window + conv_floats, 0.0f);
      float* ssm = caches_->ssm(slot, index);
      std::fill(ssm, ssm + ssm_floats, 0.0f);
    }
    stats_->state_bytes += 2 * (conv_floats + ssm_floats) * 4;
    ForEachSegment(batch.state_snapshots, cursor, begin, end,
                   [&](int64_t a, int64_t b, int32_t dst) {
                     cpu::CausalConv1dSilu(qkv + a * conv_dim, b - a, conv_dim, w.conv1d, window,
                                           s.conv.data() + a * conv_dim);
                     if (dst >= 0)
                       std::copy(window, window + conv_floats, caches_->conv_window(dst, index));
                   });
  }

  // Split q | k | v, L2-normalise q and k (q also by 1/sqrt(dk)); gates.
  for (int64_t t = 0; t < n; ++t) {
    const float* src = s.conv.data() + t * conv_dim;
    std::copy(src, src + key_dim, s.dq.data() + t * key_dim);
    std::copy(src + key_dim, src + 2 * key_dim, s.dk.data() + t * key_dim);
    std::copy(src + 2 * key_dim, src + conv_dim, s.dv.data() + t * value_dim);
  }
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  cpu::L2NormRows(s.dq.data(), n * nk, dk, 1e-6f, q_scale);
  cpu::L2NormRows(s.dk.data(), n * nk, dk, 1e-6f, 1.0f);
  cpu::DeltaGates(s.beta.data(), s.g.data(), w.a_log, w.dt_bias, n, nv, s.beta.data(), s.g.data());

  // Pass 2, per sequence: the delta rule (chunked over a segment of several tokens, recurrent
  // over one), snapshots of the state where asked.
  cursor = 0;
  for (int32_t sq = 0; sq < batch.n_seqs(); ++sq) {
    float* ssm = caches_->ssm(batch.state_slots[static_cast<size_t>(sq)], index);
    ForEachSegment(batch.state_snapshots, cursor, batch.seq_starts[sq], batch.seq_starts[sq + 1],
                   [&](int64_t a, int64_t b, int32_t dst) {
                     const float* q = s.dq.data() + a * key_dim;
                     const float* k = s.dk.data() + a * key_dim;
                     const float* v = s.dv.data() + a * value_dim;
                     const float* g = s.g.data() + a * nv;
                     const float* beta = s.beta.data() + a * nv;
                     float* out = s.core.data() + a * value_dim;
                     if (b - a == 1) {
                       cpu::GatedDeltaRecurrent(ops_, delta_shape_, q, k, v, g, beta, 1, ssm, out);
                     } else {
                       cpu::GatedDeltaChunked(ops_, delta_shape_, q, k, v, g, beta, b - a, ssm, out,
                                              s.delta);
                     }
                     if (dst >= 0) std::copy(ssm, ssm + ssm_floats, caches_->ssm(dst, index));
                   });
  }

  // Gated RMSNorm per value head, then the output projection.
  cpu::GatedRmsNorm(s.core.data(), s.z.data(), n * nv, dv, w.norm,
                    static_cast<float>(c_.rms_norm_eps), s.core.data());
  stats_->recurrent_s += SecondsSince(t0);
  LinearTimed(n, {{s.core.data(), &w.out_proj, nullptr, s.tmp.data()}});  // [n, hidden]
}

void CpuDecoder::Mlp(const MlpWeights& w, int64_t n, const float* in, float* out, bool expert) {
  const int64_t inter = w.gate_proj.shape[0];
  LinearTimed(n,
              {{in, &w.gate_proj, &w.gate_bias, s_.mlp_gate.data()},  // [n, intermediate]
               {in, &w.up_proj, &w.up_bias, s_.mlp_up.data()}},       // [n, intermediate]
              expert);
  const Clock::time_point t0 = Clock::now();
  cpu::SiluMul(ops_, s_.mlp_gate.data(), s_.mlp_up.data(), n * inter, s_.mlp_gate.data());
  stats_->other_s += SecondsSince(t0);
  LinearTimed(n, {{s_.mlp_gate.data(), &w.down_proj, &w.down_bias, out}}, expert);  // [n, hidden]
}

// Top-k routing as transformers: softmax over all experts in f32, the k largest probabilities
// (renormalised to sum 1 when norm_topk_prob); each expert runs on the rows routed to it, in
// expert order, and its output times the routing weight is added to those rows; then the shared
// expert times sigmoid(shared_expert_gate . x).
void CpuDecoder::Moe(int64_t layer, int64_t n) {
  const MoeWeights& w = w_.layers[static_cast<size_t>(layer)].moe_w;
  const int64_t hidden = c_.hidden_size;
  const int64_t n_e = c_.moe.n_experts;
  const int64_t top_k = c_.moe.top_k;
  Scratch& s = s_;
  LinearTimed(n, {{s.xn.data(), &w.router, nullptr, s.router.data()}});  // [n, n_experts]

  Clock::time_point t0 = Clock::now();
  int32_t* order = s.order.data();
  std::fill(s.expert_begin.begin(), s.expert_begin.begin() + n_e + 1, 0);
  for (int64_t t = 0; t < n; ++t) {
    float* p = s.router.data() + t * n_e;
    const float mx = *std::max_element(p, p + n_e);
    float sum = 0.0f;
    for (int64_t e = 0; e < n_e; ++e) {
      p[e] = std::exp(p[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < n_e; ++e) p[e] /= sum;
    std::iota(order, order + n_e, 0);
    std::partial_sort(order, order + top_k, order + n_e,
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += p[order[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = order[j];
      s.topk_ids[t * top_k + j] = e;
      s.topk_w[t * top_k + j] = c_.moe.norm_topk_prob ? p[e] / top_sum : p[e];
      ++s.expert_begin[e + 1];
    }
  }
  // Rows grouped by expert (counting sort), token order within each expert.
  for (int64_t e = 0; e < n_e; ++e) s.expert_begin[e + 1] += s.expert_begin[e];
  int32_t* fill = s.expert_fill.data();
  std::copy(s.expert_begin.begin(), s.expert_begin.begin() + n_e, fill);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = s.topk_ids[t * top_k + j];
      s.expert_rows[fill[e]] = static_cast<int32_t>(t);
      s.expert_row_w[fill[e]] = s.topk_w[t * top_k + j];
      ++fill[e];
    }
  }
  std::fill(s.tmp.begin(), s.tmp.begin() + n * hidden, 0.0f);
  stats_->other_s += SecondsSince(t0);

  for (int64_t e = 0; e < n_e; ++e) {
    const int32_t first = s.expert_begin[e], m = s.expert_begin[e + 1] - first;
    if (m == 0) continue;
    t0 = Clock::now();
    for (int32_t i = 0; i < m; ++i) {
      const float* src = s.xn.data() + int64_t{s.expert_rows[first + i]} * hidden;
      std::copy(src, src + hidden, s.gathered.data() + int64_t{i} * hidden);
    }
    stats_->other_s += SecondsSince(t0);
    // CUDA holds every expert weight in bf16, quantized ones included.
    Mlp(w.experts[static_cast<size_t>(e)], m, s.gathered.data(), s.expert_out.data(),
        /*expert=*/true);
    t0 = Clock::now();
    for (int32_t i = 0; i < m; ++i) {
      const float wt = s.expert_row_w[first + i];
      const float* src = s.expert_out.data() + int64_t{i} * hidden;
      float* dst = s.tmp.data() + int64_t{s.expert_rows[first + i]} * hidden;
      for (int64_t j = 0; j < hidden; ++j) dst[j] += src[j] * wt;
    }
    stats_->other_s += SecondsSince(t0);
  }

  if (!w.shared_expert.empty()) {
    Mlp(w.shared_expert, n, s.xn.data(), s.shared_out.data());
    LinearTimed(n, {{s.xn.data(), &w.shared_expert_gate, nullptr, s.shared_gate.data()}});
    t0 = Clock::now();
    for (int64_t t = 0; t < n; ++t) {
      const float gate = 1.0f / (1.0f + std::exp(-s.shared_gate[static_cast<size_t>(t)]));
      const float* src = s.shared_out.data() + t * hidden;
      float* dst = s.tmp.data() + t * hidden;
      for (int64_t j = 0; j < hidden; ++j) dst[j] += gate * src[j];
    }
    stats_->other_s += SecondsSince(t0);
  }
}

}  // namespace kestrel
