// Paged attention: the reference against a dense double-precision attention over contiguous K/V,
// and the AVX2 kernel against the reference (shapes, GQA groups, block sizes, windows, threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "backends/cpu/ops.h"
#include "kernel_test_util.h"

namespace kestrel {
namespace {

using cpu::AttentionBatch;
using cpu::AttentionShape;
using cpu::KernelSet;
using cpu::OpContext;

// A batch of sequences whose K/V already sit in a paged pool with shuffled physical blocks.
// Sequence s has context_lens[s] tokens cached; its last n_new[s] tokens are the queries.
struct PagedCase {
  AttentionShape shape;
  std::vector<int32_t> context_lens, n_new;
  std::vector<int32_t> positions, seq_starts, block_tables;
  int32_t max_blocks = 0;
  std::vector<float> q, k_cache, v_cache;
  std::vector<std::vector<float>> k_dense, v_dense;  // [s][pos * kv_dim + ...]

  AttentionBatch batch() const { return {positions, seq_starts, block_tables, max_blocks}; }
};

PagedCase MakeCase(std::mt19937& rng, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                   int32_t block_size, std::vector<int32_t> context_lens,
                   std::vector<int32_t> n_new, int64_t window) {
  PagedCase c;
  c.shape.n_heads = n_heads;
  c.shape.n_kv_heads = n_kv_heads;
  c.shape.head_dim = head_dim;
  c.shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  c.shape.sliding_window = window;
  c.shape.block_size_tokens = block_size;
  c.context_lens = context_lens;
  c.n_new = n_new;
  const int64_t kv_dim = n_kv_heads * head_dim;
  const size_t n_seqs = context_lens.size();
  int32_t total_blocks = 0;
  for (int32_t len : context_lens) {
    c.max_blocks = std::max(c.max_blocks, (len + block_size - 1) / block_size);
    total_blocks += (len + block_size - 1) / block_size;
  }
  total_blocks += 3;  // unused blocks in the pool
  std::vector<int32_t> physical(static_cast<size_t>(total_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  c.shape.n_blocks = total_blocks;
  const cpu::KvLayout layout = c.shape.layout();
  c.k_cache = testing::RandomFloats(rng, layout.n_slots() * kv_dim);  // garbage where unused
  c.v_cache = testing::RandomFloats(rng, layout.n_slots() * kv_dim);
  c.block_tables.assign(n_seqs * static_cast<size_t>(c.max_blocks), -1);
  c.seq_starts.push_back(0);
  size_t next_block = 0;
  for (size_t s = 0; s < n_seqs; ++s) {
    const int32_t len = context_lens[s];
    const int32_t n_blocks = (len + block_size - 1) / block_size;
    for (int32_t b = 0; b < n_blocks; ++b) {
      c.block_tables[s * c.max_blocks + b] = physical[next_block++];
    }
    c.k_dense.push_back(testing::RandomFloats(rng, len * kv_dim));
    c.v_dense.push_back(testing::RandomFloats(rng, len * kv_dim));
    for (int32_t p = 0; p < len; ++p) {
      const int64_t slot =
          int64_t{c.block_tables[s * c.max_blocks + p / block_size]} * block_size + p % block_size;
      for (int64_t h = 0; h < n_kv_heads; ++h) {
        const int64_t src = p * kv_dim + h * head_dim;
        std::copy_n(c.k_dense[s].begin() + src, head_dim,
                    c.k_cache.begin() + layout.RowOffset(slot, h));
        std::copy_n(c.v_dense[s].begin() + src, head_dim,
                    c.v_cache.begin() + layout.RowOffset(slot, h));
      }
    }
    for (int32_t p = len - n_new[s]; p < len; ++p) c.positions.push_back(p);
    c.seq_starts.push_back(static_cast<int32_t>(c.positions.size()));
  }
  c.q = testing::RandomFloats(rng, static_cast<int64_t>(c.positions.size()) * n_heads * head_dim);
  return c;
}

std::vector<float> RunPaged(const OpContext& ctx, const PagedCase& c) {
  const int32_t max_ctx = *std::max_element(c.context_lens.begin(), c.context_lens.end());
  std::vector<float> scratch(
      static_cast<size_t>(cpu::AttentionScratchFloats(ctx, c.shape, max_ctx)));
  std::vector<float> out(c.q.size(), -777.0f);
  cpu::PagedAttention(ctx, c.shape, c.batch(), c.q.data(), c.k_cache.data(), c.v_cache.data(),
                      out.data(), scratch);
  return out;
}

// Dense attention in double over each sequence's contiguous K/V.
std::vector<float> DenseAttention(const PagedCase& c) {
  const int64_t hd = c.shape.head_dim, nh = c.shape.n_heads;
  const int64_t group = nh / c.shape.n_kv_heads;
  const int64_t kv_dim = c.shape.n_kv_heads * hd;
  std::vector<float> out(c.q.size());
  for (size_t s = 0; s + 1 < c.seq_starts.size(); ++s) {
    for (int32_t t = c.seq_starts[s]; t < c.seq_starts[s + 1]; ++t) {
      const int64_t pos = c.positions[t];
      const int64_t first = c.shape.sliding_window > 0
                                ? std::max<int64_t>(0, pos - c.shape.sliding_window + 1)
                                : 0;
      for (int64_t h = 0; h < nh; ++h) {
        const float* q = c.q.data() + (t * nh + h) * hd;
        std::vector<double> w;
        double mx = -1e300;
        for (int64_t j = first; j <= pos; ++j) {
          const float* k = c.k_dense[s].data() + j * kv_dim + (h / group) * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
          w.push_back(dot * c.shape.scale);
          mx = std::max(mx, w.back());
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = first; j <= pos; ++j) {
            acc += w[j - first] / sum * c.v_dense[s][j * kv_dim + (h / group) * hd + d];
          }
          out[(t * nh + h) * hd + d] = static_cast<float>(acc);
        }
      }
    }
  }
  return out;
}

struct Config {
  int64_t n_heads, n_kv_heads, head_dim;
  int32_t block_size;
  std::vector<int32_t> context_lens, n_new;
  int64_t window;
};

PagedCase MakeCase(std::mt19937& rng, const Config& cfg) {
  return MakeCase(rng, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.block_size, cfg.context_lens,
                  cfg.n_new, cfg.window);
}

const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {1, 1, 8, 16, {1}, {1}, 0},                          // one token, one head
      {4, 4, 16, 16, {37}, {37}, 0},                       // prefill, MHA
      {8, 2, 64, 16, {5, 70, 33}, {5, 1, 7}, 0},           // mixed prefill chunks and decode
      {6, 1, 20, 7, {50, 1, 16}, {3, 1, 16}, 0},           // MQA, head_dim not a multiple of 8
      {32, 8, 128, 16, {300}, {1}, 0},                     // Llama-3-8B decode
      {4, 2, 12, 1, {40, 9}, {40, 2}, 0},                  // block size 1
      {8, 4, 32, 16, {100, 64}, {30, 1}, 24},              // sliding window
      {2, 1, 5, 3, {11}, {11}, 4},                         // odd head_dim, tiny window
      {6, 2, 16, 16, {45, 3}, {2, 3}, 0},                  // group of 3: head sub-groups 2 + 1
  };
  return configs;
}

TEST(PagedAttention, ReferenceMatchesDenseDouble) {
  std::mt19937 rng(11);
  int i = 0;
  for (const Config& cfg : Configs()) {
    PagedCase c = MakeCase(rng, cfg);
    std::vector<float> ref = RunPaged(OpContext{}, c);
    EXPECT_LE(testing::RelativeError(ref, DenseAttention(c)), 2e-6) << "config " << i;
    ++i;
  }
}

TEST(PagedAttention, FastMatchesReferenceAndIsThreadCountIndependent) {
  if (!cpu::CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  std::mt19937 rng(12);
  ThreadPool pool1(1), pool2(2), pool3(3);
  int i = 0;
  for (const Config& cfg : Configs()) {
    PagedCase c = MakeCase(rng, cfg);
    std::vector<float> ref = RunPaged(OpContext{}, c);
    std::vector<float> fast = RunPaged(OpContext{KernelSet::kAvx2, &pool2}, c);
    EXPECT_LE(testing::RelativeError(fast, ref), 1e-5) << "config " << i;
    for (ThreadPool* p : {&pool1, &pool3}) {
      EXPECT_TRUE(testing::SameBits(RunPaged(OpContext{KernelSet::kAvx2, p}, c), fast))
          << "config " << i << " threads " << p->n_threads();
    }
    EXPECT_TRUE(testing::SameBits(RunPaged(OpContext{KernelSet::kAvx2, nullptr}, c), fast));
    ++i;
  }
}

// Each token's output is the same bits computed in its prefill chunk (the AVX2 kernel takes a
// sequence's tokens in tiles that share each K/V chunk) as computed alone, one token per call.
TEST(PagedAttention, FastGivesATokenTheSameBitsInAChunkAsAlone) {
  if (!cpu::CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  std::mt19937 rng(13);
  ThreadPool pool2(2);
  const OpContext ctx{KernelSet::kAvx2, &pool2};
  std::vector<Config> configs = Configs();
  configs.push_back({16, 8, 128, 16, {700, 90}, {700, 41}, 0});  // Qwen3-0.6B heads, long chunks
  configs.push_back({8, 2, 64, 16, {300}, {77}, 50});            // window inside a tile
  int i = 0;
  for (const Config& cfg : configs) {
    PagedCase c = MakeCase(rng, cfg);
    const std::vector<float> all = RunPaged(ctx, c);
    const int64_t row = c.shape.n_heads * c.shape.head_dim;
    PagedCase one = c;  // the same pool, one token at a time
    for (size_t s = 0; s + 1 < c.seq_starts.size(); ++s) {
      for (int32_t t = c.seq_starts[s]; t < c.seq_starts[s + 1]; ++t) {
        one.positions = {c.positions[t]};
        one.seq_starts = {0, 1};
        one.block_tables.assign(c.block_tables.begin() + s * c.max_blocks,
                                c.block_tables.begin() + (s + 1) * c.max_blocks);
        one.context_lens = {c.context_lens[s]};
        one.q.assign(c.q.begin() + t * row, c.q.begin() + (t + 1) * row);
        const std::vector<float> alone = RunPaged(ctx, one);
        EXPECT_TRUE(testing::SameBits(
            alone, std::vector<float>(all.begin() + t * row, all.begin() + (t + 1) * row)))
            << "config " << i << " token " << t;
      }
    }
    ++i;
  }
}

// Moving a sequence's blocks to other physical ids changes nothing.
TEST(PagedAttention, PhysicalBlockIdsDoNotMatter) {
  for (KernelSet ks : {KernelSet::kReference, KernelSet::kAvx2}) {
    if (ks == KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
    ThreadPool pool(2);
    std::mt19937 rng_a(21), rng_b(21);
    PagedCase a = MakeCase(rng_a, 8, 2, 16, 4, {29, 13}, {3, 13}, 0);
    PagedCase b = MakeCase(rng_b, 8, 2, 16, 4, {29, 13}, {3, 13}, 0);
    ASSERT_EQ(a.q, b.q);
    // Re-home every block of b at a fresh physical id (reversed order) and copy its contents.
    const int64_t kv_dim = 2 * 16;
    const int64_t block_floats = 4 * kv_dim;
    const int32_t n_blocks = static_cast<int32_t>(b.shape.n_blocks);
    std::vector<float> k2(b.k_cache.size() * 2), v2(b.v_cache.size() * 2);
    for (int32_t& blk : b.block_tables) {
      if (blk < 0) continue;
      const int32_t moved = 2 * n_blocks - 1 - blk;
      std::copy_n(b.k_cache.begin() + blk * block_floats, block_floats, k2.begin() + moved * block_floats);
      std::copy_n(b.v_cache.begin() + blk * block_floats, block_floats, v2.begin() + moved * block_floats);
      blk = moved;
    }
    b.k_cache = k2;
    b.v_cache = v2;
    b.shape.n_blocks *= 2;
    const OpContext ctx{ks, &pool};
    EXPECT_TRUE(testing::SameBits(RunPaged(ctx, a), RunPaged(ctx, b))) << KernelSetName(ks);
  }
}

TEST(WriteKv, WritesEachHeadOfEachTokenAtItsSlot) {
  // 2 kv heads of dim 3, blocks of 4 slots, 3 blocks: layout [block][head][offset][dim].
  const cpu::KvLayout layout{2, 3, 4, 3};
  std::vector<float> k = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [2 tokens, 2 heads, 3]
  std::vector<float> v(k.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = -k[i];
  std::vector<float> kc(layout.n_blocks * layout.floats_per_block(), 0.0f);
  std::vector<float> vc(kc.size(), 0.0f);
  const std::vector<int32_t> slots = {9, 2};  // block 2 offset 1; block 0 offset 2
  cpu::WriteKv(k.data(), v.data(), slots, layout, kc.data(), vc.data());
  std::vector<float> want(kc.size(), 0.0f);
  // token 0 -> block 2, offset 1: head 0 at ((2*2+0)*4+1)*3 = 51, head 1 at ((2*2+1)*4+1)*3 = 63
  // token 1 -> block 0, offset 2: head 0 at 6, head 1 at ((0*2+1)*4+2)*3 = 18
  for (int d = 0; d < 3; ++d) {
    want[51 + d] = k[d];
    want[63 + d] = k[3 + d];
    want[6 + d] = k[6 + d];
    want[18 + d] = k[9 + d];
  }
  EXPECT_EQ(kc, want);
  for (float& x : want) x = -x;
  EXPECT_EQ(vc, want);
  EXPECT_EQ(layout.RowOffset(9, 1), 63);
}

// The int8 KV cache: every row of a case's f32 pool quantized (cpu::WriteKv's rule).
struct Int8Pool {
  std::vector<int8_t> kq, vq;
  std::vector<float> ks, vs;
  cpu::KvRows k() const { return {nullptr, kq.data(), ks.data()}; }
  cpu::KvRows v() const { return {nullptr, vq.data(), vs.data()}; }
};

// Every slot's rows of a case's f32 pool written through WriteKv into k_out / v_out, as the model
// writes them.
void WritePool(const PagedCase& c, const cpu::KvRowsOut& k_out, const cpu::KvRowsOut& v_out) {
  const cpu::KvLayout layout = c.shape.layout();
  std::vector<int32_t> slots(static_cast<size_t>(layout.n_slots()));
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<float> k(c.k_cache.size()), v(c.v_cache.size());  // [slot, head, dim] order
  for (int32_t slot : slots) {
    for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
      const int64_t src = layout.RowOffset(slot, h);
      const int64_t dst = (int64_t{slot} * layout.n_kv_heads + h) * layout.head_dim;
      std::copy_n(c.k_cache.begin() + src, layout.head_dim, k.begin() + dst);
      std::copy_n(c.v_cache.begin() + src, layout.head_dim, v.begin() + dst);
    }
  }
  cpu::WriteKv(k.data(), v.data(), slots, layout, k_out, v_out);
}

Int8Pool QuantizePool(const PagedCase& c) {
  const cpu::KvLayout layout = c.shape.layout();
  const int64_t rows = layout.n_slots() * layout.n_kv_heads;
  Int8Pool p;
  p.kq.resize(c.k_cache.size());
  p.vq.resize(c.v_cache.size());
  p.ks.resize(static_cast<size_t>(rows));
  p.vs.resize(static_cast<size_t>(rows));
  WritePool(c, cpu::KvRowsOut{nullptr, p.kq.data(), p.ks.data()},
            cpu::KvRowsOut{nullptr, p.vq.data(), p.vs.data()});
  return p;
}

std::vector<float> RunPagedInt8(const OpContext& ctx, const PagedCase& c, const Int8Pool& p) {
  const int32_t max_ctx = *std::max_element(c.context_lens.begin(), c.context_lens.end());
  std::vector<float> scratch(
      static_cast<size_t>(cpu::AttentionScratchFloats(ctx, c.shape, max_ctx)));
  std::vector<float> out(c.q.size(), -777.0f);
  cpu::PagedAttention(ctx, c.shape, c.batch(), c.q.data(), p.k(), p.v(), out.data(), scratch);
  return out;
}

// The bf16 pool of a case (WriteKv's rounding of its f32 rows) and attention over it.
struct Bf16Pool {
  std::vector<uint16_t> k, v;
};
Bf16Pool RoundPool(const PagedCase& c) {
  Bf16Pool p{std::vector<uint16_t>(c.k_cache.size()), std::vector<uint16_t>(c.v_cache.size())};
  WritePool(c, cpu::KvRowsOut{nullptr, nullptr, nullptr, p.k.data()},
            cpu::KvRowsOut{nullptr, nullptr, nullptr, p.v.data()});
  return p;
}
std::vector<float> RunPagedBf16(const OpContext& ctx, const PagedCase& c, const Bf16Pool& p) {
  const int32_t max_ctx = *std::max_element(c.context_lens.begin(), c.context_lens.end());
  std::vector<float> scratch(
      static_cast<size_t>(cpu::AttentionScratchFloats(ctx, c.shape, max_ctx)));
  std::vector<float> out(c.q.size(), -777.0f);
  cpu::PagedAttention(ctx, c.shape, c.batch(), c.q.data(),
                      cpu::KvRows{nullptr, nullptr, nullptr, p.k.data()},
                      cpu::KvRows{nullptr, nullptr, nullptr, p.v.data()}, out.data(), scratch);
  return out;
}

TEST(WriteKv, Int8RowsRoundTripWithinHalfAStep) {
  const cpu::KvLayout layout{2, 40, 4, 2};
  std::mt19937 rng(5);
  std::vector<float> k = testing::RandomFloats(rng, 3 * 2 * 40);
  std::vector<float> v = testing::RandomFloats(rng, 3 * 2 * 40);
  for (int d = 0; d < 40; ++d) v[40 + d] = 0.0f;  // an all-zero row: scale 0, codes 0
  std::vector<int8_t> kq(layout.n_blocks * layout.floats_per_block()), vq(kq.size());
  std::vector<float> ks(kq.size() / 40), vs(ks.size());
  const std::vector<int32_t> slots = {5, 0, 7};
  cpu::WriteKv(k.data(), v.data(), slots, layout, cpu::KvRowsOut{nullptr, kq.data(), ks.data()},
               cpu::KvRowsOut{nullptr, vq.data(), vs.data()});
  for (size_t t = 0; t < slots.size(); ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t off = layout.RowOffset(slots[t], h);
      for (const auto& [x, q, sc] : {std::tuple{&k, &kq, &ks}, std::tuple{&v, &vq, &vs}}) {
        const float* row = x->data() + (t * 2 + h) * 40;
        float amax = 0;
        for (int d = 0; d < 40; ++d) amax = std::max(amax, std::fabs(row[d]));
        const float scale = (*sc)[off / 40];
        EXPECT_EQ(scale, amax / 127.0f);
        for (int d = 0; d < 40; ++d) {
          const int8_t code = (*q)[off + d];
          EXPECT_GE(code, -127);
          EXPECT_LE(std::fabs(code * scale - row[d]), scale / 2 + 1e-7f);
        }
      }
    }
  }
  EXPECT_EQ(vs[layout.RowOffset(5, 1) / 40], 0.0f);  // token 0 (slot 5), head 1
}

// Attention over the int8 cache: both kernel sets see the same dequantized floats (the AVX2 one
// within its usual 1e-5 of the reference, and thread-count independent), and the result stays
// within the int8 rounding of the f32-cache attention.
TEST(PagedAttention, Int8CacheMatchesReferenceAndStaysNearF32) {
  std::mt19937 rng(13);
  ThreadPool pool2(2), pool3(3);
  int i = 0;
  for (const Config& cfg : Configs()) {
    PagedCase c = MakeCase(rng, cfg);
    const Int8Pool p = QuantizePool(c);
    const std::vector<float> ref = RunPagedInt8(OpContext{}, c, p);
    const std::vector<float> f32 = RunPaged(OpContext{}, c);
    const double err = testing::RelativeError(ref, f32);
    EXPECT_LE(err, 2e-2) << "config " << i;
    EXPECT_GT(err, 0.0) << "config " << i << ": the int8 cache was not read";
    if (cpu::CpuHasAvx2Fma()) {
      const std::vector<float> fast = RunPagedInt8(OpContext{KernelSet::kAvx2, &pool2}, c, p);
      EXPECT_LE(testing::RelativeError(fast, ref), 1e-5) << "config " << i;
      EXPECT_TRUE(testing::SameBits(RunPagedInt8(OpContext{KernelSet::kAvx2, &pool3}, c, p), fast))
          << "config " << i;
    }
    ++i;
  }
}

// The bf16 KV cache: WriteKv rounds each value to the nearest bf16 (ties to even), and attention
// over it is the attention over those rounded values in f32: bitwise the f32 path over a pool of
// the rounded floats, in both kernel sets (the AVX2 one thread-count independent), and near the
// unrounded cache's result.
TEST(PagedAttention, Bf16CacheIsTheF32AttentionOverTheRoundedRows) {
  std::mt19937 rng(17);
  ThreadPool pool2(2), pool3(3);
  int i = 0;
  for (const Config& cfg : Configs()) {
    PagedCase c = MakeCase(rng, cfg);
    const Bf16Pool b = RoundPool(c);
    PagedCase rounded = c;  // the f32 pool of the bf16 values
    for (size_t e = 0; e < b.k.size(); ++e) {
      ASSERT_EQ(b.k[e], F32ToBf16(c.k_cache[e])) << e;
      ASSERT_EQ(b.v[e], F32ToBf16(c.v_cache[e])) << e;
      rounded.k_cache[e] = Bf16ToF32(b.k[e]);
      rounded.v_cache[e] = Bf16ToF32(b.v[e]);
    }
    auto run = [&](const OpContext& ctx) { return RunPagedBf16(ctx, c, b); };
    const std::vector<float> ref = run(OpContext{});
    EXPECT_TRUE(testing::SameBits(ref, RunPaged(OpContext{}, rounded))) << "config " << i;
    const double err = testing::RelativeError(ref, RunPaged(OpContext{}, c));
    EXPECT_LE(err, 5e-3) << "config " << i;
    EXPECT_GT(err, 0.0) << "config " << i << ": the bf16 cache was not read";
    if (cpu::CpuHasAvx2Fma()) {
      const std::vector<float> fast = run(OpContext{KernelSet::kAvx2, &pool2});
      EXPECT_TRUE(testing::SameBits(fast, RunPaged(OpContext{KernelSet::kAvx2, &pool2}, rounded)))
          << "config " << i;
      EXPECT_TRUE(testing::SameBits(run(OpContext{KernelSet::kAvx2, &pool3}), fast))
          << "config " << i;
    }
    ++i;
  }
}

// The AVX-512 products (two query heads per register in the scores, 16 dims per register in the
// weighted sum) give the AVX2 build's bits over every cache dtype: groups of 1 to 8 heads (pairs
// of pairs, a pair, a pair and a single head), head dims with 16-, 8- and 1-wide remainders,
// prefill tiles, decode rows and windows.
TEST(PagedAttention, Avx512GivesTheAvx2Bits) {
  if (!cpu::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(17);
  ThreadPool pool2(2);
  std::vector<Config> configs = Configs();
  configs.push_back({16, 8, 128, 16, {300, 90}, {300, 1}, 0});  // Qwen3-0.6B heads
  configs.push_back({32, 4, 128, 16, {130}, {67}, 0});          // groups of 8: two pairs of pairs
  configs.push_back({12, 2, 24, 16, {70}, {70}, 0});            // group 6; 16 + 8 dims
  configs.push_back({10, 2, 40, 5, {33, 50}, {3, 50}, 20});     // group 5; 32 + 8 dims, window
  configs.push_back({4, 1, 136, 16, {29}, {29}, 0});            // 128 + 8 dims
  int i = 0;
  for (const Config& cfg : configs) {
    PagedCase c = MakeCase(rng, cfg);
    OpContext wide{KernelSet::kAvx2, &pool2}, narrow{KernelSet::kAvx2, &pool2};
    wide.avx512 = true;
    narrow.avx512 = false;
    EXPECT_TRUE(testing::SameBits(RunPaged(wide, c), RunPaged(narrow, c))) << "f32, config " << i;
    const Int8Pool q = QuantizePool(c);
    EXPECT_TRUE(testing::SameBits(RunPagedInt8(wide, c, q), RunPagedInt8(narrow, c, q)))
        << "int8, config " << i;
    const Bf16Pool b = RoundPool(c);
    EXPECT_TRUE(testing::SameBits(RunPagedBf16(wide, c, b), RunPagedBf16(narrow, c, b)))
        << "bf16, config " << i;
    ++i;
  }
}

}  // namespace
}  // namespace kestrel
