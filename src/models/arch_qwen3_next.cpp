// Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: hybrid stacks of Gated DeltaNet layers and gated
// softmax-attention layers (layer_types; by default every 4th layer is attention), with dense
// SwiGLU MLPs (Qwen3.5) or top-k MoE with a shared expert (Qwen3-Next, Qwen3.5-MoE). RMSNorm
// weights are zero-centred (the norm multiplies by 1 + w), attention uses QK-norm, partial RoPE
// and an output gate.
//
//   <root>embed_tokens.weight, <root>norm.weight, lm_head.weight   root = model. or
//                                       model.language_model. (multimodal checkpoints)
//   <root>layers.N.input_layernorm.weight / post_attention_layernorm.weight
//   <root>layers.N.linear_attn.*        Gated DeltaNet (see DeltaNetWeights for both layouts)
//   <root>layers.N.self_attn.*          q_proj emits [query | gate] per head
//   <root>layers.N.mlp.*                dense, or MoE: gate, experts.*, shared_expert.*,
//                                       shared_expert_gate
//   model.visual.*                      vision tower: not loaded (noted)
//   mtp.*                               MTP head: loaded into DecoderWeights::mtp when it has
//                                       the expected layout, else skipped with a note
#include <string>

#include "models/weights.h"

namespace kestrel::arch {
namespace {

Status BindDeltaNet(const ModelConfig& c, WeightBinder& b, const std::string& p,
                    DeltaNetWeights* out) {
  const LinearAttentionConfig& l = c.linear;
  const int64_t hidden = c.hidden_size;
  const int64_t nv = l.n_value_heads;
  if (l.fused_projections) {
    KTRY(b.Get(p + "in_proj_qkvz.weight", {2 * l.key_dim() + 2 * l.value_dim(), hidden},
               &out->in_proj_qkvz));
    KTRY(b.Get(p + "in_proj_ba.weight", {2 * nv, hidden}, &out->in_proj_ba));
  } else {
    KTRY(b.Get(p + "in_proj_qkv.weight", {l.conv_dim(), hidden}, &out->in_proj_qkv));
    KTRY(b.Get(p + "in_proj_z.weight", {l.value_dim(), hidden}, &out->in_proj_z));
    KTRY(b.Get(p + "in_proj_b.weight", {nv, hidden}, &out->in_proj_b));
    KTRY(b.Get(p + "in_proj_a.weight", {nv, hidden}, &out->in_proj_a));
  }
  KTRY(b.Get(p + "conv1d.weight", {l.conv_dim(), 1, l.conv_kernel}, &out->conv1d));
  KTRY(b.Get(p + "A_log", {nv}, &out->a_log));
  KTRY(b.Get(p + "dt_bias", {nv}, &out->dt_bias));
  KTRY(b.Get(p + "norm.weight", {l.value_head_dim}, &out->norm));
  KTRY(b.Get(p + "out_proj.weight", {hidden, l.value_dim()}, &out->out_proj));
  return Status::Ok();
}

Status BindLayer(const ModelConfig& c, WeightBinder& b, const std::string& p, LayerType type,
                 bool moe, DecoderLayerWeights* l) {
  const int64_t hidden = c.hidden_size;
  l->type = type;
  l->moe = moe;
  KTRY(b.Get(p + "input_layernorm.weight", {hidden}, &l->input_norm));
  if (type == LayerType::kAttention) {
    KTRY(BindAttention(c, b, p + "self_attn.", &l->attn));
  } else {
    KTRY(BindDeltaNet(c, b, p + "linear_attn.", &l->gdn));
  }
  KTRY(b.Get(p + "post_attention_layernorm.weight", {hidden}, &l->post_norm));
  if (moe) return BindMoe(c, b, p + "mlp.", &l->moe_w);
  return BindMlp(b, p + "mlp.", hidden, c.intermediate_size, false, &l->mlp);
}

// mtp.fc, the two pre-fc norms, mtp.layers.K (full attention; MoE when the model's MLPs are),
// mtp.norm. Never fails the load: a layout this code does not know is skipped with a note.
void BindMtp(const ModelConfig& c, WeightBinder& b, DecoderWeights* w) {
  const auto [n_tensors, n_params] = b.CountPrefix("mtp.");
  if (n_tensors == 0) return;
  const WeightBinder::Mark before = b.Save();
  const int64_t hidden = c.hidden_size;
  MtpWeights m;
  Status st = b.Get("mtp.fc.weight", {hidden, 2 * hidden}, &m.fc);
  if (st.ok()) st = b.Get("mtp.pre_fc_norm_embedding.weight", {hidden}, &m.pre_fc_norm_embedding);
  if (st.ok()) st = b.Get("mtp.pre_fc_norm_hidden.weight", {hidden}, &m.pre_fc_norm_hidden);
  if (st.ok()) st = b.Get("mtp.norm.weight", {hidden}, &m.norm);
  for (int64_t k = 0; st.ok() && b.CountPrefix("mtp.layers." + std::to_string(k) + ".").first > 0;
       ++k) {
    m.layers.emplace_back();
    st = BindLayer(c, b, "mtp.layers." + std::to_string(k) + ".", LayerType::kAttention,
                   c.has_moe(), &m.layers.back());
  }
  if (st.ok() && m.layers.empty()) st = InvalidArgument("no mtp.layers.0.*");
  const std::string what = "mtp.* (multi-token prediction head, " + std::to_string(n_tensors) +
                           " tensors, " + std::to_string(n_params) + " parameters)";
  if (!st.ok()) {
    b.Restore(before);
    b.Skip("mtp.", what + " not loaded: " + st.message());
    return;
  }
  m.n_parameters = b.n_parameters() - before.n_parameters;
  w->mtp = std::move(m);
  b.Skip("mtp.", what + " loaded for speculative decoding; " +
                     std::to_string(w->mtp->layers.size()) + " layer(s)");
}

}  // namespace

Status BindQwen3NextFamily(const ModelConfig& c, WeightBinder& b, DecoderWeights* w) {
  // transformers also loads a multimodal checkpoint's language_model into the text-only class.
  std::string root = c.weight_prefix;
  if (!b.Has(root + "embed_tokens.weight") && b.Has("model.language_model.embed_tokens.weight")) {
    root = "model.language_model.";
  }
  KTRY(BindEmbeddingsAndHead(c, b, root, w));
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    KTRY(BindLayer(c, b, root + "layers." + std::to_string(i) + ".",
                   c.layer_types[static_cast<size_t>(i)], c.layer_moe[static_cast<size_t>(i)],
                   &w->layers[static_cast<size_t>(i)]));
  }
  if (const auto [n_tensors, n_params] = b.CountPrefix("model.visual."); n_tensors > 0) {
    b.Skip("model.visual.", "model.visual.* (vision tower, " + std::to_string(n_tensors) +
                                " tensors, " + std::to_string(n_params) +
                                " parameters) not loaded: Kestrel runs the text model");
  }
  BindMtp(c, b, w);
  return Status::Ok();
}

}  // namespace kestrel::arch
