#include "models/weights.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "core/quant_blocks.h"
#include "models/model.h"
#include "models/rope.h"

namespace kestrel {

Result<const float*> WeightBinder::OwnedF32(const std::string& name, std::vector<int64_t> shape) {
  KASSIGN(TensorView t, store_.Get(name, std::move(shape)));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return Unsupported(store_.file_of(name) + ": '" + name + "' must be F32, F16 or BF16");
  }
  std::vector<float> f(static_cast<size_t>(t.numel()));
  quant::DequantizeRow(t.dtype, t.data, t.numel(), f.data());  // aligned f32, whatever the file had
  if (used_.insert(name).second) n_bytes_ += static_cast<int64_t>(t.size_bytes());
  owned_scales_.push_back(std::move(f));
  return static_cast<const float*>(owned_scales_.back().data());
}

Status WeightBinder::GetMlx(const std::string& name, const std::vector<int64_t>& shape,
                            const TensorView& packed, TensorView* out) {
  const std::string base = name.substr(0, name.size() - std::string(".weight").size());
  int64_t gs = mlx_->group_size, bits = mlx_->bits;
  for (const auto& [path, q] : mlx_->overrides) {
    if (path == base) std::tie(gs, bits) = q;
  }
  if (bits == 0) {
    return InvalidArgument(store_.file_of(name) + ": '" + name +
                           "' is packed but the config leaves that module unquantized");
  }
  const int64_t rows = shape[0], cols = shape[1];
  if (cols % gs != 0 || cols % 32 != 0) {
    return Unsupported(store_.file_of(name) + ": '" + name + "' has " + std::to_string(cols) +
                       " columns, not whole groups of " + std::to_string(gs));
  }
  if (packed.n_dims != 2 || packed.shape[0] != rows || packed.shape[1] != cols * bits / 32) {
    return InvalidArgument(store_.file_of(name) + ": tensor '" + name + "' has shape " +
                           ShapeString(packed) + ", expected [" + std::to_string(rows) + ", " +
                           std::to_string(cols * bits / 32) + "] (" + std::to_string(bits) +
                           "-bit words of " + std::to_string(cols) + " columns)");
  }
  KASSIGN(const float* scales, OwnedF32(base + ".scales", {rows, cols / gs}));
  KASSIGN(const float* biases, OwnedF32(base + ".biases", {rows, cols / gs}));
  *out = packed;
  out->dtype = bits == 4 ? DType::kMlxQ4 : DType::kMlxQ8;
  out->shape[1] = cols;
  out->block_scale = scales;
  out->group_bias = biases;
  out->block_rows = 1;
  out->block_cols = gs;
  if (used_.insert(name).second) {
    n_parameters_ += rows * cols;
    n_bytes_ += static_cast<int64_t>(packed.size_bytes());
  }
  return Status::Ok();
}

Status WeightBinder::GetInt4(const std::string& base, const std::vector<int64_t>& shape,
                             TensorView* out) {
  const int64_t rows = shape[0], cols = shape[1], gs = int4_group_size_;
  const bool awq = int4_method_ == "awq";
  const std::string where = store_.file_of(base + ".qweight") + ": '" + base + "': ";
  if (cols % gs != 0 || rows % 8 != 0 || cols % 8 != 0) {
    return Unsupported(where + "shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                       "] is not whole groups of " + std::to_string(gs) + " and words of 8");
  }
  const int64_t groups = cols / gs;
  // AWQ packs along the outputs ([in, out / 8], nibble i holding output 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]);
  // GPTQ packs the inputs ([in / 8, out], nibble i holding input 8r + i). Zeros pack along the
  // outputs in both, GPTQ's stored as zero - 1.
  // Nibble of output 8c + j in an AWQ word (the inverse of AutoAWQ's order [0, 2, 4, 6, 1, 3, 5, 7]).
  static constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  KASSIGN(TensorView qw, store_.Get(base + ".qweight", awq ? std::vector<int64_t>{cols, rows / 8}
                                                          : std::vector<int64_t>{cols / 8, rows}));
  KASSIGN(TensorView qz, store_.Get(base + ".qzeros", {groups, rows / 8}));
  KASSIGN(const float* s_in, OwnedF32(base + ".scales", {groups, rows}));
  if (qw.dtype != DType::kI32 || qz.dtype != DType::kI32) {
    return InvalidArgument(where + "qweight and qzeros must be I32");
  }
  // GPTQ's g_idx: the group of each input. i / group_size is the plain layout; anything else
  // (act-order, desc_act) puts an input's scale and zero elsewhere. When every group holds
  // group_size inputs (what GPTQ's act-order writes), the columns are stored in the order of
  // their groups (input_perm, the inputs of each group in increasing order) and the kernels
  // gather x to match; other g_idx (groups of unequal size) are dequantized to f32 below.
  std::vector<int32_t> g_idx;
  bool act_order = false;
  if (!awq && store_.Has(base + ".g_idx")) {
    KASSIGN(TensorView gi, store_.Get(base + ".g_idx", {cols}));
    if (gi.dtype != DType::kI32) return InvalidArgument(where + "g_idx must be I32");
    g_idx.resize(static_cast<size_t>(cols));
    std::memcpy(g_idx.data(), gi.data, static_cast<size_t>(cols) * 4);
    for (int64_t i = 0; i < cols; ++i) {
      if (g_idx[i] < 0 || g_idx[i] >= groups) {
        return InvalidArgument(where + "g_idx[" + std::to_string(i) + "] = " +
                               std::to_string(g_idx[i]) + " is not a group of " +
                               std::to_string(groups));
      }
      act_order |= g_idx[i] != i / gs;
    }
    used_.insert(base + ".g_idx");
  }
  auto word = [](const TensorView& t, int64_t i) {
    uint32_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
    return v;
  };
  // Output o's nibble in words packed along the outputs.
  auto out_nibble = [&](uint32_t w, int64_t o) { return (w >> (4 * (awq ? kAwqNibble[o % 8] : o % 8))) & 0xF; };
  auto code = [&](int64_t o, int64_t i) -> uint32_t {  // output o, input i
    if (awq) return out_nibble(word(qw, i * (rows / 8) + o / 8), o);
    return (word(qw, (i / 8) * rows + o) >> (4 * (i % 8))) & 0xF;
  };
  auto zero = [&](int64_t o, int64_t g) -> uint32_t {
    return out_nibble(word(qz, g * (rows / 8) + o / 8), o) + (awq ? 0 : 1);
  };
  // The bound view of the converted matrix [rows, cols], and the checkpoint tensors it used.
  // The bytes counted: the codes and zeros as published (the scales are counted as read), or
  // the f32 matrix a g_idx of unequal groups is held as.
  auto bind = [&](const void* data, DType dtype) {
    used_.insert(base + ".qweight");
    used_.insert(base + ".qzeros");
    n_parameters_ += rows * cols;
    n_bytes_ += dtype == DType::kF32 ? rows * cols * 4
                                     : static_cast<int64_t>(qw.size_bytes() + qz.size_bytes());
    *out = TensorView{};
    out->data = data;
    out->dtype = dtype;
    out->n_dims = 2;
    out->shape[0] = rows;
    out->shape[1] = cols;
  };
  // Stored column j holds input perm[j]: a stable counting sort of the inputs by group.
  std::vector<int32_t> perm;
  if (act_order) {
    std::vector<int64_t> fill(static_cast<size_t>(groups) + 1, 0);
    for (int32_t g : g_idx) ++fill[static_cast<size_t>(g) + 1];
    bool even = true;
    for (int64_t g = 0; g < groups; ++g) even &= fill[static_cast<size_t>(g) + 1] == gs;
    if (even) {
      for (size_t g = 0; g < static_cast<size_t>(groups); ++g) fill[g + 1] += fill[g];
      perm.resize(static_cast<size_t>(cols));
      for (int64_t i = 0; i < cols; ++i) {
        perm[static_cast<size_t>(fill[static_cast<size_t>(g_idx[static_cast<size_t>(i)])]++)] =
            static_cast<int32_t>(i);
      }
      act_order = false;  // the contiguous layout below, over the permuted columns
    }
  }
  if (act_order) {
    // (q - zero) * scale of the input's own group, in f32: exact (an f16 times a small integer).
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        const int64_t g = g_idx[static_cast<size_t>(i)];
        const float sc = s_in[g * rows + o];
        w[static_cast<size_t>(o * cols + i)] =
            sc * static_cast<float>(code(o, i)) + -(sc * static_cast<float>(zero(o, g)));
      }
    }
    owned_scales_.push_back(std::move(w));
    bind(owned_scales_.back().data(), DType::kF32);
    return Status::Ok();
  }
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2));
  std::vector<float> scales(static_cast<size_t>(rows * groups)), biases(scales.size());
  auto input = [&](int64_t j) -> int64_t {
    return perm.empty() ? j : perm[static_cast<size_t>(j)];
  };
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t j = 0; j < cols; j += 2) {
      codes[static_cast<size_t>(o * cols / 2 + j / 2)] =
          static_cast<uint8_t>(code(o, input(j)) | (code(o, input(j + 1)) << 4));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float s = s_in[g * rows + o];
      scales[static_cast<size_t>(o * groups + g)] = s;
      // (q - z) * s == s * q + (-(s * z)): both products are exact (an f16 times 4-5 bits).
      biases[static_cast<size_t>(o * groups + g)] = -(s * static_cast<float>(zero(o, g)));
    }
  }
  owned_bytes_.push_back(std::move(codes));
  owned_scales_.push_back(std::move(scales));
  owned_scales_.push_back(std::move(biases));
  bind(owned_bytes_.back().data(), DType::kMlxQ4);
  out->block_scale = owned_scales_[owned_scales_.size() - 2].data();
  out->group_bias = owned_scales_.back().data();
  out->block_rows = 1;
  out->block_cols = gs;
  if (!perm.empty()) {
    std::vector<uint8_t> bytes(perm.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), perm.data(), bytes.size());
    owned_bytes_.push_back(std::move(bytes));
    out->input_perm = reinterpret_cast<const int32_t*>(owned_bytes_.back().data());
  }
  return Status::Ok();
}

Status WeightBinder::Get(const std::string& name, std::vector<int64_t> shape, TensorView* out) {
  if (!int4_method_.empty() && name.ends_with(".weight") && shape.size() == 2 && !store_.Has(name)) {
    const std::string base = name.substr(0, name.size() - std::string(".weight").size());
    if (store_.Has(base + ".qweight")) return GetInt4(base, shape, out);
  }
  if (mlx_ != nullptr && mlx_->group_size > 0 && name.ends_with(".weight") && shape.size() == 2) {
    auto it = store_.tensors().find(name);
    if (it != store_.tensors().end() && it->second.dtype == DType::kU32) {
      return GetMlx(name, shape, it->second, out);
    }
  }
  Result<TensorView> t = store_.Get(name, std::move(shape));
  if (!t.ok()) return t.status();
  const bool plain = t->dtype == DType::kF32 || t->dtype == DType::kF16 || t->dtype == DType::kBF16;
  const bool fp8 = t->dtype == DType::kF8E4M3 && t->n_dims == 2 && fp8_block_rows_ > 0;
  // Block-quantized tensors (GGUF, FP8) are read as matrices: linear layers and the embedding.
  if (!plain && !fp8 && !(IsBlockQuantized(t->dtype) && t->n_dims == 2)) {
    return Unsupported(store_.file_of(name) + ": tensor '" + name + "' has dtype " +
                       std::string(DTypeName(t->dtype)) +
                       " (supported: F32, F16, BF16; Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, "
                       "Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, and F8_E4M3 with block scales, for "
                       "matrices)");
  }
  *out = *t;
  if (fp8 && (t->shape[1] % 32 != 0 || fp8_block_cols_ % 32 != 0)) {
    return Unsupported(store_.file_of(name) + ": FP8 weight '" + name + "' has " +
                       std::to_string(t->shape[1]) + " columns in blocks of " +
                       std::to_string(fp8_block_cols_) + "; both must be multiples of 32");
  }
  if (fp8) {
    const int64_t sr = (t->shape[0] + fp8_block_rows_ - 1) / fp8_block_rows_;
    const int64_t sc = (t->shape[1] + fp8_block_cols_ - 1) / fp8_block_cols_;
    Result<const float*> scales = OwnedF32(name + "_scale_inv", {sr, sc});
    if (!scales.ok()) return scales.status().With("FP8 weight '" + name + "': ");
    out->block_scale = *scales;
    out->block_rows = fp8_block_rows_;
    out->block_cols = fp8_block_cols_;
  }
  if (used_.insert(name).second) {
    n_parameters_ += t->numel();
    n_bytes_ += static_cast<int64_t>(t->size_bytes());
  }
  return Status::Ok();
}

Status WeightBinder::GetOptional(const std::string& name, std::vector<int64_t> shape,
                                 TensorView* out) {
  if (!Has(name)) {
    *out = TensorView{};
    return Status::Ok();
  }
  return Get(name, std::move(shape), out);
}

void WeightBinder::Skip(const std::string& prefix, const std::string& note) {
  skipped_prefixes_.push_back(prefix);
  if (!note.empty()) notes_.push_back(note);
}

std::pair<int64_t, int64_t> WeightBinder::CountPrefix(const std::string& prefix) const {
  int64_t n_tensors = 0, n_params = 0;
  for (auto it = store_.tensors().lower_bound(prefix);
       it != store_.tensors().end() && it->first.starts_with(prefix); ++it) {
    ++n_tensors;
    n_params += it->second.numel();
  }
  return {n_tensors, n_params};
}

Status WeightBinder::CheckAllUsed(const std::string& architecture) const {
  std::vector<std::string> extra;
  for (const auto& [name, view] : store_.tensors()) {
    if (used_.count(name) != 0) continue;
    const bool skipped = std::any_of(skipped_prefixes_.begin(), skipped_prefixes_.end(),
                                     [&](const std::string& p) { return name.starts_with(p); });
    // Old checkpoints carry the RoPE tables as buffers; they are recomputed from the config.
    if (skipped || name.ends_with(".rotary_emb.inv_freq")) continue;
    extra.push_back(name);
  }
  if (extra.empty()) return Status::Ok();
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
  if (extra.size() > 8) list += ", ... (" + std::to_string(extra.size() - 8) + " more)";
  return InvalidArgument(store_.file_of(extra[0]) + ": " + std::to_string(extra.size()) +
                         " tensor(s) that " + architecture +
                         " does not use (is config.json's architecture right?): " + list);
}

TensorView SliceMatrixRows(const TensorView& t, int64_t index, int64_t row_begin, int64_t n_rows) {
  KCHECK(t.n_dims == 3);
  KCHECK(index >= 0 && index < t.shape[0]);
  KCHECK(row_begin >= 0 && n_rows >= 0 && row_begin + n_rows <= t.shape[1]);
  TensorView v;
  v.dtype = t.dtype;
  v.n_dims = 2;
  v.shape[0] = n_rows;
  v.shape[1] = t.shape[2];
  const int64_t row = index * t.shape[1] + row_begin;
  v.data = static_cast<const uint8_t*>(t.data) + row * DTypeRowBytes(t.dtype, t.shape[2]);
  return v;
}

namespace arch {

Status BindEmbeddingsAndHead(const ModelConfig& c, WeightBinder& b, const std::string& root,
                             DecoderWeights* w) {
  KTRY(b.Get(root + "embed_tokens.weight", {c.vocab_size, c.hidden_size}, &w->embed));
  KTRY(b.Get(root + "norm.weight", {c.hidden_size}, &w->final_norm));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed;
    return Status::Ok();
  }
  return b.Get("lm_head.weight", {c.vocab_size, c.hidden_size}, &w->lm_head);
}

Status BindMlp(WeightBinder& b, const std::string& p, int64_t hidden, int64_t inter, bool bias,
               MlpWeights* out) {
  KTRY(b.Get(p + "gate_proj.weight", {inter, hidden}, &out->gate_proj));
  KTRY(b.Get(p + "up_proj.weight", {inter, hidden}, &out->up_proj));
  KTRY(b.Get(p + "down_proj.weight", {hidden, inter}, &out->down_proj));
  if (bias) {
    KTRY(b.Get(p + "gate_proj.bias", {inter}, &out->gate_bias));
    KTRY(b.Get(p + "up_proj.bias", {inter}, &out->up_bias));
    KTRY(b.Get(p + "down_proj.bias", {hidden}, &out->down_bias));
  }
  return Status::Ok();
}

Status BindAttention(const ModelConfig& c, WeightBinder& b, const std::string& p,
                     AttentionWeights* out) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t q_rows = c.attention_output_gate ? 2 * q_dim : q_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  KTRY(b.Get(p + "q_proj.weight", {q_rows, hidden}, &out->q_proj));
  KTRY(b.Get(p + "k_proj.weight", {kv_dim, hidden}, &out->k_proj));
  KTRY(b.Get(p + "v_proj.weight", {kv_dim, hidden}, &out->v_proj));
  if (c.attention_bias) {
    KTRY(b.Get(p + "q_proj.bias", {q_rows}, &out->q_bias));
    KTRY(b.Get(p + "k_proj.bias", {kv_dim}, &out->k_bias));
    KTRY(b.Get(p + "v_proj.bias", {kv_dim}, &out->v_bias));
  }
  if (c.qk_norm) {
    KTRY(b.Get(p + "q_norm.weight", {c.head_dim}, &out->q_norm));
    KTRY(b.Get(p + "k_norm.weight", {c.head_dim}, &out->k_norm));
  }
  KTRY(b.Get(p + "o_proj.weight", {hidden, q_dim}, &out->o_proj));
  if (c.attention_out_bias) KTRY(b.Get(p + "o_proj.bias", {hidden}, &out->o_bias));
  return Status::Ok();
}

// Experts are stored one tensor per expert and projection (published Qwen3-MoE / Qwen3-Next
// checkpoints, transformers' save_pretrained) or fused per layer (experts.gate_up_proj
// [E, 2*I, H] with the gate rows first, experts.down_proj [E, H, I]); both are views.
Status BindMoe(const ModelConfig& c, WeightBinder& b, const std::string& p, MoeWeights* out) {
  const int64_t hidden = c.hidden_size;
  const int64_t n_e = c.moe.n_experts;
  const int64_t inter = c.moe.expert_intermediate;
  KTRY(b.Get(p + "gate.weight", {n_e, hidden}, &out->router));
  out->experts.resize(static_cast<size_t>(n_e));
  if (b.Has(p + "experts.gate_up_proj")) {
    TensorView gate_up, down;
    KTRY(b.Get(p + "experts.gate_up_proj", {n_e, 2 * inter, hidden}, &gate_up));
    KTRY(b.Get(p + "experts.down_proj", {n_e, hidden, inter}, &down));
    for (int64_t e = 0; e < n_e; ++e) {
      MlpWeights& x = out->experts[static_cast<size_t>(e)];
      x.gate_proj = SliceMatrixRows(gate_up, e, 0, inter);
      x.up_proj = SliceMatrixRows(gate_up, e, inter, inter);
      x.down_proj = SliceMatrixRows(down, e, 0, hidden);
    }
  } else {
    for (int64_t e = 0; e < n_e; ++e) {
      KTRY(BindMlp(b, p + "experts." + std::to_string(e) + ".", hidden, inter, false,
                   &out->experts[static_cast<size_t>(e)]));
    }
  }
  if (c.moe.shared_expert_intermediate > 0) {
    KTRY(BindMlp(b, p + "shared_expert.", hidden, c.moe.shared_expert_intermediate, false,
                 &out->shared_expert));
    KTRY(b.Get(p + "shared_expert_gate.weight", {1, hidden}, &out->shared_expert_gate));
  }
  return Status::Ok();
}

}  // namespace arch

Result<DecoderWeights> BindDecoderWeights(const ModelConfig& c, const WeightStore& store) {
  WeightBinder b(store);
  b.set_fp8_blocks(c.fp8_block_rows, c.fp8_block_cols);
  b.set_mlx(&c.mlx);
  b.set_int4(c.int4_method, c.int4_group_size);
  DecoderWeights w;
  switch (c.arch) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
    case Architecture::kQwen3Moe:
      KTRY(arch::BindLlamaFamily(c, b, &w));
      break;
    case Architecture::kQwen3Next:
    case Architecture::kQwen3_5:
    case Architecture::kQwen3_5Moe:
      KTRY(arch::BindQwen3NextFamily(c, b, &w));
      break;
  }
  KTRY(b.CheckAllUsed(c.architecture_class.empty() ? ArchitectureName(c.arch)
                                                   : c.architecture_class));
  w.n_parameters = b.n_parameters() - (w.mtp ? w.mtp->n_parameters : 0);
  w.n_bytes = b.n_bytes();
  w.notes = b.notes();
  w.owned_scales = b.TakeOwnedScales();
  w.owned_bytes = b.TakeOwnedBytes();
  return w;
}

Status ValidateDecoderConfig(const ModelConfig& config, const ModelLoadOptions& options) {
  const bool any_attention = config.n_layers_of(LayerType::kAttention) > 0;
  if (config.hidden_size <= 0 || config.n_layers <= 0 || config.vocab_size <= 0 ||
      (any_attention && (config.n_heads <= 0 || config.n_kv_heads <= 0 || config.head_dim <= 0 ||
                         config.n_heads % config.n_kv_heads != 0))) {
    return InvalidArgument("model config has inconsistent sizes (heads " +
                           std::to_string(config.n_heads) + ", kv heads " +
                           std::to_string(config.n_kv_heads) + ")");
  }
  if (static_cast<int64_t>(config.layer_types.size()) != config.n_layers ||
      static_cast<int64_t>(config.layer_moe.size()) != config.n_layers) {
    return InvalidArgument("model config: layer types do not cover every layer");
  }
  for (int64_t i = 0; i < config.n_layers; ++i) {
    if (!config.layer_moe[static_cast<size_t>(i)] && config.intermediate_size <= 0) {
      return InvalidArgument("model config: layer " + std::to_string(i) +
                             " has a dense MLP but intermediate_size is not set");
    }
  }
  if (options.block_size_tokens <= 0) {
    return InvalidArgument("KV block size must be positive, got " +
                           std::to_string(options.block_size_tokens));
  }
  if (options.kv_cache_tokens < 0) {
    return InvalidArgument("KV cache capacity must be >= 0 tokens, got " +
                           std::to_string(options.kv_cache_tokens));
  }
  const int64_t rotary_dim = RopeRotaryDim(config);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > config.head_dim) {
    return Unsupported("rotary dimension " + std::to_string(rotary_dim) + " for head_dim " +
                       std::to_string(config.head_dim));
  }
  return Status::Ok();
}

}  // namespace kestrel
