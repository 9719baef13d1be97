// Mixture-of-experts layers on the GPU (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE), in four launches
// that need nothing from the host between them, so a decode step stays one CUDA graph:
//
//   MoeRoute     router logits [n, stride] f32 -> per token softmax over the experts, top-k (ties
//                to the lower expert id, as the CPU's partial_sort), optional renormalisation of
//                the k probabilities; then the token rows grouped by expert: expert_begin, the
//                list of experts that got rows, each permuted row's token and each (token, j)'s
//                permuted row. Two kernels (a warp per token, then one block grouping), or for
//                steps of up to 8 tokens both in one block.
//   MoeLinear    y[r, :] = x[row(r), :] . W_e^T for every permuted row r of every routed expert
//                e: a grouped form of the skinny tensor-core kernel (linear.h) in which a block
//                streams rows of one expert's matrix once for up to 64 of that expert's token
//                rows per pass: 16 rows with its 8 warps splitting k (k > 1024), or 128 rows, a
//                warp per 16 over all of k (k <= 1024, where a k split leaves warps idle). Only
//                the experts that received tokens are read: a batch-1 decode step reads top_k
//                experts per layer, not all of them.
//   (SiluMul of activation.h between the two expert GEMMs, on the n*top_k permuted rows.)
//   MoeCombine   out[t, :] = sum over the token's experts in increasing expert id of
//                w_j * y[pos(t, j), :]  (+ sigmoid(shared_gate[t]) * shared[t, :]),
//                the order cpu_decoder.cpp adds them in; a thread per output element.
//   A shared expert of the routed experts' shape may ride along as one more expert (MoeRoute's
//   shared slot), so its GEMMs are the grouped ones.
//   Prefill steps run the expert GEMMs as MoeGroupedGemm (moe_gemm.h) instead: tiles of 128 rows
//   of one expert on the tensor cores, numbered by tile_begin, which MoeRoute also writes.
//
// Determinism: the counting sort places rows with atomics, so the order of one expert's rows may
// differ between runs, but no value depends on it: MoeLinear computes each row from that row's x
// alone with a fixed k split (as SkinnyLinear), and MoeCombine sums in a fixed order. So the
// outputs are bitwise reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// The largest expert count MoeRoute handles (a warp holds a token's probabilities, 16 per lane).
inline constexpr int32_t kMoeMaxExperts = 512;
inline constexpr int32_t kMoeMaxTopK = 32;

// Device arrays of one layer's routing (reused by every MoE layer of a step). With MoeRoute's
// shared slot, top_k reads top_k + 1 and n_experts reads n_experts + 1 in these sizes.
struct MoeRouting {
  int32_t* topk_ids = nullptr;      // [n, top_k] expert of the token's j-th choice
  float* topk_w = nullptr;          // [n, top_k] its weight
  int32_t* expert_begin = nullptr;  // [n_experts + 1] first permuted row of each expert
  int32_t* active = nullptr;        // [n_experts (+1)] experts with rows, increasing; then unused
  int32_t* n_active = nullptr;      // [1]
  int32_t* rows = nullptr;          // [n * top_k] token of each permuted row
  int32_t* pos = nullptr;           // [n * top_k] permuted row of (token, j)
  int32_t* tile_begin = nullptr;    // [n_experts + 1] first MoeGroupedGemm tile of each expert
};

// logits: [n, logits_stride] f32, the router's n_experts columns first. n >= 1,
// 1 <= top_k <= min(n_experts, kMoeMaxTopK), n_experts <= kMoeMaxExperts. When active_log is not
// null, the number of experts that received rows is also written to *active_log (statistics:
// expert bytes a step actually reads).
//
// shared_slot: the shared expert rides along as expert n_experts (its weights stored after the
// routed ones, same shapes): every token gets a (top_k+1)-th pick of it, weighted
// sigmoid(logits[t, n_experts]) (the shared gate's column), after the top_k renormalisation.
// Then ids/w hold top_k + 1 picks per token, the grouping covers n_experts + 1 experts, and
// MoeLinear / MoeCombine (with top_k + 1 and no separate shared rows) compute the shared expert
// with the routed ones, bit for bit what the separate path gives: MoeCombine adds it last, as
// the expert of the largest id.
void MoeRoute(const float* logits, int64_t logits_stride, int32_t n, int32_t n_experts,
              int32_t top_k, bool norm_topk_prob, bool shared_slot, const MoeRouting& r,
              int32_t* active_log, cudaStream_t stream);

// y[r, :n_out] = x[x_row(r), :k] . W_e[n_out, k]^T for every permuted row r of each routed
// expert e, where W_e = w + e * n_out * k (experts stored one after the other, row-major) and
// x_row(r) = x_rows[r] (gather; the token rows) or r when x_rows is null (already permuted).
// An expert's rows go through in passes of 8 (one mma column tile), each pass streaming the
// expert's weight slice again (from L2 after the first). max_active bounds the routed experts
// (min(n_experts, n * top_k)); it sizes the grid. k a multiple of 8, x and w 16-byte aligned.
void MoeLinear(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k, const __nv_bfloat16* w,
               int32_t n_out, const MoeRouting& r, int32_t max_active, float* y,
               cudaStream_t stream);

// act[r, i] = bf16(silu(g) * u) for i < inter, g and u columns i and inter + i of MoeLinear's
// product with a gate|up matrix (W_e = w + e * 2 * inter * k: inter gate rows, then inter up
// rows): bitwise MoeLinear(..., n_out = 2 * inter, y) followed by SiluMul(y, ..., act), in one
// launch without y (each block reads gate rows and the up rows of the same activations).
void MoeLinearSiluMul(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k,
                      const __nv_bfloat16* w, int32_t inter, const MoeRouting& r,
                      int32_t max_active, __nv_bfloat16* act, cudaStream_t stream);

// out[t, :hidden] = sum_j topk_w[t, j] * y[pos[t, j], :] over j by increasing expert id, then
// + sigmoid(shared_gate[t * shared_gate_stride]) * shared[t, :] when shared is not null.
// top_k <= kMoeMaxTopK + 1 (the routing's picks, a shared slot included).
void MoeCombine(const float* y, const MoeRouting& r, int32_t n, int32_t top_k, int32_t hidden,
                const float* shared, const float* shared_gate, int64_t shared_gate_stride,
                float* out, cudaStream_t stream);

}  // namespace kestrel::cuda
