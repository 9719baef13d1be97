// The decoder's layers on CUDA (see cuda_decoder.h).
#ifdef KESTREL_HAS_CUDA

#include "models/cuda_decoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/activation.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/norm.h"
#include "backends/cuda/rope.h"
#include "core/check.h"
#include "models/rope.h"

namespace kestrel {
namespace {

size_t AlignUp(size_t n) {
  return (n + CudaWeightPlan::kAlign - 1) / CudaWeightPlan::kAlign * CudaWeightPlan::kAlign;
}

Status RequireBf16(const TensorView& t, const std::string& what) {
  if (t.empty() || t.dtype == DType::kBF16) return Status::Ok();
  return Unsupported("--device cuda runs BF16 weights; " + what + " is " +
                     std::string(DTypeName(t.dtype)) + " (use --device cpu for F32/F16 files)");
}

}  // namespace

size_t CudaWeightPlan::Place(std::initializer_list<const TensorView*> parts) {
  size_t bytes = 0;
  for (const TensorView* t : parts) bytes += t->size_bytes();
  const size_t off = total_;
  total_ += AlignUp(bytes);
  size_t at = off;
  for (const TensorView* t : parts) {
    pieces_.push_back({t, at});
    at += t->size_bytes();
  }
  return off;
}

size_t CudaWeightPlan::PlaceOptional(std::initializer_list<const TensorView*> parts) {
  if (parts.size() == 0 || (*parts.begin())->empty()) return kNone;
  return Place(parts);
}

CudaDecoder::CudaDecoder(const ModelConfig& config, const DecoderWeights& weights)
    : c_(config), w_(weights) {}

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::Create(const ModelConfig& c,
                                                         const DecoderWeights& w) {
  if (c.head_dim != 16 && c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 &&
      c.head_dim != 256) {
    return Unsupported("--device cuda supports head_dim 16, 32, 64, 128 and 256, not " +
                       std::to_string(c.head_dim));
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0 || (c.n_heads * c.head_dim) % 8 != 0) {
    return Unsupported(
        "--device cuda needs hidden, intermediate and attention sizes that are multiples of 8");
  }
  if (c.norm_weight_offset || c.attention_output_gate) {
    return Unsupported(c.architecture_class +
                       ": zero-centred (1 + w) norms and the attention output gate run on the "
                       "CPU only in this version; use --device cpu");
  }
  KTRY(RequireBf16(w.embed, "the embedding"));
  KTRY(RequireBf16(w.final_norm, "the final norm"));
  KTRY(RequireBf16(w.lm_head, "the LM head"));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& l = w.layers[i];
    const std::string where = "layer " + std::to_string(i);
    if (l.type != LayerType::kAttention || l.moe) {
      return Unsupported(c.architecture_class + " " + where +
                         " is a Gated DeltaNet or mixture-of-experts layer, which runs on the "
                         "CPU only in this version; use --device cpu");
    }
    const AttentionWeights& a = l.attn;
    if (a.q_bias.empty() != a.k_bias.empty() || a.q_bias.empty() != a.v_bias.empty()) {
      return Unsupported(where + ": q/k/v projections must all have biases or none");
    }
    for (const TensorView* t :
         {&l.input_norm, &a.q_proj, &a.q_bias, &a.k_proj, &a.k_bias, &a.v_proj, &a.v_bias,
          &a.q_norm, &a.k_norm, &a.o_proj, &a.o_bias, &l.post_norm, &l.mlp.gate_proj,
          &l.mlp.gate_bias, &l.mlp.up_proj, &l.mlp.up_bias, &l.mlp.down_proj, &l.mlp.down_bias}) {
      KTRY(RequireBf16(*t, "a tensor of " + where));
    }
  }
  std::unique_ptr<CudaDecoder> d(new CudaDecoder(c, w));
  d->q_dim_ = c.n_heads * c.head_dim;
  d->kv_dim_ = c.n_kv_heads * c.head_dim;
  d->n_attention_layers_ = c.n_layers;
  return d;
}

void CudaDecoder::PlanWeights(CudaWeightPlan* plan) {
  embed_off_ = plan->Place({&w_.embed});
  norm_off_ = plan->Place({&w_.final_norm});
  head_off_ = c_.tie_word_embeddings ? embed_off_ : plan->Place({&w_.lm_head});
  offsets_.resize(w_.layers.size());
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const DecoderLayerWeights& l = w_.layers[i];
    const AttentionWeights& a = l.attn;
    LayerOffsets& o = offsets_[i];
    o.input_norm = plan->Place({&l.input_norm});
    o.qkv = plan->Place({&a.q_proj, &a.k_proj, &a.v_proj});
    o.qkv_bias = plan->PlaceOptional({&a.q_bias, &a.k_bias, &a.v_bias});
    o.q_norm = plan->PlaceOptional({&a.q_norm});
    o.k_norm = plan->PlaceOptional({&a.k_norm});
    o.o_proj = plan->Place({&a.o_proj});
    o.o_bias = plan->PlaceOptional({&a.o_bias});
    o.post_norm = plan->Place({&l.post_norm});
    o.gate_up = plan->Place({&l.mlp.gate_proj, &l.mlp.up_proj});
    o.gate_bias = plan->PlaceOptional({&l.mlp.gate_bias});
    o.up_bias = plan->PlaceOptional({&l.mlp.up_bias});
    o.down = plan->Place({&l.mlp.down_proj});
    o.down_bias = plan->PlaceOptional({&l.mlp.down_bias});
  }
}

void CudaDecoder::BindWeights(const uint8_t* base) {
  auto at = [&](size_t off) -> const __nv_bfloat16* {
    return off == CudaWeightPlan::kNone ? nullptr
                                        : reinterpret_cast<const __nv_bfloat16*>(base + off);
  };
  embed_ = at(embed_off_);
  final_norm_ = at(norm_off_);
  lm_head_ = at(head_off_);
  layers_.resize(offsets_.size());
  for (size_t i = 0; i < offsets_.size(); ++i) {
    const LayerOffsets& o = offsets_[i];
    LayerWeights& l = layers_[i];
    l.input_norm = at(o.input_norm);
    l.qkv = at(o.qkv);
    l.qkv_bias = at(o.qkv_bias);
    l.q_norm = at(o.q_norm);
    l.k_norm = at(o.k_norm);
    l.o_proj = at(o.o_proj);
    l.o_bias = at(o.o_bias);
    l.post_norm = at(o.post_norm);
    l.gate_up = at(o.gate_up);
    l.gate_bias = at(o.gate_bias);
    l.up_bias = at(o.up_bias);
    l.down = at(o.down);
    l.down_bias = at(o.down_bias);
    l.sliding_window = static_cast<int32_t>(w_.layers[i].attn.sliding_window);
    l.attention_index = static_cast<int64_t>(i);
  }
}

Status CudaDecoder::UploadConstants() {
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
struct ActivationLayout {
  size_t x, xn, qkv, q, attn, tmp, gate_up, act, x_final, logits, workspace, workspace_bytes, total;
};

ActivationLayout Layout(const ModelConfig& c, int64_t q_dim, int64_t kv_dim, int32_t n_tokens,
                        int32_t n_logits, int32_t max_context) {
  const int64_t n = n_tokens;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  ActivationLayout l{};
  size_t total = 0;
  auto reserve = [&](int64_t bytes) {
    const size_t off = total;
    total += AlignUp(static_cast<size_t>(bytes));
    return off;
  };
  l.x = reserve(n * hidden * 4);
  l.xn = reserve(n * hidden * 2);
  l.qkv = reserve(n * (q_dim + 2 * kv_dim) * 4);
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
  l.total = total;
  return l;
}
}  // namespace

size_t CudaDecoder::ActivationBytes(int32_t n_tokens, int32_t n_logits, int32_t max_context) const {
  return Layout(c_, q_dim_, kv_dim_, n_tokens, n_logits, max_context).total;
}

void CudaDecoder::BindActivations(uint8_t* b, int32_t n_tokens, int32_t n_logits,
                                  int32_t max_context) {
  const ActivationLayout l = Layout(c_, q_dim_, kv_dim_, n_tokens, n_logits, max_context);
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
}

void CudaDecoder::Layer(int64_t layer, const DeviceBatchView& v, const CudaKvPool& kv,
                        cudaStream_t stream, cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t n = v.n_tokens;
  const int64_t hidden = c.hidden_size;
  const int64_t qkv_dim = q_dim_ + 2 * kv_dim_;
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto gemm = [&](const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* wt,
                  int64_t n_out, float* y) {
    linear->Run(x, m, k, wt, n_out, y, stream);
    marks->Mark(CudaStage::kMatmul);
  };

  // Residual of the previous layer's MLP (none before layer 0) + input norm.
  const LayerWeights* prev = layer > 0 ? &layers_[static_cast<size_t>(layer - 1)] : nullptr;
  cuda::AddRmsNorm(x_, prev != nullptr ? tmp_ : nullptr,
                   prev != nullptr ? prev->down_bias : nullptr, w.input_norm, eps, n, hidden, xn_,
                   stream);
  marks->Mark(CudaStage::kOther);
  gemm(xn_, n, hidden, w.qkv, qkv_dim, qkv_);  // [n, q_dim + 2*kv_dim]

  // Bias, QK-norm, RoPE, K/V into the pool; then attention through the block tables.
  __nv_bfloat16* k_cache = kv.k(w.attention_index);
  __nv_bfloat16* v_cache = kv.v(w.attention_index);
  cuda::QkvRopeShape rs;
  rs.n_heads = static_cast<int32_t>(c.n_heads);
  rs.n_kv_heads = static_cast<int32_t>(c.n_kv_heads);
  rs.head_dim = static_cast<int32_t>(c.head_dim);
  rs.rotary_half = static_cast<int32_t>(RopeRotaryDim(c) / 2);
  rs.block_size_tokens = kv.block_size;
  rs.qk_norm_eps = eps;
  rs.attention_scaling = rope_attention_scale_;
  cuda::QkvRope(qkv_, w.qkv_bias, w.q_norm, w.k_norm, v.positions, inv_freq_.as<float>(),
                v.slot_mapping, n, rs, q_, k_cache, v_cache, stream);
  cuda::PagedAttentionParams ap;
  ap.q = q_;
  ap.k_cache = k_cache;
  ap.v_cache = v_cache;
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
  // Pure decode beyond the decode workspace: the prefill kernel handles one-token rows too.
  ap.max_query_len =
      v.max_query_len == 1 && v.n_tokens > kMaxDecodeAttentionRows ? 2 : v.max_query_len;
  ap.max_context_len = v.max_context_len;
  cuda::PagedAttention(ap, attention_workspace_, attention_workspace_bytes_, stream);
  marks->Mark(CudaStage::kAttention);

  gemm(attn_, n, q_dim_, w.o_proj, hidden, tmp_);  // [n, hidden]
  cuda::AddRmsNorm(x_, tmp_, w.o_bias, w.post_norm, eps, n, hidden, xn_, stream);
  marks->Mark(CudaStage::kOther);

  gemm(xn_, n, hidden, w.gate_up, 2 * inter, gate_up_);  // [n, 2*intermediate]
  cuda::SiluMul(gate_up_, w.gate_bias, w.up_bias, n, inter, act_, stream);
  marks->Mark(CudaStage::kOther);
  gemm(act_, n, inter, w.down, hidden, tmp_);  // [n, hidden]; added by the next norm
}

void CudaDecoder::Forward(const DeviceBatchView& v, int32_t lm_head_rows, const CudaKvPool& kv,
                          cudaStream_t stream, cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::EmbeddingGather(embed_, c.vocab_size, c.hidden_size, v.token_ids, v.n_tokens, x_,
                        stream);  // [n, hidden]
  marks->Mark(CudaStage::kOther);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) Layer(layer, v, kv, stream, linear, marks);
  // The last MLP's residual (kept in x_ for further LM-head chunks).
  const LayerWeights& last = layers_.back();
  cuda::AddRmsNorm(x_, tmp_, last.down_bias, final_norm_, eps, v.n_tokens, c.hidden_size, xn_,
                   stream);
  if (lm_head_rows > 0) LmHead(v.logits_rows, lm_head_rows, stream, linear, marks);
}

void CudaDecoder::LmHead(const int32_t* logits_rows, int32_t rows, cudaStream_t stream,
                         cuda::LinearEngine* linear, CudaStageMarks* marks) {
  const ModelConfig& c = c_;
  cuda::GatherRmsNorm(x_, logits_rows, rows, c.hidden_size, final_norm_,
                      static_cast<float>(c.rms_norm_eps), x_final_, stream);
  marks->Mark(CudaStage::kOther);
  linear->Run(x_final_, rows, c.hidden_size, lm_head_, c.vocab_size, logits_, stream);
  marks->Mark(CudaStage::kMatmul);
}

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
