#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/gguf.h"
#include "core/json_file.h"
#include "core/mapped_file.h"
#include "models/gguf_model.h"

namespace kestrel {
namespace {

using nlohmann::json;

struct ArchInfo {
  Architecture arch;
  const char* class_name;
  const char* model_type;
};

// The first entry of an architecture names it; multimodal wrappers whose text part Kestrel runs
// follow (their text fields live in "text_config", their tensors under model.language_model.).
constexpr ArchInfo kArchs[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kMistral, "MistralForCausalLM", "mistral"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Architecture::kQwen3Next, "Qwen3NextForCausalLM", "qwen3_next"},
    {Architecture::kQwen3_5, "Qwen3_5ForCausalLM", "qwen3_5_text"},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"},
    {Architecture::kQwen3_5, "Qwen3_5ForConditionalGeneration", "qwen3_5"},
    {Architecture::kQwen3_5Moe, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"},
};

bool IsMultimodalWrapper(const std::string& class_name) {
  return class_name.ends_with("ForConditionalGeneration");
}

bool IsHybrid(Architecture a) {
  return a == Architecture::kQwen3Next || a == Architecture::kQwen3_5 ||
         a == Architecture::kQwen3_5Moe;
}

// What transformers' config classes (v5) use when config.json leaves a key out.
struct ArchDefaults {
  std::optional<int64_t> n_kv_heads;  // nullopt: = num_attention_heads
  std::optional<int64_t> head_dim;    // nullopt: = hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> eos_token_id;
  std::optional<int64_t> sliding_window;  // value when the key is absent
};

ArchDefaults DefaultsFor(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return {std::nullopt, std::nullopt, 2048, 1, 2, std::nullopt};
    case Architecture::kMistral:
      return {8, std::nullopt, 4096 * 32, 1, 2, 4096};
    case Architecture::kQwen2:
      return {32, std::nullopt, 32768, std::nullopt, std::nullopt, 4096};
    case Architecture::kQwen3:
      return {32, 128, 32768, std::nullopt, std::nullopt, 4096};
    case Architecture::kQwen3Moe:
      return {4, std::nullopt, 32768, std::nullopt, std::nullopt, 4096};
    case Architecture::kQwen3Next:
      return {2, 256, 32768, std::nullopt, std::nullopt, std::nullopt};
    case Architecture::kQwen3_5:
      return {4, 256, 32768, std::nullopt, std::nullopt, std::nullopt};
    case Architecture::kQwen3_5Moe:
      return {2, 256, 32768, std::nullopt, std::nullopt, std::nullopt};
  }
  return {};
}

// Typed, optional field access: absent or null -> nullopt; wrong type -> InvalidArgument
// naming the field. `where` is "<path>: " plus, for nested objects, the parent key.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  bool Has(const char* key) const { return obj_.contains(key); }
  bool HasValue(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  Result<std::optional<int64_t>> Int(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return TypeError(key, "an integer in 64-bit range", *v);
      }
      return std::optional<int64_t>(v->get<int64_t>());
    }
    // Some exporters write integral floats (4096.0).
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        return std::optional<int64_t>(static_cast<int64_t>(d));
      }
    }
    return TypeError(key, "an integer", *v);
  }

  Result<std::optional<double>> Number(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return TypeError(key, "a number", *v);
    return std::optional<double>(v->get<double>());
  }

  Result<std::optional<bool>> Bool(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return TypeError(key, "true or false", *v);
    return std::optional<bool>(v->get<bool>());
  }

  Result<std::optional<std::string>> String(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return TypeError(key, "a string", *v);
    return std::optional<std::string>(v->get<std::string>());
  }

  // A token id, a list of token ids, or null.
  Result<std::vector<int32_t>> TokenIds(const char* key) const {
    std::vector<int32_t> ids;
    const json* v = Find(key);
    if (v == nullptr) return ids;
    auto one = [&](const json& x) -> Status {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
          x.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
          (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))) {
        return TypeError(key, "a token id (non-negative 32-bit integer) or a list of them", *v);
      }
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
      return Status::Ok();
    };
    if (v->is_array()) {
      for (const json& x : *v) KTRY(one(x));
    } else {
      KTRY(one(*v));
    }
    return ids;
  }

  Status TypeError(const char* key, const char* expected, const json& got) const {
    return InvalidArgument(where_ + "field \"" + key + "\" must be " + expected + ", got " +
                           JsonTypeName(got) + " " + JsonExcerpt(got));
  }
  Status Error(const std::string& message) const { return InvalidArgument(where_ + message); }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
};

// The architecture and the class name it was found under.
Result<std::pair<Architecture, std::string>> ParseArchitecture(const Fields& f) {
  std::string name;
  if (const json* archs = f.Find("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return f.TypeError("architectures", "a non-empty list of class names", *archs);
    }
    name = (*archs)[0].get<std::string>();
    for (const ArchInfo& a : kArchs) {
      if (name == a.class_name) return std::make_pair(a.arch, name);
    }
    return Unsupported(f.where() + "architecture '" + name +
                       "' is not supported; supported: " + SupportedArchitecturesList());
  }
  KASSIGN(std::optional<std::string> model_type, f.String("model_type"));
  if (!model_type) {
    return f.Error("neither \"architectures\" nor \"model_type\" is set");
  }
  for (const ArchInfo& a : kArchs) {
    if (*model_type == a.model_type) return std::make_pair(a.arch, std::string(a.class_name));
  }
  return Unsupported(f.where() + "model_type '" + *model_type +
                     "' is not supported; supported: " + SupportedArchitecturesList());
}

Result<int64_t> RequiredPositive(const Fields& f, const char* key) {
  KASSIGN(std::optional<int64_t> v, f.Int(key));
  if (!v) return f.Error("missing required field \"" + std::string(key) + "\"");
  if (*v <= 0)
    return f.Error("field \"" + std::string(key) + "\" must be positive, got " +
                   std::to_string(*v));
  return *v;
}

Status CheckPositive(const Fields& f, const char* key, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return f.Error("field \"" + std::string(key) + "\" must be a positive number, got " +
                   std::to_string(v));
  }
  return Status::Ok();
}

// rope_theta + rope_scaling (published checkpoints) or rope_parameters (transformers >= 5),
// resolved the way transformers' RotaryEmbeddingConfigMixin standardizes them.
Status ParseRope(const Fields& top, ModelConfig* c) {
  const json* params = nullptr;
  std::string params_key;
  // transformers: `rope_scaling or rope_parameters`: a non-empty rope_scaling wins.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = top.Find(key);
    if (v == nullptr) continue;
    if (!v->is_object()) return top.TypeError(key, "an object", *v);
    if (v->empty()) continue;
    params = v;
    params_key = key;
    break;
  }
  const json empty = json::object();
  const Fields p(params ? *params : empty, top.where() + (params ? params_key + ": " : ""));
  // mrope_section / mrope_interleaved (Qwen3.5): multimodal RoPE gives text tokens the same
  // position on all three axes, which is plain RoPE; nothing to read for text.
  for (const char* layer_type : {"full_attention", "sliding_attention"}) {
    if (p.Has(layer_type)) {
      return Unsupported(p.where() + "per-layer-type RoPE parameters are not supported");
    }
  }

  RopeConfig& r = c->rope;
  KASSIGN(std::optional<double> theta, p.Number("rope_theta"));
  if (!theta) {
    KASSIGN(theta, top.Number("rope_theta"));
  }
  r.theta = theta.value_or(10000.0);
  KTRY(CheckPositive(top, "rope_theta", r.theta));

  KASSIGN(std::optional<double> partial, p.Number("partial_rotary_factor"));
  if (!partial) {
    KASSIGN(partial, top.Number("partial_rotary_factor"));
  }
  // Qwen3-Next and Qwen3.5 default to 0.25 (transformers sets it when the file does not).
  r.partial_rotary_factor = partial.value_or(IsHybrid(c->arch) ? 0.25 : 1.0);
  if (!(r.partial_rotary_factor > 0.0 && r.partial_rotary_factor <= 1.0)) {
    return top.Error("partial_rotary_factor must be in (0, 1], got " +
                     std::to_string(r.partial_rotary_factor));
  }

  KASSIGN(std::optional<std::string> type, p.String("rope_type"));
  if (!type) {
    KASSIGN(type, p.String("type"));
  }
  const std::string type_name = type.value_or("default");
  if (type_name == "default") {
    r.type = RopeType::kDefault;
    return Status::Ok();
  }
  if (type_name == "linear") {
    r.type = RopeType::kLinear;
  } else if (type_name == "llama3") {
    r.type = RopeType::kLlama3;
  } else if (type_name == "yarn") {
    r.type = RopeType::kYarn;
  } else {
    return Unsupported(p.where() + "rope type '" + type_name +
                       "' is not supported; supported: default, linear, llama3, yarn");
  }

  // `factor` must be present; yarn alone accepts an explicit null (derived below).
  KASSIGN(std::optional<double> factor, p.Number("factor"));
  if (!p.Has("factor") || (!factor && r.type != RopeType::kYarn)) {
    return p.Error("rope type '" + type_name + "' needs \"factor\"");
  }

  if (r.type == RopeType::kLinear) {
    r.factor = *factor;
    return CheckPositive(p, "factor", r.factor);
  }

  // The pre-extension context length: a top-level original_max_position_embeddings wins (Phi-3
  // style), then the one inside the RoPE dict, then max_position_embeddings.
  KASSIGN(std::optional<int64_t> orig_top, top.Int("original_max_position_embeddings"));
  KASSIGN(std::optional<int64_t> orig_in, p.Int("original_max_position_embeddings"));
  r.original_max_position = orig_top.value_or(orig_in.value_or(c->max_position_embeddings));
  if (r.original_max_position <= 0) {
    return p.Error("original_max_position_embeddings must be positive, got " +
                   std::to_string(r.original_max_position));
  }

  if (r.type == RopeType::kLlama3) {
    KASSIGN(std::optional<double> low, p.Number("low_freq_factor"));
    KASSIGN(std::optional<double> high, p.Number("high_freq_factor"));
    if (!low || !high)
      return p.Error("rope type 'llama3' needs \"low_freq_factor\" and \"high_freq_factor\"");
    r.factor = *factor;
    r.low_freq_factor = *low;
    r.high_freq_factor = *high;
    KTRY(CheckPositive(p, "factor", r.factor));
    KTRY(CheckPositive(p, "low_freq_factor", r.low_freq_factor));
    if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
      return p.Error("high_freq_factor must be greater than low_freq_factor");
    }
    return Status::Ok();
  }

  // yarn
  r.factor = factor ? *factor
                    : static_cast<double>(c->max_position_embeddings) /
                          static_cast<double>(r.original_max_position);
  KTRY(CheckPositive(p, "factor", r.factor));
  KASSIGN(std::optional<double> beta_fast, p.Number("beta_fast"));
  KASSIGN(std::optional<double> beta_slow, p.Number("beta_slow"));
  // transformers: `get("beta_fast") or 32`, so 0 also means the default.
  r.beta_fast = beta_fast && *beta_fast != 0 ? *beta_fast : 32.0;
  r.beta_slow = beta_slow && *beta_slow != 0 ? *beta_slow : 1.0;
  KTRY(CheckPositive(p, "beta_fast", r.beta_fast));
  KTRY(CheckPositive(p, "beta_slow", r.beta_slow));
  KASSIGN(r.mscale, p.Number("mscale"));
  KASSIGN(r.mscale_all_dim, p.Number("mscale_all_dim"));
  KASSIGN(std::optional<bool> truncate, p.Bool("truncate"));
  r.truncate = truncate.value_or(true);
  KASSIGN(r.attention_factor, p.Number("attention_factor"));
  if (!r.attention_factor) {
    auto get_mscale = [](double scale, double m) {
      return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    const bool both = r.mscale && *r.mscale != 0 && r.mscale_all_dim && *r.mscale_all_dim != 0;
    r.attention_factor =
        both ? get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim)
             : get_mscale(r.factor, 1.0);
  }
  if (!std::isfinite(*r.attention_factor) || *r.attention_factor < 0) {
    return p.Error("attention_factor must be a non-negative number");
  }
  return Status::Ok();
}

// Which layers slide, as transformers decides it per architecture.
Status ParseSlidingWindow(const Fields& f, const ArchDefaults& d, ModelConfig* c) {
  c->layer_sliding.assign(static_cast<size_t>(c->n_layers), false);
  c->sliding_window.reset();
  if (c->arch == Architecture::kLlama) return Status::Ok();  // Llama has no sliding window

  KASSIGN(std::optional<int64_t> window, f.Int("sliding_window"));
  if (!f.Has("sliding_window")) window = d.sliding_window;  // absent: the default; null: none
  if (window && *window <= 0) {
    return f.Error("field \"sliding_window\" must be positive or null, got " +
                   std::to_string(*window));
  }

  if (c->arch == Architecture::kMistral) {
    if (window) {
      c->sliding_window = window;
      c->layer_sliding.assign(static_cast<size_t>(c->n_layers), true);
    }
    return Status::Ok();
  }

  // Qwen2 / Qwen3: the window only applies with use_sliding_window, and only to the layers that
  // layer_types marks "sliding_attention" (default: layers >= max_window_layers).
  KASSIGN(std::optional<bool> use, f.Bool("use_sliding_window"));
  if (!use.value_or(false)) window.reset();
  KASSIGN(std::optional<int64_t> max_window_layers, f.Int("max_window_layers"));
  const int64_t first_sliding = max_window_layers.value_or(28);
  if (first_sliding < 0) return f.Error("field \"max_window_layers\" must be >= 0");
  std::vector<bool> sliding(static_cast<size_t>(c->n_layers), false);
  if (const json* types = f.Find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->n_layers) {
      return f.Error("field \"layer_types\" must be a list of " + std::to_string(c->n_layers) +
                     " layer types");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "sliding_attention") {
        sliding[i] = true;
      } else if (t != "full_attention") {
        return Unsupported(f.where() + "layer_types[" + std::to_string(i) +
                           "] = " + JsonExcerpt(t) +
                           " is not supported (full_attention or sliding_attention)");
      }
    }
  } else {
    for (int64_t i = first_sliding; i < c->n_layers; ++i) sliding[static_cast<size_t>(i)] = true;
  }
  if (!window) return Status::Ok();
  bool any = false;
  for (size_t i = 0; i < sliding.size(); ++i) {
    c->layer_sliding[i] = sliding[i];
    any = any || sliding[i];
  }
  if (any) c->sliding_window = window;
  return Status::Ok();
}

// Reads an optional list of non-negative layer indices (mlp_only_layers).
Result<std::vector<int64_t>> LayerIndexList(const Fields& f, const char* key, int64_t n_layers) {
  std::vector<int64_t> out;
  const json* v = f.Find(key);
  if (v == nullptr) return out;
  if (!v->is_array()) return f.TypeError(key, "a list of layer indices", *v);
  for (const json& x : *v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n_layers) {
      return f.TypeError(key, ("a list of layer indices below " + std::to_string(n_layers)).c_str(),
                         *v);
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

Result<int64_t> PositiveOr(const Fields& f, const char* key, int64_t fallback) {
  KASSIGN(std::optional<int64_t> v, f.Int(key));
  const int64_t value = v.value_or(fallback);
  if (value <= 0) {
    return f.Error("field \"" + std::string(key) + "\" must be positive, got " +
                   std::to_string(value));
  }
  return value;
}

// layer_types (or full_attention_interval) and the Gated DeltaNet sizes of hybrid models; every
// layer of the other architectures is softmax attention.
Status ParseLayerTypes(const Fields& f, ModelConfig* c) {
  c->layer_types.assign(static_cast<size_t>(c->n_layers), LayerType::kAttention);
  if (!IsHybrid(c->arch)) return Status::Ok();
  c->norm_weight_offset = true;
  c->attention_output_gate = true;
  KASSIGN(std::optional<bool> gate, f.Bool("attn_output_gate"));
  if (gate && !*gate) {
    return Unsupported(f.where() + "attn_output_gate false is not supported (" +
                       c->architecture_class + " always gates its attention output)");
  }
  if (const json* types = f.Find("layer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->n_layers) {
      return f.Error("field \"layer_types\" must be a list of " + std::to_string(c->n_layers) +
                     " layer types");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      // transformers also maps the legacy names "attention" and "mamba".
      if (t == "full_attention" || t == "attention") {
        c->layer_types[i] = LayerType::kAttention;
      } else if (t == "linear_attention" || t == "mamba") {
        c->layer_types[i] = LayerType::kLinearAttention;
      } else {
        return Unsupported(f.where() + "layer_types[" + std::to_string(i) + "] = " +
                           JsonExcerpt(t) + " is not supported (full_attention, linear_attention)");
      }
    }
  } else {
    KASSIGN(int64_t interval, PositiveOr(f, "full_attention_interval", 4));
    for (int64_t i = 0; i < c->n_layers; ++i) {
      c->layer_types[static_cast<size_t>(i)] =
          (i + 1) % interval == 0 ? LayerType::kAttention : LayerType::kLinearAttention;
    }
  }
  LinearAttentionConfig& l = c->linear;
  KASSIGN(l.n_key_heads, PositiveOr(f, "linear_num_key_heads", 16));
  KASSIGN(l.n_value_heads, PositiveOr(f, "linear_num_value_heads", 32));
  KASSIGN(l.key_head_dim, PositiveOr(f, "linear_key_head_dim", 128));
  KASSIGN(l.value_head_dim, PositiveOr(f, "linear_value_head_dim", 128));
  KASSIGN(l.conv_kernel, PositiveOr(f, "linear_conv_kernel_dim", 4));
  l.fused_projections = c->arch == Architecture::kQwen3Next;
  if (l.n_value_heads % l.n_key_heads != 0) {
    return f.Error("linear_num_value_heads (" + std::to_string(l.n_value_heads) +
                   ") must be a multiple of linear_num_key_heads (" +
                   std::to_string(l.n_key_heads) + ")");
  }
  if (l.conv_kernel < 2) return f.Error("linear_conv_kernel_dim must be at least 2");
  KASSIGN(std::optional<int64_t> mtp, f.Int("mtp_num_hidden_layers"));
  c->n_mtp_layers = std::max<int64_t>(mtp.value_or(0), 0);
  return Status::Ok();
}

// Which layers are MoE and the router/expert sizes (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE).
Status ParseMoe(const Fields& f, ModelConfig* c) {
  c->layer_moe.assign(static_cast<size_t>(c->n_layers), false);
  const bool moe_arch = c->arch == Architecture::kQwen3Moe || c->arch == Architecture::kQwen3Next ||
                        c->arch == Architecture::kQwen3_5Moe;
  if (!moe_arch) return Status::Ok();
  MoeConfig& m = c->moe;
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts.
  KASSIGN(std::optional<int64_t> n_experts, f.Int("num_experts"));
  if (!n_experts) {
    KASSIGN(n_experts, f.Int("num_local_experts"));
  }
  m.n_experts = n_experts.value_or(c->arch == Architecture::kQwen3Moe    ? 128
                                   : c->arch == Architecture::kQwen3Next ? 512
                                                                         : 256);
  if (m.n_experts < 0) return f.Error("num_experts must be >= 0");
  KASSIGN(m.top_k, PositiveOr(f, "num_experts_per_tok", 8));
  KASSIGN(m.expert_intermediate, PositiveOr(f, "moe_intermediate_size", 512));
  if (c->arch != Architecture::kQwen3Moe) {
    KASSIGN(m.shared_expert_intermediate, PositiveOr(f, "shared_expert_intermediate_size", 512));
  }
  if (m.n_experts > 0 && m.top_k > m.n_experts) {
    return f.Error("num_experts_per_tok (" + std::to_string(m.top_k) + ") exceeds num_experts (" +
                   std::to_string(m.n_experts) + ")");
  }
  // Qwen3.5-MoE always renormalises the top-k probabilities; the others follow norm_topk_prob.
  KASSIGN(std::optional<bool> norm, f.Bool("norm_topk_prob"));
  m.norm_topk_prob =
      c->arch == Architecture::kQwen3_5Moe || norm.value_or(c->arch == Architecture::kQwen3Next);
  if (c->arch == Architecture::kQwen3_5Moe) {
    if (m.n_experts == 0) return f.Error("num_experts must be positive");
    c->layer_moe.assign(static_cast<size_t>(c->n_layers), true);
    return Status::Ok();
  }
  KASSIGN(int64_t step, PositiveOr(f, "decoder_sparse_step", 1));
  KASSIGN(std::vector<int64_t> dense_layers, LayerIndexList(f, "mlp_only_layers", c->n_layers));
  for (int64_t i = 0; i < c->n_layers; ++i) {
    const bool dense = std::find(dense_layers.begin(), dense_layers.end(), i) != dense_layers.end();
    c->layer_moe[static_cast<size_t>(i)] = m.n_experts > 0 && !dense && (i + 1) % step == 0;
  }
  return Status::Ok();
}

// quantization_config: FP8 block quantization is read; other methods are refused by name
// instead of failing later on tensors the loader does not know.
// MLX affine quantization: {"group_size", "bits", "<module>": {...} | false, ...}.
Status ParseMlxQuantization(const Fields& f, const json& q, ModelConfig* c) {
  auto read = [&](const json& o, const std::string& what, int64_t* gs, int64_t* bits) -> Status {
    const auto g = o.find("group_size"), b = o.find("bits");
    if (g == o.end() || b == o.end() || !g->is_number_integer() || !b->is_number_integer()) {
      return f.Error(what + " needs integer group_size and bits");
    }
    *gs = g->get<int64_t>();
    *bits = b->get<int64_t>();
    if (*bits != 4 && *bits != 8) {
      return Unsupported(f.where() + what + ": MLX " + std::to_string(*bits) +
                         "-bit weights (4 and 8 are supported)");
    }
    if (*gs <= 0 || *gs % 32 != 0) {
      return Unsupported(f.where() + what + ": group_size " + std::to_string(*gs) +
                         " (multiples of 32 are supported)");
    }
    return Status::Ok();
  };
  KTRY(read(q, "quantization", &c->mlx.group_size, &c->mlx.bits));
  for (const auto& [key, value] : q.items()) {
    if (key == "group_size" || key == "bits" || key == "mode") continue;
    if (key == "quant_method") continue;
    if (value.is_boolean() && !value.get<bool>()) {
      c->mlx.overrides.push_back({key, {0, 0}});
    } else if (value.is_object()) {
      int64_t gs = 0, bits = 0;
      KTRY(read(value, "quantization." + key, &gs, &bits));
      c->mlx.overrides.push_back({key, {gs, bits}});
    }
  }
  if (auto mode = q.find("mode"); mode != q.end() && !(mode->is_string() && *mode == "affine")) {
    return Unsupported(f.where() + "MLX quantization mode " + mode->dump() + " (affine is supported)");
  }
  return Status::Ok();
}

Status ParseQuantization(const Fields& f, ModelConfig* c) {
  if (const json* mlx = f.Find("quantization"); mlx != nullptr && mlx->is_object()) {
    return ParseMlxQuantization(f, *mlx, c);
  }
  const json* q = f.Find("quantization_config");
  if (q != nullptr && q->is_object() && !q->contains("quant_method") && q->contains("bits") &&
      q->contains("group_size")) {
    return ParseMlxQuantization(f, *q, c);  // MLX writes both spellings
  }
  if (q == nullptr || q->is_null()) return Status::Ok();
  if (!q->is_object()) return f.TypeError("quantization_config", "an object", *q);
  const auto method = q->find("quant_method");
  const std::string name = method != q->end() && method->is_string() ? method->get<std::string>() : "";
  if (name == "awq" || name == "gptq") {
    auto num = [&](const char* key, int64_t dflt) {
      const auto it = q->find(key);
      return it != q->end() && it->is_number_integer() ? it->get<int64_t>() : dflt;
    };
    if (num("bits", 4) != 4 || (name == "awq" && num("w_bit", 4) != 4)) {
      return Unsupported(f.where() + name + " with other than 4 bits");
    }
    const int64_t gs = name == "awq" ? num("group_size", num("q_group_size", 128)) : num("group_size", 128);
    if (gs <= 0 || gs % 32 != 0) {
      return Unsupported(f.where() + name + " group_size " + std::to_string(gs) +
                         " (positive multiples of 32 are supported)");
    }
    if (name == "awq") {
      const auto version = q->find("version");
      if (version != q->end() && !(version->is_string() && (*version == "gemm" || *version == "GEMM"))) {
        return Unsupported(f.where() + "AWQ version " + version->dump() + " (GEMM packing is supported)");
      }
      if (auto zp = q->find("zero_point"); zp != q->end() && zp->is_boolean() && !zp->get<bool>()) {
        return Unsupported(f.where() + "AWQ without zero points");
      }
    } else if (auto fmt = q->find("checkpoint_format"); fmt != q->end() && !(fmt->is_string() && *fmt == "gptq")) {
      return Unsupported(f.where() + "GPTQ checkpoint_format " + fmt->dump() + " (gptq is supported)");
    }
    c->int4_method = name;
    c->int4_group_size = gs;
    return Status::Ok();
  }
  if (name != "fp8") {
    return Unsupported(f.where() + "quantization method '" + name +
                       "' is not supported (FP8 block, AWQ, GPTQ and MLX quantization are; GGUF "
                       "files load too)");
  }
  if (auto fmt = q->find("fmt"); fmt != q->end() && !(fmt->is_string() && *fmt == "e4m3")) {
    return Unsupported(f.where() + "FP8 format " + fmt->dump() + " (e4m3 is supported)");
  }
  if (auto act = q->find("activation_scheme"); act != q->end() && !(act->is_string() && *act == "dynamic")) {
    return Unsupported(f.where() + "FP8 activation_scheme " + act->dump() + " (dynamic is supported)");
  }
  const auto block = q->find("weight_block_size");
  if (block == q->end() || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 || (*block)[1].get<int64_t>() <= 0) {
    return Unsupported(f.where() + "FP8 quantization without a weight_block_size [rows, cols] "
                       "(per-tensor FP8 is not supported)");
  }
  c->fp8_block_rows = (*block)[0].get<int64_t>();
  c->fp8_block_cols = (*block)[1].get<int64_t>();
  return Status::Ok();
}

Result<DType> ParseTorchDtype(const Fields& f) {
  // transformers >= 5 writes "dtype"; older files "torch_dtype".
  const char* key = f.HasValue("dtype") ? "dtype" : "torch_dtype";
  KASSIGN(std::optional<std::string> name, f.String(key));
  if (!name) return DType::kBF16;
  if (*name == "bfloat16") return DType::kBF16;
  if (*name == "float16" || *name == "half") return DType::kF16;
  if (*name == "float32" || *name == "float") return DType::kF32;
  return Unsupported(f.where() + "field \"" + key + "\" = '" + *name +
                     "' is not supported (bfloat16, float16, float32)");
}

}  // namespace

int64_t ModelConfig::n_layers_of(LayerType t) const {
  return std::count(layer_types.begin(), layer_types.end(), t);
}

bool ModelConfig::has_moe() const {
  return std::find(layer_moe.begin(), layer_moe.end(), true) != layer_moe.end();
}

std::string ArchitectureName(Architecture a) {
  for (const ArchInfo& info : kArchs) {
    if (info.arch == a) return info.class_name;
  }
  return "?";
}

std::string SupportedArchitecturesList() {
  std::string s;
  for (const ArchInfo& info : kArchs) {
    if (!s.empty()) s += ", ";
    s += info.class_name;
  }
  return s;
}

std::string RopeTypeName(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

Result<ModelConfig> ParseModelConfig(const json& j, const std::string& path) {
  const Fields top(j, path + ": ");
  if (!j.is_object()) return top.Error("must be a JSON object, got " + JsonTypeName(j));
  ModelConfig c;
  KASSIGN(auto arch, ParseArchitecture(top));
  c.arch = arch.first;
  c.architecture_class = arch.second;
  // A multimodal wrapper keeps the language model's fields in "text_config".
  const bool wrapper = IsMultimodalWrapper(c.architecture_class);
  const json* text = wrapper ? top.Find("text_config") : &j;
  if (text == nullptr || !text->is_object()) {
    return top.Error("field \"text_config\" (an object) is required for " + c.architecture_class);
  }
  const Fields f(*text, wrapper ? path + ": text_config: " : path + ": ");
  const ArchDefaults d = DefaultsFor(c.arch);
  if (wrapper) c.weight_prefix = "model.language_model.";

  KASSIGN(c.vocab_size, RequiredPositive(f, "vocab_size"));
  KASSIGN(c.hidden_size, RequiredPositive(f, "hidden_size"));
  if (c.arch == Architecture::kQwen3_5Moe && !f.HasValue("intermediate_size")) {
    c.intermediate_size = 0;  // every layer is MoE
  } else {
    KASSIGN(c.intermediate_size, RequiredPositive(f, "intermediate_size"));
  }
  KASSIGN(c.n_layers, RequiredPositive(f, "num_hidden_layers"));
  KASSIGN(c.n_heads, RequiredPositive(f, "num_attention_heads"));
  if (c.vocab_size > std::numeric_limits<int32_t>::max()) {
    return f.Error("vocab_size " + std::to_string(c.vocab_size) + " does not fit 32-bit token ids");
  }

  KASSIGN(std::optional<int64_t> kv, f.Int("num_key_value_heads"));
  if (!f.Has("num_key_value_heads")) kv = d.n_kv_heads;
  c.n_kv_heads = kv.value_or(c.n_heads);
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    return f.Error("num_attention_heads (" + std::to_string(c.n_heads) +
                   ") must be a positive multiple of num_key_value_heads (" +
                   std::to_string(c.n_kv_heads) + ")");
  }

  KASSIGN(std::optional<int64_t> head_dim, f.Int("head_dim"));
  if (!f.Has("head_dim")) head_dim = d.head_dim;
  if (head_dim) {
    c.head_dim = *head_dim;
  } else {
    if (c.hidden_size % c.n_heads != 0) {
      return f.Error("hidden_size (" + std::to_string(c.hidden_size) +
                     ") is not a multiple of num_attention_heads (" + std::to_string(c.n_heads) +
                     ") and head_dim is not given");
    }
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return f.Error("head_dim must be positive and even (RoPE rotates pairs), got " +
                   std::to_string(c.head_dim));
  }

  KASSIGN(std::optional<int64_t> max_pos, f.Int("max_position_embeddings"));
  c.max_position_embeddings = max_pos.value_or(d.max_position_embeddings);
  if (c.max_position_embeddings <= 0) {
    return f.Error("max_position_embeddings must be positive, got " +
                   std::to_string(c.max_position_embeddings));
  }

  KASSIGN(std::optional<double> eps, f.Number("rms_norm_eps"));
  c.rms_norm_eps = eps.value_or(1e-6);
  KTRY(CheckPositive(f, "rms_norm_eps", c.rms_norm_eps));

  KASSIGN(std::optional<std::string> act, f.String("hidden_act"));
  if (act && *act != "silu") {
    return Unsupported(f.where() + "hidden_act '" + *act + "' is not supported (silu)");
  }

  KASSIGN(std::optional<bool> attention_bias, f.Bool("attention_bias"));
  KASSIGN(std::optional<bool> mlp_bias, f.Bool("mlp_bias"));
  switch (c.arch) {
    case Architecture::kLlama:
      c.attention_bias = c.attention_out_bias = attention_bias.value_or(false);
      c.mlp_bias = mlp_bias.value_or(false);
      break;
    case Architecture::kMistral:  // transformers builds Mistral without any bias
      break;
    case Architecture::kQwen2:  // q/k/v always carry a bias, o_proj never
      c.attention_bias = true;
      break;
    case Architecture::kQwen3:
    case Architecture::kQwen3Moe:
    case Architecture::kQwen3Next:
    case Architecture::kQwen3_5:
    case Architecture::kQwen3_5Moe:
      c.attention_bias = c.attention_out_bias = attention_bias.value_or(false);
      c.qk_norm = true;
      break;
  }

  // Top level first: a wrapper's own tie_word_embeddings is the one transformers applies.
  KASSIGN(std::optional<bool> tie, top.Bool("tie_word_embeddings"));
  if (!tie) {
    KASSIGN(tie, f.Bool("tie_word_embeddings"));
  }
  c.tie_word_embeddings = tie.value_or(false);
  KASSIGN(
      c.torch_dtype,
      ParseTorchDtype(wrapper && !top.HasValue("dtype") && !top.HasValue("torch_dtype") ? f : top));

  KASSIGN(std::vector<int32_t> bos, f.TokenIds("bos_token_id"));
  if (bos.size() > 1) return f.Error("field \"bos_token_id\" must be one token id");
  if (!f.Has("bos_token_id")) {
    c.bos_token_id = d.bos_token_id;
  } else if (!bos.empty()) {
    c.bos_token_id = bos[0];
  }
  KASSIGN(c.eos_token_ids, f.TokenIds("eos_token_id"));
  if (!f.Has("eos_token_id") && d.eos_token_id) c.eos_token_ids = {*d.eos_token_id};

  if (IsHybrid(c.arch)) {
    c.layer_sliding.assign(static_cast<size_t>(c.n_layers), false);
  } else {
    KTRY(ParseSlidingWindow(f, d, &c));
  }
  KTRY(ParseLayerTypes(f, &c));
  KTRY(ParseMoe(f, &c));
  KTRY(ParseRope(f, &c));
  KTRY(ParseQuantization(f, &c));
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  if (IsGgufFile(model_dir)) {
    KASSIGN(GgufFile g, GgufFile::Open(model_dir));
    return LoadGgufConfig(g);
  }
  const std::string path = model_dir + "/config.json";
  KASSIGN(json j, ReadJsonFile(path));
  return ParseModelConfig(j, path);
}

Result<GenerationDefaults> ParseGenerationDefaults(const json& j, const std::string& path) {
  const Fields f(j, path + ": ");
  if (!j.is_object()) return f.Error("must be a JSON object, got " + JsonTypeName(j));
  GenerationDefaults g;
  KASSIGN(g.eos_token_ids, f.TokenIds("eos_token_id"));
  KASSIGN(std::vector<int32_t> bos, f.TokenIds("bos_token_id"));
  if (bos.size() > 1) return f.Error("field \"bos_token_id\" must be one token id");
  if (!bos.empty()) g.bos_token_id = bos[0];

  auto as_float = [](const std::optional<double>& v) {
    return v ? std::optional<float>(static_cast<float>(*v)) : std::optional<float>();
  };
  KASSIGN(std::optional<double> temperature, f.Number("temperature"));
  KASSIGN(std::optional<double> top_p, f.Number("top_p"));
  KASSIGN(std::optional<double> min_p, f.Number("min_p"));
  KASSIGN(std::optional<double> repetition_penalty, f.Number("repetition_penalty"));
  KASSIGN(std::optional<int64_t> top_k, f.Int("top_k"));
  KASSIGN(g.do_sample, f.Bool("do_sample"));
  if (temperature && (*temperature < 0 || !std::isfinite(*temperature))) {
    return f.Error("temperature must be >= 0");
  }
  if (top_p && !(*top_p > 0 && *top_p <= 1)) return f.Error("top_p must be in (0, 1]");
  if (min_p && !(*min_p >= 0 && *min_p <= 1)) return f.Error("min_p must be in [0, 1]");
  if (repetition_penalty && !(*repetition_penalty > 0 && std::isfinite(*repetition_penalty))) {
    return f.Error("repetition_penalty must be > 0");
  }
  if (top_k && (*top_k < 0 || *top_k > std::numeric_limits<int32_t>::max())) {
    return f.Error("top_k must be >= 0");
  }
  g.temperature = as_float(temperature);
  g.top_p = as_float(top_p);
  g.min_p = as_float(min_p);
  g.repetition_penalty = as_float(repetition_penalty);
  if (top_k) g.top_k = static_cast<int32_t>(*top_k);
  return g;
}

Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model_dir) {
  if (IsGgufFile(model_dir)) {
    KASSIGN(GgufFile g, GgufFile::Open(model_dir));
    return GgufGenerationDefaults(g);
  }
  const std::string path = model_dir + "/generation_config.json";
  if (!FileExists(path)) return GenerationDefaults{};
  KASSIGN(json j, ReadJsonFile(path));
  return ParseGenerationDefaults(j, path);
}

}  // namespace kestrel
