// Loading of the dense decoder: weight binding with shape checks, KV pool sizing, kernel choice.
// The forward pass is in llama_forward.cpp.
#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "models/rope.h"

namespace kestrel {

int64_t ResolveKvCacheTokens(const ModelConfig& config, const ModelLoadOptions& options) {
  if (options.kv_cache_tokens > 0) return options.kv_cache_tokens;
  int64_t tokens = config.max_position_embeddings > 0 ? config.max_position_embeddings
                                                      : kDefaultKvCacheTokensCap;
  tokens = std::min(tokens, kDefaultKvCacheTokensCap);
  const int64_t bytes_per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4;
  if (bytes_per_token > 0) tokens = std::min(tokens, kDefaultKvBudgetBytes / bytes_per_token);
  return std::max<int64_t>(tokens, options.block_size_tokens);
}

DenseDecoder::DenseDecoder(ModelConfig config, WeightStore store)
    : config_(std::move(config)), store_(std::move(store)) {}

int64_t DenseDecoder::kv_bytes_per_token() const {
  return 2 * config_.n_layers * kv_dim_ * static_cast<int64_t>(sizeof(float));
}

std::string DenseDecoder::kernels_name() const {
  return std::string(cpu::KernelSetName(ops_.kernels));
}

namespace detail {

Result<DenseDecoderWeights> BindDenseDecoderWeights(const ModelConfig& c,
                                                    const WeightStore& store) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;
  DenseDecoderWeights w;
  auto get = [&](const std::string& name, std::vector<int64_t> shape,
                 TensorView* out) -> Status {
    Result<TensorView> t = store.Get(name, std::move(shape));
    if (!t.ok()) return t.status();
    if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
      return Unsupported(store.file_of(name) + ": tensor '" + name + "' has dtype " +
                         std::string(DTypeName(t->dtype)) + " (supported: F32, F16, BF16)");
    }
    *out = *t;
    w.n_parameters += t->numel();
    w.n_bytes += static_cast<int64_t>(t->size_bytes());
    return Status::Ok();
  };

  KTRY(get("model.embed_tokens.weight", {c.vocab_size, hidden}, &w.embed));
  KTRY(get("model.norm.weight", {hidden}, &w.final_norm));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    KTRY(get("lm_head.weight", {c.vocab_size, hidden}, &w.lm_head));
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    DecoderLayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    KTRY(get(p + "input_layernorm.weight", {hidden}, &l.input_norm));
    KTRY(get(p + "self_attn.q_proj.weight", {q_dim, hidden}, &l.q_proj));
    KTRY(get(p + "self_attn.k_proj.weight", {kv_dim, hidden}, &l.k_proj));
    KTRY(get(p + "self_attn.v_proj.weight", {kv_dim, hidden}, &l.v_proj));
    if (c.attention_bias) {
      KTRY(get(p + "self_attn.q_proj.bias", {q_dim}, &l.q_bias));
      KTRY(get(p + "self_attn.k_proj.bias", {kv_dim}, &l.k_bias));
      KTRY(get(p + "self_attn.v_proj.bias", {kv_dim}, &l.v_bias));
    }
    if (c.qk_norm) {
      KTRY(get(p + "self_attn.q_norm.weight", {c.head_dim}, &l.q_norm));
      KTRY(get(p + "self_attn.k_norm.weight", {c.head_dim}, &l.k_norm));
    }
    KTRY(get(p + "self_attn.o_proj.weight", {hidden, q_dim}, &l.o_proj));
    if (c.attention_out_bias) KTRY(get(p + "self_attn.o_proj.bias", {hidden}, &l.o_bias));
    KTRY(get(p + "post_attention_layernorm.weight", {hidden}, &l.post_norm));
    KTRY(get(p + "mlp.gate_proj.weight", {inter, hidden}, &l.gate_proj));
    KTRY(get(p + "mlp.up_proj.weight", {inter, hidden}, &l.up_proj));
    KTRY(get(p + "mlp.down_proj.weight", {hidden, inter}, &l.down_proj));
    if (c.mlp_bias) {
      KTRY(get(p + "mlp.gate_proj.bias", {inter}, &l.gate_bias));
      KTRY(get(p + "mlp.up_proj.bias", {inter}, &l.up_bias));
      KTRY(get(p + "mlp.down_proj.bias", {hidden}, &l.down_bias));
    }
    const bool sliding = static_cast<size_t>(i) < c.layer_sliding.size() &&
                         c.layer_sliding[static_cast<size_t>(i)] && c.sliding_window.has_value();
    l.sliding_window = sliding ? *c.sliding_window : 0;
  }
  return w;
}

Status ValidateDenseDecoderConfig(const ModelConfig& config, const ModelLoadOptions& options) {
  if (config.hidden_size <= 0 || config.n_layers <= 0 || config.n_heads <= 0 ||
      config.n_kv_heads <= 0 || config.head_dim <= 0 || config.vocab_size <= 0 ||
      config.intermediate_size <= 0 || config.n_heads % config.n_kv_heads != 0) {
    return InvalidArgument("model config has inconsistent sizes (heads " +
                           std::to_string(config.n_heads) + ", kv heads " +
                           std::to_string(config.n_kv_heads) + ")");
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

}  // namespace detail

Status DenseDecoder::BindWeights() {
  KASSIGN(detail::DenseDecoderWeights w, detail::BindDenseDecoderWeights(config_, store_));
  embed_ = w.embed;
  final_norm_ = w.final_norm;
  lm_head_ = w.lm_head;
  layers_ = std::move(w.layers);
  n_parameters_ = w.n_parameters;
  weight_bytes_ = w.n_bytes;
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadDenseDecoder(ModelConfig config, WeightStore store,
                                                const ModelLoadOptions& options) {
  KTRY(detail::ValidateDenseDecoderConfig(config, options));
  const int64_t rotary_dim = RopeRotaryDim(config);

  std::unique_ptr<DenseDecoder> m(new DenseDecoder(std::move(config), std::move(store)));
  KTRY(m->BindWeights());
  const ModelConfig& c = m->config_;

  const bool fast = options.kernels == CpuKernels::kAuto && cpu::CpuHasAvx2Fma();
  m->ops_.kernels = fast ? cpu::KernelSet::kAvx2 : cpu::KernelSet::kReference;
  m->pool_ = std::make_unique<ThreadPool>(options.n_threads);
  m->ops_.pool = m->pool_.get();

  m->inv_freq_ = RopeInvFreq(c);
  KCHECK(static_cast<int64_t>(m->inv_freq_.size()) == rotary_dim / 2);
  m->rope_attention_scale_ = RopeAttentionScale(c);
  m->attention_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));

  // KV pool: capacity rounded up to whole blocks.
  m->block_size_ = options.block_size_tokens;
  m->kv_dim_ = c.n_kv_heads * c.head_dim;
  const int64_t tokens = ResolveKvCacheTokens(c, options);
  const int64_t n_blocks = (tokens + m->block_size_ - 1) / m->block_size_;
  const int64_t n_slots = n_blocks * m->block_size_;
  if (n_slots > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("KV cache of " + std::to_string(tokens) +
                           " tokens exceeds the 2^31 slot limit");
  }
  m->n_blocks_ = static_cast<int32_t>(n_blocks);
  m->n_slots_ = n_slots;
  const int64_t kv_floats = 2 * c.n_layers * n_slots * m->kv_dim_;
  // Uninitialised on purpose: slots are written before they are read, and a large new[] maps
  // fresh zero pages lazily, so an unused capacity costs no memory.
  m->kv_.reset(new (std::nothrow) float[static_cast<size_t>(kv_floats)]);
  if (m->kv_ == nullptr) {
    return ResourceExhausted("cannot allocate the KV cache: " + std::to_string(tokens) +
                             " tokens x " + std::to_string(m->kv_bytes_per_token()) + " bytes");
  }
  // Attention score rows for the whole capacity now, so that a long context never allocates in
  // Forward; activation buffers are sized by the first batches (see ForwardScratch).
  m->EnsureScratch(1, n_slots);
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kestrel
