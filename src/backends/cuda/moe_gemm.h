// Grouped GEMM of the routed experts for prefill: every expert's block of permuted rows (the
// grouping of moe.h, 50-500 rows per expert at prefill) times that expert's weight matrix, in one
// launch for all experts, on the tensor cores, with nothing read back to the host (so it can be
// captured in a CUDA graph). MoeLinear (moe.h) streams each expert's weights once per 64 rows,
// which suits decode; with hundreds of rows per expert a tiled GEMM that reuses each weight tile
// staged in shared memory for 128 rows does far less traffic per flop.
//
// The work is cut into tiles of kMoeGemmTileRows rows of one expert (an expert's last tile may be
// partial, a tile never spans two experts). tile_begin numbers them: expert e owns tiles
// [tile_begin[e], tile_begin[e + 1]). It is a device array like expert_begin; the host only
// needs an upper bound of its total to size the grid, e.g. (rows + 127 * min(n_experts, rows)) /
// 128 for `rows` routed rows.
//
// Deterministic: every output element is one thread's accumulator over k in increasing order,
// computed from its own x row and W row only; no atomics, no split of k.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// Rows of an expert's tile; tile_begin counts tiles of this many rows.
inline constexpr int32_t kMoeGemmTileRows = 128;

// y[r, :n_out] = x[x_row(r), :k] . W_e[n_out, k]^T for every permuted row r in
// [expert_begin[e], expert_begin[e+1]) of every expert e, W_e = w + e * n_out * k (experts one
// after the other, row-major bf16), x_row(r) = x_rows[r] when x_rows is not null (gather) else r.
// tile_begin [n_experts + 1] (device) = prefix sums of ceil(m_e / kMoeGemmTileRows), m_e =
// expert_begin[e+1] - expert_begin[e]; max_tiles (host) >= tile_begin[n_experts] sizes the grid
// (blocks past the real tile count exit). k a multiple of 8, n_out >= 1, x and w 16-byte aligned,
// y f32 row-major [*, n_out] with n_out even. Only rows of routed experts are written.
void MoeGroupedGemm(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k,
                    const __nv_bfloat16* w, int32_t n_out, const int32_t* expert_begin,
                    const int32_t* tile_begin, int32_t n_experts, int32_t max_tiles, float* y,
                    cudaStream_t stream);

}  // namespace kestrel::cuda
