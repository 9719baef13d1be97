// Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE: every layer is softmax attention (RoPE, GQA;
// Qwen2 q/k/v biases, Qwen3 QK-norm, Mistral/Qwen sliding windows) followed by a SwiGLU MLP,
// or in Qwen3-MoE's sparse layers a top-k mixture of SwiGLU experts.
//
//   model.embed_tokens.weight                 (vocab, hidden)
//   model.layers.N.input_layernorm.weight     (hidden)
//   model.layers.N.self_attn.{q,k,v,o}_proj.* see BindAttention
//   model.layers.N.post_attention_layernorm.weight
//   model.layers.N.mlp.{gate,up,down}_proj.*  dense layers
//   model.layers.N.mlp.gate.weight            (n_experts, hidden)   MoE layers
//   model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, or experts.gate_up_proj/down_proj
//   model.norm.weight, lm_head.weight (absent when tied)
#include "models/weights.h"

namespace kestrel::arch {

Status BindLlamaFamily(const ModelConfig& c, WeightBinder& b, DecoderWeights* w) {
  const int64_t hidden = c.hidden_size;
  const std::string& root = c.weight_prefix;
  KTRY(BindEmbeddingsAndHead(c, b, root, w));
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    DecoderLayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = root + "layers." + std::to_string(i) + ".";
    l.type = LayerType::kAttention;
    l.moe = c.layer_moe[static_cast<size_t>(i)];
    KTRY(b.Get(p + "input_layernorm.weight", {hidden}, &l.input_norm));
    KTRY(BindAttention(c, b, p + "self_attn.", &l.attn));
    KTRY(b.Get(p + "post_attention_layernorm.weight", {hidden}, &l.post_norm));
    if (l.moe) {
      KTRY(BindMoe(c, b, p + "mlp.", &l.moe_w));
    } else {
      KTRY(BindMlp(b, p + "mlp.", hidden, c.intermediate_size, c.mlp_bias, &l.mlp));
    }
    const bool sliding = static_cast<size_t>(i) < c.layer_sliding.size() &&
                         c.layer_sliding[static_cast<size_t>(i)] && c.sliding_window.has_value();
    l.attn.sliding_window = sliding ? *c.sliding_window : 0;
  }
  return Status::Ok();
}

}  // namespace kestrel::arch
