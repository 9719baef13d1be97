// CPU ops of the dense decoder forward, in f32 from weights in their file dtype (F32/F16/BF16).
//
// Two kernel sets behind one dispatch (OpContext::kernels):
//   kReference  plain scalar loops, one thread, sequential f32 sums: the numerical reference for
//               every fast path here and for the CUDA kernels.
//   kAvx2       AVX2/FMA/F16C kernels (files *_avx2.cpp), threaded over output rows / heads with
//               the ThreadPool. Selected only when CpuHasAvx2Fma() (checked at run time).
// Both sets are deterministic: every output element is computed by one thread in a fixed order,
// so results do not depend on the thread count. Cheap element-wise ops (norms, RoPE) have a
// single implementation shared by both sets; SiLU, whose exp dominates it, has both.
//
// Weights are TensorViews into the mmapped safetensors: possibly unaligned, never written.
// Activations are f32, row-major, contiguous; shapes are given in the comments.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace kestrel::cpu {

enum class KernelSet : uint8_t { kReference, kAvx2 };

std::string_view KernelSetName(KernelSet k);

// AVX2 + FMA + F16C available on this CPU (and the OS saves YMM state).
bool CpuHasAvx2Fma();
// AVX-512 F / BW / VL / DQ available too (and the OS saves its state). Avx512ByDefault(): it is,
// and KESTREL_CPU_AVX512 is not 0.
bool CpuHasAvx512();
bool Avx512ByDefault();

// The builds of the kAvx2 set's integer dot products (block-quantized weights against int8
// activations): plain AVX2, or with a VNNI extension's vpdpbusd (AVX-VNNI, VEX-encoded; or
// AVX512-VNNI on 256-bit registers). All give the same bits; the VNNI ones take fewer instructions
// for Q8_0 / Q4_0 / Q5_0 / IQ4_NL. Int8DotIsaInUse() is the best this CPU supports, or what
// KESTREL_CPU_VNNI names (0 or avx2, avxvnni, avx512vnni) when this CPU supports it.
enum class Int8DotIsa : uint8_t { kAvx2, kAvxVnni, kAvx512Vnni };
std::string_view Int8DotIsaName(Int8DotIsa isa);
bool CpuSupports(Int8DotIsa isa);
Int8DotIsa Int8DotIsaInUse();

struct OpContext {
  KernelSet kernels = KernelSet::kReference;
  ThreadPool* pool = nullptr;  // used by the fast paths; null means the calling thread only
  // Block-quantized weights (GGUF Q8_0/Q4_K/Q5_K/Q6_K) meet int8-quantized activations in integer
  // dot products, as llama.cpp computes them on the CPU (core/quant_blocks.h; both kernel sets give
  // the same bits). false: f32 activations against the exactly dequantized weights, equal bit
  // for bit to the same model with f32 weights (slower).
  bool int8_activations = true;
  // Batch-invariant mode (`--deterministic`): every Linear takes the streaming kernel, whose
  // result for a token row does not depend on how many rows share the call (the packed kernel
  // of larger batches sums k in another order), so a request's logits are the same bits whatever
  // else is batched with it. Costs prefill speed.
  bool batch_invariant = false;
  // Which build of the integer kernels runs (all give the same bits); tests set each in turn.
  Int8DotIsa int8_isa = Int8DotIsaInUse();
  // The kAvx2 set's attention and packed (prefill) Linear kernel take 512-bit registers where
  // the CPU has AVX-512 (the same bits; tests set both).
  bool avx512 = Avx512ByDefault();
};

// ---- Linear layers --------------------------------------------------------------------------

// y = x W^T (+ b):  y[m, n] = sum_k x[m, k] * w[n, k] + bias[n]
//   x    [m_rows, k] f32
//   w    [n, k]      F32/F16/BF16 (2-D view)
//   bias [n]         F32/F16/BF16, or an empty view for none
//   y    [m_rows, n] f32 (must not alias x)
// Reference: for each (m, n) a sequential f32 sum over k (no FMA), then + bias.
// Fast: m_rows <= kDirectMaxRows streams W once per call with 8-lane partial sums (decode and
// small decode batches); larger batches use a packed, cache-blocked micro-kernel (prefill).
void Linear(const OpContext& ctx, const float* x, int64_t m_rows, const TensorView& w,
            const TensorView& bias, float* y);

// Several Linear ops over the same number of token rows, run as one parallel region (one thread
// wake-up for the group instead of one per op; chunks of all jobs are shared out dynamically).
// Results are bit-identical to calling Linear on each job.
struct LinearJob {
  const float* x = nullptr;            // [m_rows, k]
  const TensorView* w = nullptr;       // [n, k]
  const TensorView* bias = nullptr;    // [n] or null / empty
  float* y = nullptr;                  // [m_rows, n]
};
inline constexpr int kMaxLinearGroup = 4;
void LinearGroup(const OpContext& ctx, int64_t m_rows, std::span<const LinearJob> jobs);

// Token rows up to which the fast Linear uses the streaming (matvec-like) kernel. Measured on a
// 2-core Zen 3: the streaming kernel (tiles of 3 weight rows x 4 tokens, 12 accumulators) beats
// packing up to ~32 rows; above that x no longer stays in L2 and the packed kernel wins.
inline constexpr int64_t kDirectMaxRows = 16;

// ---- Block-quantized rows interleaved for the AVX2 integer kernels -------------------------
//
// A Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS, Q3_K or Q2_K matrix with rows % 8 == 0
// can be repacked at load: rows in groups of 8, the groups one after another, and within a group
// one packed block per block of the format, in order. Q4_K (256 elements; kQ4_KPackedBlockBytes,
// 1,184 bytes for 8 rows: 2.8 % more than Q4_K's 8 x 144):
//   [4 c][8 j][8 rows][4 bytes]  bytes 4j..4j+3 of each row's 32-byte nibble run c: elements
//                                4j..4j+3 of its groups 2c (low nibbles) and 2c + 1 (high)
//   [8 rows] f16 d, then [8 rows] f16 dmin
//   [8 g][8 rows] u8 scale, then [8 g][8 rows] u8 min (the 12 packed bytes, unpacked)
// Q5_K (256 elements; kQ5_KPackedBlockBytes, 1,440 bytes for 8 rows: 2.3 % more than 8 x 176):
//   the nibbles as Q4_K's, then [8 j][8 rows][4 bytes] qh bytes 4j..4j+3 of each row (bit g: the
//   fifth bit of element 4j.. of group g), then d, dmin, scales and mins as Q4_K's
// Q8_0 (32 elements; kQ8_0PackedBlockBytes, 272 bytes for 8 rows, as many as 8 x 34):
//   [8 j][8 rows][4 bytes]  elements 4j..4j+3 of each row
//   [8 rows] f16 d
// Q4_0, IQ4_NL and Q5_0 (32 elements; 8 x 18 and 8 x 22 bytes, as the file's):
//   [4 i][8 rows][4 bytes]  nibble bytes 4i..4i+3 of each row: elements 4i..4i+3 (low nibbles)
//                           and 16 + 4i..16 + 4i + 3 (high)
//   Q5_0 only: [8 rows] u32 qh
//   [8 rows] f16 d
// IQ4_XS (256 elements; kIq4XsPackedBlockBytes, 1,104 bytes for 8 rows: 1.5 % more than 8 x 136):
//   [8 ib][4 i][8 rows][4 bytes]  nibble bytes 4i..4i+3 of each row's group ib: its elements
//                                 4i..4i+3 (low nibbles) and 16 + 4i.. (high)
//   [8 rows] f16 d, then [8 ib][8 rows] int8 ls - 32 (the split 6-bit scales, unpacked)
// Q3_K (256 elements; kQ3_KPackedBlockBytes, 912 bytes for 8 rows: 3.6 % more than 8 x 110):
//   [2 n][8 i][8 rows][4 bytes]  qs bytes 32n + 4i..4i+3 of each row: the low bits of elements
//                                128n + 32j + 4i.. at bits 2j (j < 4)
//   [8 i][8 rows][4 bytes]       hmask bytes 4i..4i+3 (bit 4n + j: the third bit of the same)
//   [8 rows] f16 d, then [16 g][8 rows] int8 sc - 32
// Q6_K (256 elements; kQ6_KPackedBlockBytes, 1,680 bytes for 8 rows, as many as 8 x 210):
//   [2 n][2 h][8 i][8 rows][4 bytes]  ql bytes 64n + 32h + 4i..4i+3 of each row: the low 4 bits
//                                     of elements 128n + 32h + 4i.. (low nibbles) and
//                                     128n + 64 + 32h + 4i.. (high)
//   [2 n][8 i][8 rows][4 bytes]       qh bytes 32n + 4i..4i+3 (bits 2j, 2j + 1: the high 2 bits
//                                     of elements 128n + 32j + 4i..)
//   [8 rows] f16 d, then [16 g][8 rows] int8 sc
// Q2_K (256 elements; kQ2_KPackedBlockBytes, 672 bytes for 8 rows, as many as 8 x 84):
//   [2 n][8 i][8 rows][4 bytes]  qs bytes 32n + 4i..4i+3 of each row: the 2-bit codes of
//                                elements 128n + 32j + 4i.. at bits 2j (j < 4)
//   [8 rows] f16 d, then [8 rows] f16 dmin, then [16 g][8 rows] the scale byte (sc | m << 4)
// With it the AVX2 integer kernels compute 8 rows per pass over an activation block, the lanes
// of their vectors being the rows, so the activations are loaded (and broadcast) and the block's
// scales decoded once for the 8 rows; every row still gets the same integers and the same float
// operations as the format's row kernel (quant_blocks.h), so the same bits.
// TensorView::cpu_packed points at the packed copy.
inline constexpr int64_t kQ4_KPackedBlockBytes = 8 * 144 + 32;
inline constexpr int64_t kQ8_0PackedBlockBytes = 8 * 34;
inline constexpr int64_t kQ4_0PackedBlockBytes = 8 * 18, kQ5_0PackedBlockBytes = 8 * 22;
inline constexpr int64_t kIq4XsPackedBlockBytes = 8 * 128 + 16 + 64;
inline constexpr int64_t kQ3_KPackedBlockBytes = 8 * 64 + 8 * 32 + 16 + 128;
inline constexpr int64_t kQ6_KPackedBlockBytes = 8 * 128 + 8 * 64 + 16 + 128;
inline constexpr int64_t kQ2_KPackedBlockBytes = 8 * 64 + 16 + 16 + 128;
inline constexpr int64_t kQ5_KPackedBlockBytes = 8 * 128 + 8 * 32 + 32 + 128;
// The packed block size of a packable dtype (kQ4_K, kQ5_K, kQ6_K, kQ8_0, kQ4_0, kQ5_0, kIQ4_NL,
// kIQ4_XS, kQ3_K, kQ2_K); 0 for every other dtype.
constexpr int64_t PackedBlockBytes(DType t) {
  return t == DType::kQ4_K                          ? kQ4_KPackedBlockBytes
         : t == DType::kQ4_0 || t == DType::kIQ4_NL ? kQ4_0PackedBlockBytes
         : t == DType::kQ5_0                        ? kQ5_0PackedBlockBytes
         : t == DType::kIQ4_XS                      ? kIq4XsPackedBlockBytes
         : t == DType::kQ3_K                        ? kQ3_KPackedBlockBytes
         : t == DType::kQ6_K                        ? kQ6_KPackedBlockBytes
         : t == DType::kQ2_K                        ? kQ2_KPackedBlockBytes
         : t == DType::kQ5_K                        ? kQ5_KPackedBlockBytes
         : t == DType::kQ8_0                        ? kQ8_0PackedBlockBytes
                                                    : 0;  // not packable
}
// Whether w (2-D, one of PackedBlockBytes' dtypes, rows % 8 == 0) can be packed, and its packed
// size in bytes.
bool CanPackRows(const TensorView& w);
int64_t PackedRowsBytes(const TensorView& w);
// Writes the packed copy of w to out (PackedRowsBytes(w) bytes).
void PackRows(const TensorView& w, uint8_t* out);

// ---- Element-wise (shared by both kernel sets) ----------------------------------------------

// out[i, :] = f32(table[ids[i], :])
//   table [vocab, d] F32/F16/BF16;  out [ids.size(), d]
void EmbeddingGather(const TensorView& table, std::span<const int32_t> ids, float* out);

// y[r, :] = (weight_offset + w) * (x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps)), as transformers'
// LlamaRMSNorm in f32 (offset 0: the weight multiplies the normalised value) or the zero-centred
// Qwen3-Next / Qwen3.5 norm (offset 1: 1 + w). y may alias x.
//   x, y [n_rows, d];  w [d] F32/F16/BF16
void RmsNorm(const float* x, int64_t n_rows, int64_t d, const TensorView& w, float eps, float* y,
             float weight_offset = 0.0f);

// RoPE tables for the tokens of a batch, computed as transformers does in f32:
// freq = f32(position) * inv_freq[i]; cos = cos(freq) * attention_scaling; same for sin.
//   positions [n_tokens];  inv_freq [n_half];  cos_out, sin_out [n_tokens, n_half]
void RopeTables(std::span<const int32_t> positions, std::span<const float> inv_freq,
                float attention_scaling, float* cos_out, float* sin_out);

// Rotates the first 2*n_half dims of every head in place, HF rotate_half convention (pairs
// (i, i + n_half), not interleaved): x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin.
//   x [n_tokens, n_heads, head_dim];  cos, sin [n_tokens, n_half];  2*n_half <= head_dim
void ApplyRope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin, int64_t n_half);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).  out may alias gate or up.
// Reference: scalar expf; fast: vectorised exp (within a few ulp).
void SiluMul(const OpContext& ctx, const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i]
void AddInPlace(float* x, const float* y, int64_t n);

// ---- Paged attention ------------------------------------------------------------------------
//
// K/V pool layout, one pair per layer:
//   k_cache, v_cache [n_blocks, n_kv_heads, block_size, head_dim] f32
// A slot is block * block_size + offset; the token at position p of a sequence lives at slot
// block_table[p / block_size] * block_size + p % block_size. Within a block each kv head's rows
// are contiguous (block_size * head_dim floats), so attention, which reads one kv head across
// many positions, streams whole blocks instead of striding by n_kv_heads * head_dim floats
// (a page apart at 8 x 128 heads). A block is still one contiguous
// n_kv_heads * block_size * head_dim range, so blocks can be copied or swapped as units.
struct KvLayout {
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int32_t block_size_tokens = 16;
  int64_t n_blocks = 0;

  int64_t n_slots() const { return n_blocks * block_size_tokens; }
  int64_t floats_per_block() const { return n_kv_heads * block_size_tokens * head_dim; }
  // Offset of the row of (slot, kv_head) in a cache array.
  int64_t RowOffset(int64_t slot, int64_t kv_head) const {
    const int64_t block = slot / block_size_tokens;
    const int64_t offset = slot % block_size_tokens;
    return ((block * n_kv_heads + kv_head) * block_size_tokens + offset) * head_dim;
  }
};

// One layer's K (or V) cache: f32 rows, or int8 rows with an f32 scale per row (the int8 KV
// cache, --kv-cache-dtype int8: element = q * scale, q = round-to-even(x / scale) with
// scale = max|row| / 127, 0 for an all-zero row). Rows are laid out by KvLayout in both; the
// scale of the row at element offset o is scale[o / head_dim].
struct KvRows {
  const float* f32 = nullptr;
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const uint16_t* bf16 = nullptr;  // bf16 rows (the upper halves of the f32 values)
};
struct KvRowsOut {
  float* f32 = nullptr;
  int8_t* q = nullptr;
  float* scale = nullptr;
  uint16_t* bf16 = nullptr;
};

// Row (slots[t], h) of k_cache = k[t, h, :]; same for v.
//   k, v [n_tokens, n_kv_heads, head_dim];  slots [n_tokens] < layout.n_slots()
void WriteKv(const float* k, const float* v, std::span<const int32_t> slots,
             const KvLayout& layout, float* k_cache, float* v_cache);
// The same into f32, int8 or bf16 caches (bf16: each value rounded to nearest even, F32ToBf16).
void WriteKv(const float* k, const float* v, std::span<const int32_t> slots,
             const KvLayout& layout, const KvRowsOut& k_cache, const KvRowsOut& v_cache);

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads; query head h reads kv head h / (n_heads/n_kv_heads)
  int64_t head_dim = 0;
  float scale = 1.0f;          // multiplies q.k (1/sqrt(head_dim))
  int64_t sliding_window = 0;  // > 0: position p attends (p - window, p]; 0: all of [0, p]
  int32_t block_size_tokens = 16;
  int64_t n_blocks = 0;  // blocks in the pool, for bounds checks

  KvLayout layout() const { return {n_kv_heads, head_dim, block_size_tokens, n_blocks}; }
};

// The sequences of a flattened batch, as attention needs them (see models/batch.h).
struct AttentionBatch {
  std::span<const int32_t> positions;     // [n_tokens]
  std::span<const int32_t> seq_starts;    // [n_seqs + 1]
  std::span<const int32_t> block_tables;  // [n_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
};

// Causal attention of every token over positions [0, position] (window-limited) of its own
// sequence, read through the block table (pool layout: KvLayout). The K/V of this batch must
// already be written.
// Softmax in f32 with max subtraction (scores * scale, exp(s - max) / sum).
//   q   [n_tokens, n_heads, head_dim];  out [n_tokens, n_heads, head_dim]
//   scratch: at least AttentionScratchFloats(...) floats (per-thread score rows)
void PagedAttention(const OpContext& ctx, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const float* k_cache, const float* v_cache, float* out,
                    std::span<float> scratch);
// The same over f32 or int8 caches (int8 rows are dequantized, q * scale in f32, as they are
// read: both kernel sets see the same floats).
void PagedAttention(const OpContext& ctx, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch);

// Scratch floats PagedAttention needs for contexts up to max_context_tokens.
int64_t AttentionScratchFloats(const OpContext& ctx, const AttentionShape& shape,
                               int64_t max_context_tokens);

}  // namespace kestrel::cpu
