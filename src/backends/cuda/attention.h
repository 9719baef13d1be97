// Paged attention on the GPU: the CUDA counterpart of cpu::PagedAttention (backends/cpu/ops.h),
// same semantics and the same K/V pool layout, in bf16 with f32 softmax. The cache holds bf16
// rows, or e4m3 / int8 codes with an f32 scale per row (kv_cache.h): the decode path multiplies
// codes by their scale in f32 (the scores by the K row's, the probabilities by the V row's); the
// prefill path feeds the codes, exact in bf16, to the tensor cores and applies the same scales
// to the f32 scores and, before their bf16 rounding, to the probabilities.
//
// Every token attends causally over positions [0, position] of its own sequence (with
// sliding_window > 0: (position - window, position]), read through the sequence's block table;
// query head h reads kv head h / (n_heads / n_kv_heads). The K/V of this batch must already be
// in the cache.
//
// Two paths, picked by the host-known max_query_len:
//   == 1  decode: split-K flash-decoding (attention_decode.cu). Each split covers a fixed range
//         of kDecodeSplitTokens absolute positions, so a sequence's result depends only on its
//         own context: bitwise the same alone or inside any batch (batch invariance).
//   >  1  prefill / mixed: FlashAttention-2 style on tensor cores (attention_prefill.cu); with
//         decode_rows_apart the one-token sequences of a mixed batch take the decode path.
// Both are deterministic (no atomics, fixed reduction orders) and CUDA-graph capturable: all
// per-step data are read from device memory, and the grids depend only on n_tokens, n_seqs,
// n_heads and max_context_len.
//
// Includable from plain host code (g++): CUDA runtime and bf16 headers only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kv_cache.h"

namespace kestrel::cuda {

struct PagedAttentionParams {
  const __nv_bfloat16* q = nullptr;        // [n_tokens, n_heads, head_dim]
  const void* k_cache = nullptr;  // [n_blocks, n_kv_heads, block_size, head_dim] of kv_type
  const void* v_cache = nullptr;  // [n_blocks, n_kv_heads, block_size, head_dim] of kv_type
  const float* k_scale = nullptr;  // quantized kv_type: [n_blocks, n_kv_heads, block_size]
  const float* v_scale = nullptr;
  KvCacheType kv_type = KvCacheType::kBf16;
  __nv_bfloat16* out = nullptr;            // [n_tokens, n_heads, head_dim]
  const int32_t* positions = nullptr;      // [n_tokens] absolute position of each token
  const int32_t* seq_starts = nullptr;     // [n_seqs + 1] tokens of seq s: [seq_starts[s], [s+1])
  const int32_t* context_lens = nullptr;   // [n_seqs] tokens in the cache for seq s
  const int32_t* block_tables = nullptr;   // [n_seqs, max_blocks_per_seq] physical block ids
  int32_t max_blocks_per_seq = 0;
  int32_t n_tokens = 0, n_seqs = 0;
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim in {16, 32, 64, 128, 256}
  int32_t block_size = 16;                            // tokens per KV block, a multiple of 16
  float scale = 1.0f;                                 // multiplies q.k
  int32_t sliding_window = 0;                         // > 0: attend (p - window, p]; 0: [0, p]
  int32_t max_query_len = 0;    // host-known: max tokens of one sequence in the batch (1 = decode)
  // max_query_len > 1: the sequences with exactly one token in this batch (decodes beside
  // prefill chunks) take the decode path, as in an all-decode step, and the prefill kernel the
  // others. Needs a decode workspace of n_seqs rows (PagedAttentionWorkspaceBytes(n_seqs, ...)).
  bool decode_rows_apart = false;
  int32_t max_context_len = 0;  // host-known: upper bound of every position + 1 (graph bucket)
};

// Positions covered by one decode split (a constant: see the batch-invariance note above); the
// tensor-core kernel's quantized caches at head_dim 128 take twice as many, a constant of the
// cache type and head dim. The workspace is sized for this one, the larger count of splits.
inline constexpr int32_t kDecodeSplitTokens = 256;

// Bytes of device workspace PagedAttention needs: the split-K partials of the decode path, one
// row per sequence (the prefill path uses none). max_tokens, max_context_len: the largest values
// any call with this workspace will pass as n_seqs (= n_tokens in an all-decode batch) and
// max_context_len.
size_t PagedAttentionWorkspaceBytes(int32_t max_tokens, int32_t n_heads, int32_t head_dim,
                                    int32_t max_context_len);

// Launches the attention of one layer on `stream` (no allocation, no synchronisation).
// Preconditions (KCHECK): supported head_dim, n_heads % n_kv_heads == 0, block_size % 16 == 0,
// and for decode a workspace of at least PagedAttentionWorkspaceBytes(n_tokens, n_heads,
// head_dim, max_context_len) bytes. Device-side data must satisfy: every position + 1 <=
// max_context_len (the decode combine traps otherwise) and position / block_size <
// max_blocks_per_seq. context_lens is not read: the attended range comes from the positions,
// exactly as in cpu::PagedAttention.
void PagedAttention(const PagedAttentionParams& p, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream);

// Tuning: the decode split kernel has several implementations with identical semantics (each
// batch invariant and deterministic on its own; different variants may differ in the last
// bits). "tensor_cores" (the default) runs where it applies (head_dim 64, 128 or 256, GQA groups of
// up to 16 heads) and "registers" elsewhere; a quantized cache runs "tensor_cores",
// "registers" or "registers_db" (the cp.async variants take "registers").
// Process-wide, read at each launch (a captured graph keeps the variant it captured);
// not meant to change while kernels are being enqueued from other threads.
int DecodeAttentionVariantCount();
const char* DecodeAttentionVariantName(int variant);  // e.g. "cp_async_s4"
void SetDecodeAttentionVariant(int variant);  // 0 <= variant < Count(); default "tensor_cores"
int DecodeAttentionVariant();

// Tuning of the "tensor_cores" decode kernel: the consecutive splits of a (sequence, kv head)
// that one block computes, 1..8, or 0 (the default) to choose by the grid size. It moves work
// between blocks, never changes it: each split's partial is the same bits whatever the value.
// The initial value comes from KESTREL_DECODE_SPLITS_PER_BLOCK. Same threading rules as above.
void SetDecodeSplitsPerBlock(int n);
int DecodeSplitsPerBlock();

// Tuning of the "tensor_cores" decode kernel's register-loaded path (every cache at head_dims 64
// and 256, bf16 at 128): how many of a warp's 16-key chunks ahead are asked of L2 (one bulk
// prefetch of the chunk's K rows and one of its V rows) while the current one is loaded and
// computed, 0..3, or -1 for the built-in choice per head dim. A hint to the memory system: it
// never changes a bit. The initial value comes from KESTREL_DECODE_PREFETCH_AHEAD. Same
// threading rules as above.
void SetDecodePrefetchAhead(int n);
int DecodePrefetchAhead();

// Tuning of the prefill path: its blocks' tile shape, warps x 16-row m-tiles per warp (4 x 1:
// 64 query rows; 4 x 2 and 8 x 1: 128 rows). Every shape gives the same bits (each row's
// operations do not depend on its tile-mates), so auto (the default) may follow the call: 128-row
// tiles where the call's longest query run has 128 rows and they still make two blocks per SM,
// 64-row tiles otherwise. Head_dim 256 runs 8 x 1 for 4 x 2 (two m-tiles of O would not fit the
// registers). The initial value comes from KESTREL_PREFILL_ATTENTION_TILE ("4x1", "4x2", "8x1").
// Same threading rules as above.
enum PrefillAttentionTileShape : int {
  kPrefillTileAuto = 0,
  kPrefillTile4x1 = 1,
  kPrefillTile4x2 = 2,
  kPrefillTile8x1 = 3,
};
void SetPrefillAttentionTile(int shape);
int PrefillAttentionTile();
const char* PrefillAttentionTileName(int shape);

}  // namespace kestrel::cuda
