// The scalar reference kernels: one thread, sequential f32 sums in the obvious order, no FMA
// (baseline x86-64 has none, so the compiler cannot contract). Every fast path and every CUDA
// kernel is tested against these.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "core/check.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu::reference {

void Linear(const float* x, int64_t m_rows, const TensorView& w, const TensorView& bias, float* y,
            bool int8_activations) {
  const int64_t n_out = w.shape[0];
  const int64_t k_in = w.shape[1];
  if (HasIntDot(w.dtype) && int8_activations) {
    const bool k_quant = !TakesQ8_0Activations(w.dtype);
    std::vector<int8_t> q(static_cast<size_t>(k_in));
    std::vector<float> d(static_cast<size_t>(k_in / 32));
    std::vector<int16_t> bsum(static_cast<size_t>(k_in / 16));
    for (int64_t m = 0; m < m_rows; ++m) {
      if (k_quant) {
        quant::QuantizeActsQ8_K(x + m * k_in, k_in, q.data(), d.data(), bsum.data());
      } else {
        quant::QuantizeActsQ8_0(x + m * k_in, k_in, q.data(), d.data());
      }
      for (int64_t n = 0; n < n_out; ++n) {
        const uint8_t* row = static_cast<const uint8_t*>(w.data) + n * w.row_bytes();
        const quant::ActsQ8_0View a0{q.data(), d.data()};
        const quant::ActsQ8_KView ak{q.data(), d.data(), bsum.data()};
        switch (w.dtype) {
          case DType::kQ8_0:
            y[m * n_out + n] = quant::DotQ8_0(row, a0, k_in);
            break;
          case DType::kQ4_0:
          case DType::kQ5_0:
            y[m * n_out + n] = quant::DotLegacySymmetric(w.dtype, row, a0, k_in);
            break;
          case DType::kIQ4_NL:
            y[m * n_out + n] = quant::DotIq4Nl(row, a0, k_in);
            break;
          case DType::kQ4_K:
            y[m * n_out + n] = quant::DotQ4_K(row, ak, k_in);
            break;
          case DType::kQ5_K:
            y[m * n_out + n] = quant::DotQ5_K(row, ak, k_in);
            break;
          case DType::kQ6_K:
            y[m * n_out + n] = quant::DotQ6_K(row, ak, k_in);
            break;
          case DType::kQ2_K:
            y[m * n_out + n] = quant::DotQ2_K(row, ak, k_in);
            break;
          case DType::kQ3_K:
            y[m * n_out + n] = quant::DotQ3_K(row, ak, k_in);
            break;
          default:
            y[m * n_out + n] = quant::DotIq4Xs(row, ak, k_in);
            break;
        }
      }
    }
  } else {
    // Each row's exact f32 values (any dtype), then a sequential sum per output.
    std::vector<float> row(static_cast<size_t>(k_in));
    for (int64_t n = 0; n < n_out; ++n) {
      quant::DequantizeMatrixRow(w, n, row.data());
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xm = x + m * k_in;
        float acc = 0.0f;
        for (int64_t k = 0; k < k_in; ++k) acc += xm[k] * row[static_cast<size_t>(k)];
        y[m * n_out + n] = acc;
      }
    }
  }
  if (bias.empty()) return;
  DispatchWeightDType(bias.dtype, [&]<DType T>() {
    for (int64_t m = 0; m < m_rows; ++m) {
      for (int64_t n = 0; n < n_out; ++n) y[m * n_out + n] += LoadWeight<T>(bias.data, n);
    }
  });
}

void PagedAttention(const AttentionShape& shape, const AttentionBatch& batch, const float* q,
                    const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch) {
  const int64_t n_heads = shape.n_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t group = n_heads / shape.n_kv_heads;
  const KvLayout layout = shape.layout();
  const int32_t bs = shape.block_size_tokens;
  const int32_t n_seqs = static_cast<int32_t>(batch.seq_starts.size()) - 1;
  for (int32_t s = 0; s < n_seqs; ++s) {
    const int32_t* table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
    for (int32_t t = batch.seq_starts[s]; t < batch.seq_starts[s + 1]; ++t) {
      const int64_t pos = batch.positions[t];
      const int64_t first = shape.sliding_window > 0
                                ? std::max<int64_t>(0, pos - shape.sliding_window + 1)
                                : 0;
      const int64_t n_ctx = pos + 1 - first;
      KCHECK(pos / bs < batch.max_blocks_per_seq);
      KCHECK(static_cast<int64_t>(scratch.size()) >= n_ctx + head_dim);
      float* scores = scratch.data();
      float* row = scratch.data() + n_ctx;  // an int8 or bf16 row as floats
      // Row (slot, kvh) of a cache as floats.
      auto read = [&](const KvRows& c, int64_t slot, int64_t kvh) -> const float* {
        const int64_t off = layout.RowOffset(slot, kvh);
        if (c.f32 != nullptr) return c.f32 + off;
        if (c.bf16 != nullptr) {
          for (int64_t d = 0; d < head_dim; ++d) row[d] = Bf16ToF32(c.bf16[off + d]);
          return row;
        }
        const float sc = c.scale[off / head_dim];
        for (int64_t d = 0; d < head_dim; ++d) row[d] = static_cast<float>(c.q[off + d]) * sc;
        return row;
      };
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qh = q + (t * n_heads + h) * head_dim;
        const int64_t kvh = h / group;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n_ctx; ++j) {
          const int64_t p = first + j;
          const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
          KCHECK(slot >= 0 && slot < layout.n_slots());
          const float* kj = read(k_cache, slot, kvh);
          float dot = 0.0f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kj[d];
          scores[j] = dot * shape.scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n_ctx; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        for (int64_t j = 0; j < n_ctx; ++j) scores[j] /= sum;
        float* oh = out + (t * n_heads + h) * head_dim;
        std::fill(oh, oh + head_dim, 0.0f);
        for (int64_t j = 0; j < n_ctx; ++j) {
          const int64_t p = first + j;
          const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
          const float* vj = read(v_cache, slot, kvh);
          for (int64_t d = 0; d < head_dim; ++d) oh[d] += scores[j] * vj[d];
        }
      }
    }
  }
}

}  // namespace kestrel::cpu::reference
