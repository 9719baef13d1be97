// PagedAttention (CUDA) against cpu::PagedAttention (reference kernels) on the same bf16 inputs:
// decode batches (split-K path), single prefill sequences with and without cached prefixes,
// mixed batches (prefill path), GQA groups 1..16, head dims 16..256, block sizes 16 and 32,
// sliding windows. Every run: output poisoned first (NaN), workspace poisoned (a split the
// combine reads but nobody wrote fails), K/V pool rows outside every sequence's context NaN
// (unused blocks, the tail of each last block, and a poison block that pads the block tables),
// and two runs compared bitwise (determinism). Decode batch invariance: a sequence alone and
// inside a batch of 8 (a larger graph bucket) gives bitwise the same output.
//
// Tolerances (the CPU reference is f32 on the same bf16 inputs; u = 2^-8, bf16's unit roundoff):
//   decode   everything is f32 until the final bf16 rounding of the output, so every element is
//            within u relative (+ f32 noise): per (token, head) row rel L2 <= 5e-3, over the
//            whole output <= 3e-3 (rounding errors average ~u/2), max abs <= 2.5e-3 (|out| < 1:
//            half an ulp is <= 2^-9).
//   prefill  (and the tensor-core decode variant) also rounds the softmax weights P to bf16 for
//            the tensor-core P.V product (the sum l stays f32): another <= u relative per
//            weight, averaging out over keys. Whole output rel L2 <= 1e-2, per row <= 2e-2, max
//            abs <= 8e-3 (2^-9 + u * max|v|).
// Quantized caches (kv_cache.h, fp8 and int8): the host quantizes each bf16 K/V row as the
// write kernels do, the GPU reads the codes and scales, and the reference runs in f32 on the
// dequantized rows (code * scale), so the same tolerances hold; unused pool rows hold NaN
// scales (and NaN e4m3 codes).
#include "backends/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cpu/ops.h"
#include "core/check.h"  // KCHECK, used by cuda_test_util.h
#include "cuda_test_util.h"

namespace kestrel::cuda {
namespace {

namespace kt = ::kestrel::cuda::testing;

constexpr uint16_t kNanBf16 = 0xFFFF;

struct SeqSpec {
  int32_t n_cached = 0;  // positions [0, n_cached) cached by earlier steps
  int32_t n_new = 1;     // this batch's tokens: positions [n_cached, n_cached + n_new)
  uint64_t seed = 0;     // its K/V rows and queries: the same seed gives the same data anywhere
};

struct AttnConfig {
  int32_t n_heads = 8, n_kv_heads = 2, head_dim = 128, block_size = 16, window = 0;
  float scale_mult = 2.0f;     // scale = scale_mult / sqrt(head_dim): scores of std ~0.7
  int32_t context_bucket = 0;  // max_context_len passed to the kernel; 0: the exact maximum
  bool force_prefill = false;  // max_query_len >= 2 even for one-token sequences
  uint64_t table_seed = 1;     // shuffle of the physical blocks
  KvCacheType kv = KvCacheType::kBf16;
  bool decode_rows_apart = false;  // PagedAttentionParams::decode_rows_apart
};


struct Tolerance {
  double rel_l2, row_rel_l2, max_abs;
};
constexpr Tolerance kDecodeTol{3e-3, 5e-3, 2.5e-3};
constexpr Tolerance kPrefillTol{1e-2, 2e-2, 8e-3};

// Host inputs of one batch; bf16 as raw bits.
struct HostBatch {
  std::vector<uint16_t> q;                 // [n_tokens, n_heads, head_dim]
  std::vector<uint16_t> k_cache, v_cache;  // [n_blocks, n_kv_heads, block_size, head_dim]
  std::vector<int32_t> positions;          // [n_tokens]
  std::vector<int32_t> seq_starts;         // [n_seqs + 1]
  std::vector<int32_t> context_lens;       // [n_seqs]
  std::vector<int32_t> block_tables;       // [n_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0, n_blocks = 0, n_tokens = 0;
  int32_t max_query_len = 0, max_context_len = 0;
  // Quantized caches: codes and row scales, and the f32 images (code * scale) the reference
  // reads.
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scale, v_scale, k_ref, v_ref;
};

// Fills the quantized pools of b from its bf16 ones: every row the batch wrote (its bf16 images
// quantized), NaN elsewhere.
void QuantizePools(const AttnConfig& c, HostBatch& b) {
  const int64_t d = c.head_dim;
  const size_t n_rows = b.k_cache.size() / static_cast<size_t>(d);
  const std::vector<float> k = kt::Bf16ToF32(b.k_cache);
  const std::vector<float> v = kt::Bf16ToF32(b.v_cache);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  b.k_codes.assign(b.k_cache.size(), 0x7F);
  b.v_codes.assign(b.v_cache.size(), 0x7F);
  b.k_scale.assign(n_rows, nan);
  b.v_scale.assign(n_rows, nan);
  b.k_ref.assign(k.size(), nan);
  b.v_ref.assign(v.size(), nan);
  for (size_t r = 0; r < n_rows; ++r) {
    const size_t o = r * static_cast<size_t>(d);
    if (std::isnan(k[o])) continue;  // a row outside every context
    b.k_scale[r] = kt::QuantizeKvRow(k.data() + o, d, c.kv, b.k_codes.data() + o);
    b.v_scale[r] = kt::QuantizeKvRow(v.data() + o, d, c.kv, b.v_codes.data() + o);
    for (int64_t i = 0; i < d; ++i) {
      b.k_ref[o + i] = kt::KvCodeValue(b.k_codes[o + i], c.kv) * b.k_scale[r];
      b.v_ref[o + i] = kt::KvCodeValue(b.v_codes[o + i], c.kv) * b.v_scale[r];
    }
  }
}

HostBatch BuildBatch(const AttnConfig& c, const std::vector<SeqSpec>& seqs) {
  HostBatch b;
  const int32_t bs = c.block_size;
  const int64_t d = c.head_dim;
  const size_t n_seqs = seqs.size();
  int32_t total_blocks = 0, max_blocks = 0, max_ctx = 0;
  for (const SeqSpec& s : seqs) {
    const int32_t ctx = s.n_cached + s.n_new;
    const int32_t n = (ctx + bs - 1) / bs;
    total_blocks += n;
    max_blocks = std::max(max_blocks, n);
    max_ctx = std::max(max_ctx, ctx);
    b.max_query_len = std::max(b.max_query_len, s.n_new);
  }
  if (c.force_prefill) b.max_query_len = std::max(b.max_query_len, 2);
  b.max_context_len = c.context_bucket > 0 ? c.context_bucket : max_ctx;
  KCHECK(b.max_context_len >= max_ctx);
  // One spare table entry per sequence (pointing at the poison block) and 3 spare pool blocks.
  b.max_blocks_per_seq = max_blocks + 1;
  b.n_blocks = total_blocks + 3;
  std::vector<int32_t> physical(static_cast<size_t>(b.n_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::mt19937_64 rng(c.table_seed);
  std::shuffle(physical.begin(), physical.end(), rng);
  const int32_t poison_block = physical[static_cast<size_t>(total_blocks)];
  const cpu::KvLayout layout{c.n_kv_heads, d, bs, b.n_blocks};
  const size_t pool_elems = static_cast<size_t>(layout.n_slots() * c.n_kv_heads * d);
  b.k_cache.assign(pool_elems, kNanBf16);
  b.v_cache.assign(pool_elems, kNanBf16);
  b.block_tables.assign(n_seqs * static_cast<size_t>(b.max_blocks_per_seq), poison_block);
  b.seq_starts.push_back(0);
  size_t next_block = 0;
  for (size_t s = 0; s < n_seqs; ++s) {
    const SeqSpec& spec = seqs[s];
    const int32_t ctx = spec.n_cached + spec.n_new;
    int32_t* table = b.block_tables.data() + s * b.max_blocks_per_seq;
    for (int32_t blk = 0; blk < (ctx + bs - 1) / bs; ++blk) table[blk] = physical[next_block++];
    // Rows in (position, kv head) order, written through the table.
    const size_t row_elems = static_cast<size_t>(d);
    const std::vector<uint16_t> k_rows =
        kt::RandomBf16(static_cast<size_t>(ctx) * c.n_kv_heads * row_elems, spec.seed * 4 + 1);
    const std::vector<uint16_t> v_rows =
        kt::RandomBf16(static_cast<size_t>(ctx) * c.n_kv_heads * row_elems, spec.seed * 4 + 2);
    for (int32_t pos = 0; pos < ctx; ++pos) {
      const int64_t slot = int64_t{table[pos / bs]} * bs + pos % bs;
      for (int32_t h = 0; h < c.n_kv_heads; ++h) {
        const size_t src = (static_cast<size_t>(pos) * c.n_kv_heads + h) * row_elems;
        const size_t dst = static_cast<size_t>(layout.RowOffset(slot, h));
        std::copy_n(k_rows.begin() + src, row_elems, b.k_cache.begin() + dst);
        std::copy_n(v_rows.begin() + src, row_elems, b.v_cache.begin() + dst);
      }
    }
    const std::vector<uint16_t> q =
        kt::RandomBf16(static_cast<size_t>(spec.n_new) * c.n_heads * row_elems, spec.seed * 4 + 3);
    b.q.insert(b.q.end(), q.begin(), q.end());
    for (int32_t i = 0; i < spec.n_new; ++i) b.positions.push_back(spec.n_cached + i);
    b.seq_starts.push_back(b.seq_starts.back() + spec.n_new);
    b.context_lens.push_back(ctx);
  }
  b.n_tokens = b.seq_starts.back();
  if (KvCacheQuantized(c.kv)) QuantizePools(c, b);
  return b;
}

float Scale(const AttnConfig& c) {
  return c.scale_mult / std::sqrt(static_cast<float>(c.head_dim));
}

// cpu::PagedAttention with the reference kernels on the f32 images of the bf16 inputs.
std::vector<float> RunCpu(const AttnConfig& c, const HostBatch& b) {
  cpu::AttentionShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.scale = Scale(c);
  shape.sliding_window = c.window;
  shape.block_size_tokens = c.block_size;
  shape.n_blocks = b.n_blocks;
  const cpu::AttentionBatch batch{b.positions, b.seq_starts, b.block_tables, b.max_blocks_per_seq};
  const cpu::OpContext ctx{};
  const std::vector<float> q = kt::Bf16ToF32(b.q);
  const bool quantized = KvCacheQuantized(c.kv);
  const std::vector<float> k = quantized ? b.k_ref : kt::Bf16ToF32(b.k_cache);
  const std::vector<float> v = quantized ? b.v_ref : kt::Bf16ToF32(b.v_cache);
  std::vector<float> out(b.q.size());
  std::vector<float> scratch(
      static_cast<size_t>(cpu::AttentionScratchFloats(ctx, shape, b.max_context_len)));
  cpu::PagedAttention(ctx, shape, batch, q.data(), k.data(), v.data(), out.data(), scratch);
  return out;
}

// Device copies of one batch's inputs, reused by the runs of a determinism check.
struct DeviceBatch {
  DeviceBuffer q, k_cache, v_cache, positions, seq_starts, context_lens, block_tables;
  DeviceBuffer k_scale, v_scale;  // quantized caches (k_cache / v_cache then hold the codes)
};

DeviceBatch UploadBatch(const HostBatch& b) {
  const bool quantized = !b.k_codes.empty();
  DeviceBatch d{kt::Upload(b.q),
                quantized ? kt::Upload(b.k_codes) : kt::Upload(b.k_cache),
                quantized ? kt::Upload(b.v_codes) : kt::Upload(b.v_cache),
                kt::Upload(b.positions),
                kt::Upload(b.seq_starts),
                kt::Upload(b.context_lens),
                kt::Upload(b.block_tables),
                quantized ? kt::Upload(b.k_scale) : DeviceBuffer(),
                quantized ? kt::Upload(b.v_scale) : DeviceBuffer()};
  return d;
}

// One PagedAttention call into a poisoned output with a poisoned workspace.
std::vector<uint16_t> RunGpu(const AttnConfig& c, const HostBatch& b, const DeviceBatch& d) {
  const size_t n_out = b.q.size();
  DeviceBuffer out = kt::Poisoned<uint16_t>(n_out);
  const size_t ws_bytes =
      PagedAttentionWorkspaceBytes(b.n_tokens, c.n_heads, c.head_dim, b.max_context_len);
  DeviceBuffer ws = kt::Poisoned<uint8_t>(std::max<size_t>(ws_bytes, 16));
  PagedAttentionParams p;
  p.q = d.q.as<const __nv_bfloat16>();
  p.k_cache = d.k_cache.get();
  p.v_cache = d.v_cache.get();
  if (KvCacheQuantized(c.kv)) {
    p.k_scale = d.k_scale.as<const float>();
    p.v_scale = d.v_scale.as<const float>();
    p.kv_type = c.kv;
  }
  p.out = out.as<__nv_bfloat16>();
  p.positions = d.positions.as<const int32_t>();
  p.seq_starts = d.seq_starts.as<const int32_t>();
  p.context_lens = d.context_lens.as<const int32_t>();
  p.block_tables = d.block_tables.as<const int32_t>();
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.n_tokens = b.n_tokens;
  p.n_seqs = static_cast<int32_t>(b.seq_starts.size()) - 1;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.block_size = c.block_size;
  p.scale = Scale(c);
  p.sliding_window = c.window;
  p.max_query_len = b.max_query_len;
  p.max_context_len = b.max_context_len;
  p.decode_rows_apart = c.decode_rows_apart;
  PagedAttention(p, ws.get(), ws_bytes, /*stream=*/nullptr);
  KCUDA_CHECK(cudaGetLastError());
  return kt::Download<uint16_t>(out, n_out);
}

std::string Describe(const AttnConfig& c, const std::vector<SeqSpec>& seqs) {
  std::string s = "heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) +
                  " head_dim " + std::to_string(c.head_dim) + " block " +
                  std::to_string(c.block_size) + " window " + std::to_string(c.window) +
                  " scale x" + std::to_string(c.scale_mult) +
                  (c.force_prefill ? " (prefill path)" : "") + " kv " + KvCacheTypeName(c.kv) +
                  " seqs (cached+new):";
  for (const SeqSpec& q : seqs)
    s += " " + std::to_string(q.n_cached) + "+" + std::to_string(q.n_new);
  return s;
}

// Compares with the reference (whole output, every (token, head) row, max abs) and checks that
// a second run is bitwise identical. Returns the GPU output (bf16 bits).
std::vector<uint16_t> RunAndCheck(const AttnConfig& c, const std::vector<SeqSpec>& seqs) {
  SCOPED_TRACE(Describe(c, seqs));
  const HostBatch b = BuildBatch(c, seqs);
  const bool decode = b.max_query_len == 1;
  // The tensor-core decode kernel rounds P to bf16 (f16 for quantized caches) for its P.V mma,
  // as the prefill path does.
  const bool decode_mma =
      std::string(DecodeAttentionVariantName(DecodeAttentionVariant())) == "tensor_cores";
  const Tolerance tol = decode && !decode_mma ? kDecodeTol : kPrefillTol;
  const DeviceBatch d = UploadBatch(b);
  const std::vector<uint16_t> out = RunGpu(c, b, d);
  const std::vector<uint16_t> again = RunGpu(c, b, d);
  EXPECT_TRUE(out == again) << "two runs differ (nondeterminism)";

  const std::vector<float> ref = RunCpu(c, b);
  const std::vector<float> got = kt::Bf16ToF32(out);
  EXPECT_LE(kt::RelL2(got, ref), tol.rel_l2);
  EXPECT_LE(kt::MaxAbsDiff(got, ref), tol.max_abs);
  const size_t row = static_cast<size_t>(c.head_dim);
  double worst = 0;
  size_t worst_row = 0;
  for (size_t r = 0; r * row < ref.size(); ++r) {
    const std::vector<float> g(got.begin() + r * row, got.begin() + (r + 1) * row);
    const std::vector<float> e(ref.begin() + r * row, ref.begin() + (r + 1) * row);
    const double err = kt::RelL2(g, e);
    if (!(err <= worst)) {  // also catches NaN/inf
      worst = err;
      worst_row = r;
    }
  }
  EXPECT_LE(worst, tol.row_rel_l2)
      << "worst row: token " << worst_row / c.n_heads << " head " << worst_row % c.n_heads;
  return out;
}

// Decode sequences (one new token each) with the given context lengths.
std::vector<SeqSpec> DecodeSeqs(const std::vector<int32_t>& context_lens, uint64_t seed0) {
  std::vector<SeqSpec> seqs;
  for (size_t i = 0; i < context_lens.size(); ++i) {
    seqs.push_back({context_lens[i] - 1, 1, seed0 + i});
  }
  return seqs;
}

// Runs fn once per decode split-kernel variant (SetDecodeAttentionVariant), restoring the
// default afterwards: every variant must pass every decode check.
template <class F>
void ForEachDecodeVariant(F&& fn) {
  const int saved = DecodeAttentionVariant();
  for (int v = 0; v < DecodeAttentionVariantCount(); ++v) {
    SCOPED_TRACE(std::string("decode variant ") + DecodeAttentionVariantName(v));
    SetDecodeAttentionVariant(v);
    fn();
  }
  SetDecodeAttentionVariant(saved);
}

// Runs fn(c) for each cache type (bf16, fp8, int8) and each of `windows`, c having both set.
template <class F>
void ForEachCacheAndWindow(std::initializer_list<int32_t> windows, F&& fn) {
  for (KvCacheType kv : {KvCacheType::kBf16, KvCacheType::kFp8, KvCacheType::kInt8}) {
    for (int32_t window : windows) {
      SCOPED_TRACE(std::string(KvCacheTypeName(kv)) + " window " + std::to_string(window));
      AttnConfig c;
      c.kv = kv;
      c.window = window;
      fn(c);
    }
  }
}

const std::vector<int32_t> kDecodeContexts = {1, 15, 16, 17, 300, 2049, 5000};

struct HeadCounts {
  int32_t n_heads, n_kv_heads;
};

TEST(CudaAttention, DecodeHeadDimsAndGqaGroups) {
  KESTREL_REQUIRE_CUDA();
  ForEachDecodeVariant([&] {
    for (int32_t head_dim : {16, 32, 64, 128, 256}) {
      for (const auto [n_heads, n_kv_heads] :
           {HeadCounts{4, 4}, {8, 2}, {8, 1}, {16, 1}, {6, 2}}) {
        AttnConfig c;
        c.n_heads = n_heads;
        c.n_kv_heads = n_kv_heads;
        c.head_dim = head_dim;
        c.block_size = head_dim == 64 ? 32 : 16;
        RunAndCheck(c, DecodeSeqs({1, 15, 16, 17, 300, 2049}, 100));
      }
    }
  });
}

TEST(CudaAttention, DecodeBlockSizesAndWindows) {
  KESTREL_REQUIRE_CUDA();
  ForEachDecodeVariant([&] {
    for (int32_t block_size : {16, 32}) {
      for (int32_t window : {0, 1, 100}) {
        AttnConfig c;
        c.block_size = block_size;
        c.window = window;
        c.context_bucket = 5120;  // a graph bucket above the longest context
        RunAndCheck(c, DecodeSeqs({1, 15, 16, 17, 100, 101, 300, 2049, 5000}, 200));
      }
    }
  });
}

TEST(CudaAttention, DecodeBatchSizes) {
  KESTREL_REQUIRE_CUDA();
  ForEachDecodeVariant([&] {
    AttnConfig c;
    c.n_heads = 16;
    c.n_kv_heads = 4;
    RunAndCheck(c, DecodeSeqs({2049}, 300));
    RunAndCheck(c, DecodeSeqs({1, 5000, 17}, 310));
    std::vector<int32_t> lens;
    for (int i = 0; i < 64; ++i) lens.push_back(kDecodeContexts[i % kDecodeContexts.size()]);
    c.context_bucket = 8192;
    c.table_seed = 7;
    RunAndCheck(c, DecodeSeqs(lens, 400));
  });
}

// A sharper softmax (scores of std ~2.7) exercises the running-max rescaling on both paths.
TEST(CudaAttention, SharpSoftmax) {
  KESTREL_REQUIRE_CUDA();
  AttnConfig c;
  c.scale_mult = 8.0f;
  ForEachDecodeVariant([&] { RunAndCheck(c, DecodeSeqs({1, 17, 300, 2049}, 500)); });
  RunAndCheck(c, {{0, 200, 510}, {256, 65, 511}});
}

TEST(CudaAttention, PrefillSingleSequence) {
  KESTREL_REQUIRE_CUDA();
  AttnConfig c;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.force_prefill = true;  // the 1-token case goes through the prefill kernel too
  for (int32_t n_cached : {0, 256}) {
    for (int32_t n_new : {1, 17, 64, 65, 300, 1000}) {
      RunAndCheck(c, {{n_cached, n_new, 600 + static_cast<uint64_t>(n_new)}});
    }
  }
}

// Long single prefills at the shapes of kestrel-tiny (8/2 heads x 64) and Qwen3-8B (32/8 x 128).
TEST(CudaAttention, PrefillLongAtModelShapes) {
  KESTREL_REQUIRE_CUDA();
  for (const auto& [n_heads, n_kv_heads, head_dim] :
       {std::tuple{8, 2, 64}, std::tuple{32, 8, 128}}) {
    AttnConfig c;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    for (int32_t n_new : {1400, 2100}) RunAndCheck(c, {{0, n_new, 800 + static_cast<uint64_t>(n_new)}});
  }
}

TEST(CudaAttention, PrefillHeadDimsAndGqaGroups) {
  KESTREL_REQUIRE_CUDA();
  for (int32_t head_dim : {16, 32, 64, 128, 256}) {
    for (const auto [n_heads, n_kv_heads] : {HeadCounts{2, 2}, {8, 2}, {8, 1}}) {
      for (int32_t window : {0, 100}) {
        AttnConfig c;
        c.n_heads = n_heads;
        c.n_kv_heads = n_kv_heads;
        c.head_dim = head_dim;
        c.window = window;
        c.block_size = head_dim == 32 ? 32 : 16;
        RunAndCheck(c, {{40, 130, 700}, {0, 70, 701}});
      }
    }
  }
}

TEST(CudaAttention, PrefillBlockSizesAndWindows) {
  KESTREL_REQUIRE_CUDA();
  for (int32_t block_size : {16, 32, 48}) {  // 48: the kernel's division path (not a power of 2)
    for (int32_t window : {0, 1, 100}) {
      AttnConfig c;
      c.block_size = block_size;
      c.window = window;
      RunAndCheck(c, {{256, 300, 800}, {0, 150, 801}, {1000, 64, 802}});
    }
  }
}

// 2 prefill chunks (one with a cached prefix) among 5 decode tokens, in one prefill-path call.
TEST(CudaAttention, MixedBatch) {
  KESTREL_REQUIRE_CUDA();
  const std::vector<SeqSpec> seqs = {{0, 1, 900},     {0, 70, 901},  {15, 1, 902},  {16, 1, 903},
                                     {300, 129, 904}, {299, 1, 905}, {2048, 1, 906}};
  for (int32_t window : {0, 100}) {
    for (const auto [n_heads, n_kv_heads] : {HeadCounts{8, 8}, {8, 2}, {32, 4}}) {
      AttnConfig c;
      c.n_heads = n_heads;
      c.n_kv_heads = n_kv_heads;
      c.window = window;
      RunAndCheck(c, seqs);
    }
  }
}

// decode_rows_apart: in a mixed batch the one-token sequences take the decode path and the
// others the prefill kernel. Every row agrees with the reference, and the decode rows are
// bitwise the rows of the same sequences in an all-decode batch, for every decode variant and
// cache type, with and without a window.
TEST(CudaAttention, MixedBatchDecodeRowsTakeTheDecodePath) {
  KESTREL_REQUIRE_CUDA();
  const std::vector<SeqSpec> mixed = {{0, 1, 900},     {0, 70, 901},   {15, 1, 902},
                                      {300, 129, 904}, {2048, 1, 906}, {5000, 1, 907}};
  const std::vector<size_t> decode_seqs = {0, 2, 4, 5};
  const std::vector<size_t> decode_tokens = {0, 71, 201, 202};  // their rows in `mixed`
  ForEachDecodeVariant([&] {
    ForEachCacheAndWindow({0, 100}, [&](AttnConfig c) {
      c.n_heads = 32;
      c.n_kv_heads = 8;
      c.decode_rows_apart = true;
      const std::vector<uint16_t> out = RunAndCheck(c, mixed);
      AttnConfig d = c;
      d.decode_rows_apart = false;
      d.table_seed = 7;
      std::vector<SeqSpec> alone;
      for (size_t i : decode_seqs) alone.push_back(mixed[i]);
      const std::vector<uint16_t> ref = RunAndCheck(d, alone);
      const size_t row = static_cast<size_t>(c.n_heads) * c.head_dim;
      for (size_t j = 0; j < decode_seqs.size(); ++j) {
        EXPECT_TRUE(std::equal(ref.begin() + j * row, ref.begin() + (j + 1) * row,
                               out.begin() + decode_tokens[j] * row))
            << "decode row of sequence " << decode_seqs[j];
      }
    });
  });
}

// A sequence alone and as the 4th of a batch of 8 (other contexts, a larger bucket, other
// physical blocks): bitwise the same output, as split boundaries depend only on positions.
void CheckDecodeBatchInvariance(KvCacheType kv) {
  ForEachDecodeVariant([&] {
    for (int32_t window : {0, 100}) {
      AttnConfig alone;
      alone.window = window;
      alone.kv = kv;
      const SeqSpec target{2048, 1, 1000};
      const std::vector<uint16_t> single = RunAndCheck(alone, {target});

      AttnConfig batched = alone;
      batched.context_bucket = 8192;
      batched.table_seed = 99;
      std::vector<SeqSpec> seqs = DecodeSeqs({5000, 1, 300, 1, 17, 4097, 700, 16}, 1100);
      seqs[3] = target;
      const std::vector<uint16_t> in_batch = RunAndCheck(batched, seqs);
      const size_t row = static_cast<size_t>(alone.n_heads) * alone.head_dim;
      ASSERT_EQ(single.size(), row);
      EXPECT_TRUE(std::equal(single.begin(), single.end(), in_batch.begin() + 3 * row))
          << "window " << window << ": decode output depends on the batch";
    }
  });
}

TEST(CudaAttention, DecodeBatchInvariance) {
  KESTREL_REQUIRE_CUDA();
  CheckDecodeBatchInvariance(KvCacheType::kBf16);
}

constexpr KvCacheType kQuantizedTypes[] = {KvCacheType::kFp8, KvCacheType::kInt8};

// Quantized caches on the decode path: head dims, GQA groups, windows, a graph bucket, a batch
// of 64; the tensor-core kernel and both register kernels (the ones a quantized cache runs,
// attention.h).
TEST(CudaAttention, QuantizedKvCacheDecode) {
  KESTREL_REQUIRE_CUDA();
  const int saved = DecodeAttentionVariant();
  for (KvCacheType kv : kQuantizedTypes) {
    for (const char* variant : {"tensor_cores", "registers", "registers_db"}) {
      SCOPED_TRACE(variant);
      for (int v = 0; v < DecodeAttentionVariantCount(); ++v) {
        if (std::string(DecodeAttentionVariantName(v)) == variant) SetDecodeAttentionVariant(v);
      }
      for (int32_t head_dim : {16, 64, 128, 256}) {
        for (const auto [n_heads, n_kv_heads] : {HeadCounts{8, 2}, {32, 8}, {16, 1}, {6, 2}}) {
          AttnConfig c;
          c.kv = kv;
          c.n_heads = n_heads;
          c.n_kv_heads = n_kv_heads;
          c.head_dim = head_dim;
          c.block_size = head_dim == 64 ? 32 : 16;
          RunAndCheck(c, DecodeSeqs({1, 15, 16, 17, 300, 2049}, 1200));
        }
      }
      AttnConfig c;
      c.kv = kv;
      c.window = 100;
      c.context_bucket = 5120;
      RunAndCheck(c, DecodeSeqs({1, 17, 100, 101, 2049, 5000}, 1300));
      std::vector<int32_t> lens;
      for (int i = 0; i < 64; ++i) lens.push_back(kDecodeContexts[i % kDecodeContexts.size()]);
      c.window = 0;
      c.context_bucket = 8192;
      c.scale_mult = 8.0f;  // sharp softmax too
      RunAndCheck(c, DecodeSeqs(lens, 1400));
    }
  }
  SetDecodeAttentionVariant(saved);
}

// Quantized caches on the prefill path: single sequences with and without cached prefixes,
// head dims and groups, windows, a mixed batch, a long prefill at Qwen3-8B's shape.
TEST(CudaAttention, QuantizedKvCachePrefillAndMixed) {
  KESTREL_REQUIRE_CUDA();
  for (KvCacheType kv : kQuantizedTypes) {
    AttnConfig single;
    single.kv = kv;
    single.n_heads = 4;
    single.n_kv_heads = 1;
    single.force_prefill = true;
    for (int32_t n_cached : {0, 256}) {
      for (int32_t n_new : {1, 17, 65, 300}) {
        RunAndCheck(single, {{n_cached, n_new, 1500 + static_cast<uint64_t>(n_new)}});
      }
    }
    for (int32_t head_dim : {16, 64, 128, 256}) {
      for (int32_t window : {0, 100}) {
        AttnConfig c;
        c.kv = kv;
        c.head_dim = head_dim;
        c.window = window;
        RunAndCheck(c, {{40, 130, 1600}, {0, 70, 1601}});
      }
    }
    AttnConfig mixed;
    mixed.kv = kv;
    mixed.n_heads = 32;
    mixed.n_kv_heads = 4;
    RunAndCheck(mixed, {{0, 1, 1700}, {0, 70, 1701}, {15, 1, 1702}, {300, 129, 1703},
                        {2048, 1, 1704}});
    AttnConfig long_prefill;
    long_prefill.kv = kv;
    long_prefill.n_heads = 32;
    long_prefill.n_kv_heads = 8;
    RunAndCheck(long_prefill, {{0, 1100, 1800}});
  }
}

TEST(CudaAttention, QuantizedKvCacheDecodeBatchInvariance) {
  KESTREL_REQUIRE_CUDA();
  for (KvCacheType kv : kQuantizedTypes) {
    SCOPED_TRACE(KvCacheTypeName(kv));
    CheckDecodeBatchInvariance(kv);
  }
}

// Runs seqs once per value of a tuning setting (set(v) before each run): every run checked
// against the reference, and every run's bits equal to the first value's (what(v) names the
// value in a failure).
template <class Set, class What>
void ExpectSettingChangesNoBit(const AttnConfig& c, const std::vector<SeqSpec>& seqs,
                               std::initializer_list<int> values, Set set, What what) {
  std::vector<uint16_t> first;
  bool have_first = false;
  for (int v : values) {
    set(v);
    std::vector<uint16_t> out = RunAndCheck(c, seqs);
    if (!have_first) {
      first = std::move(out);
      have_first = true;
    } else {
      EXPECT_TRUE(out == first) << what(v);
    }
  }
}

// The tensor-core decode kernel's blocks may compute several consecutive splits (a ring of
// copies running across them for quantized caches at head_dim 128 and the bf16 cache at 256):
// 1, 2, 3 and 8 splits per block must give the same bits, for every cache type at head dims 128
// and 256, with and without a window, over contexts that leave the last block of a sequence
// partly empty.
TEST(CudaAttention, DecodeSplitsPerBlockChangeNoBit) {
  KESTREL_REQUIRE_CUDA();
  const int saved = DecodeSplitsPerBlock();
  for (int32_t head_dim : {128, 256}) {
    ForEachCacheAndWindow({0, 700}, [&](AttnConfig c) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      c.head_dim = head_dim;
      if (head_dim == 256) {  // Qwen3.5-27B's group of 6
        c.n_heads = 12;
        c.n_kv_heads = 2;
      }
      c.context_bucket = 8192;
      const std::vector<SeqSpec> seqs =
          DecodeSeqs({5000, 1, 300, 4097, 2049, 700, 16, 7777}, 1300);
      ExpectSettingChangesNoBit(c, seqs, {1, 2, 3, 8}, SetDecodeSplitsPerBlock,
                                [](int n) { return std::to_string(n) + " splits per block"; });
    });
  }
  SetDecodeSplitsPerBlock(saved);
}

// The L2 prefetch of the register-loaded decode path is a hint: every distance gives the bits of
// none, at the head dims that take that path (64, 256; bf16 at 128), with several splits per
// block (prefetches that cross a split) and a window (chunks skipped at a split's start).
TEST(CudaAttention, DecodePrefetchChangesNoBit) {
  KESTREL_REQUIRE_CUDA();
  const int saved_prefetch = DecodePrefetchAhead();
  const int saved_splits = DecodeSplitsPerBlock();
  SetDecodeSplitsPerBlock(2);
  for (int32_t head_dim : {64, 128, 256}) {
    ForEachCacheAndWindow({0, 700}, [&](AttnConfig c) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      c.head_dim = head_dim;
      c.n_heads = 12;
      c.n_kv_heads = 2;
      c.context_bucket = 4096;
      const std::vector<SeqSpec> seqs = DecodeSeqs({3000, 1, 300, 2049, 700, 16}, 1400);
      ExpectSettingChangesNoBit(c, seqs, {0, 1, 2, 3}, SetDecodePrefetchAhead,
                                [](int n) { return std::to_string(n) + " chunks ahead"; });
    });
  }
  SetDecodePrefetchAhead(saved_prefetch);
  SetDecodeSplitsPerBlock(saved_splits);
}

// The prefill path's tile shapes (4 x 1, 4 x 2, 8 x 1 warps x m-tiles) give the same bits: every
// head dim and cache type, with and without a window, over prefill chunks with and without a
// cached prefix (tiles that start mid-block, key tiles skipped by some warps of a block), a run
// shorter than one m-tile, and one-token rows taken by the prefill kernel.
TEST(CudaAttention, PrefillTilesChangeNoBit) {
  KESTREL_REQUIRE_CUDA();
  const int saved = PrefillAttentionTile();
  for (int32_t head_dim : {16, 32, 64, 128, 256}) {
    ForEachCacheAndWindow({0, 100}, [&](AttnConfig c) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      c.head_dim = head_dim;
      c.n_heads = 6;
      c.n_kv_heads = 2;
      c.block_size = head_dim == 32 ? 32 : 16;
      c.force_prefill = true;
      const std::vector<SeqSpec> seqs = {
          {0, 300, 1500}, {40, 130, 1501}, {1000, 64, 1502}, {15, 1, 1503}, {256, 200, 1504},
          {3, 9, 1505}};
      ExpectSettingChangesNoBit(
          c, seqs, {kPrefillTile4x1, kPrefillTile4x2, kPrefillTile8x1, kPrefillTileAuto},
          SetPrefillAttentionTile, [](int shape) { return PrefillAttentionTileName(shape); });
    });
  }
  SetPrefillAttentionTile(saved);
}

}  // namespace
}  // namespace kestrel::cuda
