#include "models/gguf_model.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/quant_blocks.h"
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
    {"qwen3next", "Qwen3NextForCausalLM"},
    {"qwen35", "Qwen3_5ForCausalLM"},
    {"qwen35moe", "Qwen3_5MoeForCausalLM"},
};

// Qwen3-Next and Qwen3.5 (dense, MoE): Gated DeltaNet layers between gated attention layers.
bool IsHybrid(const std::string& arch) {
  return arch == "qwen3next" || arch == "qwen35" || arch == "qwen35moe";
}

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

// ---- Hybrid Qwen (qwen3next, qwen35, qwen35moe) -----------------------------------------------

// The decoder's layers: block_count counts the MTP blocks (nextn_predict_layers) after them.
Result<int64_t> HybridDecoderLayers(const GgufFile& g, const std::string& arch) {
  KASSIGN(std::optional<int64_t> blocks, g.Int(arch + ".block_count"));
  KASSIGN(std::optional<int64_t> nextn, g.Int(arch + ".nextn_predict_layers"));
  const int64_t n = blocks.value_or(0) - nextn.value_or(0);
  if (!blocks || nextn.value_or(0) < 0 || n <= 0) {
    return InvalidArgument(g.path() +
                           ": block_count and nextn_predict_layers leave no decoder layers");
  }
  return n;
}

// Which of the n decoder layers are linear attention: attention.recurrent_layers (one flag per
// block, the MTP blocks' included), else every full_attention_interval-th layer is attention.
Result<std::vector<bool>> HybridRecurrentLayers(const GgufFile& g, const std::string& arch,
                                                int64_t n) {
  std::vector<bool> recurrent(static_cast<size_t>(n));
  const auto flags = g.metadata().find(arch + ".attention.recurrent_layers");
  if (flags != g.metadata().end()) {
    if (!flags->is_array() || static_cast<int64_t>(flags->size()) < n) {
      return InvalidArgument(g.path() + ": " + arch +
                             ".attention.recurrent_layers must be an array of " +
                             std::to_string(n) + " or more flags");
    }
    for (int64_t i = 0; i < n; ++i) {
      const json& f = (*flags)[static_cast<size_t>(i)];
      if (!f.is_boolean() && !f.is_number_integer()) {
        return InvalidArgument(g.path() + ": " + arch +
                               ".attention.recurrent_layers holds a non-flag");
      }
      recurrent[static_cast<size_t>(i)] = f.is_boolean() ? f.get<bool>() : f.get<int64_t>() != 0;
    }
    return recurrent;
  }
  KASSIGN(std::optional<int64_t> interval, g.Int(arch + ".full_attention_interval"));
  if (interval.value_or(4) <= 0) {
    return InvalidArgument(g.path() + ": " + arch + ".full_attention_interval must be positive");
  }
  for (int64_t i = 0; i < n; ++i) {
    recurrent[static_cast<size_t>(i)] = (i + 1) % interval.value_or(4) != 0;
  }
  return recurrent;
}

// Gated DeltaNet sizes from the ssm.* keys: nk key heads of dk, nv value heads of dv (r = nv / nk
// value heads per key head).
struct LinearDims {
  int64_t nk = 0, nv = 0, dk = 0, dv = 0, conv_kernel = 0;
  int64_t r() const { return nv / nk; }
};

Result<LinearDims> HybridLinearDims(const GgufFile& g, const std::string& arch) {
  auto need = [&](const char* key) -> Result<int64_t> {
    KASSIGN(std::optional<int64_t> v, g.Int(arch + ".ssm." + key));
    if (!v || *v <= 0) {
      return InvalidArgument(g.path() + ": GGUF metadata needs a positive '" + arch + ".ssm." +
                             key + "'");
    }
    return *v;
  };
  LinearDims d;
  KASSIGN(d.nk, need("group_count"));
  KASSIGN(d.nv, need("time_step_rank"));
  KASSIGN(d.dk, need("state_size"));
  KASSIGN(int64_t inner, need("inner_size"));
  KASSIGN(d.conv_kernel, need("conv_kernel"));
  if (d.nv % d.nk != 0 || inner % d.nv != 0) {
    return InvalidArgument(g.path() + ": ssm.time_step_rank (" + std::to_string(d.nv) +
                           ") must be a multiple of ssm.group_count and divide ssm.inner_size");
  }
  d.dv = inner / d.nv;
  return d;
}

// The config.json fields of a hybrid model (beside the common ones GgufConfigJson writes).
Status HybridConfigJson(const GgufFile& g, const std::string& arch, json& c) {
  const std::string p = arch + ".";
  KASSIGN(int64_t n_layers, HybridDecoderLayers(g, arch));
  c["num_hidden_layers"] = n_layers;
  KASSIGN(std::optional<int64_t> nextn, g.Int(p + "nextn_predict_layers"));
  c["mtp_num_hidden_layers"] = nextn.value_or(0);
  KASSIGN(std::vector<bool> recurrent, HybridRecurrentLayers(g, arch, n_layers));
  json types = json::array();
  for (bool r : recurrent) types.push_back(r ? "linear_attention" : "full_attention");
  c["layer_types"] = types;
  KASSIGN(LinearDims d, HybridLinearDims(g, arch));
  c["linear_num_key_heads"] = d.nk;
  c["linear_num_value_heads"] = d.nv;
  c["linear_key_head_dim"] = d.dk;
  c["linear_value_head_dim"] = d.dv;
  c["linear_conv_kernel_dim"] = d.conv_kernel;
  // Partial RoPE: rope.dimension_count of each head's dimensions rotate.
  const int64_t head_dim = c.contains("head_dim") ? c["head_dim"].get<int64_t>()
                                                  : c["hidden_size"].get<int64_t>() /
                                                        c["num_attention_heads"].get<int64_t>();
  KASSIGN(std::optional<int64_t> rot, g.Int(p + "rope.dimension_count"));
  if (rot) {
    if (*rot <= 0 || *rot > head_dim || *rot % 2 != 0) {
      return InvalidArgument(g.path() + ": " + p + "rope.dimension_count " + std::to_string(*rot) +
                             " is not an even count of at most head_dim (" +
                             std::to_string(head_dim) + ")");
    }
    // rotary_dim = int(head_dim * factor): the factor is nudged up where the quotient rounded down.
    double factor = static_cast<double>(*rot) / static_cast<double>(head_dim);
    if (static_cast<int64_t>(static_cast<double>(head_dim) * factor) < *rot) {
      factor = std::nextafter(factor, 2.0);
    }
    c["rope_parameters"]["partial_rotary_factor"] = factor;
  }
  KASSIGN(std::optional<int64_t> ff, g.Int(p + "feed_forward_length"));
  if (!ff) c.erase("intermediate_size");  // Qwen3.5-MoE: every layer is MoE
  if (arch == "qwen35") return Status::Ok();
  auto need = [&](const std::string& key) -> Result<int64_t> {
    KASSIGN(std::optional<int64_t> v, g.Int(p + key));
    if (!v) return InvalidArgument(g.path() + ": GGUF metadata has no '" + p + key + "'");
    return *v;
  };
  KASSIGN(c["num_experts"], need("expert_count"));
  KASSIGN(c["num_experts_per_tok"], need("expert_used_count"));
  KASSIGN(c["moe_intermediate_size"], need("expert_feed_forward_length"));
  KASSIGN(c["shared_expert_intermediate_size"], need("expert_shared_feed_forward_length"));
  if (arch == "qwen3next") {
    // llama.cpp renormalises Qwen3-Next's top-k weights; the file can say otherwise.
    KASSIGN(std::optional<bool> norm, g.Bool(p + "expert_weights_norm"));
    c["norm_topk_prob"] = norm.value_or(true);
    c["decoder_sparse_step"] = 1;
    json dense = json::array();  // layers without a router are dense
    for (int64_t i = 0; i < n_layers; ++i) {
      if (FindTensor(g, "blk." + std::to_string(i) + ".ffn_gate_inp.weight") == nullptr) {
        dense.push_back(i);
      }
    }
    c["mlp_only_layers"] = dense;
  }
  return Status::Ok();
}

// Value head h = g*r + j of key head g (the checkpoint's order, grouped by key head) sits at
// j*nk + g in the tiled order llama.cpp's converter writes for Qwen3.5.
int64_t TiledHead(int64_t h, const LinearDims& d) {
  return (h % d.r()) * d.nk + h / d.r();
}

// Bytes of a tensor with its value-head rows back in the checkpoint's order: rows [0, first) stay,
// then nv heads of rows_per_head rows each (rows are whole blocks: any dtype moves as bytes).
std::vector<uint8_t> UntileRows(const TensorView& v, int64_t first, int64_t rows_per_head,
                                const LinearDims& d) {
  // Bytes per row; a 1-D tensor's rows are its elements.
  const int64_t rb = static_cast<int64_t>(v.size_bytes()) / v.shape[0];
  const int64_t unit = rows_per_head * rb;
  const auto* src = static_cast<const uint8_t*>(v.data);
  std::vector<uint8_t> out(v.size_bytes());
  std::memcpy(out.data(), src, static_cast<size_t>(first * rb));
  for (int64_t h = 0; h < d.nv; ++h) {
    std::memcpy(out.data() + first * rb + h * unit, src + first * rb + TiledHead(h, d) * unit,
                static_cast<size_t>(unit));
  }
  return out;
}

// out_proj (hidden, nv*dv) with its value-head columns back in the checkpoint's order. Plain
// types, and blocks that hold whole heads, move as bytes; a block spanning heads (Q8_0 blocks of
// 32 with dv = 24, Q4_K blocks of 256 with dv = 128) cannot, so such a tensor is dequantized to
// f32 (exactly, the format's definition) and its values moved: `dtype` says which came out.
std::vector<uint8_t> UntileColumns(const TensorView& v, const LinearDims& d, DType* dtype) {
  const int64_t rows = v.shape[0], cols = v.shape[1];
  const auto* src = static_cast<const uint8_t*>(v.data);
  if (!IsBlockQuantized(v.dtype) || d.dv % DTypeBlockElems(v.dtype) == 0) {
    const int64_t unit = DTypeRowBytes(v.dtype, d.dv), rb = v.row_bytes();
    std::vector<uint8_t> out(v.size_bytes());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t h = 0; h < d.nv; ++h) {
        std::memcpy(out.data() + i * rb + h * unit, src + i * rb + TiledHead(h, d) * unit,
                    static_cast<size_t>(unit));
      }
    }
    *dtype = v.dtype;
    return out;
  }
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    quant::DequantizeRow(v.dtype, src + i * v.row_bytes(), cols, row.data());
    for (int64_t h = 0; h < d.nv; ++h) {
      std::memcpy(out.data() + (i * cols + h * d.dv) * sizeof(float),
                  row.data() + TiledHead(h, d) * d.dv, static_cast<size_t>(d.dv) * sizeof(float));
    }
  }
  *dtype = DType::kF32;
  return out;
}

// Qwen3-Next's in_proj_qkvz (per key head g: q_g | k_g | v_g | z_g, v_g and z_g its r value
// heads) from the two tensors llama.cpp's converter splits it into: attn_qkv (all q | all k |
// all v) and attn_gate (all z). Rows move as bytes.
std::vector<uint8_t> MergeQkvz(const TensorView& qkv, const TensorView& z, const LinearDims& d) {
  const int64_t rb = qkv.row_bytes(), vz = d.r() * d.dv;
  const auto* q_src = static_cast<const uint8_t*>(qkv.data);
  const auto* z_src = static_cast<const uint8_t*>(z.data);
  std::vector<uint8_t> out(qkv.size_bytes() + z.size_bytes());
  uint8_t* o = out.data();
  auto copy = [&](const uint8_t* src, int64_t row, int64_t n) {
    std::memcpy(o, src + row * rb, static_cast<size_t>(n * rb));
    o += n * rb;
  };
  for (int64_t g = 0; g < d.nk; ++g) {
    copy(q_src, g * d.dk, d.dk);                // q
    copy(q_src, d.nk * d.dk + g * d.dk, d.dk);  // k
    copy(q_src, 2 * d.nk * d.dk + g * vz, vz);  // v
    copy(z_src, g * vz, vz);                    // z
  }
  return out;
}

// The values of a 1-D tensor of a plain type.
Result<std::vector<float>> VectorValues(const TensorView& v, const std::string& name) {
  if (v.n_dims != 1 || IsBlockQuantized(v.dtype)) {
    return InvalidArgument("tensor '" + name + "' must be a 1-D F32, F16 or BF16 vector");
  }
  std::vector<float> out(static_cast<size_t>(v.shape[0]));
  quant::DequantizeRow(v.dtype, v.data, v.shape[0], out.data());
  return out;
}

// A_log from the A = -exp(A_log) llama.cpp's converter stores. exp is not one-to-one in f32, so
// A cannot name every f32 A_log; but the spacing of bf16 and f16 values is far wider than exp's
// rounding, so when the checkpoint held A_log in one of them (Qwen's releases: bf16), the nearest
// such value of log(-A) that gives A back is the checkpoint's value, bit for bit. Otherwise the
// f32 nearest to log(-A) is taken (within an ulp or so of the original).
Result<float> ALogOf(float a) {
  if (!(a < 0) || !std::isfinite(a)) {
    return InvalidArgument("ssm_a holds " + std::to_string(a) + " (it must be -exp(A_log) < 0)");
  }
  const float y = static_cast<float>(std::log(-static_cast<double>(a)));
  auto gives_a = [&](float c) {
    const float back = static_cast<float>(-std::exp(static_cast<double>(c)));
    int32_t x = 0, z = 0;
    std::memcpy(&x, &back, 4);
    std::memcpy(&z, &a, 4);
    return std::llabs(static_cast<int64_t>(x) - static_cast<int64_t>(z)) <= 2;
  };
  if (const float b = Bf16ToF32(F32ToBf16(y)); gives_a(b)) return b;
  if (const float h = F16ToF32(F32ToF16(y)); gives_a(h)) return h;
  return y;
}

// How the hybrid architectures' per-layer GGUF tensors map onto the checkpoint's names.
enum class Transform {
  kNone,
  kNormOffset,  // stored 1 + w (the model applies 1 + w): w = stored - 1, in f32
  kALog,        // stored -exp(A_log): ALogOf, then the value heads untiled (Qwen3.5)
  kConv,        // (C, K) -> (C, 1, K); Qwen3.5: the v channels' heads untiled
  kQkv,         // Qwen3.5: v rows untiled; Qwen3-Next: merged with attn_gate into in_proj_qkvz
  kGate,        // Qwen3.5: rows untiled (in_proj_z); Qwen3-Next: see kQkv
  kHeadRows,    // one row (element) per value head, untiled (Qwen3.5 in_proj_b/a, dt_bias)
  kOutProj,     // Qwen3.5: columns untiled
  kSharedGate,  // (hidden) or (1, hidden) -> (1, hidden)
};

struct HybridName {
  const char* gguf;  // after "blk.N.", without ".weight" / ".bias"
  const char* hf;    // after the layer prefix, without the kind
  Transform transform;
  const char* only_arch;  // nullptr: all three
};
constexpr HybridName kHybridNames[] = {
    {"attn_norm", "input_layernorm", Transform::kNormOffset, nullptr},
    {"post_attention_norm", "post_attention_layernorm", Transform::kNormOffset, nullptr},
    {"attn_q", "self_attn.q_proj", Transform::kNone, nullptr},  // per head [query | gate]
    {"attn_k", "self_attn.k_proj", Transform::kNone, nullptr},
    {"attn_v", "self_attn.v_proj", Transform::kNone, nullptr},
    {"attn_output", "self_attn.o_proj", Transform::kNone, nullptr},
    {"attn_q_norm", "self_attn.q_norm", Transform::kNormOffset, nullptr},
    {"attn_k_norm", "self_attn.k_norm", Transform::kNormOffset, nullptr},
    {"ffn_gate", "mlp.gate_proj", Transform::kNone, nullptr},
    {"ffn_up", "mlp.up_proj", Transform::kNone, nullptr},
    {"ffn_down", "mlp.down_proj", Transform::kNone, nullptr},
    {"ffn_gate_inp", "mlp.gate", Transform::kNone, nullptr},
    {"ffn_gate_shexp", "mlp.shared_expert.gate_proj", Transform::kNone, nullptr},
    {"ffn_up_shexp", "mlp.shared_expert.up_proj", Transform::kNone, nullptr},
    {"ffn_down_shexp", "mlp.shared_expert.down_proj", Transform::kNone, nullptr},
    {"ffn_gate_inp_shexp", "mlp.shared_expert_gate", Transform::kSharedGate, nullptr},
    {"ssm_a", "linear_attn.A_log", Transform::kALog, nullptr},
    {"ssm_dt", "linear_attn.dt_bias", Transform::kHeadRows, nullptr},
    {"ssm_conv1d", "linear_attn.conv1d", Transform::kConv, nullptr},
    {"ssm_norm", "linear_attn.norm", Transform::kNone, nullptr},  // applied as w: stored as it is
    {"ssm_out", "linear_attn.out_proj", Transform::kOutProj, nullptr},
    {"attn_qkv", "linear_attn.in_proj_qkv", Transform::kQkv, nullptr},
    {"attn_gate", "linear_attn.in_proj_z", Transform::kGate, nullptr},
    {"ssm_beta", "linear_attn.in_proj_b", Transform::kHeadRows, "qwen35"},
    {"ssm_alpha", "linear_attn.in_proj_a", Transform::kHeadRows, "qwen35"},
    {"ssm_ba", "linear_attn.in_proj_ba", Transform::kNone, "qwen3next"},
    {"ssm_in", "linear_attn.in_proj_qkvz", Transform::kNone, "qwen3next"},  // the older layout
    // The MTP head (its first block): mtp.fc, its two input norms, its final norm.
    {"nextn.eh_proj", "fc", Transform::kNone, nullptr},
    {"nextn.enorm", "pre_fc_norm_embedding", Transform::kNormOffset, nullptr},
    {"nextn.hnorm", "pre_fc_norm_hidden", Transform::kNormOffset, nullptr},
    {"nextn.shared_head_norm", "norm", Transform::kNormOffset, nullptr},
};

const HybridName* FindHybridName(const std::string& suffix, const std::string& arch) {
  for (const HybridName& n : kHybridNames) {
    if (suffix != n.gguf) continue;
    // "qwen35" entries serve both Qwen3.5 architectures.
    if (n.only_arch != nullptr && !arch.starts_with(n.only_arch)) return nullptr;
    return &n;
  }
  return nullptr;
}

// A tensor under its Hugging Face name: a view into the file, or bytes re-laid at load (`owned`
// non-empty; the view's data is pointed at them where they are kept).
struct MappedTensor {
  std::string name;
  TensorView view;
  std::vector<uint8_t> owned;
};

// Stacked experts (n_experts, rows, cols): one (rows, cols) view per expert, as
// <prefix>mlp.experts.<e>.<gate|up|down>_proj.weight.
Status ViewExperts(const std::string& path, const std::string& gguf_name, const TensorView& v,
                   const std::string& prefix, const std::string& suffix, const std::string& kind,
                   std::vector<MappedTensor>* out) {
  if (kind != "weight" || v.n_dims != 3) {
    return InvalidArgument(path + ": tensor '" + gguf_name + "' must be a 3-D weight");
  }
  const char* proj = suffix == "ffn_gate_exps" ? "gate_proj"
                     : suffix == "ffn_up_exps" ? "up_proj"
                                               : "down_proj";
  const int64_t matrix_bytes = v.shape[1] * DTypeRowBytes(v.dtype, v.shape[2]);
  for (int64_t e = 0; e < v.shape[0]; ++e) {
    TensorView x = v;
    x.n_dims = 2;
    x.shape[0] = v.shape[1];
    x.shape[1] = v.shape[2];
    x.data = static_cast<const uint8_t*>(v.data) + e * matrix_bytes;
    out->push_back({prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight", x, {}});
  }
  return Status::Ok();
}

bool IsExpertStack(const std::string& suffix) {
  return suffix == "ffn_gate_exps" || suffix == "ffn_up_exps" || suffix == "ffn_down_exps";
}

// "blk.N.<suffix>[.weight|.bias]" -> N, suffix, kind ("" for ssm_a, which has none).
bool SplitBlockName(const std::string& name, std::string* layer, std::string* suffix,
                    std::string* kind) {
  if (!name.starts_with("blk.")) return false;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4) return false;
  *layer = name.substr(4, dot - 4);
  std::string rest = name.substr(dot + 1);
  kind->clear();
  for (const char* k : {"weight", "bias"}) {
    const std::string tail = std::string(".") + k;
    if (rest.size() > tail.size() && rest.ends_with(tail)) {
      rest.resize(rest.size() - tail.size());
      *kind = k;
      break;
    }
  }
  *suffix = rest;
  return !rest.empty();
}

// Maps the tensors of a qwen3next / qwen35 / qwen35moe file onto the checkpoint's names, undoing
// what llama.cpp's converter did (see kHybridNames' transforms). Blocks past the decoder's layers
// are the MTP head (mtp.layers.K, its own tensors under mtp.).
class HybridMapper {
 public:
  static Result<HybridMapper> Create(const GgufFile& g, const std::string& arch) {
    HybridMapper m;
    m.path_ = g.path();
    m.arch_ = arch;
    KASSIGN(m.n_layers_, HybridDecoderLayers(g, arch));
    KASSIGN(m.recurrent_, HybridRecurrentLayers(g, arch, m.n_layers_));
    KASSIGN(m.d_, HybridLinearDims(g, arch));
    // Qwen3.5's value heads are tiled when there are fewer key heads than value heads.
    m.untile_ = arch != "qwen3next" && m.d_.r() > 1;
    return m;
  }

  Status Map(const std::string& gguf_name, const TensorView& v, std::vector<MappedTensor>* out) {
    if (gguf_name == "token_embd.weight") return Add(out, "model.embed_tokens.weight", v);
    if (gguf_name == "output.weight") return Add(out, "lm_head.weight", v);
    if (gguf_name == "output_norm.weight") return MinusOne(out, "model.norm.weight", gguf_name, v);
    std::string layer, suffix, kind;
    char* end = nullptr;
    const int64_t index = SplitBlockName(gguf_name, &layer, &suffix, &kind)
                              ? std::strtoll(layer.c_str(), &end, 10)
                              : -1;
    if (index < 0 || end == nullptr || *end != '\0') return NotMapped(gguf_name);
    const bool mtp = index >= n_layers_;
    const std::string prefix = mtp ? "mtp.layers." + std::to_string(index - n_layers_) + "."
                                   : "model.layers." + layer + ".";
    if (IsExpertStack(suffix)) return ViewExperts(path_, gguf_name, v, prefix, suffix, kind, out);
    const HybridName* n = FindHybridName(suffix, arch_);
    if (n == nullptr || (n->transform == Transform::kALog) != kind.empty() ||
        (suffix == "ssm_dt") != (kind == "bias")) {
      return NotMapped(gguf_name);
    }
    const std::string hf = n->hf;
    if (suffix.starts_with("nextn.")) {
      if (!mtp) return NotMapped(gguf_name);
      return Transformed(out, "mtp." + hf + ".weight", gguf_name, *n, v);
    }
    if (hf.starts_with("linear_attn.") && (mtp || !recurrent_[static_cast<size_t>(index)])) {
      return Unsupported(path_ + ": tensor '" + gguf_name + "' in attention layer " + layer +
                         " (a fused attention q/k/v is not read)");
    }
    const std::string name = prefix + hf + (kind.empty() || suffix == "ssm_dt" ? "" : "." + kind);
    return Transformed(out, name, gguf_name, *n, v);
  }

  // Merges what Map held back: Qwen3-Next's in_proj_qkvz from attn_qkv and attn_gate.
  Status Finish(std::vector<MappedTensor>* out) {
    for (const auto& [prefix, parts] : qkvz_parts_) {
      const auto& [qkv, z] = parts;
      const std::string name = prefix + "linear_attn.in_proj_qkvz.weight";
      if (qkv.empty() || z.empty()) {
        return InvalidArgument(path_ + ": " + prefix + " has only one of attn_qkv and attn_gate");
      }
      if (qkv.dtype != z.dtype || qkv.n_dims != 2 || z.n_dims != 2 || qkv.shape[1] != z.shape[1] ||
          qkv.shape[0] != 2 * d_.nk * d_.dk + d_.nv * d_.dv || z.shape[0] != d_.nv * d_.dv) {
        return Unsupported(path_ + ": " + prefix + " attn_qkv (" +
                           std::string(DTypeName(qkv.dtype)) + ") and attn_gate (" +
                           std::string(DTypeName(z.dtype)) +
                           ") must be one type and the linear attention's sizes to form " + name);
      }
      TensorView x = qkv;
      x.shape[0] = qkv.shape[0] + z.shape[0];
      out->push_back({name, x, MergeQkvz(qkv, z, d_)});
    }
    return Status::Ok();
  }

 private:
  Status NotMapped(const std::string& gguf_name) const {
    return Unsupported(path_ + ": GGUF tensor '" + gguf_name + "' is not one Kestrel maps for '" +
                       arch_ + "'");
  }
  Status WrongShape(const std::string& gguf_name, const std::string& expected) const {
    return InvalidArgument(path_ + ": tensor '" + gguf_name + "' must be " + expected);
  }
  static Status Add(std::vector<MappedTensor>* out, const std::string& name, const TensorView& v,
                    std::vector<uint8_t> owned = {}) {
    out->push_back({name, v, std::move(owned)});
    return Status::Ok();
  }
  static Status AddF32(std::vector<MappedTensor>* out, const std::string& name,
                       const std::vector<float>& values) {
    TensorView v;
    v.dtype = DType::kF32;
    v.n_dims = 1;
    v.shape[0] = static_cast<int64_t>(values.size());
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return Add(out, name, v, std::move(bytes));
  }
  Status MinusOne(std::vector<MappedTensor>* out, const std::string& name,
                  const std::string& gguf_name, const TensorView& v) const {
    Result<std::vector<float>> w = VectorValues(v, gguf_name);
    if (!w.ok()) return InvalidArgument(path_ + ": " + w.status().message());
    for (float& x : *w) x -= 1.0f;  // exact where 1 + w was (every bf16 w with |w| >= 2^-16)
    return AddF32(out, name, *w);
  }

  Status Transformed(std::vector<MappedTensor>* out, const std::string& name,
                     const std::string& gguf_name, const HybridName& n, const TensorView& v) {
    const LinearDims& d = d_;
    const int64_t qk_rows = 2 * d.nk * d.dk, v_rows = d.nv * d.dv;
    switch (n.transform) {
      case Transform::kNone:
        return Add(out, name, v);
      case Transform::kNormOffset:
        return MinusOne(out, name, gguf_name, v);
      case Transform::kALog: {
        Result<std::vector<float>> a = VectorValues(v, gguf_name);
        if (!a.ok()) return InvalidArgument(path_ + ": " + a.status().message());
        if (static_cast<int64_t>(a->size()) != d.nv) {
          return WrongShape(gguf_name, "(" + std::to_string(d.nv) + ")");
        }
        std::vector<float> a_log(a->size());
        for (int64_t h = 0; h < d.nv; ++h) {
          Result<float> x = ALogOf((*a)[static_cast<size_t>(untile_ ? TiledHead(h, d) : h)]);
          if (!x.ok()) {
            return InvalidArgument(path_ + ": tensor '" + gguf_name + "': " + x.status().message());
          }
          a_log[static_cast<size_t>(h)] = *x;
        }
        return AddF32(out, name, a_log);
      }
      case Transform::kHeadRows:
        if (v.shape[0] != d.nv) {
          return WrongShape(gguf_name, std::to_string(d.nv) + " rows, one per value head");
        }
        if (!untile_) return Add(out, name, v);
        return Add(out, name, v, UntileRows(v, 0, 1, d));
      case Transform::kConv: {
        // (C, K), squeezed from the checkpoint's (C, 1, K): the same bytes.
        if (v.n_dims != 2 || v.shape[0] != qk_rows + v_rows || IsBlockQuantized(v.dtype)) {
          return WrongShape(gguf_name,
                            "a plain (" + std::to_string(qk_rows + v_rows) + ", kernel) matrix");
        }
        TensorView c = v;
        c.n_dims = 3;
        c.shape = {v.shape[0], 1, v.shape[1]};
        if (!untile_) return Add(out, name, c);
        return Add(out, name, c, UntileRows(v, qk_rows, d.dv, d));
      }
      case Transform::kQkv:
      case Transform::kGate: {
        const bool qkv = n.transform == Transform::kQkv;
        if (v.n_dims != 2 || v.shape[0] != (qkv ? qk_rows + v_rows : v_rows)) {
          return WrongShape(gguf_name, std::to_string(qkv ? qk_rows + v_rows : v_rows) + " rows");
        }
        if (arch_ == "qwen3next") {
          const std::string prefix = name.substr(0, name.find("linear_attn."));
          (qkv ? qkvz_parts_[prefix].first : qkvz_parts_[prefix].second) = v;
          return Status::Ok();
        }
        if (!untile_) return Add(out, name, v);
        return Add(out, name, v, UntileRows(v, qkv ? qk_rows : 0, d.dv, d));
      }
      case Transform::kOutProj: {
        if (v.n_dims != 2 || v.shape[1] != v_rows) {
          return WrongShape(gguf_name, "a matrix of " + std::to_string(v_rows) + " columns");
        }
        if (!untile_) return Add(out, name, v);
        TensorView x = v;
        std::vector<uint8_t> bytes = UntileColumns(v, d, &x.dtype);
        return Add(out, name, x, std::move(bytes));
      }
      case Transform::kSharedGate: {
        TensorView x = v;
        if (v.n_dims == 1) {  // (hidden) -> (1, hidden): the same bytes
          x.n_dims = 2;
          x.shape = {1, v.shape[0]};
        }
        return Add(out, name, x);
      }
    }
    return NotMapped(gguf_name);
  }

  std::string path_, arch_;
  int64_t n_layers_ = 0;
  std::vector<bool> recurrent_;
  LinearDims d_;
  bool untile_ = false;
  std::map<std::string, std::pair<TensorView, TensorView>> qkvz_parts_;  // layer prefix -> (qkv, z)
};

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
  if (arch == "llama" || arch == "qwen3" || arch == "qwen3moe" || IsHybrid(arch)) {
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
  if (IsHybrid(arch)) KTRY(HybridConfigJson(g, arch, c));
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
  std::optional<HybridMapper> hybrid;
  if (IsHybrid(arch)) {
    KASSIGN(hybrid, HybridMapper::Create(g, arch));
  }
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
  auto add_all = [&](std::vector<MappedTensor>& mapped) -> Status {
    for (MappedTensor& m : mapped) {
      if (!m.owned.empty()) {
        store.owned_.push_back(std::move(m.owned));
        m.view.data = store.owned_.back().data();
      }
      KTRY(add(m.name, m.view));
    }
    mapped.clear();
    return Status::Ok();
  };
  std::vector<MappedTensor> mapped;
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == "rope_freqs.weight") continue;  // read into the config (LoadGgufConfig)
    std::optional<DType> dtype = DTypeOfGgmlType(t.ggml_type);
    if (!dtype) {
      return Unsupported(path + ": tensor '" + t.name + "' is " + GgmlTypeName(t.ggml_type) +
                         "; Kestrel reads F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                         "Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS GGUF tensors");
    }
    const TensorView v = view_of(t, *dtype);
    if (hybrid) {
      KTRY(hybrid->Map(t.name, v, &mapped));
      KTRY(add_all(mapped));
      continue;
    }
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
    if (IsExpertStack(suffix)) {
      KTRY(ViewExperts(path, t.name, v, prefix, suffix, kind, &mapped));
      KTRY(add_all(mapped));
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
  if (hybrid) {
    KTRY(hybrid->Finish(&mapped));
    KTRY(add_all(mapped));
  }
  return store;
}

}  // namespace kestrel
