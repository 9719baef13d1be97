#include "tiny_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace kestrel::testing {

using nlohmann::json;

std::vector<int32_t> ReversedBlocks(const Model& m) {
  std::vector<int32_t> blocks(m.n_kv_blocks());
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b] = static_cast<int32_t>(blocks.size() - 1 - b);
  }
  return blocks;
}

std::string MakeTempDir(const std::string& tag) {
  static int counter = 0;
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("kestrel_" + tag + "_" + std::to_string(::getpid()) + "_" +
                             std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

void WriteSafetensors(const std::string& path, const std::map<std::string, TensorToWrite>& tensors,
                      DType dtype) {
  json header = json::object();
  std::vector<uint8_t> data;
  const size_t elem = DTypeSize(dtype);
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    data.resize(begin + t.values.size() * elem);
    for (size_t i = 0; i < t.values.size(); ++i) {
      uint8_t* dst = data.data() + begin + i * elem;
      if (dtype == DType::kF32) {
        std::memcpy(dst, &t.values[i], 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(t.values[i]) : F32ToF16(t.values[i]);
        std::memcpy(dst, &h, 2);
      }
    }
    header[name] = {{"dtype", std::string(DTypeName(dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  // An odd header length leaves every tensor misaligned, as real files may be.
  if (text.size() % 2 == 0) text += ' ';
  const uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  KCHECK(out.good());
}

TensorMap WriteTinyModel(const std::string& dir, const TinyModelSpec& s) {
  std::filesystem::create_directories(dir);
  json config = {{"architectures", {s.architecture}},
                 {"vocab_size", s.vocab},
                 {"hidden_size", s.hidden},
                 {"intermediate_size", s.intermediate},
                 {"num_hidden_layers", s.n_layers},
                 {"num_attention_heads", s.n_heads},
                 {"num_key_value_heads", s.n_kv_heads},
                 {"head_dim", s.head_dim},
                 {"max_position_embeddings", s.max_position},
                 {"rms_norm_eps", s.rms_norm_eps},
                 {"rope_theta", s.rope_theta},
                 {"tie_word_embeddings", s.tie_embeddings},
                 {"hidden_act", "silu"},
                 {"attention_bias", s.attention_bias},
                 {"torch_dtype", s.dtype == DType::kF32   ? "float32"
                                 : s.dtype == DType::kF16 ? "float16"
                                                          : "bfloat16"}};
  if (s.architecture == "MistralForCausalLM") {
    config["sliding_window"] = s.sliding_window ? json(*s.sliding_window) : json(nullptr);
  }
  if (s.architecture == "Qwen2ForCausalLM" || s.architecture == "Qwen3ForCausalLM") {
    config["use_sliding_window"] = false;
  }
  std::ofstream(dir + "/config.json") << config.dump(2);

  std::mt19937 rng(s.seed);
  std::map<std::string, TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    TensorToWrite t{shape, std::vector<float>(static_cast<size_t>(n))};
    for (float& v : t.values) v = dist(rng);
    tensors[name] = std::move(t);
  };
  const int64_t q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  add("model.embed_tokens.weight", {s.vocab, s.hidden}, 0.0f, 1.0f);
  add("model.norm.weight", {s.hidden}, 1.0f, 0.2f);
  if (!s.tie_embeddings) add("lm_head.weight", {s.vocab, s.hidden}, 0.0f, in_h);
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, 1.0f, 0.2f);
    add(p + "post_attention_layernorm.weight", {s.hidden}, 1.0f, 0.2f);
    add(p + "self_attn.q_proj.weight", {q_dim, s.hidden}, 0.0f, in_h);
    add(p + "self_attn.k_proj.weight", {kv_dim, s.hidden}, 0.0f, in_h);
    add(p + "self_attn.v_proj.weight", {kv_dim, s.hidden}, 0.0f, in_h);
    add(p + "self_attn.o_proj.weight", {s.hidden, q_dim}, 0.0f,
        1.0f / std::sqrt(static_cast<float>(q_dim)));
    if (s.qkv_bias()) {
      add(p + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.3f);
      add(p + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 0.3f);
      add(p + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.3f);
    }
    if (s.o_bias()) add(p + "self_attn.o_proj.bias", {s.hidden}, 0.0f, 0.3f);
    if (s.qk_norm()) {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, 1.0f, 0.2f);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, 1.0f, 0.2f);
    }
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, 0.0f, in_h);
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, 0.0f, in_h);
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, 0.0f,
        1.0f / std::sqrt(static_cast<float>(s.intermediate)));
  }
  std::map<std::string, TensorToWrite> to_write = tensors;
  to_write.erase(s.omit_tensor);
  if (auto it = to_write.find(s.grow_tensor); it != to_write.end()) {
    const int64_t row = it->second.shape.size() > 1 ? it->second.shape[1] : 1;
    it->second.shape[0] += 1;
    it->second.values.resize(it->second.values.size() + static_cast<size_t>(row), 0.5f);
  }
  WriteSafetensors(dir + "/model.safetensors", to_write, s.dtype);

  TensorMap values;
  for (auto& [name, t] : tensors) {
    for (float& v : t.values) {
      if (s.dtype == DType::kBF16) v = Bf16ToF32(F32ToBf16(v));
      if (s.dtype == DType::kF16) v = F16ToF32(F32ToF16(v));
    }
    values[name] = std::move(t.values);
  }
  return values;
}

namespace {

using Vec = std::vector<double>;

// y = W x (+ b);  W [rows, cols]
Vec MatVec(const std::vector<float>& w, const Vec& x, int64_t rows, const std::vector<float>* b) {
  const int64_t cols = static_cast<int64_t>(x.size());
  Vec y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = b != nullptr ? (*b)[r] : 0.0;
    for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(w[r * cols + c]) * x[c];
    y[r] = acc;
  }
  return y;
}

// RMSNorm of x[offset, offset + d) with weight w, in place.
void NormInPlace(Vec& x, size_t offset, int64_t d, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < d; ++j) ss += x[offset + j] * x[offset + j];
  const double inv = 1.0 / std::sqrt(ss / d + eps);
  for (int64_t j = 0; j < d; ++j) x[offset + j] = w[j] * (x[offset + j] * inv);
}

void RopeInPlace(Vec& x, int64_t n_heads, int64_t hd, int64_t pos, double theta) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos / std::pow(theta, 2.0 * i / hd);
      const double c = std::cos(angle), s = std::sin(angle);
      double& a = x[h * hd + i];
      double& b = x[h * hd + i + half];
      const double a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = b0 * c + a0 * s;
    }
  }
}

}  // namespace

std::vector<std::vector<double>> NaiveForward(const TinyModelSpec& s, const TensorMap& w,
                                              const std::vector<int32_t>& tokens) {
  auto W = [&](const std::string& name) -> const std::vector<float>& {
    auto it = w.find(name);
    KCHECK_MSG(it != w.end(), name.c_str());
    return it->second;
  };
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const int64_t group = s.n_heads / s.n_kv_heads;
  std::vector<Vec> x(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const auto& e = W("model.embed_tokens.weight");
    x[t].assign(e.begin() + tokens[t] * s.hidden, e.begin() + (tokens[t] + 1) * s.hidden);
  }
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      Vec h = x[t];
      NormInPlace(h, 0, s.hidden, W(p + "input_layernorm.weight"), s.rms_norm_eps);
      q[t] = MatVec(W(p + "self_attn.q_proj.weight"), h, q_dim,
                    s.qkv_bias() ? &W(p + "self_attn.q_proj.bias") : nullptr);
      k[t] = MatVec(W(p + "self_attn.k_proj.weight"), h, kv_dim,
                    s.qkv_bias() ? &W(p + "self_attn.k_proj.bias") : nullptr);
      v[t] = MatVec(W(p + "self_attn.v_proj.weight"), h, kv_dim,
                    s.qkv_bias() ? &W(p + "self_attn.v_proj.bias") : nullptr);
      if (s.qk_norm()) {
        for (int64_t hh = 0; hh < s.n_heads; ++hh)
          NormInPlace(q[t], hh * hd, hd, W(p + "self_attn.q_norm.weight"), s.rms_norm_eps);
        for (int64_t hh = 0; hh < s.n_kv_heads; ++hh)
          NormInPlace(k[t], hh * hd, hd, W(p + "self_attn.k_norm.weight"), s.rms_norm_eps);
      }
      RopeInPlace(q[t], s.n_heads, hd, t, s.rope_theta);
      RopeInPlace(k[t], s.n_kv_heads, hd, t, s.rope_theta);
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec attn(static_cast<size_t>(q_dim), 0.0);
      const int64_t first =
          s.sliding_window ? std::max<int64_t>(0, t - *s.sliding_window + 1) : 0;
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / group;
        Vec scores;
        double mx = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += q[t][h * hd + d] * k[j][kvh * hd + d];
          scores.push_back(dot / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, scores.back());
        }
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - mx));
        for (int64_t j = first; j <= t; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            attn[h * hd + d] += scores[j - first] / sum * v[j][kvh * hd + d];
          }
        }
      }
      const Vec o = MatVec(W(p + "self_attn.o_proj.weight"), attn, s.hidden,
                           s.o_bias() ? &W(p + "self_attn.o_proj.bias") : nullptr);
      for (int64_t d = 0; d < s.hidden; ++d) x[t][d] += o[d];
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec h = x[t];
      NormInPlace(h, 0, s.hidden, W(p + "post_attention_layernorm.weight"), s.rms_norm_eps);
      Vec g = MatVec(W(p + "mlp.gate_proj.weight"), h, s.intermediate, nullptr);
      const Vec u = MatVec(W(p + "mlp.up_proj.weight"), h, s.intermediate, nullptr);
      for (int64_t i = 0; i < s.intermediate; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec d = MatVec(W(p + "mlp.down_proj.weight"), g, s.hidden, nullptr);
      for (int64_t j = 0; j < s.hidden; ++j) x[t][j] += d[j];
    }
  }
  std::vector<Vec> logits(static_cast<size_t>(n));
  const auto& head = W(s.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int64_t t = 0; t < n; ++t) {
    NormInPlace(x[t], 0, s.hidden, W("model.norm.weight"), s.rms_norm_eps);
    logits[t] = MatVec(head, x[t], s.vocab, nullptr);
  }
  return logits;
}

SeqRunner::SeqRunner(Model* model, std::vector<int32_t> free_blocks)
    : model_(model), free_blocks_(std::move(free_blocks)) {}

int SeqRunner::AddSequence(std::vector<int32_t> tokens) {
  seqs_.push_back(Seq{std::move(tokens), 0, {}});
  return static_cast<int>(seqs_.size()) - 1;
}

std::vector<std::vector<std::vector<float>>> SeqRunner::Step(const std::vector<Work>& work) {
  const int32_t bs = model_->block_size_tokens();
  std::vector<int32_t> ids, positions, slots, starts{0}, ctx_lens, rows;
  size_t max_blocks = 1;
  for (const Work& w : work) {
    Seq& s = seqs_[static_cast<size_t>(w.seq)];
    KCHECK(s.n_computed + w.n_tokens <= static_cast<int64_t>(s.tokens.size()));
    const int64_t end = s.n_computed + w.n_tokens;
    while (static_cast<int64_t>(s.blocks.size()) * bs < end) {
      KCHECK(next_free_ < free_blocks_.size());
      s.blocks.push_back(free_blocks_[next_free_++]);
    }
    max_blocks = std::max(max_blocks, s.blocks.size());
    for (int64_t p = s.n_computed; p < end; ++p) {
      rows.push_back(static_cast<int32_t>(ids.size()));
      ids.push_back(s.tokens[static_cast<size_t>(p)]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(s.blocks[static_cast<size_t>(p / bs)] * bs + static_cast<int32_t>(p % bs));
    }
    starts.push_back(static_cast<int32_t>(ids.size()));
    ctx_lens.push_back(static_cast<int32_t>(end));
  }
  // Recurrent-state models: sequence i keeps its state in slot i.
  std::vector<int32_t> state_slots;
  if (model_->n_state_slots() > 0) {
    for (const Work& w : work) {
      KCHECK(w.seq < model_->n_state_slots());
      state_slots.push_back(w.seq);
    }
  }
  std::vector<int32_t> tables(work.size() * max_blocks, -1);
  for (size_t i = 0; i < work.size(); ++i) {
    const Seq& s = seqs_[static_cast<size_t>(work[i].seq)];
    std::copy(s.blocks.begin(), s.blocks.end(), tables.begin() + i * max_blocks);
  }
  Batch batch;
  batch.token_ids = ids;
  batch.positions = positions;
  batch.slot_mapping = slots;
  batch.seq_starts = starts;
  batch.context_lens = ctx_lens;
  batch.block_tables = tables;
  batch.max_blocks_per_seq = static_cast<int32_t>(max_blocks);
  batch.logits_indices = rows;
  batch.state_slots = state_slots;
  const int64_t vocab = model_->config().vocab_size;
  std::vector<float> logits(rows.size() * static_cast<size_t>(vocab));
  model_->Forward(batch, logits.data());

  std::vector<std::vector<std::vector<float>>> out(work.size());
  size_t row = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    seqs_[static_cast<size_t>(work[i].seq)].n_computed += work[i].n_tokens;
    for (int64_t t = 0; t < work[i].n_tokens; ++t, ++row) {
      out[i].emplace_back(logits.begin() + static_cast<int64_t>(row) * vocab,
                          logits.begin() + static_cast<int64_t>(row + 1) * vocab);
    }
  }
  return out;
}

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  KCHECK(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

double Range(const std::vector<float>& row) {
  const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
  return static_cast<double>(*hi) - *lo;
}

double TopMargin(const std::vector<float>& row) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : row) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return static_cast<double>(a) - b;
}

}  // namespace kestrel::testing
