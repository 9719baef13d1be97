// The decoder's layers on CUDA (see cuda_decoder.h).
#ifdef KESTREL_HAS_CUDA

#include "models/cuda_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda/activation.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/deltanet.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/moe.h"
#include "backends/cuda/moe_gemm.h"
#include "backends/cuda/norm.h"
#include "backends/cuda/rope.h"
#include "core/check.h"
#include "models/rope.h"

namespace kestrel {
namespace {

// Element i of a F32/F16/BF16 tensor as f32.
float ElementF32(const TensorView& t, int64_t i) {
  uint16_t h;
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
      return f;
    }
    case DType::kF16:
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return F16ToF32(h);
    default:
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return Bf16ToF32(h);
  }
}

// Appends the tensor as f32 to `out`; returns its offset (in floats).
size_t AppendF32(const TensorView& t, std::vector<float>* out) {
  const size_t at = out->size();
  const int64_t n = static_cast<int64_t>(t.size_bytes() / DTypeSize(t.dtype));
  for (int64_t i = 0; i < n; ++i) out->push_back(ElementF32(t, i));
  while (out->size() % 64 != 0) out->push_back(0.0f);  // 256-byte aligned pieces
  return at;
}

}  // namespace

CudaDecoder::CudaDecoder(const ModelConfig& config, const DecoderWeights& weights)
    : c_(config), w_(weights) {}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::Create(const ModelConfig& c,
                                                         const DecoderWeights& w) {
  const bool any_attention = c.n_layers_of(LayerType::kAttention) > 0;
  if (any_attention && c.head_dim != 16 && c.head_dim != 32 && c.head_dim != 64 &&
      c.head_dim != 128 && c.head_dim != 256) {
    return Unsupported("--device cuda supports head_dim 16, 32, 64, 128 and 256, not " +
                       std::to_string(c.head_dim));
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0 || (c.n_heads * c.head_dim) % 8 != 0) {
    return Unsupported(
        "--device cuda needs hidden, intermediate and attention sizes that are multiples of 8");
  }
  if (c.attention_output_gate && c.head_dim % 32 != 0) {
    return Unsupported("--device cuda runs gated attention with head_dim a multiple of 32");
  }
  if (c.has_moe()) {
    const MoeConfig& m = c.moe;
    if (m.n_experts > cuda::kMoeMaxExperts || m.top_k > cuda::kMoeMaxTopK) {
      return Unsupported("--device cuda runs up to " + std::to_string(cuda::kMoeMaxExperts) +
                         " experts with top-k up to " + std::to_string(cuda::kMoeMaxTopK) +
                         ", not " + std::to_string(m.n_experts) + " / " + std::to_string(m.top_k));
    }
    if (m.expert_intermediate % 8 != 0 || m.shared_expert_intermediate % 8 != 0) {
      return Unsupported("--device cuda needs expert widths that are multiples of 8");
    }
  }
  const LinearAttentionConfig& la = c.linear;
  if (c.n_layers_of(LayerType::kLinearAttention) > 0) {
    if (la.key_head_dim > 256 || la.value_head_dim > 256 || la.conv_kernel > 8) {
      return Unsupported(
          "--device cuda runs Gated DeltaNet heads up to 256 wide, conv kernels up "
          "to 8");
    }
  }
  // Weights in any dtype the loader reads: bf16 as is, F32 / F16 rounded to bf16, quantized
  // linear layers in their device formats (cuda_weight_plan.h).
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& l = w.layers[i];
    if (l.type == LayerType::kLinearAttention) continue;
    const std::string where = "layer " + std::to_string(i);
    const AttentionWeights& a = l.attn;
    if (a.q_bias.empty() != a.k_bias.empty() || a.q_bias.empty() != a.v_bias.empty()) {
      return Unsupported(where + ": q/k/v projections must all have biases or none");
    }
    if (c.attention_output_gate && !a.q_bias.empty()) {
      return Unsupported(where + ": gated attention with q/k/v biases is not supported on CUDA");
    }
  }
  std::unique_ptr<CudaDecoder> d(new CudaDecoder(c, w));
  d->q_dim_ = c.n_heads * c.head_dim;
  d->kv_dim_ = c.n_kv_heads * c.head_dim;
  d->qkv_width_ = (c.attention_output_gate ? 2 : 1) * d->q_dim_ + 2 * d->kv_dim_;
  d->n_attention_layers_ = c.n_layers_of(LayerType::kAttention);
  d->n_recurrent_layers_ = c.n_layers_of(LayerType::kLinearAttention);
  if (d->n_recurrent_layers_ > 0) {
    d->gdn_width_ = la.conv_dim() + la.value_dim() + 2 * la.n_value_heads;
  }
  d->norm_offset_ = c.norm_weight_offset ? 1.0f : 0.0f;
  d->moe_shared_slot_ = c.has_moe() && c.moe.shared_expert_intermediate > 0 &&
                        c.moe.shared_expert_intermediate == c.moe.expert_intermediate;
  // KESTREL_MOE_SHARED_SLOT_MAX_TOKENS overrides the step size up to which the slot is used
  // (0: never; for comparison).
  if (const char* env = std::getenv("KESTREL_MOE_SHARED_SLOT_MAX_TOKENS"); env != nullptr) {
    d->moe_slot_max_tokens_ = std::atoi(env);
  }
  d->mlp_inter_ = std::max(c.intermediate_size, c.moe.shared_expert_intermediate);
  if (c.has_moe()) {
    d->router_width_ = c.moe.n_experts + (c.moe.shared_expert_intermediate > 0 ? 1 : 0);
    for (const DecoderLayerWeights& l : w.layers) d->n_moe_layers_ += l.moe ? 1 : 0;
  }
  return d;
}

int64_t CudaDecoder::moe_expert_bytes() const {
  return 3 * c_.moe.expert_intermediate * c_.hidden_size * 2;
}

// Rows [row0, row0 + rows) of a row-major 2-D tensor.
namespace {
TensorView RowSlice(const TensorView& t, int64_t row0, int64_t rows) {
  TensorView v = t;
  v.shape[0] = rows;
  v.data = static_cast<const uint8_t*>(t.data) + row0 * t.row_bytes();  // block types too
  return v;
}
}  // namespace

std::vector<const TensorView*> CudaDecoder::FusedDeltaNetRows(const DeltaNetWeights& g) {
  // in_proj_qkvz per key head gk: q (dk) | k (dk) | v (group*dv) | z (group*dv);
  // in_proj_ba per key head: b (group) | a (group). Re-laid as all q | all k | v | z | b | a.
  const LinearAttentionConfig& la = c_.linear;
  const int64_t nk = la.n_key_heads, dk = la.key_head_dim, dv = la.value_head_dim;
  const int64_t group = la.n_value_heads / nk;
  const int64_t per = 2 * dk + 2 * group * dv;
  std::vector<const TensorView*> parts;
  auto add = [&](const TensorView& t, int64_t row0, int64_t rows) {
    slices_.push_back(RowSlice(t, row0, rows));
    parts.push_back(&slices_.back());
  };
  for (int64_t gk = 0; gk < nk; ++gk) add(g.in_proj_qkvz, gk * per, dk);
  for (int64_t gk = 0; gk < nk; ++gk) add(g.in_proj_qkvz, gk * per + dk, dk);
  for (int64_t gk = 0; gk < nk; ++gk) add(g.in_proj_qkvz, gk * per + 2 * dk, group * dv);
  for (int64_t gk = 0; gk < nk; ++gk) {
    add(g.in_proj_qkvz, gk * per + 2 * dk + group * dv, group * dv);
  }
  for (int64_t gk = 0; gk < nk; ++gk) add(g.in_proj_ba, gk * 2 * group, group);
  for (int64_t gk = 0; gk < nk; ++gk) add(g.in_proj_ba, gk * 2 * group + group, group);
  return parts;
}

void CudaDecoder::PlanWeights(CudaWeightPlan* plan) {
  embed_off_ = plan->Place({&w_.embed});
  norm_off_ = plan->Place({&w_.final_norm});
  if (c_.tie_word_embeddings && w_.embed.dtype == DType::kBF16) {
    head_plan_ = {CudaWeightPlan::Segment{cuda::WeightFormat::kBf16, c_.vocab_size, embed_off_}};
  } else {
    head_plan_ = plan->PlaceLinear({c_.tie_word_embeddings ? &w_.embed : &w_.lm_head});
  }
  offsets_.assign(w_.layers.size(), LayerOffsets{});
  small_host_.clear();
  slices_.clear();
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const DecoderLayerWeights& l = w_.layers[i];
    LayerOffsets& o = offsets_[i];
    o.input_norm = plan->Place({&l.input_norm});
    if (l.type == LayerType::kLinearAttention) {
      const DeltaNetWeights& g = l.gdn;
      o.in_proj = c_.linear.fused_projections
                      ? plan->PlaceLinear(FusedDeltaNetRows(g))
                      : plan->PlaceLinear({&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a});
      o.out_proj = plan->PlaceLinear({&g.out_proj});
      o.conv_w = AppendF32(g.conv1d, &small_host_);
      const size_t a_log = AppendF32(g.a_log, &small_host_);
      for (int64_t h = 0; h < c_.linear.n_value_heads; ++h) {
        float& x = small_host_[a_log + static_cast<size_t>(h)];
        x = -std::exp(x);  // as cpu::DeltaGates
      }
      o.neg_exp_a = a_log;
      o.dt_bias = AppendF32(g.dt_bias, &small_host_);
      o.gdn_norm = AppendF32(g.norm, &small_host_);
    } else {
      const AttentionWeights& a = l.attn;
      o.qkv = plan->PlaceLinear({&a.q_proj, &a.k_proj, &a.v_proj});
      o.qkv_bias = plan->PlaceOptional({&a.q_bias, &a.k_bias, &a.v_bias});
      o.q_norm = plan->PlaceOptional({&a.q_norm});
      o.k_norm = plan->PlaceOptional({&a.k_norm});
      o.o_proj = plan->PlaceLinear({&a.o_proj});
      o.o_bias = plan->PlaceOptional({&a.o_bias});
    }
    o.post_norm = plan->Place({&l.post_norm});
    if (l.moe) {
      const MoeWeights& m = l.moe_w;
      const bool shared = !m.shared_expert.gate_proj.empty();
      // The routed experts run through the bf16 grouped kernels (quantized ones dequantized),
      // the shared expert as the last of them when it has their shape. Then the router's rows
      // (and the shared expert's gate row) follow the shared expert's gate|up in bf16, so that
      // steps which run the shared expert apart take [its gate|up | router | shared gate] as
      // one product (BindWeights).
      std::vector<const TensorView*> gate_up, down;
      for (const MlpWeights& e : m.experts) {
        gate_up.push_back(&e.gate_proj);
        gate_up.push_back(&e.up_proj);
        down.push_back(&e.down_proj);
      }
      if (moe_shared_slot_) {
        gate_up.push_back(&m.shared_expert.gate_proj);
        gate_up.push_back(&m.shared_expert.up_proj);
        down.push_back(&m.shared_expert.down_proj);
        gate_up.push_back(&m.router);
        gate_up.push_back(&m.shared_expert_gate);
      } else {
        o.router = shared ? plan->PlaceLinear({&m.router, &m.shared_expert_gate})
                          : plan->PlaceLinear({&m.router});
      }
      o.experts_gate_up = plan->Place(gate_up);
      o.experts_down = plan->Place(down);
      if (shared && !moe_shared_slot_) {
        o.shared_gate_up =
            plan->PlaceLinear({&m.shared_expert.gate_proj, &m.shared_expert.up_proj});
        o.shared_down = plan->PlaceLinear({&m.shared_expert.down_proj});
      }
      continue;
    }
    o.gate_up = plan->PlaceLinear({&l.mlp.gate_proj, &l.mlp.up_proj});
    o.gate_bias = plan->PlaceOptional({&l.mlp.gate_bias});
    o.up_bias = plan->PlaceOptional({&l.mlp.up_bias});
    o.down = plan->PlaceLinear({&l.mlp.down_proj});
    o.down_bias = plan->PlaceOptional({&l.mlp.down_bias});
  }
}

void CudaDecoder::BindWeights(const uint8_t* base) {
  auto at = [&](size_t off) -> const __nv_bfloat16* {
    return off == CudaWeightPlan::kNone ? nullptr
                                        : reinterpret_cast<const __nv_bfloat16*>(base + off);
  };
  auto linear = [&](const CudaWeightPlan::Linear& w) { return CudaWeightPlan::Bind(w, base); };
  embed_ = at(embed_off_);
  final_norm_ = at(norm_off_);
  lm_head_ = linear(head_plan_);
  layers_.resize(offsets_.size());
  for (size_t i = 0; i < offsets_.size(); ++i) {
    const LayerOffsets& o = offsets_[i];
    LayerWeights& l = layers_[i];
    l.input_norm = at(o.input_norm);
    l.qkv = linear(o.qkv);
    l.qkv_bias = at(o.qkv_bias);
    l.q_norm = at(o.q_norm);
    l.k_norm = at(o.k_norm);
    l.o_proj = linear(o.o_proj);
    l.o_bias = at(o.o_bias);
    l.post_norm = at(o.post_norm);
    l.gate_up = linear(o.gate_up);
    l.gate_bias = at(o.gate_bias);
    l.up_bias = at(o.up_bias);
    l.down = linear(o.down);
    l.down_bias = at(o.down_bias);
    l.sliding_window = static_cast<int32_t>(w_.layers[i].attn.sliding_window);
    l.recurrent = w_.layers[i].type == LayerType::kLinearAttention;
    l.in_proj = linear(o.in_proj);
    l.out_proj = linear(o.out_proj);
    l.moe = w_.layers[i].moe;
    l.router = linear(o.router);
    l.experts_gate_up = at(o.experts_gate_up);
    l.experts_down = at(o.experts_down);
    l.shared_gate_up = linear(o.shared_gate_up);
    l.shared_down = linear(o.shared_down);
    if (l.moe && moe_shared_slot_) {
      // The slot's bf16 matrices, for steps that run it apart, and the router rows after it
      // (PlanWeights): shared_router is [shared gate|up | router | shared gate].
      const int64_t inter = c_.moe.expert_intermediate, n_e = c_.moe.n_experts;
      const __nv_bfloat16* slot = l.experts_gate_up + n_e * 2 * inter * c_.hidden_size;
      l.shared_gate_up = slot;
      l.shared_router = slot;
      l.router = slot + 2 * inter * c_.hidden_size;
      l.shared_down = l.experts_down + n_e * c_.hidden_size * inter;
    }
  }
  int64_t n_attention = 0, n_recurrent = 0, n_moe = 0;
  for (LayerWeights& l : layers_) {
    if (l.moe) l.moe_index = n_moe++;
    if (l.recurrent) {
      l.recurrent_index = n_recurrent++;
    } else {
      l.attention_index = n_attention++;
    }
  }
}

Status CudaDecoder::UploadConstants() {
  if (!small_host_.empty()) {
    KASSIGN(small_,
            cuda::DeviceBuffer::Allocate(small_host_.size() * 4, "Gated DeltaNet constants"));
    KCUDA_CHECK(cudaMemcpy(small_.get(), small_host_.data(), small_host_.size() * 4,
                           cudaMemcpyHostToDevice));
    const float* base = small_.as<float>();
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (!layers_[i].recurrent) continue;
      const LayerOffsets& o = offsets_[i];
      layers_[i].conv_w = base + o.conv_w;
      layers_[i].neg_exp_a = base + o.neg_exp_a;
      layers_[i].dt_bias = base + o.dt_bias;
      layers_[i].gdn_norm = base + o.gdn_norm;
    }
  }
  const std::vector<float> inv_freq = RopeInvFreq(c_);
  KASSIGN(inv_freq_, cuda::DeviceBuffer::Allocate(inv_freq.size() * 4, "RoPE tables"));
  KCUDA_CHECK(
      cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice));
  rope_attention_scale_ = RopeAttentionScale(c_);
  attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim)));
  return Status::Ok();
}

// Offsets of one activation layout; ActivationBytes and BindActivations share it.
namespace {
// Floats per row of the [shared gate|up | router | shared gate] product (CudaDecoder::Moe): a
// multiple of 4, so that its rows are 16-byte aligned for cuBLASLt's and SiluMul's vector paths.
int64_t SharedRouterStride(int64_t router_width, int64_t shared_inter) {
  return (2 * shared_inter + router_width + 3) / 4 * 4;
}

struct ActivationLayout {
  size_t x, xn, qkv, q, attn, tmp, gate_up, act, x_final, logits, workspace, workspace_bytes;
  size_t gate, conv_out, dq, dk, beta, g, core, gdn_out, delta_workspace;
  size_t router, topk_ids, topk_w, expert_begin, active, n_active, rows, pos, tile_begin,
      expert_gate_up, expert_act, expert_out, shared_out, active_log, total;
};

ActivationLayout Layout(const ModelConfig& c, const CudaDecoder::LayoutDims& d, int32_t n_tokens,
                        int32_t n_logits, int32_t max_context) {
  const int64_t n = n_tokens;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = d.mlp_inter;
  const int64_t q_dim = d.q_dim, fused_width = d.fused_width;
  const bool gated = d.gated, recurrent = d.recurrent;
  const LinearAttentionConfig& la = c.linear;
  ActivationLayout l{};
  size_t total = 0;
  auto reserve = [&](int64_t bytes) {
    const size_t off = total;
    total += CudaWeightPlan::AlignUp(static_cast<size_t>(bytes));
    return off;
  };
  l.x = reserve(n * hidden * 4);
  l.xn = reserve(n * hidden * 2);
  l.qkv = reserve(n * fused_width * 4);
  l.q = reserve(n * q_dim * 2);
  l.attn = reserve(n * q_dim * 2);
  l.tmp = reserve(n * hidden * 4);
  l.gate_up = reserve(n * 2 * inter * 4);
  l.act = reserve(n * inter * 2);
  l.x_final = reserve(int64_t{n_logits} * hidden * 2);
  l.logits = reserve(int64_t{n_logits} * c.vocab_size * 4);
  // Split-K partials of the decode path for up to kMaxDecodeAttentionRows sequences.
  l.workspace_bytes = cuda::PagedAttentionWorkspaceBytes(
      std::min(n_tokens, CudaDecoder::kMaxDecodeAttentionRows), static_cast<int32_t>(c.n_heads),
      static_cast<int32_t>(c.head_dim), max_context);
  l.workspace = reserve(static_cast<int64_t>(l.workspace_bytes));
  l.gate = reserve(gated ? n * q_dim * 4 : 0);
  const int64_t r = recurrent ? n : 0;
  l.conv_out = reserve(r * la.conv_dim() * 4);
  l.dq = reserve(r * la.key_dim() * 4);
  l.dk = reserve(r * la.key_dim() * 4);
  l.beta = reserve(r * la.n_value_heads * 4);
  l.g = reserve(r * la.n_value_heads * 4);
  l.core = reserve(r * la.value_dim() * 4);
  l.gdn_out = reserve(r * la.value_dim() * 2);
  l.delta_workspace =
      reserve(recurrent ? static_cast<int64_t>(cuda::GatedDeltaRuleChunkedWorkspaceBytes(
                              n_tokens, std::min(n_tokens, CudaDecoder::kChunkedDeltaRuleMaxSeqs),
                              static_cast<int32_t>(la.n_value_heads)))
                        : 0);
  // MoE: routing of n * picks pairs (the shared slot's included), the permuted expert rows, the
  // shared expert's output when it runs apart.
  const bool moe = d.n_moe_layers > 0;
  const int64_t slot = d.moe_shared_slot ? 1 : 0;
  const int64_t pairs = moe ? n * (c.moe.top_k + slot) : 0;
  const int64_t experts = moe ? c.moe.n_experts + slot : 0;
  // Router logits; with the shared slot, steps that run the shared expert apart write its
  // gate|up in front of them (CudaDecoder::Moe).
  const int64_t router_width =
      d.moe_shared_slot ? SharedRouterStride(d.router_width, c.moe.expert_intermediate)
                        : d.router_width;
  l.router = reserve(moe ? n * router_width * 4 : 0);
  l.topk_ids = reserve(pairs * 4);
  l.topk_w = reserve(pairs * 4);
  l.expert_begin = reserve(moe ? (experts + 1) * 4 : 0);
  l.active = reserve(experts * 4);
  l.n_active = reserve(moe ? 4 : 0);
  l.rows = reserve(pairs * 4);
  l.pos = reserve(pairs * 4);
  l.expert_gate_up = reserve(pairs * 2 * c.moe.expert_intermediate * 4);
  l.expert_act = reserve(pairs * c.moe.expert_intermediate * 2);
  l.expert_out = reserve(pairs * hidden * 4);
  l.tile_begin = reserve(moe ? (experts + 1) * 4 : 0);
  l.shared_out = reserve(moe && c.moe.shared_expert_intermediate > 0 ? n * hidden * 4 : 0);
  l.active_log = reserve(d.n_moe_layers * 4);
  l.total = total;
  return l;
}
}  // namespace

CudaDecoder::LayoutDims CudaDecoder::layout_dims() const {
  return {q_dim_,
          std::max(qkv_width_, gdn_width_),
          mlp_inter_,
          router_width_,
          n_moe_layers_,
          c_.attention_output_gate,
          n_recurrent_layers_ > 0,
          moe_shared_slot_};
}

size_t CudaDecoder::ActivationBytes(int32_t n_tokens, int32_t n_logits, int32_t max_context) const {
  return Layout(c_, layout_dims(), n_tokens, n_logits, max_context).total;
}

void CudaDecoder::BindActivations(uint8_t* b, int32_t n_tokens, int32_t n_logits,
                                  int32_t max_context) {
  const ActivationLayout l = Layout(c_, layout_dims(), n_tokens, n_logits, max_context);
  x_ = reinterpret_cast<float*>(b + l.x);
  xn_ = reinterpret_cast<__nv_bfloat16*>(b + l.xn);
  qkv_ = reinterpret_cast<float*>(b + l.qkv);
  q_ = reinterpret_cast<__nv_bfloat16*>(b + l.q);
  attn_ = reinterpret_cast<__nv_bfloat16*>(b + l.attn);
  tmp_ = reinterpret_cast<float*>(b + l.tmp);
  gate_up_ = reinterpret_cast<float*>(b + l.gate_up);
  act_ = reinterpret_cast<__nv_bfloat16*>(b + l.act);
  x_final_ = reinterpret_cast<__nv_bfloat16*>(b + l.x_final);
  logits_ = reinterpret_cast<float*>(b + l.logits);
  attention_workspace_ = b + l.workspace;
  attention_workspace_bytes_ = l.workspace_bytes;
  gate_ = reinterpret_cast<float*>(b + l.gate);
  conv_out_ = reinterpret_cast<float*>(b + l.conv_out);
  dq_ = reinterpret_cast<float*>(b + l.dq);
  dk_ = reinterpret_cast<float*>(b + l.dk);
  beta_ = reinterpret_cast<float*>(b + l.beta);
  g_ = reinterpret_cast<float*>(b + l.g);
  core_ = reinterpret_cast<float*>(b + l.core);
  gdn_out_ = reinterpret_cast<__nv_bfloat16*>(b + l.gdn_out);
  delta_workspace_ = reinterpret_cast<float*>(b + l.delta_workspace);
  router_ = reinterpret_cast<float*>(b + l.router);
  routing_.topk_ids = reinterpret_cast<int32_t*>(b + l.topk_ids);
  routing_.topk_w = reinterpret_cast<float*>(b + l.topk_w);
  routing_.expert_begin = reinterpret_cast<int32_t*>(b + l.expert_begin);
  routing_.active = reinterpret_cast<int32_t*>(b + l.active);
  routing_.n_active = reinterpret_cast<int32_t*>(b + l.n_active);
  routing_.rows = reinterpret_cast<int32_t*>(b + l.rows);
  routing_.pos = reinterpret_cast<int32_t*>(b + l.pos);
  routing_.tile_begin = reinterpret_cast<int32_t*>(b + l.tile_begin);
  expert_gate_up_ = reinterpret_cast<float*>(b + l.expert_gate_up);
  expert_act_ = reinterpret_cast<__nv_bfloat16*>(b + l.expert_act);
  expert_out_ = reinterpret_cast<float*>(b + l.expert_out);
  shared_out_ = reinterpret_cast<float*>(b + l.shared_out);
  moe_active_log_ = reinterpret_cast<int32_t*>(b + l.active_log);
}

void CudaDecoder::Layer(int64_t layer, const DeviceBatchView& v, const CudaKvPool& kv,
                        const CudaStatePool& state, cudaStream_t stream, cuda::LinearEngine* linear,
                        CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t n = v.n_tokens;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Residual of the previous layer's MLP (none before layer 0) + input norm.
  const LayerWeights* prev = layer > 0 ? &layers_[static_cast<size_t>(layer - 1)] : nullptr;
  cuda::AddRmsNorm(x_, prev != nullptr ? tmp_ : nullptr,
                   prev != nullptr ? prev->down_bias : nullptr, w.input_norm, eps, n, hidden, xn_,
                   stream, norm_offset_);
  marks->Mark(CudaStage::kOther);
  if (w.recurrent) {
    DeltaNet(w, v, state, stream, linear, marks);
  } else {
    Attention(w, v, kv, stream, linear, marks);
  }
  // tmp_ = the mixer's output (without its bias: o_bias goes into the norm's add).
  cuda::AddRmsNorm(x_, tmp_, w.recurrent ? nullptr : w.o_bias, w.post_norm, eps, n, hidden, xn_,
                   stream, norm_offset_);
  marks->Mark(CudaStage::kOther);
  if (w.moe) {
    Moe(w, v, stream, linear, marks);  // tmp_ = the experts' weighted sum
    return;
  }
  linear->Run(xn_, n, hidden, w.gate_up, 2 * inter, gate_up_, stream);  // [n, 2*intermediate]
  marks->Mark(CudaStage::kMatmul);
  cuda::SiluMul(gate_up_, w.gate_bias, w.up_bias, n, inter, act_, stream);
  marks->Mark(CudaStage::kOther);
  linear->Run(act_, n, inter, w.down, hidden, tmp_, stream);  // [n, hidden]; added by the next norm
  marks->Mark(CudaStage::kMatmul);
}

void CudaDecoder::Attention(const LayerWeights& w, const DeviceBatchView& v, const CudaKvPool& kv,
                            cudaStream_t stream, cuda::LinearEngine* linear,
                            CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const int64_t n = v.n_tokens;
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  linear->Run(xn_, n, hidden, w.qkv, qkv_width_, qkv_, stream);  // [n, qkv_width]
  marks->Mark(CudaStage::kMatmul);

  // Bias, QK-norm, RoPE, K/V into the pool; then attention through the block tables.
  const cuda::KvCacheOut cache = kv.layer(w.attention_index);
  if (c.attention_output_gate) {
    cuda::GatedQkvShape gs;
    gs.n_heads = static_cast<int32_t>(c.n_heads);
    gs.n_kv_heads = static_cast<int32_t>(c.n_kv_heads);
    gs.head_dim = static_cast<int32_t>(c.head_dim);
    gs.rotary_dim = static_cast<int32_t>(RopeRotaryDim(c));
    gs.block_size = kv.block_size;
    gs.eps = eps;
    gs.norm_offset = norm_offset_;
    gs.attention_scaling = rope_attention_scale_;
    cuda::GatedQkvRope(qkv_, w.q_norm, w.k_norm, v.positions, inv_freq_.as<float>(), v.slot_mapping,
                       n, gs, q_, gate_, cache, stream);
  } else {
    cuda::QkvRopeShape rs;
    rs.n_heads = static_cast<int32_t>(c.n_heads);
    rs.n_kv_heads = static_cast<int32_t>(c.n_kv_heads);
    rs.head_dim = static_cast<int32_t>(c.head_dim);
    rs.rotary_half = static_cast<int32_t>(RopeRotaryDim(c) / 2);
    rs.block_size_tokens = kv.block_size;
    rs.qk_norm_eps = eps;
    rs.attention_scaling = rope_attention_scale_;
    cuda::QkvRope(qkv_, w.qkv_bias, w.q_norm, w.k_norm, v.positions, inv_freq_.as<float>(),
                  v.slot_mapping, n, rs, q_, cache, stream);
  }
  cuda::PagedAttentionParams ap;
  ap.q = q_;
  ap.k_cache = cache.k;
  ap.v_cache = cache.v;
  ap.k_scale = cache.k_scale;
  ap.v_scale = cache.v_scale;
  ap.kv_type = cache.type;
  ap.out = attn_;
  ap.positions = v.positions;
  ap.seq_starts = v.seq_starts;
  ap.context_lens = v.context_lens;
  ap.block_tables = v.block_tables;
  ap.max_blocks_per_seq = v.max_blocks_per_seq;
  ap.n_tokens = v.n_tokens;
  ap.n_seqs = v.n_seqs;
  ap.n_heads = static_cast<int32_t>(c.n_heads);
  ap.n_kv_heads = static_cast<int32_t>(c.n_kv_heads);
  ap.head_dim = static_cast<int32_t>(c.head_dim);
  ap.block_size = kv.block_size;
  ap.scale = attention_scale_;
  ap.sliding_window = w.sliding_window;
  // Pure decode beyond the decode workspace, and every batch in batch-invariant mode: the
  // prefill kernel handles one-token rows too.
  ap.max_query_len =
      v.max_query_len == 1 && (v.n_tokens > kMaxDecodeAttentionRows || batch_invariant_)
          ? 2
          : v.max_query_len;
  // Mixed steps: their decode rows take the decode kernel (which reads each K/V row once per
  // GQA group, and gives them the bits of an all-decode step), the prefill chunks the prefill
  // kernel. Not in batch-invariant mode, whose rows all take the prefill kernel.
  ap.decode_rows_apart =
      !batch_invariant_ && v.max_query_len > 1 && v.n_seqs <= kMaxDecodeAttentionRows;
  ap.max_context_len = v.max_context_len;
  cuda::PagedAttention(ap, attention_workspace_, attention_workspace_bytes_, stream);
  if (c.attention_output_gate) cuda::SigmoidGate(attn_, gate_, n * q_dim_, stream);
  marks->Mark(CudaStage::kAttention);
  linear->Run(attn_, n, q_dim_, w.o_proj, hidden, tmp_, stream);  // [n, hidden]
  marks->Mark(CudaStage::kMatmul);
}

void CudaDecoder::DeltaNet(const LayerWeights& w, const DeviceBatchView& v,
                           const CudaStatePool& state, cudaStream_t stream,
                           cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const LinearAttentionConfig& la = c.linear;
  const int64_t n = v.n_tokens;
  const int32_t nk = static_cast<int32_t>(la.n_key_heads),
                nv = static_cast<int32_t>(la.n_value_heads);
  const int32_t dk = static_cast<int32_t>(la.key_head_dim),
                dv = static_cast<int32_t>(la.value_head_dim);
  const int64_t conv_dim = la.conv_dim(), value_dim = la.value_dim();
  linear->Run(xn_, n, c.hidden_size, w.in_proj, gdn_width_, qkv_, stream);  // qkv | z | b | a
  marks->Mark(CudaStage::kMatmul);

  cuda::DeltaStateView sv;
  sv.state = state.base;
  sv.slot_floats = state.slot_floats;
  sv.layer_offset = w.recurrent_index * state.layer_floats;
  sv.conv_floats = state.conv_floats;
  cuda::DeltaBatchView bv;
  bv.seq_starts = v.seq_starts;
  bv.positions = v.positions;
  bv.state_slots = v.state_slots;
  bv.snapshot_slot = v.snapshot_slot;
  bv.n_seqs = v.n_seqs;
  bv.n_tokens = v.n_tokens;
  cuda::CausalConv1dSiluDeltaPrep(qkv_, gdn_width_, static_cast<int32_t>(la.conv_kernel), w.conv_w,
                                  bv, sv, conv_out_, nk, dk, nv, dv, qkv_ + conv_dim + value_dim,
                                  gdn_width_, w.neg_exp_a, w.dt_bias, dq_, dk_, beta_, g_, stream);
  // In chunks where a sequence brings many rows (prefill; the workspace holds up to
  // kChunkedDeltaRuleMaxSeqs sequences); token by token otherwise.
  const float* values = conv_out_ + 2 * la.key_dim();
  if (v.max_query_len >= kChunkedDeltaRuleMinRows && v.n_seqs <= kChunkedDeltaRuleMaxSeqs) {
    cuda::GatedDeltaRuleChunked(dq_, dk_, values, conv_dim, g_, beta_, nk, dk, nv, dv, bv, sv,
                                core_, delta_workspace_, stream);
  } else {
    cuda::GatedDeltaRule(dq_, dk_, values, conv_dim, g_, beta_, nk, dk, nv, dv, bv, sv, core_,
                         stream);
  }
  cuda::GatedRmsNormSilu(core_, qkv_ + conv_dim, gdn_width_, nv, n * nv, dv, w.gdn_norm,
                         static_cast<float>(c.rms_norm_eps), gdn_out_, stream);
  marks->Mark(CudaStage::kRecurrent);
  linear->Run(gdn_out_, n, value_dim, w.out_proj, c.hidden_size, tmp_, stream);  // [n, hidden]
  marks->Mark(CudaStage::kMatmul);
}

void CudaDecoder::Moe(const LayerWeights& w, const DeviceBatchView& v, cudaStream_t stream,
                      cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const MoeConfig& m = c_.moe;
  const int32_t n = v.n_tokens;
  const int64_t hidden = c_.hidden_size;
  const int32_t n_e = static_cast<int32_t>(m.n_experts), top_k = static_cast<int32_t>(m.top_k);
  const int32_t inter = static_cast<int32_t>(m.expert_intermediate);
  const int64_t shared_inter = m.shared_expert_intermediate;
  // The shared expert runs as one of the grouped experts (the slot) in steps of few tokens, else
  // as its own GEMMs: there the slot's blocks, with every token's row, would outlast the routed
  // experts' (a few rows each).
  const bool slot = UseSharedSlot(n);
  const bool shared = !w.shared_gate_up.empty() && !slot;
  // Router logits and, in the last column, the shared expert's gate logit: [n, router_width]
  // at `logits`, rows `ld` floats apart.
  // The shared expert's gate|up (when it runs apart) likewise at `shared_gate_up`, rows
  // `shared_ld` floats apart.
  float* logits = router_;
  int64_t ld = router_width_;
  const float* shared_gate_up = gate_up_;
  int64_t shared_ld = 2 * shared_inter;
  if (shared && moe_shared_slot_) {
    // One product for the shared expert's gate|up and the router (rows stored together).
    ld = SharedRouterStride(router_width_, shared_inter);
    linear->RunCublasLtStrided(xn_, n, hidden, w.shared_router.bf16(),
                               2 * shared_inter + router_width_, router_, ld, stream);
    logits = router_ + 2 * shared_inter;
    shared_gate_up = router_;
    shared_ld = ld;
  } else {
    linear->Run(xn_, n, hidden, w.router, router_width_, router_, stream);
    if (shared) linear->Run(xn_, n, hidden, w.shared_gate_up, shared_ld, gate_up_, stream);
  }
  if (shared) {
    marks->Mark(CudaStage::kMatmul);
    cuda::SiluMul(shared_gate_up, shared_ld, nullptr, nullptr, n, shared_inter, act_, stream);
    marks->Mark(CudaStage::kOther);
    linear->Run(act_, n, shared_inter, w.shared_down, hidden, shared_out_, stream);  // [n, hidden]
  }
  marks->Mark(CudaStage::kMatmul);
  cuda::MoeRoute(logits, ld, n, n_e, top_k, m.norm_topk_prob, slot, routing_,
                 moe_active_log_ + w.moe_index, stream);
  // The shared slot makes the shared expert one more expert (id n_e) that every token picks.
  const int32_t picks = static_cast<int32_t>(moe_picks(n));
  const int32_t slots = n_e + (slot ? 1 : 0);
  const int32_t pairs = n * picks;
  if (n >= kMoeGemmMinTokens) {
    // Many rows per expert (prefill): tiles of 128 rows of one expert on the tensor cores, each
    // weight tile staged once per tile; the grid is sized for the most tiles the pairs can make
    // (every expert's last tile partial).
    const int32_t max_tiles =
        (pairs + (cuda::kMoeGemmTileRows - 1) * std::min(slots, pairs)) / cuda::kMoeGemmTileRows;
    cuda::MoeGroupedGemm(xn_, routing_.rows, static_cast<int32_t>(hidden), w.experts_gate_up,
                         2 * inter, routing_.expert_begin, routing_.tile_begin, slots, max_tiles,
                         expert_gate_up_, stream);
    cuda::SiluMul(expert_gate_up_, nullptr, nullptr, pairs, inter, expert_act_, stream);
    cuda::MoeGroupedGemm(expert_act_, nullptr, inter, w.experts_down, static_cast<int32_t>(hidden),
                         routing_.expert_begin, routing_.tile_begin, slots, max_tiles, expert_out_,
                         stream);
  } else {
    // Few rows (decode): one grouped launch per GEMM that streams only the routed experts'
    // weights. A token picks an expert at most once; at most `pairs` experts get rows.
    // SiLU·up is the gate|up GEMM's epilogue (one launch, no f32 gate|up rows).
    const int32_t max_active = std::min(slots, pairs);
    cuda::MoeLinearSiluMul(xn_, routing_.rows, static_cast<int32_t>(hidden), w.experts_gate_up,
                           inter, routing_, max_active, expert_act_, stream);
    cuda::MoeLinear(expert_act_, nullptr, inter, w.experts_down, static_cast<int32_t>(hidden),
                    routing_, max_active, expert_out_, stream);  // [pairs, hidden]
  }
  cuda::MoeCombine(expert_out_, routing_, n, picks, static_cast<int32_t>(hidden),
                   shared ? shared_out_ : nullptr, logits + n_e, ld, tmp_, stream);
  marks->Mark(CudaStage::kMoe);
}

void CudaDecoder::Forward(const DeviceBatchView& v, int32_t lm_head_rows, const CudaKvPool& kv,
                          const CudaStatePool& state, cudaStream_t stream,
                          cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::EmbeddingGather(embed_, c.vocab_size, c.hidden_size, v.token_ids, v.n_tokens, x_,
                        stream);  // [n, hidden]
  marks->Mark(CudaStage::kOther);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    Layer(layer, v, kv, state, stream, linear, marks);
  }
  // The last MLP's residual (kept in x_ for further LM-head chunks).
  const LayerWeights& last = layers_.back();
  cuda::AddRmsNorm(x_, tmp_, last.down_bias, final_norm_, eps, v.n_tokens, c.hidden_size, xn_,
                   stream, norm_offset_);
  if (lm_head_rows > 0) LmHead(v.logits_rows, lm_head_rows, stream, linear, marks);
}

void CudaDecoder::LmHead(const int32_t* logits_rows, int32_t rows, cudaStream_t stream,
                         cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  cuda::GatherRmsNorm(x_, logits_rows, rows, c.hidden_size, final_norm_,
                      static_cast<float>(c.rms_norm_eps), x_final_, stream, norm_offset_);
  marks->Mark(CudaStage::kOther);
  linear->Run(x_final_, rows, c.hidden_size, lm_head_, c.vocab_size, logits_, stream);
  marks->Mark(CudaStage::kMatmul);
}

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
