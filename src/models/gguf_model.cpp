#include "models/gguf_model.h"

#include <cstring>

#include "models/safetensors.h"

namespace kestrel {
namespace {

using nlohmann::json;

struct ArchMap {
  const char* gguf;
  const char* hf_class;
};
constexpr ArchMap kArchs[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"qwen3moe", "Qwen3MoeForCausalLM"},
};

Result<std::string> GgufArchitecture(const GgufFile& g) {
  KASSIGN(std::optional<std::string> arch, g.String("general.architecture"));
  if (!arch) return InvalidArgument(g.path() + ": no general.architecture in the GGUF metadata");
  for (const ArchMap& a : kArchs) {
    if (*arch == a.gguf) return *arch;
  }
  std::string list;
  for (const ArchMap& a : kArchs) list += std::string(list.empty() ? "" : ", ") + a.gguf;
  return Unsupported(g.path() + ": GGUF architecture '" + *arch + "' is not supported (" + list +
                     " are)");
}

const GgufTensorInfo* FindTensor(const GgufFile& g, const std::string& name) {
  for (const GgufTensorInfo& t : g.header().tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// Hugging Face name of a per-layer GGUF tensor suffix ("attn_q.weight" -> "self_attn.q_proj.weight").
const char* LayerTensorName(const std::string& suffix) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},       {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},  {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},  {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},        {"ffn_gate_inp", "mlp.gate"},
  };
  for (const auto& [g, hf] : kNames) {
    if (suffix == g) return hf;
  }
  return nullptr;
}

}  // namespace

Result<json> GgufConfigJson(const GgufFile& g) {
  KASSIGN(std::string arch, GgufArchitecture(g));
  const std::string p = arch + ".";
  json c = json::object();
  for (const ArchMap& a : kArchs) {
    if (arch == a.gguf) c["architectures"] = json::array({a.hf_class});
  }
  auto need_int = [&](const std::string& key) -> Result<int64_t> {
    KASSIGN(std::optional<int64_t> v, g.Int(p + key));
    if (!v) return InvalidArgument(g.path() + ": GGUF metadata has no '" + p + key + "'");
    return *v;
  };
  const GgufTensorInfo* embd = FindTensor(g, "token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return InvalidArgument(g.path() + ": no 2-D token_embd.weight tensor");
  }
  c["vocab_size"] = embd->shape[0];
  KASSIGN(c["hidden_size"], need_int("embedding_length"));
  KASSIGN(c["num_hidden_layers"], need_int("block_count"));
  KASSIGN(c["num_attention_heads"], need_int("attention.head_count"));
  KASSIGN(std::optional<int64_t> kv_heads, g.Int(p + "attention.head_count_kv"));
  c["num_key_value_heads"] = kv_heads.value_or(c["num_attention_heads"].get<int64_t>());
  KASSIGN(std::optional<int64_t> head_dim, g.Int(p + "attention.key_length"));
  if (head_dim) c["head_dim"] = *head_dim;
  KASSIGN(std::optional<int64_t> ff, g.Int(p + "feed_forward_length"));
  c["intermediate_size"] = ff.value_or(0);
  KASSIGN(std::optional<int64_t> ctx, g.Int(p + "context_length"));
  if (ctx) c["max_position_embeddings"] = *ctx;
  KASSIGN(std::optional<double> eps, g.Float(p + "attention.layer_norm_rms_epsilon"));
  if (eps) c["rms_norm_eps"] = *eps;
  KASSIGN(std::optional<double> theta, g.Float(p + "rope.freq_base"));
  json rope = {{"rope_type", "default"}, {"rope_theta", theta.value_or(10000.0)}};
  KASSIGN(std::optional<std::string> scaling, g.String(p + "rope.scaling.type"));
  if (scaling && *scaling != "none") {
    KASSIGN(std::optional<double> factor, g.Float(p + "rope.scaling.factor"));
    if (*scaling == "linear") {
      rope["rope_type"] = "linear";
      rope["factor"] = factor.value_or(1.0);
    } else if (*scaling == "yarn") {
      rope["rope_type"] = "yarn";
      rope["factor"] = factor.value_or(1.0);
      KASSIGN(std::optional<int64_t> orig, g.Int(p + "rope.scaling.original_context_length"));
      if (orig) rope["original_max_position_embeddings"] = *orig;
    } else {
      return Unsupported(g.path() + ": rope scaling '" + *scaling + "' in a GGUF file");
    }
  }
  c["rope_parameters"] = rope;
  c["tie_word_embeddings"] = FindTensor(g, "output.weight") == nullptr;
  const bool q_bias = FindTensor(g, "blk.0.attn_q.bias") != nullptr;
  const bool o_bias = FindTensor(g, "blk.0.attn_output.bias") != nullptr;
  if (arch == "llama" || arch == "qwen3" || arch == "qwen3moe") {
    if (q_bias != o_bias) {
      return Unsupported(g.path() + ": q/k/v biases without an output bias (or the reverse) in a " +
                         arch + " GGUF");
    }
    c["attention_bias"] = q_bias;
  }
  if (arch == "llama") c["mlp_bias"] = FindTensor(g, "blk.0.ffn_gate.bias") != nullptr;
  if (arch == "qwen3moe") {
    KASSIGN(c["num_experts"], need_int("expert_count"));
    KASSIGN(c["num_experts_per_tok"], need_int("expert_used_count"));
    KASSIGN(c["moe_intermediate_size"], need_int("expert_feed_forward_length"));
    // llama.cpp renormalises Qwen3-MoE's top-k weights unless the file says otherwise.
    KASSIGN(std::optional<bool> norm, g.Bool(p + "expert_weights_norm"));
    c["norm_topk_prob"] = norm.value_or(true);
    c["decoder_sparse_step"] = 1;
    // Layers without a router are dense.
    json dense = json::array();
    for (int64_t i = 0; i < c["num_hidden_layers"].get<int64_t>(); ++i) {
      if (FindTensor(g, "blk." + std::to_string(i) + ".ffn_gate_inp.weight") == nullptr) {
        dense.push_back(i);
      }
    }
    c["mlp_only_layers"] = dense;
  }
  KASSIGN(std::optional<int64_t> bos, g.Int("tokenizer.ggml.bos_token_id"));
  KASSIGN(std::optional<int64_t> eos, g.Int("tokenizer.ggml.eos_token_id"));
  if (bos) c["bos_token_id"] = *bos;
  if (eos) c["eos_token_id"] = *eos;
  c["dtype"] = "bfloat16";
  return c;
}

Result<ModelConfig> LoadGgufConfig(const GgufFile& g) {
  KASSIGN(json j, GgufConfigJson(g));
  KASSIGN(ModelConfig c, ParseModelConfig(j, g.path()));
  if (const GgufTensorInfo* t = FindTensor(g, "rope_freqs.weight")) {
    const int64_t half = c.head_dim / 2;
    if (t->ggml_type != 0 || t->shape.size() != 1 || t->shape[0] != half) {
      return InvalidArgument(g.path() + ": rope_freqs.weight must be F32 [" +
                             std::to_string(half) + "]");
    }
    c.rope.freq_factors.resize(static_cast<size_t>(half));
    std::memcpy(c.rope.freq_factors.data(), g.tensor_data(*t), static_cast<size_t>(half) * 4);
    for (float f : c.rope.freq_factors) {
      if (!(f > 0)) return InvalidArgument(g.path() + ": rope_freqs.weight holds a factor <= 0");
    }
  }
  return c;
}

Result<GenerationDefaults> GgufGenerationDefaults(const GgufFile& g) {
  GenerationDefaults d;
  KASSIGN(std::optional<int64_t> bos, g.Int("tokenizer.ggml.bos_token_id"));
  KASSIGN(std::optional<int64_t> eos, g.Int("tokenizer.ggml.eos_token_id"));
  if (bos) d.bos_token_id = static_cast<int32_t>(*bos);
  if (eos) d.eos_token_ids.push_back(static_cast<int32_t>(*eos));
  return d;
}

Result<WeightStore> WeightStore::OpenGguf(const std::string& path) {
  KASSIGN(GgufFile g, GgufFile::Open(path));
  KASSIGN(std::string arch, GgufArchitecture(g));
  KASSIGN(std::optional<int64_t> n_head, g.Int(arch + ".attention.head_count"));
  KASSIGN(std::optional<int64_t> n_kv_head, g.Int(arch + ".attention.head_count_kv"));
  WeightStore store;
  store.model_dir_ = path;
  const std::vector<GgufTensorInfo> tensors = g.header().tensors;
  const uint64_t data_offset = g.header().data_offset;
  const uint8_t* base = nullptr;
  auto view_of = [&](const GgufTensorInfo& t, DType dtype) {
    TensorView v;
    v.data = base + data_offset + t.offset;
    v.dtype = dtype;
    v.n_dims = static_cast<int>(t.shape.size());
    for (int i = 0; i < v.n_dims; ++i) v.shape[i] = t.shape[i];
    return v;
  };
  store.files_.push_back(std::move(g).ReleaseMapping());
  base = store.files_[0].data();
  auto add = [&](const std::string& name, const TensorView& v) -> Status {
    if (!store.tensors_.emplace(name, v).second) {
      return InvalidArgument(path + ": two GGUF tensors map to '" + name + "'");
    }
    store.tensor_file_.emplace(name, 0);
    return Status::Ok();
  };
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == "rope_freqs.weight") continue;  // read into the config (LoadGgufConfig)
    std::optional<DType> dtype = DTypeOfGgmlType(t.ggml_type);
    if (!dtype) {
      return Unsupported(path + ": tensor '" + t.name + "' is " + GgmlTypeName(t.ggml_type) +
                         "; Kestrel reads F32, F16, BF16, Q8_0, Q4_K and Q6_K GGUF tensors");
    }
    const TensorView v = view_of(t, *dtype);
    if (t.name == "token_embd.weight") { KTRY(add("model.embed_tokens.weight", v)); continue; }
    if (t.name == "output_norm.weight") { KTRY(add("model.norm.weight", v)); continue; }
    if (t.name == "output.weight") { KTRY(add("lm_head.weight", v)); continue; }
    // blk.N.<suffix>.(weight|bias)
    std::string layer, suffix, kind;
    if (t.name.starts_with("blk.")) {
      const size_t dot1 = t.name.find('.', 4);
      const size_t dot2 = t.name.rfind('.');
      if (dot1 != std::string::npos && dot2 > dot1) {
        layer = t.name.substr(4, dot1 - 4);
        suffix = t.name.substr(dot1 + 1, dot2 - dot1 - 1);
        kind = t.name.substr(dot2 + 1);
      }
    }
    const std::string prefix = "model.layers." + layer + ".";
    if (suffix == "ffn_gate_exps" || suffix == "ffn_up_exps" || suffix == "ffn_down_exps") {
      if (kind != "weight" || v.n_dims != 3) {
        return InvalidArgument(path + ": tensor '" + t.name + "' must be a 3-D weight");
      }
      const char* proj = suffix == "ffn_gate_exps" ? "gate_proj" : suffix == "ffn_up_exps" ? "up_proj" : "down_proj";
      const int64_t matrix_bytes = v.shape[1] * DTypeRowBytes(v.dtype, v.shape[2]);
      for (int64_t e = 0; e < v.shape[0]; ++e) {
        TensorView x = v;
        x.n_dims = 2;
        x.shape[0] = v.shape[1];
        x.shape[1] = v.shape[2];
        x.data = static_cast<const uint8_t*>(v.data) + e * matrix_bytes;
        KTRY(add(prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight", x));
      }
      continue;
    }
    const char* hf = LayerTensorName(suffix);
    if (layer.empty() || hf == nullptr || (kind != "weight" && kind != "bias")) {
      return Unsupported(path + ": GGUF tensor '" + t.name + "' is not one Kestrel maps for '" +
                         arch + "'");
    }
    TensorView out = v;
    // llama.cpp's converter interleaves the two rotate-half halves of every Llama q/k head
    // (row h*hd + 2i + j holds row h*hd + j*hd/2 + i); rows are whole blocks, so they move as
    // bytes.
    if (arch == "llama" && (suffix == "attn_q" || suffix == "attn_k")) {
      const int64_t heads = suffix == "attn_q" ? n_head.value_or(0) : n_kv_head.value_or(n_head.value_or(0));
      const int64_t rows = v.shape[0];
      if (heads <= 0 || rows % (2 * heads) != 0) {
        return InvalidArgument(path + ": tensor '" + t.name + "' has " + std::to_string(rows) +
                               " rows, not whole heads of " + std::to_string(heads));
      }
      const int64_t hd = rows / heads;
      const int64_t rb = v.n_dims == 1 ? static_cast<int64_t>(DTypeSize(v.dtype)) : v.row_bytes();
      std::vector<uint8_t> buf(static_cast<size_t>(rows * rb));
      const auto* src = static_cast<const uint8_t*>(v.data);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < 2; ++j) {
          for (int64_t i = 0; i < hd / 2; ++i) {
            std::memcpy(buf.data() + (h * hd + j * hd / 2 + i) * rb, src + (h * hd + 2 * i + j) * rb,
                        static_cast<size_t>(rb));
          }
        }
      }
      store.owned_.push_back(std::move(buf));
      out.data = store.owned_.back().data();
    }
    KTRY(add(prefix + hf + "." + kind, out));
  }
  return store;
}

}  // namespace kestrel
