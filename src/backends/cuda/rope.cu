// QkvRope: one warp per (token, head). Lane l owns the rotation pairs [l * kPairs, (l+1) * kPairs)
// of the head, i.e. elements p and p + half for each, so a pair never crosses lanes and the only
// cross-lane step is the qk-norm sum of squares (a warp shuffle reduction). kPairs = 1, 2, 4
// covers half = head_dim/2 up to 32, 64, 128 (loads of 4, 8, 16 bytes per half-row per lane; at
// head_dim 16 / 32 only 8 / 16 lanes have pairs). When there is plenty of work a warp handles
// several heads of one token, computing the token's cos/sin once.
#include "backends/cuda/rope.h"

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_cache.cuh"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/vec_io.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxHeadDim = 256;

struct QkvRopeArgs {
  const float* qkv;               // [n, n_total_heads * head_dim]
  const __nv_bfloat16* qkv_bias;  // [n_total_heads * head_dim] or null
  const __nv_bfloat16* q_norm;    // [head_dim] or null
  const __nv_bfloat16* k_norm;    // [head_dim] or null
  const int32_t* positions;       // [n]
  const float* inv_freq;          // [half]
  const int32_t* slot_mapping;    // [n]
  __nv_bfloat16* q_out;           // [n, n_heads, head_dim]
  KvCacheOut kv;                  // [n_blocks, n_kv_heads, bs, head_dim] (+ row scales)
  int32_t n_heads, n_kv_heads, head_dim, half, block_size;
  int32_t heads_per_warp;
  float eps, attention_scaling;
};


// grid = (n tokens, ceil(n_total_heads / (kWarpsPerBlock * heads_per_warp))), block = 8 warps.
// Launched with PDL (pdl.cuh): waits before the early return below.
template <int kPairs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) QkvRopeKernel(QkvRopeArgs a) {
  PdlWait();
  PdlLaunchDependents();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n_total = a.n_heads + 2 * a.n_kv_heads;
  const int head_begin = (blockIdx.y * kWarpsPerBlock + warp) * a.heads_per_warp;
  if (head_begin >= n_total) return;  // whole warp: the shuffles below stay full-warp
  const int head_end = min(head_begin + a.heads_per_warp, n_total);

  const int64_t t = blockIdx.x;
  const int hd = a.head_dim;
  const int half = a.half;
  const int p0 = lane * kPairs;  // first pair of this lane; half % kPairs == 0
  const bool active = p0 < half;
  const float* row = a.qkv + t * static_cast<int64_t>(n_total) * hd;
  const int64_t slot = a.slot_mapping[t];

  float c[kPairs], s[kPairs];
  bool have_trig = false;
  for (int h = head_begin; h < head_end; ++h) {
    const bool is_q = h < a.n_heads;
    const bool is_v = h >= a.n_heads + a.n_kv_heads;
    float x1[kPairs], x2[kPairs];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) x1[k] = x2[k] = 0.0f;  // inactive lanes add 0 to the sum
    if (active) {
      const float* src = row + static_cast<int64_t>(h) * hd;
      LoadF32<kPairs>(src + p0, x1);
      LoadF32<kPairs>(src + half + p0, x2);
      if (a.qkv_bias != nullptr) {
        const __nv_bfloat16* b = a.qkv_bias + static_cast<int64_t>(h) * hd;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          x1[k] = __fadd_rn(x1[k], __bfloat162float(b[p0 + k]));
          x2[k] = __fadd_rn(x2[k], __bfloat162float(b[half + p0 + k]));
        }
      }
    }
    if (!is_v) {
      const __nv_bfloat16* norm = is_q ? a.q_norm : a.k_norm;
      if (norm != nullptr) {  // warp-uniform: every lane reaches the shuffles
        float sum_sq = 0.0f;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          sum_sq = fmaf(x1[k], x1[k], sum_sq);
          sum_sq = fmaf(x2[k], x2[k], sum_sq);
        }
        sum_sq = WarpSum(sum_sq);
        // As cpu::RmsNorm: 1.0f / sqrt(sum / d + eps), then w * (x * inv_rms), IEEE rounding.
        const float inv_rms = __fdiv_rn(
            1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(hd)), a.eps)));
        if (active) {
#pragma unroll
          for (int k = 0; k < kPairs; ++k) {
            x1[k] = __fmul_rn(__bfloat162float(norm[p0 + k]), __fmul_rn(x1[k], inv_rms));
            x2[k] = __fmul_rn(__bfloat162float(norm[half + p0 + k]), __fmul_rn(x2[k], inv_rms));
          }
        }
      }
      if (active) {
        if (!have_trig) {
          // As cpu::RopeTables: the angle is one f32 product; accurate sincosf (not __sinf,
          // which is wrong for the large angles of late positions).
          const float pos = static_cast<float>(a.positions[t]);
#pragma unroll
          for (int k = 0; k < kPairs; ++k) {
            float sn, cs;
            sincosf(__fmul_rn(pos, a.inv_freq[p0 + k]), &sn, &cs);
            c[k] = __fmul_rn(cs, a.attention_scaling);
            s[k] = __fmul_rn(sn, a.attention_scaling);
          }
          have_trig = true;
        }
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float r1 = __fsub_rn(__fmul_rn(x1[k], c[k]), __fmul_rn(x2[k], s[k]));
          const float r2 = __fadd_rn(__fmul_rn(x2[k], c[k]), __fmul_rn(x1[k], s[k]));
          x1[k] = r1;
          x2[k] = r2;
        }
      }
    }
    if (is_q) {
      if (!active) continue;
      __nv_bfloat16* dst = a.q_out + (t * a.n_heads + h) * hd;
      StoreBf16<kPairs>(dst + p0, x1);
      StoreBf16<kPairs>(dst + half + p0, x2);
      continue;
    }
    if (slot < 0) continue;  // padding token: no K/V (warp-uniform)
    const int kv_head = is_v ? h - a.n_heads - a.n_kv_heads : h - a.n_heads;
    const int64_t block = slot / a.block_size;
    const int64_t offset = slot % a.block_size;
    const int64_t cache_row = (block * a.n_kv_heads + kv_head) * a.block_size + offset;
    if (a.kv.type == KvCacheType::kBf16) {
      if (!active) continue;
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(is_v ? a.kv.v : a.kv.k) + cache_row * hd;
      StoreBf16<kPairs>(dst + p0, x1);
      StoreBf16<kPairs>(dst + half + p0, x2);
      continue;
    }
    // Quantized row: the warp's max |x| (inactive lanes hold zeros), then the codes.
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < kPairs; ++k) amax = fmaxf(amax, fmaxf(fabsf(x1[k]), fabsf(x2[k])));
    const float scale = KvRowScale(WarpMax(amax), a.kv.type);
    if (lane == 0) (is_v ? a.kv.v_scale : a.kv.k_scale)[cache_row] = scale;
    if (!active) continue;
    uint8_t* dst = static_cast<uint8_t*>(is_v ? a.kv.v : a.kv.k) + cache_row * hd;
    StoreKvCodes<kPairs>(dst + p0, x1, scale, a.kv.type);
    StoreKvCodes<kPairs>(dst + half + p0, x2, scale, a.kv.type);
  }
}

bool AlignedTo(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

void QkvRope(const float* qkv /*[n, (n_heads + 2*n_kv_heads) * head_dim]*/,
             const __nv_bfloat16* qkv_bias /*[(n_heads + 2*n_kv_heads) * head_dim] or nullptr*/,
             const __nv_bfloat16* q_norm /*[head_dim] or nullptr*/,
             const __nv_bfloat16* k_norm /*[head_dim] or nullptr*/,
             const int32_t* positions /*[n] device*/,
             const float* inv_freq /*[rotary_half] device*/,
             const int32_t* slot_mapping /*[n] device*/, int64_t n, const QkvRopeShape& shape,
             __nv_bfloat16* q_out /*[n, n_heads, head_dim]*/, const KvCacheOut& kv,
             cudaStream_t stream) {
  KCHECK(shape.n_heads > 0 && shape.n_kv_heads > 0);
  KCHECK(shape.head_dim > 0 && shape.head_dim % 2 == 0 && shape.head_dim <= kMaxHeadDim);
  // Partial rotary (rotary_half < head_dim/2) is not supported by this kernel's pair layout.
  KCHECK(shape.rotary_half * 2 == shape.head_dim);
  KCHECK(shape.block_size_tokens > 0);
  KCHECK(n >= 0 && n <= INT32_MAX);  // grid.x
  if (n == 0) return;
  KCHECK(qkv != nullptr && positions != nullptr && inv_freq != nullptr && slot_mapping != nullptr &&
         q_out != nullptr && kv.k != nullptr && kv.v != nullptr);
  KCHECK(!KvCacheQuantized(kv.type) || (kv.k_scale != nullptr && kv.v_scale != nullptr));
  const int half = shape.rotary_half;
  const int pairs = half <= 32 ? 1 : half <= 64 ? 2 : 4;
  KCHECK_MSG(half % pairs == 0, "head_dim/2 must be even above 32 and a multiple of 4 above 64");
  KCHECK(AlignedTo(qkv, 16) && AlignedTo(q_out, 8) && AlignedTo(kv.k, 8) && AlignedTo(kv.v, 8));

  const int n_total = shape.n_heads + 2 * shape.n_kv_heads;
  // Few (token, head) items (decode): one head per warp, for the most warps in flight. Many
  // (prefill): 4 heads per warp, sharing the token's cos/sin.
  const int heads_per_warp = n * n_total >= 8192 ? 4 : 1;
  const int heads_per_block = kWarpsPerBlock * heads_per_warp;
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>((n_total + heads_per_block - 1) / heads_per_block));
  const QkvRopeArgs args{qkv,
                         qkv_bias,
                         q_norm,
                         k_norm,
                         positions,
                         inv_freq,
                         slot_mapping,
                         q_out,
                         kv,
                         shape.n_heads,
                         shape.n_kv_heads,
                         shape.head_dim,
                         half,
                         shape.block_size_tokens,
                         heads_per_warp,
                         shape.qk_norm_eps,
                         shape.attention_scaling};
  auto* kernel = pairs == 1 ? &QkvRopeKernel<1> : pairs == 2 ? &QkvRopeKernel<2> : &QkvRopeKernel<4>;
  LaunchPdl(kernel, grid, dim3(kWarpsPerBlock * 32), 0, stream, args);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
