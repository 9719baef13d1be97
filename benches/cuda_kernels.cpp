// Benchmark of every CUDA kernel family but the linear layers (bench_cuda_linear has those), on
// the Qwen3-8B shapes, printed as JSON lines against the device's ceilings measured in the same
// run (cuda::MeasureRoofline, the first line):
//   embedding_gather, add_rms_norm, gather_rms_norm, qkv_rope, silu_mul    memory-bound:
//       bytes = every input read once + every output written once; us, gb_per_s, frac_copy_bw
//   attention_decode    batch x context, bytes = K+V of every sequence's context + q + out;
//                       one line per decode split-kernel variant ("variant": its name)
//   attention_prefill   one sequence, causal; flops = 4 * n_heads * head_dim * attended keys
//                       summed over the queries; us, tflop_per_s, frac_gemm_peak; one line per
//                       tile shape of the prefill kernel ("tile"), then the automatic choice
//   gpu_sample          1 and 64 rows of the 151936 vocabulary: us per call and per row
// Every figure is the median of --reps timed calls (CUDA events, queued back to back after a
// warm-up), on random data with fixed seeds. Inputs and outputs rotate over sets that together
// exceed 256 MB, so a timed call never finds its data in the 60 MB L2.
// Usage: bench_cuda_kernels [--reps N] [--only FAMILY[,FAMILY...]] [--kv-cache-dtype bf16|fp8|int8]
//                           [--decode-shapes BxC[,BxC...]] [--attention-heads Q:KV:D]
// --only runs those families (the names above); --kv-cache-dtype stores the attention benchmarks'
// K/V pool in that dtype (random codes, per-row scales in [0.001, 0.02]; qkv_rope writes bf16
// rows and is skipped); --decode-shapes replaces attention_decode's batch x context grid
// (default 1,8,64 x 128,2048,8192); --attention-heads sets the query heads, kv heads and head dim
// of the attention and qkv_rope benchmarks (default 32:8:128; Qwen3.5-27B's gated attention is
// 24:4:256, Qwen3.5-35B-A3B's 16:2:256). Example, one shape to profile:
//   ncu --kernel-name regex:DecodeSplitMma --launch-skip 10 --launch-count 1 --set full
//       bench_cuda_kernels --only attention_decode --kv-cache-dtype fp8 --decode-shapes 64x8192
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef KESTREL_HAS_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/activation.h"
#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/embedding.h"
#include "backends/cuda/kv_cache.h"
#include "backends/cuda/norm.h"
#include "backends/cuda/roofline.h"
#include "backends/cuda/rope.h"
#include "backends/cuda/sampling.h"
#include "core/check.h"
#include "core/dtype.h"
#include "cuda_timing.h"
#include "models/gpu_sampling_rows.h"
#include "sampling/sampler.h"

namespace kestrel::cuda {
namespace {

// Qwen3-8B.
constexpr int64_t kHidden = 4096;
constexpr int64_t kIntermediate = 12288;
constexpr int32_t kVocab = 151936;
// The attention shapes: Qwen3-8B's unless --attention-heads says otherwise (set once, before
// any benchmark runs).
int32_t g_heads = 32, g_kv_heads = 8, g_head_dim = 128;
constexpr int32_t kBlockTokens = 16;
int64_t QkvCols() { return int64_t{g_heads + 2 * g_kv_heads} * g_head_dim; }  // 6144 for 8B
constexpr float kRmsEps = 1e-6f;
constexpr double kRopeTheta = 1e6;
// Rows (kv head, token) of K (or V) in one KV block, each head_dim elements.
size_t RowsPerBlock() { return size_t(g_kv_heads) * kBlockTokens; }
// Data a kernel's rotating sets span together: over 4x the L2.
constexpr size_t kRotateBytes = size_t{256} << 20;

DeviceBuffer MustAllocate(size_t bytes, const char* what) {
  auto buf = DeviceBuffer::Allocate(bytes, what);
  if (!buf.ok()) {
    std::fprintf(stderr, "%s\n", buf.status().message().c_str());
    std::exit(1);
  }
  return std::move(buf).value();
}

template <class T>
DeviceBuffer Upload(const std::vector<T>& host, const char* what) {
  DeviceBuffer b = MustAllocate(std::max<size_t>(1, host.size()) * sizeof(T), what);
  if (!host.empty()) {
    KCUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return b;
}

// Host blocks of random values, generated once and tiled into device buffers from a
// seed-dependent offset (start-up stays short; the data is still random to the kernels).
// Never zeros: some kernels run faster on zeros than on real data.
const std::vector<uint16_t>& Bf16Block() {  // bf16 in (-1, 1)
  static const std::vector<uint16_t> block = [] {
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> b(size_t{8} << 20);
    for (uint16_t& x : b) {
      x = F32ToBf16(dist(rng));
      if ((x & 0x7FFF) == 0) x = 0x3C00;
    }
    return b;
  }();
  return block;
}

// n floats drawn from dist with a fixed seed.
template <class Dist>
std::vector<float> DrawFloats(uint64_t seed, size_t n, Dist dist) {
  std::mt19937_64 rng(seed);
  std::vector<float> b(n);
  for (float& x : b) x = dist(rng);
  return b;
}

const std::vector<float>& F32Block() {  // f32 in (-1, 1)
  static const std::vector<float> block = [] {
    std::vector<float> b =
        DrawFloats(2, size_t{4} << 20, std::uniform_real_distribution<float>(-1.0f, 1.0f));
    for (float& x : b) {
      if (x == 0.0f) x = 0.5f;
    }
    return b;
  }();
  return block;
}

const std::vector<float>& LogitBlock() {  // normal, std 3
  static const std::vector<float> block =
      DrawFloats(3, size_t{4} << 20, std::normal_distribution<float>(0.0f, 3.0f));
  return block;
}

template <class T>
void FillTiled(void* dst, size_t n_elems, const std::vector<T>& block, uint64_t seed) {
  size_t offset = (seed * 7919) % block.size();
  for (size_t done = 0; done < n_elems;) {
    const size_t chunk = std::min(n_elems - done, block.size() - offset);
    KCUDA_CHECK(cudaMemcpy(static_cast<T*>(dst) + done, block.data() + offset, chunk * sizeof(T),
                           cudaMemcpyHostToDevice));
    done += chunk;
    offset = 0;
  }
}

void FillRandomBf16(DeviceBuffer& buf, uint64_t seed) {
  FillTiled(buf.get(), buf.size_bytes() / 2, Bf16Block(), seed);
}
void FillRandomF32(DeviceBuffer& buf, uint64_t seed) {
  FillTiled(buf.get(), buf.size_bytes() / 4, F32Block(), seed);
}

using bench::Median;

// What every measurement shares: the stream, the timing loop, the ceilings.
class Bench {
 public:
  Bench(int reps, const Roofline& roofline) : reps_(reps), roofline_(roofline) {
    KCUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    delay_src_ = MustAllocate(kDelayBytes, "delay copy source");
    delay_dst_ = MustAllocate(kDelayBytes, "delay copy destination");
    KCUDA_CHECK(cudaMemset(delay_src_.get(), 0x3C, kDelayBytes));
  }
  ~Bench() { KCUDA_CHECK(cudaStreamDestroy(stream_)); }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  cudaStream_t stream() const { return stream_; }
  int reps() const { return reps_; }
  const Roofline& roofline() const { return roofline_; }

  // Input/output sets to rotate over for a call that moves call_bytes: together >= kRotateBytes,
  // and no more than the timed calls can use.
  int RotationSets(double call_bytes) const {
    const double need = std::ceil(static_cast<double>(kRotateBytes) / std::max(call_bytes, 1.0));
    return static_cast<int>(std::clamp(need, 1.0, static_cast<double>(reps_)));
  }

  // Median seconds of one call of fn(rep), rep = 0..reps-1. Three 1 GiB device copies (~1.5 ms)
  // are queued first, so the host has queued every timed call before the GPU reaches them: the
  // events then time the kernels back to back, without the launch latency between them. The
  // copies also flush the L2 after the warm-up.
  template <class Fn>
  double MedianSeconds(Fn&& fn) {
    return bench::MedianSeconds(reps_, stream_, delay_src_, delay_dst_, kDelayBytes, 3, fn);
  }

  // {"kernel": ..., <fields>, "bytes", "us", "gb_per_s", "frac_copy_bw"}
  void PrintBandwidth(const char* kernel, const std::string& fields, double bytes,
                      double sec) const {
    const double gb_s = bytes / sec / 1e9;
    std::printf(
        "{\"kernel\": \"%s\", %s, \"bytes\": %.0f, \"us\": %.2f, \"gb_per_s\": %.1f, "
        "\"frac_copy_bw\": %.3f}\n",
        kernel, fields.c_str(), bytes, sec * 1e6, gb_s, gb_s / roofline_.copy_gb_per_s);
    std::fflush(stdout);
  }

 private:
  static constexpr size_t kDelayBytes = size_t{1} << 30;
  int reps_;
  Roofline roofline_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer delay_src_, delay_dst_;
};

std::string Fields(const char* fmt, long a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
}

// ---- Memory-bound kernels ----------------------------------------------------------------

void BenchEmbeddingGather(Bench& bench) {
  DeviceBuffer table = MustAllocate(size_t{kVocab} * kHidden * 2, "embedding table");
  FillRandomBf16(table, 10);  // [vocab, hidden] bf16, 1.2 GB: random rows miss the L2
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  for (const int64_t n : {1, 64, 2048}) {
    const double bytes = n * kHidden * 2.0 + n * 4.0 + n * kHidden * 4.0;
    const int n_sets = bench.RotationSets(bytes);
    std::vector<int32_t> ids(static_cast<size_t>(n_sets * n));  // [n_sets, n]
    for (int32_t& id : ids) id = token(rng);
    DeviceBuffer d_ids = Upload(ids, "token ids");
    DeviceBuffer out = MustAllocate(n_sets * n * kHidden * 4, "embeddings");  // [n_sets, n, hidden]
    const double sec = bench.MedianSeconds([&](int r) {
      const int64_t s = r % n_sets;
      EmbeddingGather(table.as<__nv_bfloat16>(), kVocab, kHidden, d_ids.as<int32_t>() + s * n, n,
                      out.as<float>() + s * n * kHidden, bench.stream());
    });
    bench.PrintBandwidth("embedding_gather", Fields("\"n\": %ld", n), bytes, sec);
  }
}

void BenchAddRmsNorm(Bench& bench) {
  DeviceBuffer weight = MustAllocate(kHidden * 2, "norm weight");  // [hidden] bf16
  FillRandomBf16(weight, 20);
  for (const int64_t n : {1, 64, 2048, 8192}) {
    // x read and written (f32), delta read (f32), y written (bf16), the weight read.
    const double bytes = n * kHidden * (4.0 + 4.0 + 4.0 + 2.0) + kHidden * 2.0;
    const int n_sets = bench.RotationSets(bytes);
    const int64_t elems = n_sets * n * kHidden;
    DeviceBuffer x = MustAllocate(elems * 4, "residual");   // [n_sets, n, hidden] f32
    DeviceBuffer delta = MustAllocate(elems * 4, "delta");  // [n_sets, n, hidden] f32
    DeviceBuffer y = MustAllocate(elems * 2, "normed");     // [n_sets, n, hidden] bf16
    FillRandomF32(x, 21);
    FillRandomF32(delta, 22);
    const double sec = bench.MedianSeconds([&](int r) {
      const int64_t off = (r % n_sets) * n * kHidden;
      AddRmsNorm(x.as<float>() + off, delta.as<float>() + off, nullptr, weight.as<__nv_bfloat16>(),
                 kRmsEps, n, kHidden, y.as<__nv_bfloat16>() + off, bench.stream());
    });
    bench.PrintBandwidth("add_rms_norm", Fields("\"n\": %ld, \"delta\": true", n), bytes, sec);
  }
}

void BenchGatherRmsNorm(Bench& bench) {
  // The final norm of the rows that sample, out of a large batch: each call gathers 64 rows of a
  // 16384-token residual (256 MB); the calls take disjoint rows, so none is still in the L2.
  constexpr int64_t kTokens = 16384, kRows = 64;
  DeviceBuffer x = MustAllocate(kTokens * kHidden * 4, "residual");  // [tokens, hidden] f32
  DeviceBuffer weight = MustAllocate(kHidden * 2, "norm weight");    // [hidden] bf16
  FillRandomF32(x, 30);
  FillRandomBf16(weight, 31);
  const int n_sets = std::min<int>(bench.reps(), kTokens / kRows);
  std::vector<int32_t> rows(kTokens);  // [n_sets, kRows] used
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937(32));
  DeviceBuffer d_rows = Upload(rows, "gathered rows");
  DeviceBuffer y = MustAllocate(n_sets * kRows * kHidden * 2, "normed");  // [n_sets, rows, hidden]
  const double sec = bench.MedianSeconds([&](int r) {
    const int64_t s = r % n_sets;
    GatherRmsNorm(x.as<float>(), d_rows.as<int32_t>() + s * kRows, kRows, kHidden,
                  weight.as<__nv_bfloat16>(), kRmsEps, y.as<__nv_bfloat16>() + s * kRows * kHidden,
                  bench.stream());
  });
  const double bytes = kRows * kHidden * (4.0 + 2.0) + kRows * 4.0 + kHidden * 2.0;
  bench.PrintBandwidth("gather_rms_norm", Fields("\"n_rows\": %ld, \"n_tokens\": 16384", kRows),
                       bytes, sec);
}

void BenchSiluMul(Bench& bench) {
  for (const int64_t n : {1, 64, 2048}) {
    const double bytes = n * kIntermediate * (2 * 4.0 + 2.0);
    const int n_sets = bench.RotationSets(bytes);
    DeviceBuffer gate_up = MustAllocate(n_sets * n * 2 * kIntermediate * 4, "gate_up");
    DeviceBuffer out = MustAllocate(n_sets * n * kIntermediate * 2, "activation");
    FillRandomF32(gate_up, 40);  // [n_sets, n, 2 * intermediate] f32
    const double sec = bench.MedianSeconds([&](int r) {
      const int64_t s = r % n_sets;
      SiluMul(gate_up.as<float>() + s * n * 2 * kIntermediate, nullptr, nullptr, n, kIntermediate,
              out.as<__nv_bfloat16>() + s * n * kIntermediate, bench.stream());
    });
    bench.PrintBandwidth("silu_mul", Fields("\"n\": %ld", n), bytes, sec);
  }
}

// ---- The paged KV pool (one layer) -------------------------------------------------------

struct KvPool {
  int32_t n_blocks = 0;
  KvCacheType type = KvCacheType::kBf16;
  DeviceBuffer k, v;              // [n_blocks, n_kv_heads, block_size, head_dim] of type
  DeviceBuffer k_scale, v_scale;  // quantized types: [n_blocks, n_kv_heads, block_size] f32
  std::vector<int32_t> shuffled;  // every block id once, in random order
  // Bytes of K and V per token and kv head, scales included.
  double bytes_per_row() const {
    return 2.0 * (g_head_dim * KvCacheElementBytes(type) + (KvCacheQuantized(type) ? 4 : 0));
  }
};

// Random e4m3 / int8 codes: bit 6 clear, so no e4m3 NaN (its codes are s1111111) and |x| < 2.
const std::vector<uint8_t>& CodeBlock() {
  static const std::vector<uint8_t> block = [] {
    std::mt19937_64 rng(4);
    std::vector<uint8_t> b(size_t{16} << 20);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng() & 0xBF);
    return b;
  }();
  return block;
}

const std::vector<float>& ScaleBlock() {  // K/V row scales in [0.001, 0.02]
  static const std::vector<float> block =
      DrawFloats(5, size_t{1} << 20, std::uniform_real_distribution<float>(0.001f, 0.02f));
  return block;
}

KvPool MakeKvPool(int32_t n_blocks, KvCacheType type) {
  KvPool pool;
  pool.n_blocks = n_blocks;
  pool.type = type;
  const size_t elems = n_blocks * RowsPerBlock() * g_head_dim;
  pool.k = MustAllocate(elems * KvCacheElementBytes(type), "K pool");
  pool.v = MustAllocate(elems * KvCacheElementBytes(type), "V pool");
  if (KvCacheQuantized(type)) {
    FillTiled(pool.k.get(), elems, CodeBlock(), 50);
    FillTiled(pool.v.get(), elems, CodeBlock(), 51);
    pool.k_scale = MustAllocate(n_blocks * RowsPerBlock() * 4, "K scales");
    pool.v_scale = MustAllocate(n_blocks * RowsPerBlock() * 4, "V scales");
    FillTiled(pool.k_scale.get(), n_blocks * RowsPerBlock(), ScaleBlock(), 53);
    FillTiled(pool.v_scale.get(), n_blocks * RowsPerBlock(), ScaleBlock(), 54);
  } else {
    FillRandomBf16(pool.k, 50);
    FillRandomBf16(pool.v, 51);
  }
  pool.shuffled.resize(static_cast<size_t>(n_blocks));
  std::iota(pool.shuffled.begin(), pool.shuffled.end(), 0);
  std::shuffle(pool.shuffled.begin(), pool.shuffled.end(), std::mt19937(52));
  return pool;
}

// n_sets block tables, each [n_seqs, blocks_per_seq] of random blocks; a block appears at most
// once in all of them while they fit in the pool (n_sets is cut to make them fit).
std::vector<int32_t> MakeBlockTables(const KvPool& pool, int32_t n_seqs, int32_t blocks_per_seq,
                                     int* n_sets) {
  const int64_t per_set = int64_t{n_seqs} * blocks_per_seq;
  KCHECK(per_set <= pool.n_blocks);
  *n_sets = static_cast<int>(std::min<int64_t>(*n_sets, pool.n_blocks / per_set));
  std::vector<int32_t> tables(static_cast<size_t>(*n_sets * per_set));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = pool.shuffled[i];
  return tables;
}

void BenchQkvRope(Bench& bench, KvPool& pool) {
  DeviceBuffer q_norm = MustAllocate(g_head_dim * 2, "q_norm");  // [head_dim] bf16
  DeviceBuffer k_norm = MustAllocate(g_head_dim * 2, "k_norm");  // [head_dim] bf16
  FillRandomBf16(q_norm, 60);
  FillRandomBf16(k_norm, 61);
  std::vector<float> inv_freq(g_head_dim / 2);  // [rotary_half]
  for (int i = 0; i < g_head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(kRopeTheta, 2.0 * i / g_head_dim));
  }
  DeviceBuffer d_inv_freq = Upload(inv_freq, "inv_freq");
  QkvRopeShape shape;
  shape.n_heads = g_heads;
  shape.n_kv_heads = g_kv_heads;
  shape.head_dim = g_head_dim;
  shape.rotary_half = g_head_dim / 2;
  shape.block_size_tokens = kBlockTokens;
  shape.qk_norm_eps = kRmsEps;
  std::mt19937 rng(62);
  for (const int64_t n : {1, 64, 2048}) {
    // qkv read (f32), q written (bf16), K and V rows written (bf16), positions and slots read,
    // the two norm weights and inv_freq read.
    const double bytes =
        n * (QkvCols() * 4.0 + g_heads * g_head_dim * 2.0 +
             2.0 * g_kv_heads * g_head_dim * 2.0 + 2 * 4.0) +
        2 * g_head_dim * 2.0 + g_head_dim / 2 * 4.0;
    int n_sets = bench.RotationSets(bytes);
    // Up to 64 tokens: a decode step, every token at a random position of its own sequence, in
    // a random block. Above: one sequence's prefill from position 0, 16 tokens per block.
    const bool decode = n <= 64;
    const int32_t blocks_per_set = decode ? static_cast<int32_t>(n) : static_cast<int32_t>(n / 16);
    std::vector<int32_t> blocks = MakeBlockTables(pool, 1, blocks_per_set, &n_sets);
    std::vector<int32_t> positions(static_cast<size_t>(n_sets * n));  // [n_sets, n]
    std::vector<int32_t> slots(positions.size());                     // [n_sets, n]
    std::uniform_int_distribution<int32_t> pos(0, 8191);
    for (int64_t i = 0; i < n_sets * n; ++i) {
      const int64_t s = i / n, t = i % n;
      if (decode) {
        positions[i] = pos(rng);
        slots[i] = blocks[i] * kBlockTokens + positions[i] % kBlockTokens;
      } else {
        positions[i] = static_cast<int32_t>(t);
        slots[i] = blocks[s * blocks_per_set + t / kBlockTokens] * kBlockTokens + t % kBlockTokens;
      }
    }
    DeviceBuffer d_positions = Upload(positions, "positions");
    DeviceBuffer d_slots = Upload(slots, "slot mapping");
    DeviceBuffer qkv = MustAllocate(n_sets * n * QkvCols() * 4, "qkv");  // [n_sets, n, 6144] f32
    // [n_sets, n, heads, head_dim]
    DeviceBuffer q = MustAllocate(n_sets * n * g_heads * g_head_dim * 2, "q");
    FillRandomF32(qkv, 63);
    const double sec = bench.MedianSeconds([&](int r) {
      const int64_t s = r % n_sets;
      QkvRope(qkv.as<float>() + s * n * QkvCols(), nullptr, q_norm.as<__nv_bfloat16>(),
              k_norm.as<__nv_bfloat16>(), d_positions.as<int32_t>() + s * n, d_inv_freq.as<float>(),
              d_slots.as<int32_t>() + s * n, n, shape,
              q.as<__nv_bfloat16>() + s * n * g_heads * g_head_dim, pool.k.as<__nv_bfloat16>(),
              pool.v.as<__nv_bfloat16>(), bench.stream());
    });
    bench.PrintBandwidth("qkv_rope", Fields("\"n\": %ld, \"qk_norm\": true", n), bytes, sec);
  }
}

// ---- Paged attention -----------------------------------------------------------------------

struct AttentionInputs {
  PagedAttentionParams p;  // pointers into the buffers below; block_tables of set 0
  DeviceBuffer q, out, positions, seq_starts, context_lens, block_tables;
  int n_sets = 1;
  int64_t set_stride = 0;  // int32 elements between two sets of block tables
};

// n_seqs sequences, each with n_new tokens at positions [n_cached, n_cached + n_new) (the whole
// context already in the pool), block tables rotating over up to `n_sets` disjoint sets.
AttentionInputs MakeAttentionInputs(const KvPool& pool, int32_t n_seqs, int32_t n_cached,
                                    int32_t n_new, int n_sets, uint64_t seed) {
  const int32_t ctx = n_cached + n_new;
  const int32_t blocks_per_seq = (ctx + kBlockTokens - 1) / kBlockTokens;
  const int64_t n_tokens = int64_t{n_seqs} * n_new;
  AttentionInputs a;
  a.n_sets = n_sets;
  std::vector<int32_t> tables = MakeBlockTables(pool, n_seqs, blocks_per_seq, &a.n_sets);
  a.set_stride = int64_t{n_seqs} * blocks_per_seq;
  std::vector<int32_t> positions(static_cast<size_t>(n_tokens));
  std::vector<int32_t> seq_starts(static_cast<size_t>(n_seqs) + 1);
  std::vector<int32_t> context_lens(static_cast<size_t>(n_seqs), ctx);
  for (int32_t s = 0; s <= n_seqs; ++s) seq_starts[s] = s * n_new;
  for (int64_t t = 0; t < n_tokens; ++t) positions[t] = n_cached + static_cast<int32_t>(t % n_new);
  a.q = MustAllocate(n_tokens * g_heads * g_head_dim * 2, "q");  // [n_tokens, n_heads, head_dim]
  a.out = MustAllocate(n_tokens * g_heads * g_head_dim * 2, "attention out");
  FillRandomBf16(a.q, seed);
  a.positions = Upload(positions, "positions");
  a.seq_starts = Upload(seq_starts, "seq starts");
  a.context_lens = Upload(context_lens, "context lens");
  a.block_tables = Upload(tables, "block tables");  // [n_sets, n_seqs, blocks_per_seq]
  PagedAttentionParams& p = a.p;
  p.q = a.q.as<__nv_bfloat16>();
  p.k_cache = pool.k.get();
  p.v_cache = pool.v.get();
  p.kv_type = pool.type;
  if (KvCacheQuantized(pool.type)) {
    p.k_scale = pool.k_scale.as<float>();
    p.v_scale = pool.v_scale.as<float>();
  }
  p.out = a.out.as<__nv_bfloat16>();
  p.positions = a.positions.as<int32_t>();
  p.seq_starts = a.seq_starts.as<int32_t>();
  p.context_lens = a.context_lens.as<int32_t>();
  p.block_tables = a.block_tables.as<int32_t>();
  p.max_blocks_per_seq = blocks_per_seq;
  p.n_tokens = static_cast<int32_t>(n_tokens);
  p.n_seqs = n_seqs;
  p.n_heads = g_heads;
  p.n_kv_heads = g_kv_heads;
  p.head_dim = g_head_dim;
  p.block_size = kBlockTokens;
  p.scale = 1.0f / std::sqrt(static_cast<float>(g_head_dim));
  p.max_query_len = n_new;
  p.max_context_len = ctx;
  return a;
}

double TimeAttention(Bench& bench, AttentionInputs& a, DeviceBuffer& workspace) {
  return bench.MedianSeconds([&](int r) {
    PagedAttentionParams p = a.p;
    p.block_tables = a.block_tables.as<int32_t>() + (r % a.n_sets) * a.set_stride;
    PagedAttention(p, workspace.get(), workspace.size_bytes(), bench.stream());
  });
}

struct Shape {
  int32_t batch, context;
};

void BenchAttentionDecode(Bench& bench, const KvPool& pool, DeviceBuffer& workspace,
                          const std::vector<Shape>& shapes) {
  const double kv_bytes_per_token = g_kv_heads * pool.bytes_per_row();  // K and V (+ scales)
  for (const auto [batch, ctx] : shapes) {
    {
      const double kv_bytes = kv_bytes_per_token * ctx * batch;
      const double bytes = kv_bytes + 2.0 * batch * g_heads * g_head_dim * 2;  // + q + out
      AttentionInputs a =
          MakeAttentionInputs(pool, batch, ctx - 1, 1, bench.RotationSets(bytes), 70);
      // Every split-kernel variant (SetDecodeAttentionVariant), then back to the default.
      const int saved = DecodeAttentionVariant();
      for (int v = 0; v < DecodeAttentionVariantCount(); ++v) {
        SetDecodeAttentionVariant(v);
        const double sec = TimeAttention(bench, a, workspace);
        char fields[160];
        std::snprintf(fields, sizeof fields,
                      "\"batch\": %d, \"context\": %d, \"kv_cache_dtype\": \"%s\", "
                      "\"variant\": \"%s\"",
                      batch, ctx, KvCacheTypeName(pool.type), DecodeAttentionVariantName(v));
        bench.PrintBandwidth("attention_decode", fields, bytes, sec);
      }
      SetDecodeAttentionVariant(saved);
    }
  }
}

void BenchAttentionPrefill(Bench& bench, const KvPool& pool, DeviceBuffer& workspace) {
  struct Case {
    int32_t n_cached, n_new;
  };
  const int saved = PrefillAttentionTile();
  for (const Case c : {Case{0, 512}, Case{0, 2048}, Case{0, 8192}, Case{6144, 2048}}) {
    // Query i (position n_cached + i) attends n_cached + i + 1 keys.
    const double keys = static_cast<double>(c.n_new) * c.n_cached + 0.5 * c.n_new * (c.n_new + 1.0);
    const double flops = 4.0 * g_heads * g_head_dim * keys;
    const double kv_bytes = g_kv_heads * pool.bytes_per_row() * (c.n_cached + c.n_new);
    AttentionInputs a =
        MakeAttentionInputs(pool, 1, c.n_cached, c.n_new, bench.RotationSets(kv_bytes), 80);
    // Every tile shape (the same bits), then the automatic choice.
    for (int shape : {kPrefillTile4x1, kPrefillTile4x2, kPrefillTile8x1, kPrefillTileAuto}) {
      SetPrefillAttentionTile(shape);
      const double sec = TimeAttention(bench, a, workspace);
      const double tflops = flops / sec / 1e12;
      std::printf(
          "{\"kernel\": \"attention_prefill\", \"cached\": %d, \"new\": %d, "
          "\"heads\": \"%d:%d:%d\", \"kv_cache_dtype\": \"%s\", \"tile\": \"%s\", "
          "\"flops\": %.0f, \"us\": %.2f, \"tflop_per_s\": %.1f, \"frac_gemm_peak\": %.3f}\n",
          c.n_cached, c.n_new, g_heads, g_kv_heads, g_head_dim, KvCacheTypeName(pool.type),
          PrefillAttentionTileName(shape), flops, sec * 1e6, tflops,
          tflops / bench.roofline().gemm_tflop_per_s);
      std::fflush(stdout);
    }
  }
  SetPrefillAttentionTile(saved);
}

// ---- Sampling ------------------------------------------------------------------------------

void BenchSampling(Bench& bench) {
  constexpr int32_t kMaxRows = 64;
  // A pool of logit rows ([pool_rows, vocab] f32, 272 MB); call r reads rows of set r. GpuSample
  // only sanitises the logits in place here (no bias, no penalties), so they stay as generated.
  const int32_t pool_rows = kMaxRows * 7;
  DeviceBuffer logits = MustAllocate(size_t{pool_rows} * kVocab * 4, "logits");
  for (int32_t row = 0; row < pool_rows; ++row) {
    FillTiled(logits.as<float>() + int64_t{row} * kVocab, kVocab, LogitBlock(), 90 + row);
  }
  DeviceBuffer workspace =
      MustAllocate(GpuSamplingWorkspaceBytes(kMaxRows, kVocab), "sampling workspace");
  DeviceBuffer out_tokens = MustAllocate(kMaxRows * 4, "sampled tokens");
  DeviceBuffer out_logprob = MustAllocate(kMaxRows * 4, "sampled logprobs");
  DeviceBuffer out_top_ids = MustAllocate(kMaxRows * kGpuMaxTopLogprobs * 4, "top ids");
  DeviceBuffer out_top_lp = MustAllocate(kMaxRows * kGpuMaxTopLogprobs * 4, "top logprobs");

  struct Config {
    const char* name;
    float temperature, top_p;
    int32_t top_k, n_logprobs;
  };
  const Config configs[] = {{"greedy", 0.0f, 1.0f, 0, 0},
                            {"t0.7_p0.9_k50", 0.7f, 0.9f, 50, 0},
                            {"t1.0", 1.0f, 1.0f, 0, 0},
                            {"t1.0_logprobs5", 1.0f, 1.0f, 0, 5}};
  for (const int32_t n_rows : {1, kMaxRows}) {
    for (const Config& c : configs) {
      SamplingParams params;
      params.temperature = c.temperature;
      params.top_p = c.top_p;
      params.top_k = c.top_k;
      params.logprobs = c.n_logprobs > 0;
      params.n_top_logprobs = c.n_logprobs;
      GpuSamplingHostBatch arrays;  // rows as the engine builds them
      for (int32_t i = 0; i < n_rows; ++i) {
        params.seed = 1000 + static_cast<uint64_t>(i);
        Sampler sampler(params, kVocab);
        AppendGpuSamplingRow(sampler, &arrays);
      }
      DeviceBuffer d_rows = Upload(arrays.rows, "sampling rows");
      DeviceBuffer d_rep = Upload(arrays.repetition_ids, "repetition ids");
      DeviceBuffer d_cids = Upload(arrays.count_ids, "count ids");
      DeviceBuffer d_cvals = Upload(arrays.count_values, "count values");
      DeviceBuffer d_bids = Upload(arrays.bias_ids, "bias ids");
      DeviceBuffer d_bvals = Upload(arrays.bias_values, "bias values");
      GpuSamplingBatch b{};
      b.n_rows = n_rows;
      b.vocab = kVocab;
      b.rows = d_rows.as<GpuSamplingRow>();
      b.repetition_ids = d_rep.as<int32_t>();
      b.count_ids = d_cids.as<int32_t>();
      b.count_values = d_cvals.as<int32_t>();
      b.bias_ids = d_bids.as<int32_t>();
      b.bias_values = d_bvals.as<float>();
      b.out_tokens = out_tokens.as<int32_t>();
      b.out_logprob = out_logprob.as<float>();
      b.out_top_ids = out_top_ids.as<int32_t>();
      b.out_top_logprobs = out_top_lp.as<float>();
      const int n_sets = std::min(bench.reps(), pool_rows / n_rows);
      const double sec = bench.MedianSeconds([&](int r) {
        GpuSamplingBatch call = b;
        call.logits = logits.as<float>() + int64_t{r % n_sets} * n_rows * kVocab;
        GpuSample(call, workspace.get(), workspace.size_bytes(), bench.stream());
      });
      // One read of the logits: a lower bound on what the kernel moves.
      const double gb_s = static_cast<double>(n_rows) * kVocab * 4 / sec / 1e9;
      std::printf(
          "{\"kernel\": \"gpu_sample\", \"rows\": %d, \"vocab\": %d, \"config\": \"%s\", "
          "\"us\": %.2f, \"us_per_row\": %.2f, \"logits_gb_per_s\": %.1f, "
          "\"frac_copy_bw\": %.3f}\n",
          n_rows, kVocab, c.name, sec * 1e6, sec * 1e6 / n_rows, gb_s,
          gb_s / bench.roofline().copy_gb_per_s);
      std::fflush(stdout);
    }
  }
}

struct Options {
  int reps = 30;
  KvCacheType kv_type = KvCacheType::kBf16;
  std::vector<std::string> only;  // empty: every family
  std::vector<Shape> decode_shapes = {{1, 128},  {1, 2048},  {1, 8192},  {8, 128}, {8, 2048},
                                      {8, 8192}, {64, 128}, {64, 2048}, {64, 8192}};
  bool Runs(const char* family) const {
    return only.empty() || std::find(only.begin(), only.end(), family) != only.end();
  }
};

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The flags of the usage line; anything else is an error (one line, exit 2).
bool ParseOptions(int argc, char** argv, Options* o) {
  static const char* const kFamilies[] = {"embedding_gather", "add_rms_norm",   "gather_rms_norm",
                                          "silu_mul",         "qkv_rope",       "attention_decode",
                                          "attention_prefill", "gpu_sample"};
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", msg.c_str());
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return fail(flag + " needs a value (or is not a flag)");
    const std::string value = argv[++i];
    if (flag == "--reps") {
      o->reps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--kv-cache-dtype") {
      if (value == "bf16") {
        o->kv_type = KvCacheType::kBf16;
      } else if (value == "fp8") {
        o->kv_type = KvCacheType::kFp8;
      } else if (value == "int8") {
        o->kv_type = KvCacheType::kInt8;
      } else {
        return fail("--kv-cache-dtype must be bf16, fp8 or int8, not '" + value + "'");
      }
    } else if (flag == "--only") {
      for (const std::string& f : SplitCommas(value)) {
        if (std::find(std::begin(kFamilies), std::end(kFamilies), f) == std::end(kFamilies)) {
          return fail("--only: unknown family '" + f + "'");
        }
        o->only.push_back(f);
      }
    } else if (flag == "--attention-heads") {
      int q = 0, kv = 0, d = 0;
      char tail = 0;
      if (std::sscanf(value.c_str(), "%d:%d:%d%c", &q, &kv, &d, &tail) != 3 || q < 1 ||
          kv < 1 || q % kv != 0 || (d != 64 && d != 128 && d != 256)) {
        return fail("--attention-heads: '" + value +
                    "' is not HEADS:KV_HEADS:HEAD_DIM (heads a multiple of kv heads, head dim "
                    "64, 128 or 256)");
      }
      g_heads = q;
      g_kv_heads = kv;
      g_head_dim = d;
    } else if (flag == "--decode-shapes") {
      o->decode_shapes.clear();
      for (const std::string& item : SplitCommas(value)) {
        int batch = 0, ctx = 0;
        char tail = 0;
        if (std::sscanf(item.c_str(), "%dx%d%c", &batch, &ctx, &tail) != 2 || batch < 1 ||
            ctx < 1) {
          return fail("--decode-shapes: '" + item + "' is not BATCHxCONTEXT");
        }
        o->decode_shapes.push_back({batch, ctx});
      }
    } else {
      return fail("unknown flag " + flag);
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  Options opt;
  if (!ParseOptions(argc, argv, &opt)) return 2;
  auto info = OpenDevice(0);
  if (!info.ok()) {
    std::printf("{\"skipped\": \"%s\"}\n", info.status().message().c_str());
    return 0;
  }
  auto roofline = MeasureRoofline();
  if (!roofline.ok()) {
    std::fprintf(stderr, "%s\n", roofline.status().message().c_str());
    return 1;
  }
  const Roofline& roof = roofline.value();
  std::printf(
      "{\"kernel\": \"roofline\", \"device\": \"%s\", \"copy_bytes\": %ld, "
      "\"copy_gb_per_s\": %.1f, \"gemm_size\": %ld, \"gemm_tflop_per_s\": %.1f}\n",
      DescribeDevice(*info).c_str(), static_cast<long>(roof.copy_bytes), roof.copy_gb_per_s,
      static_cast<long>(roof.gemm_size), roof.gemm_tflop_per_s);
  std::fflush(stdout);

  Bench bench(opt.reps, roof);
  if (opt.Runs("embedding_gather")) BenchEmbeddingGather(bench);
  if (opt.Runs("add_rms_norm")) BenchAddRmsNorm(bench);
  if (opt.Runs("gather_rms_norm")) BenchGatherRmsNorm(bench);
  if (opt.Runs("silu_mul")) BenchSiluMul(bench);
  const bool rope = opt.Runs("qkv_rope") && opt.kv_type == KvCacheType::kBf16;
  if (opt.Runs("qkv_rope") && !rope) {
    std::fprintf(stderr, "bench_cuda_kernels: qkv_rope skipped (it writes a bf16 pool)\n");
  }
  if (rope || opt.Runs("attention_decode") || opt.Runs("attention_prefill")) {
    // One layer's pool: at least 64 sequences of 8192 tokens (2 GiB of bf16 K and V), more
    // when a decode shape needs it.
    int64_t tokens = int64_t{64} * 8192;
    int32_t max_ctx = 8192, max_batch = 64;
    for (const Shape& sh : opt.decode_shapes) {
      tokens = std::max(tokens, int64_t{sh.batch} * ((sh.context + kBlockTokens - 1) /
                                                     kBlockTokens * kBlockTokens));
      max_ctx = std::max(max_ctx, sh.context);
      max_batch = std::max(max_batch, sh.batch);
    }
    KvPool pool = MakeKvPool(static_cast<int32_t>(tokens / kBlockTokens), opt.kv_type);
    DeviceBuffer workspace = MustAllocate(
        PagedAttentionWorkspaceBytes(max_batch, g_heads, g_head_dim, max_ctx),
        "attention workspace");
    if (rope) BenchQkvRope(bench, pool);
    if (opt.Runs("attention_decode")) BenchAttentionDecode(bench, pool, workspace, opt.decode_shapes);
    if (opt.Runs("attention_prefill")) BenchAttentionPrefill(bench, pool, workspace);
  }
  if (opt.Runs("gpu_sample")) BenchSampling(bench);
  KCUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) {
  return kestrel::cuda::Main(argc, argv);
}

#else  // !KESTREL_HAS_CUDA

int main() {
  std::printf("{\"skipped\": \"no CUDA build\"}\n");
  return 0;
}

#endif  // KESTREL_HAS_CUDA
