// Op dispatch, CPU feature detection and the element-wise ops shared by both kernel sets.
#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "core/check.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu {

std::string_view KernelSetName(KernelSet k) {
  switch (k) {
    case KernelSet::kReference: return "reference";
    case KernelSet::kAvx2: return "avx2";
  }
  return "?";
}

bool CpuHasAvx2Fma() {
  // __builtin_cpu_supports also checks that the OS enabled the YMM state (OSXSAVE/XCR0).
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

bool CpuHasAvx512() {
  // Also checks that the OS saves the AVX-512 state (opmask and ZMM, XCR0).
  static const bool has = CpuHasAvx2Fma() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
}

bool Avx512ByDefault() {
  static const bool on = [] {
    const char* env = std::getenv("KESTREL_CPU_AVX512");
    return CpuHasAvx512() && (env == nullptr || std::string_view(env) != "0");
  }();
  return on;
}

std::string_view Int8DotIsaName(Int8DotIsa isa) {
  switch (isa) {
    case Int8DotIsa::kAvx2:
      return "avx2";
    case Int8DotIsa::kAvxVnni:
      return "avxvnni";
    case Int8DotIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

bool CpuSupports(Int8DotIsa isa) {
  if (!CpuHasAvx2Fma()) return false;
  switch (isa) {
    case Int8DotIsa::kAvx2:
      return true;
    case Int8DotIsa::kAvxVnni: {
      static const bool has = __builtin_cpu_supports("avxvnni");
      return has;
    }
    case Int8DotIsa::kAvx512Vnni: {
      // Also checks that the OS saves the AVX-512 state (opmask and ZMM, XCR0).
      static const bool has = __builtin_cpu_supports("avx512vnni") &&
                              __builtin_cpu_supports("avx512vl") &&
                              __builtin_cpu_supports("avx512bw");
      return has;
    }
  }
  return false;
}

Int8DotIsa Int8DotIsaInUse() {
  static const Int8DotIsa isa = [] {
    // KESTREL_CPU_VNNI=0 keeps AVX2; =avxvnni or =avx512vnni asks for that build (if supported).
    const char* env = std::getenv("KESTREL_CPU_VNNI");
    const std::string_view want = env != nullptr ? env : "";
    if (want == "0" || want == "avx2") return Int8DotIsa::kAvx2;
    for (Int8DotIsa isa : {Int8DotIsa::kAvxVnni, Int8DotIsa::kAvx512Vnni}) {
      if (want == Int8DotIsaName(isa) && CpuSupports(isa)) return isa;
    }
    if (CpuSupports(Int8DotIsa::kAvxVnni)) return Int8DotIsa::kAvxVnni;
    if (CpuSupports(Int8DotIsa::kAvx512Vnni)) return Int8DotIsa::kAvx512Vnni;
    return Int8DotIsa::kAvx2;
  }();
  return isa;
}

void IntDotRangeOn(Int8DotIsa isa, DType t, const void* w, const void* packed, int64_t k_in,
                   int64_t n_out, int64_t n_begin, int64_t n_end, const avx2::ActsView* acts,
                   int64_t m_rows, float* y) {
  if (!CpuSupports(isa)) isa = Int8DotIsa::kAvx2;
  switch (isa) {
    case Int8DotIsa::kAvxVnni:
      return avxvnni::IntDotRange(t, w, packed, k_in, n_out, n_begin, n_end, acts, m_rows, y);
    case Int8DotIsa::kAvx512Vnni:
      return avx512vnni::IntDotRange(t, w, packed, k_in, n_out, n_begin, n_end, acts, m_rows, y);
    case Int8DotIsa::kAvx2:
      break;
  }
  avx2::IntDotRange(t, w, packed, k_in, n_out, n_begin, n_end, acts, m_rows, y);
}

static void CheckWeight2D(const TensorView& w) {
  KCHECK(w.n_dims == 2 && w.data != nullptr);
  KCHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16 ||
         IsBlockQuantized(w.dtype) || HasSideScales(w.dtype));
  KCHECK(w.shape[1] % DTypeBlockElems(w.dtype) == 0);
  // FP8 / MLX: the AVX2 kernels dequantize 32 columns under one scale.
  KCHECK(!HasSideScales(w.dtype) ||
         (w.block_scale != nullptr && w.shape[1] % 32 == 0 && w.block_cols % 32 == 0));
}

void Linear(const OpContext& ctx, const float* x, int64_t m_rows, const TensorView& w,
            const TensorView& bias, float* y) {
  const LinearJob job{x, &w, &bias, y};
  LinearGroup(ctx, m_rows, std::span<const LinearJob>(&job, 1));
}

void LinearGroup(const OpContext& ctx, int64_t m_rows, std::span<const LinearJob> jobs) {
  KCHECK(jobs.size() <= static_cast<size_t>(kMaxLinearGroup));
  for (const LinearJob& job : jobs) {
    CheckWeight2D(*job.w);
    KCHECK(job.bias == nullptr || job.bias->empty() ||
           (job.bias->n_dims == 1 && job.bias->shape[0] == job.w->shape[0]));
  }
  if (m_rows <= 0 || jobs.empty()) return;
  switch (ctx.kernels) {
    case KernelSet::kReference:
      for (const LinearJob& job : jobs) {
        reference::Linear(job.x, m_rows, *job.w, job.bias != nullptr ? *job.bias : TensorView{},
                          job.y, ctx.int8_activations);
      }
      return;
    case KernelSet::kAvx2: {
      KCHECK(CpuHasAvx2Fma());
      // GPTQ act-order weights (input_perm): their codes read x in the permuted order, so x is
      // gathered into a copy first (the reference kernels dequantize rows in the inputs' own
      // order and need none).
      LinearJob gathered[kMaxLinearGroup];
      bool any = false;
      for (size_t j = 0; j < jobs.size(); ++j) {
        gathered[j] = jobs[j];
        const int32_t* perm = jobs[j].w->input_perm;
        if (perm == nullptr) continue;
        thread_local std::vector<float> copies[kMaxLinearGroup];
        const int64_t k = jobs[j].w->shape[1];
        std::vector<float>& c = copies[j];
        c.resize(static_cast<size_t>(m_rows * k));
        for (int64_t t = 0; t < m_rows; ++t) {
          const float* src = jobs[j].x + t * k;
          float* dst = c.data() + t * k;
          for (int64_t i = 0; i < k; ++i) dst[i] = src[perm[i]];
        }
        gathered[j].x = c.data();
        any = true;
      }
      avx2::LinearGroup(
          ctx.pool, m_rows, any ? std::span<const LinearJob>(gathered, jobs.size()) : jobs,
          ctx.int8_activations, ctx.batch_invariant, ctx.int8_isa, ctx.avx512 && CpuHasAvx512());
      return;
    }
  }
}

void PagedAttention(const OpContext& ctx, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const float* k_cache, const float* v_cache, float* out,
                    std::span<float> scratch) {
  PagedAttention(ctx, shape, batch, q, KvRows{k_cache}, KvRows{v_cache}, out, scratch);
}

void PagedAttention(const OpContext& ctx, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch) {
  // Exactly one storage per cache: f32, int8 (codes and scales) or bf16.
  auto storages = [](const KvRows& c) {
    return (c.f32 != nullptr) + (c.q != nullptr && c.scale != nullptr) + (c.bf16 != nullptr);
  };
  KCHECK(storages(k_cache) == 1 && storages(v_cache) == 1);
  KCHECK(shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0 && shape.head_dim > 0);
  KCHECK(batch.seq_starts.size() >= 1);
  KCHECK(batch.block_tables.size() ==
         (batch.seq_starts.size() - 1) * static_cast<size_t>(batch.max_blocks_per_seq));
  switch (ctx.kernels) {
    case KernelSet::kReference:
      reference::PagedAttention(shape, batch, q, k_cache, v_cache, out, scratch);
      return;
    case KernelSet::kAvx2:
      KCHECK(CpuHasAvx2Fma());
      avx2::PagedAttention(ctx.pool, shape, batch, q, k_cache, v_cache, out, scratch,
                           ctx.avx512 && CpuHasAvx512());
      return;
  }
}

int64_t AttentionScratchFloats(const OpContext& ctx, const AttentionShape& shape,
                               int64_t max_context_tokens) {
  switch (ctx.kernels) {
    case KernelSet::kReference: return max_context_tokens + shape.head_dim;  // + an int8 row
    case KernelSet::kAvx2: {
      int64_t n_threads = ctx.pool != nullptr ? ctx.pool->n_threads() : 1;
      return n_threads * avx2::AttentionScratchPerThread(shape, max_context_tokens);
    }
  }
  return 0;
}

void EmbeddingGather(const TensorView& table, std::span<const int32_t> ids, float* out) {
  CheckWeight2D(table);
  const int64_t vocab = table.shape[0];
  const int64_t d = table.shape[1];
  for (size_t i = 0; i < ids.size(); ++i) {
    KCHECK(ids[i] >= 0 && ids[i] < vocab);
    quant::DequantizeMatrixRow(table, ids[i], out + static_cast<int64_t>(i) * d);
  }
}

void RmsNorm(const float* x, int64_t n_rows, int64_t d, const TensorView& w, float eps, float* y,
             float weight_offset) {
  KCHECK(w.n_dims == 1 && w.shape[0] == d);
  DispatchWeightDType(w.dtype, [&]<DType T>() {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      float sum_sq = 0.0f;
      for (int64_t j = 0; j < d; ++j) sum_sq += xr[j] * xr[j];
      // torch.rsqrt(variance + eps) in f32; 1/sqrt is correctly rounded, rsqrt within 1 ulp.
      const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
      for (int64_t j = 0; j < d; ++j) {
        yr[j] = (weight_offset + LoadWeight<T>(w.data, j)) * (xr[j] * inv_rms);
      }
    }
  });
}

void RopeTables(std::span<const int32_t> positions, std::span<const float> inv_freq,
                float attention_scaling, float* cos_out, float* sin_out) {
  const int64_t n_half = static_cast<int64_t>(inv_freq.size());
  for (size_t t = 0; t < positions.size(); ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < n_half; ++i) {
      const float freq = pos * inv_freq[i];
      cos_out[static_cast<int64_t>(t) * n_half + i] = std::cos(freq) * attention_scaling;
      sin_out[static_cast<int64_t>(t) * n_half + i] = std::sin(freq) * attention_scaling;
    }
  }
}

void ApplyRope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t n_half) {
  KCHECK(2 * n_half <= head_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = cos + t * n_half;
    const float* s = sin + t * n_half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* head = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < n_half; ++i) {
        const float x1 = head[i];
        const float x2 = head[i + n_half];
        head[i] = x1 * c[i] - x2 * s[i];
        head[i + n_half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

void SiluMul(const OpContext& ctx, const float* gate, const float* up, int64_t n, float* out) {
  if (ctx.kernels == KernelSet::kAvx2) {
    KCHECK(CpuHasAvx2Fma());
    avx2::SiluMul(gate, up, n, out);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// fn(src, dst) for each token t and kv head h of a WriteKv call: src = the row's offset in
// k / v ([n_tokens, n_kv_heads, head_dim]), dst = its offset in the cache (slot slots[t]).
template <class Fn>
static void ForEachKvRow(std::span<const int32_t> slots, const KvLayout& layout, Fn&& fn) {
  for (size_t t = 0; t < slots.size(); ++t) {
    KCHECK(slots[t] >= 0 && slots[t] < layout.n_slots());
    for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
      fn((static_cast<int64_t>(t) * layout.n_kv_heads + h) * layout.head_dim,
         layout.RowOffset(slots[t], h));
    }
  }
}

void WriteKv(const float* k, const float* v, std::span<const int32_t> slots,
             const KvLayout& layout, const KvRowsOut& k_cache, const KvRowsOut& v_cache) {
  if (k_cache.f32 != nullptr) {
    WriteKv(k, v, slots, layout, k_cache.f32, v_cache.f32);
    return;
  }
  const int64_t hd = layout.head_dim;
  if (k_cache.bf16 != nullptr) {
    ForEachKvRow(slots, layout, [&](int64_t src, int64_t dst) {
      for (int64_t d = 0; d < hd; ++d) {
        k_cache.bf16[dst + d] = F32ToBf16(k[src + d]);
        v_cache.bf16[dst + d] = F32ToBf16(v[src + d]);
      }
    });
    return;
  }
  auto quantize = [hd](const float* x, int8_t* q, float* scale) {
    float amax = 0.0f;
    for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float s = amax / 127.0f;
    *scale = s;
    for (int64_t d = 0; d < hd; ++d) {
      q[d] = s > 0.0f ? static_cast<int8_t>(std::clamp(std::nearbyint(x[d] / s), -127.0f, 127.0f))
                      : int8_t{0};
    }
  };
  ForEachKvRow(slots, layout, [&](int64_t src, int64_t dst) {
    quantize(k + src, k_cache.q + dst, k_cache.scale + dst / hd);
    quantize(v + src, v_cache.q + dst, v_cache.scale + dst / hd);
  });
}

void WriteKv(const float* k, const float* v, std::span<const int32_t> slots,
             const KvLayout& layout, float* k_cache, float* v_cache) {
  const int64_t hd = layout.head_dim;
  ForEachKvRow(slots, layout, [&](int64_t src, int64_t dst) {
    std::copy(k + src, k + src + hd, k_cache + dst);
    std::copy(v + src, v + src + hd, v_cache + dst);
  });
}

}  // namespace kestrel::cpu
