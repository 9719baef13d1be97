// GPU sampling (sampling.h): one block of 1024 threads per logits row. The row stays in global
// memory (L2-resident after the lm_head) and is read in a few coalesced passes; shared memory
// holds the radix-select histograms, the draw's segment sums and the block reductions.
//
// Every step mirrors sampling/sampler.cpp; the comments name the CPU function each part copies.
// Float arithmetic uses the _rn intrinsics so that nvcc cannot contract it into FMAs (the CPU
// build has no FMA), in the same order as the C++ expressions.
#include "backends/cuda/sampling.h"

#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kDigitBits = 11;  // radix select: 2048 buckets a pass, two per thread
constexpr int kBuckets = 1 << kDigitBits;
static_assert(kBuckets == 2 * kThreads);
constexpr int kIdBits = 20;  // ranking key = (z descending: 32 bits, id: 20 bits)
static_assert(kGpuSamplingMaxVocab == 1 << kIdBits);
constexpr uint64_t kMaxRankKey = (uint64_t{1} << (32 + kIdBits)) - 1;
constexpr uint32_t kNegInfBits = 0xFF800000u;
constexpr uint32_t kPosInfBits = 0x7F800000u;
constexpr uint32_t kMaxFloatBits = 0x7F7FFFFFu;
// Tokens with x = (z - z_max) / T below this have fixed weight 0 (ExpNonPositive(x) < 2^-44 for
// every float x < -32, checked over all of them), so they can never be drawn.
constexpr float kCandidateMinX = -32.0f;
// kTopPBandCutBits as scalars (device code cannot index a host constexpr array).
constexpr uint32_t kBandCut0Bits = kTopPBandCutBits[0];
constexpr uint32_t kBandCut1Bits = kTopPBandCutBits[1];
constexpr uint32_t kBandCut2Bits = kTopPBandCutBits[2];

// The polynomial coefficients of sampling::ExpNonPositive, as the host compiler rounds them.
constexpr float kC7 = 0x1.a01a02p-13f, kC6 = 0x1.6c16c2p-10f, kC5 = 0x1.111112p-7f;
constexpr float kC4 = 0x1.555556p-5f, kC3 = 0x1.555556p-3f;
static_assert(kC7 == 1.0f / 5040.0f && kC6 == 1.0f / 720.0f && kC5 == 1.0f / 120.0f &&
              kC4 == 1.0f / 24.0f && kC3 == 1.0f / 6.0f);

// ---------------------------------------------------------------------------------------------
// Exact copies of the CPU arithmetic (sampling/logit_kernels.h).

// sampling::ExpNonPositive, operation for operation.
__device__ __forceinline__ float ExpNonPositive(float x) {
  const uint32_t bits = __float_as_uint(x);
  constexpr uint32_t kMinus87 = 0xC2AE0000u;
  const uint32_t under = bits > kMinus87 ? 0xFFFFFFFFu : 0u;
  const float xc = __uint_as_float((under & kMinus87) | (~under & bits));
  const float t = __fmul_rn(xc, 1.44269504088896341f);
  const float n = __fsub_rn(__fadd_rn(t, 12582912.0f), 12582912.0f);
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, 0.693145751953125f)),
                            __fmul_rn(n, 1.42860682030941723212e-6f));
  float p = kC7;
  p = __fadd_rn(__fmul_rn(p, r), kC6);
  p = __fadd_rn(__fmul_rn(p, r), kC5);
  p = __fadd_rn(__fmul_rn(p, r), kC4);
  p = __fadd_rn(__fmul_rn(p, r), kC3);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const int32_t ni = __float2int_rz(n);  // n is an integer in [-126, 0]
  const float scale = __uint_as_float(static_cast<uint32_t>(ni + 127) << 23);
  return __uint_as_float(~under & __float_as_uint(__fmul_rn(p, scale)));
}

// sampling::FixedWeight: round(w * 2^43) as the low bits of w * 2^43 + 2^52.
__device__ __forceinline__ uint64_t FixedWeight(float w) {
  const double shifted = __dadd_rn(__dmul_rn(static_cast<double>(w), 0x1p43), 0x1p52);
  return static_cast<uint64_t>(__double_as_longlong(shifted)) - 0x4330000000000000ull;
}

// sampling::CeilScaled: ceil(p * total) exactly, p in (0, 1].
__device__ uint64_t CeilScaled(float p, uint64_t total) {
  int e = 0;
  const float mantissa = frexpf(p, &e);
  const auto m = static_cast<uint64_t>(ldexpf(mantissa, 24));
  const unsigned __int128 product = static_cast<unsigned __int128>(m) * total;
  const int shift = 24 - e;
  if (shift <= 0) return static_cast<uint64_t>(product << -shift);
  if (shift >= 127) return product == 0 ? 0 : 1;
  const unsigned __int128 one = 1;
  return static_cast<uint64_t>((product + (one << shift) - 1) >> shift);
}

// sampling::DrawTarget: floor(r53 * total / 2^53).
__device__ __forceinline__ uint64_t DrawTarget(uint64_t r53, uint64_t total) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r53) * total) >> 53);
}

// sampling::SanitizeAndMax, one element: NaN -> -inf, +inf -> the largest float.
__device__ __forceinline__ float Sanitize(float v) {
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) > kPosInfBits) b = kNegInfBits;
  if (b == kPosInfBits) b = kMaxFloatBits;
  return __uint_as_float(b);
}

// The CPU's OrderKey: signed order = float order (-0 below +0); its own inverse.
__device__ __forceinline__ int32_t OrderKey(int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

// ---------------------------------------------------------------------------------------------
// Ranking keys. The CPU compares floats, so -0 and +0 are the same logit.

// Unsigned key increasing with z (z not NaN), -0 mapped to +0.
__device__ __forceinline__ uint32_t AscendingKey(float z) {
  uint32_t b = __float_as_uint(z);
  b = b == 0x80000000u ? 0u : b;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Top-k / top-p / top-logprobs ranking (sampler.cpp, Better): smaller key = better, i.e. higher
// logit first and lower id first among equal logits. Unique per token.
__device__ __forceinline__ uint64_t RankKey(float z, int32_t id) {
  return (static_cast<uint64_t>(~AscendingKey(z)) << kIdBits) | static_cast<uint32_t>(id);
}

// Greedy (sampling::FirstIndexOf of the maximum): the largest key is the first maximal token.
__device__ __forceinline__ uint64_t ArgmaxKey(float z, int32_t id) {
  return (static_cast<uint64_t>(AscendingKey(z)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t ArgmaxKeyId(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

// ---------------------------------------------------------------------------------------------
// Block-wide helpers (blockDim.x == kThreads; every thread calls them).

struct SharedState {
  // Radix-select histograms; mass[] also holds the draw's segment sums.
  unsigned long long mass[kBuckets];
  uint32_t count[kBuckets];
  int32_t last[kBuckets];  // some member of the bucket (the member when count == 1)
  unsigned long long scratch_u64[kWarps];
  double scratch_f64[kWarps];
  int32_t scratch_i32[kWarps];
  unsigned long long result_u64;
  int32_t result_i32[2];
  int32_t n_top;
  int32_t top_ids[kGpuMaxTopLogprobs];
  unsigned long long top_keys[kGpuMaxTopLogprobs];
};

struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

template <class T, class Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// The reduction over the block, returned to every thread (fixed order: deterministic).
template <class T, class Op>
__device__ T BlockReduce(T v, Op op, T* scratch /*[kWarps] shared*/) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpReduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  __syncthreads();
  return r;
}

// Exclusive prefix sum of one value per thread, in thread order; *total gets the sum.
__device__ uint64_t BlockExclusiveSum(uint64_t v, unsigned long long* scratch /*[kWarps]*/,
                                      uint64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t inclusive = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint64_t other = __shfl_up_sync(kFullMask, inclusive, off);
    if (lane >= off) inclusive += other;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  uint64_t before = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    const uint64_t s = scratch[w];
    if (w < warp) before += s;
    sum += s;
  }
  __syncthreads();
  *total = sum;
  return before + inclusive - v;
}

// Among the tokens i in [0, n) with key_of(i, &key) true, key in [lo, hi] and mass_of(i) > 0
// (the members), finds the one with the smallest key whose inclusive running mass, in key order,
// reaches need; returns its id. Requires unique keys, every member key >= lo, the answer's key
// <= hi, and 1 <= need <= the mass of the members. mass_of (possibly costly) is called only for
// keys in range. kUnitMass: every mass is 1 (a count; mass_of is not called). Returns -1 if the
// requirements are broken.
//
// Radix select on key - lo, the top 11 bits of the remaining range a pass (the range shrinks by
// 2048 each pass), stopping as soon as the bucket holding the answer has one member: typically 2-3
// passes over the row.
// The mass_of of a counting selection (not called).
struct UnitMass {
  template <class I>
  __device__ uint64_t operator()(I) const {
    return 1;
  }
};

template <bool kUnitMass, class KeyOf, class MassOf>
__device__ int32_t SelectByMass(const KeyOf& key_of, const MassOf& mass_of, int32_t n, uint64_t lo,
                                uint64_t hi, uint64_t need, SharedState& sh) {
  const int tid = threadIdx.x, lane = tid & 31;
  for (;;) {
    const uint64_t range = hi - lo;
    const int shift =
        range < kBuckets ? 0 : 64 - __clzll(static_cast<long long>(range)) - kDigitBits;
    for (int b = tid; b < kBuckets; b += kThreads) {
      sh.mass[b] = 0;
      sh.count[b] = 0;
    }
    if (tid == 0) sh.result_i32[0] = -1;
    __syncthreads();
    for (int32_t base = tid - lane; base < n; base += kThreads) {  // same trip count per warp
      const int32_t i = base + lane;
      uint64_t key = 0, mass = 1;
      bool in = i < n && key_of(i, &key) && key >= lo && key <= hi;
      if constexpr (!kUnitMass) {
        if (in) mass = mass_of(i);
        in = in && mass != 0;
      }
      const uint32_t digit = in ? static_cast<uint32_t>((key - lo) >> shift) : kBuckets;
      if constexpr (kUnitMass) {
        // One atomic per distinct digit of the warp: tied logits share a digit for several passes.
        const unsigned peers = __match_any_sync(kFullMask, digit);
        if (in && lane == __ffs(peers) - 1) {
          atomicAdd(&sh.count[digit], static_cast<uint32_t>(__popc(peers)));
          atomicExch(&sh.last[digit], i);
        }
      } else if (in) {
        atomicAdd(&sh.mass[digit], static_cast<unsigned long long>(mass));
        atomicAdd(&sh.count[digit], 1u);
        // Any member will do (last is read only when count == 1); an atomic, so that members
        // of one bucket never race on it (compute-sanitizer racecheck flagged the plain store).
        atomicExch(&sh.last[digit], i);
      }
    }
    __syncthreads();
    // The bucket where the running mass reaches need: thread t owns buckets 2t and 2t + 1.
    const int b0 = 2 * tid;
    const uint64_t m0 = kUnitMass ? sh.count[b0] : sh.mass[b0];
    const uint64_t m1 = kUnitMass ? sh.count[b0 + 1] : sh.mass[b0 + 1];
    uint64_t total = 0;
    const uint64_t before = BlockExclusiveSum(m0 + m1, sh.scratch_u64, &total);
    if (need > before && need <= before + m0) {
      sh.result_i32[0] = b0;
      sh.result_u64 = need - before;
    } else if (need > before + m0 && need <= before + m0 + m1) {
      sh.result_i32[0] = b0 + 1;
      sh.result_u64 = need - before - m0;
    }
    __syncthreads();
    const int digit = sh.result_i32[0];
    const uint64_t need_left = sh.result_u64;
    const uint32_t count = digit >= 0 ? sh.count[digit] : 0;
    const int32_t last = digit >= 0 ? sh.last[digit] : -1;
    __syncthreads();  // all have read before the next pass clears
    if (digit < 0) return -1;
    if (count == 1) return last;
    if (shift == 0) return -1;  // a single key with several members: keys were not unique
    need = need_left;
    lo += static_cast<uint64_t>(digit) << shift;
    const uint64_t top = lo + ((uint64_t{1} << shift) - 1);
    hi = top < hi ? top : hi;
  }
}

// The draw (sampler.cpp, WalkVocab / WalkList): with W the total of mass_of over the row and
// target = DrawTarget(r53, W), the first token in id order whose running mass exceeds target.
// The row is cut into at most kThreads segments of consecutive ids; each warp sums 32 segments
// (coalesced), a block scan finds the segment holding the target, and one warp walks it.
template <class MassOf>
__device__ int32_t DrawInIdOrder(const MassOf& mass_of, int32_t n, uint64_t r53, SharedState& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t seg_len = ((n + kThreads - 1) / kThreads + 31) / 32 * 32;
  const int32_t n_seg = (n + seg_len - 1) / seg_len;  // <= kThreads
  if (tid == 0) sh.result_i32[0] = -1;
  for (int32_t s = warp; s < n_seg; s += kWarps) {
    uint64_t acc = 0;
    for (int32_t j = lane; j < seg_len; j += 32) {
      const int32_t i = s * seg_len + j;
      if (i < n) acc += mass_of(i);
    }
    acc = WarpReduce(acc, Sum());
    if (lane == 0) sh.mass[s] = acc;
  }
  __syncthreads();
  const uint64_t mine = tid < n_seg ? sh.mass[tid] : 0;
  uint64_t total = 0;
  const uint64_t before = BlockExclusiveSum(mine, sh.scratch_u64, &total);
  const uint64_t target = DrawTarget(r53, total);
  if (tid < n_seg && target >= before && target - before < mine) {
    sh.result_i32[0] = tid;
    sh.result_u64 = before;
  }
  __syncthreads();
  const int32_t seg = sh.result_i32[0];
  if (seg >= 0 && warp == 0) {
    uint64_t running = sh.result_u64;
    int32_t token = -1;
    for (int32_t j0 = 0; j0 < seg_len; j0 += 32) {
      const int32_t i = seg * seg_len + j0 + lane;
      const uint64_t m = i < n ? mass_of(i) : 0;
      uint64_t inclusive = m;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const uint64_t other = __shfl_up_sync(kFullMask, inclusive, off);
        if (lane >= off) inclusive += other;
      }
      const unsigned hit = __ballot_sync(kFullMask, running + inclusive > target);
      if (hit != 0) {
        token = seg * seg_len + j0 + __ffs(hit) - 1;
        break;
      }
      running += __shfl_sync(kFullMask, inclusive, 31);
    }
    if (lane == 0) sh.result_i32[1] = token;
  }
  __syncthreads();
  const int32_t token = seg >= 0 ? sh.result_i32[1] : -1;
  __syncthreads();
  return token;
}

// ---------------------------------------------------------------------------------------------
// The steps of Sampler::Sample.

// Sampler::ApplyBiasAndPenalties on the sanitised row z. Per id the CPU order is: its bias
// entries in order, then the repetition penalty, then frequency, then presence; different ids
// are independent, so each phase runs in parallel over its (distinct) ids.
__device__ void ApplyBiasAndPenalties(const GpuSamplingBatch& b, const GpuSamplingRow& p,
                                      bool use_repetition, bool use_counts, float* z /*[vocab]*/) {
  const int tid = threadIdx.x;
  const int32_t* bias_ids = b.bias_ids + p.bias_offset;
  const float* bias_values = b.bias_values + p.bias_offset;
  for (int32_t j = tid; j < p.n_bias; j += kThreads) {
    const int32_t id = bias_ids[j];
    bool first = true;
    for (int32_t k = 0; k < j && first; ++k) first = bias_ids[k] != id;
    if (!first) continue;  // the first entry of an id applies all of its entries, in order
    float v = z[id];
    for (int32_t k = j; k < p.n_bias; ++k) {
      if (bias_ids[k] == id) v = __fadd_rn(v, bias_values[k]);
    }
    z[id] = v;
  }
  __syncthreads();
  if (use_repetition) {
    const float r = p.repetition_penalty;
    const int32_t* ids = b.repetition_ids + p.repetition_offset;
    for (int32_t j = tid; j < p.n_repetition; j += kThreads) {
      const int32_t id = ids[j];
      const float v = z[id];
      z[id] = v > 0.0f ? __fdiv_rn(v, r) : __fmul_rn(v, r);
    }
    __syncthreads();
  }
  if (use_counts) {
    const int32_t* ids = b.count_ids + p.count_offset;
    const int32_t* counts = b.count_values + p.count_offset;
    for (int32_t j = tid; j < p.n_count; j += kThreads) {
      const int32_t id = ids[j];
      float v = z[id];
      v = __fsub_rn(v, __fmul_rn(p.frequency_penalty, __int2float_rn(counts[j])));
      v = __fsub_rn(v, p.presence_penalty);
      z[id] = v;
    }
    __syncthreads();
  }
}

// Sampler::Draw for a finite temperature: the kept set of top-k, top-p and min-p, then the draw.
// Only candidates (x >= kCandidateMinX) are considered: the others have weight 0 and rank below
// every candidate, so dropping them changes neither the top-k / top-p prefixes that matter nor
// any mass.
__device__ int32_t SampleWithTemperature(const float* z /*[vocab]*/, int32_t vocab,
                                         const GpuSamplingRow& p, float z_max, int32_t greedy,
                                         float inv_t, SharedState& sh) {
  const int tid = threadIdx.x;
  auto x_of = [&](float zi) { return __fmul_rn(__fsub_rn(zi, z_max), inv_t); };
  const uint64_t best_key = RankKey(z[greedy], greedy);  // the smallest key of the row

  // Kept: candidates with key <= key_limit and w >= w_floor.
  uint64_t key_limit = kMaxRankKey;
  float w_floor = 0.0f;
  if (p.top_k > 0 && p.top_k < vocab) {
    // SelectTopK: the k best candidates. First their number and the worst key among them.
    uint64_t worst_key = best_key;
    int32_t n_cand = 0;
    for (int32_t i = tid; i < vocab; i += kThreads) {
      const float zi = z[i];
      if (x_of(zi) >= kCandidateMinX) {
        ++n_cand;
        const uint64_t key = RankKey(zi, i);
        worst_key = key > worst_key ? key : worst_key;
      }
    }
    key_limit = BlockReduce<unsigned long long>(worst_key, Max(), sh.scratch_u64);
    n_cand = BlockReduce(n_cand, Sum(), sh.scratch_i32);
    if (n_cand > p.top_k) {
      auto candidate_key = [&](int32_t i, uint64_t* key) {
        const float zi = z[i];
        *key = RankKey(zi, i);
        return x_of(zi) >= kCandidateMinX;
      };
      const int32_t kth = SelectByMass<true>(candidate_key, UnitMass(), vocab, best_key, key_limit,
                                             static_cast<uint64_t>(p.top_k), sh);
      if (kth < 0) return -1;
      key_limit = RankKey(z[kth], kth);
    }
    if (p.top_p < 1.0f) {
      // NucleusByMass over the top-k set.
      auto top_k_key = [&](int32_t i, uint64_t* key) {
        const float zi = z[i];
        *key = RankKey(zi, i);
        return x_of(zi) >= kCandidateMinX && *key <= key_limit;
      };
      auto mass = [&](int32_t i) { return FixedWeight(ExpNonPositive(x_of(z[i]))); };
      uint64_t total = 0;
      for (int32_t i = tid; i < vocab; i += kThreads) {
        uint64_t key = 0;
        if (top_k_key(i, &key)) total += mass(i);
      }
      total = BlockReduce<unsigned long long>(total, Sum(), sh.scratch_u64);
      const uint64_t need = CeilScaled(p.top_p, total);
      const int32_t last =
          SelectByMass<false>(top_k_key, mass, vocab, best_key, key_limit, need, sh);
      if (last < 0) return -1;
      key_limit = RankKey(z[last], last);
    }
  } else if (p.top_p < 1.0f) {
    // TopPOfVocab: the first weight band w >= cut holding need, then NucleusByMass inside it.
    float cuts[4];
    cuts[0] = __uint_as_float(kBandCut0Bits);
    cuts[1] = __uint_as_float(kBandCut1Bits);
    cuts[2] = __uint_as_float(kBandCut2Bits);
    cuts[3] = __uint_as_float(1u);  // denorm_min
    uint64_t band[4] = {0, 0, 0, 0};
    uint64_t worst_key[4] = {best_key, best_key, best_key, best_key};  // of each band
    for (int32_t i = tid; i < vocab; i += kThreads) {
      const float zi = z[i];
      const float x = x_of(zi);
      if (!(x >= kCandidateMinX)) continue;
      const uint64_t key = RankKey(zi, i);
      const float w = ExpNonPositive(x);
      const uint64_t fw = FixedWeight(w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (w >= cuts[j]) {
          band[j] += fw;
          worst_key[j] = key > worst_key[j] ? key : worst_key[j];
        }
      }
    }
    const uint64_t total = BlockReduce<unsigned long long>(band[3], Sum(), sh.scratch_u64);
    const uint64_t need = CeilScaled(p.top_p, total);  // band 3 holds every positive weight
    uint64_t band_total[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      band_total[j] = BlockReduce<unsigned long long>(band[j], Sum(), sh.scratch_u64);
    }
    const int j_cut = band_total[0] >= need   ? 0
                      : band_total[1] >= need ? 1
                      : band_total[2] >= need ? 2
                                              : 3;
    uint64_t hi = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) hi = j == j_cut ? worst_key[j] : hi;
    hi = BlockReduce<unsigned long long>(hi, Max(), sh.scratch_u64);
    float cut = cuts[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) cut = j == j_cut ? cuts[j] : cut;
    auto candidate_key = [&](int32_t i, uint64_t* key) {
      const float zi = z[i];
      *key = RankKey(zi, i);
      return x_of(zi) >= kCandidateMinX;
    };
    auto band_mass = [&](int32_t i) -> uint64_t {
      const float w = ExpNonPositive(x_of(z[i]));
      return w >= cut ? FixedWeight(w) : 0;
    };
    const int32_t last =
        SelectByMass<false>(candidate_key, band_mass, vocab, best_key, hi, need, sh);
    if (last < 0) return -1;
    key_limit = RankKey(z[last], last);
    w_floor = cut;
  }
  // min-p: w >= min_p (the CPU's x >= log(min_p) - 0.01 prefilter never drops a token of
  // positive fixed weight that passes this test).
  if (p.min_p > 0.0f) w_floor = w_floor > p.min_p ? w_floor : p.min_p;

  auto kept_mass = [&](int32_t i) -> uint64_t {
    const float zi = z[i];
    const float x = x_of(zi);
    if (!(x >= kCandidateMinX) || RankKey(zi, i) > key_limit) return 0;
    const float w = ExpNonPositive(x);
    return w >= w_floor ? FixedWeight(w) : 0;
  };
  return DrawInIdOrder(kept_mass, vocab, p.r53, sh);
}

// Sampler::FillLogprobs on the row src (sanitised on read): log_softmax in double of the chosen
// token and of the n best by (logit descending, id ascending).
__device__ void FillLogprobs(const float* src /*[vocab]*/, int32_t vocab, float z_max,
                             int32_t token, const GpuSamplingRow& p, float* out_logprob,
                             int32_t* out_top_ids /*[kGpuMaxTopLogprobs]*/,
                             float* out_top_logprobs /*[kGpuMaxTopLogprobs]*/, SharedState& sh) {
  const int tid = threadIdx.x;
  const bool all_banned = __float_as_uint(z_max) == kNegInfBits;
  double log_sum = 0.0;
  if (!all_banned) {
    // ComputeWeights(z, z_max, 1.0f) and LaneSum (summed in another order: error ~1e-16).
    double sum = 0.0;
    for (int32_t i = tid; i < vocab; i += kThreads) {
      sum += static_cast<double>(ExpNonPositive(__fsub_rn(Sanitize(src[i]), z_max)));
    }
    sum = BlockReduce(sum, Sum(), sh.scratch_f64);
    log_sum = log(sum);
  }
  auto logprob = [&](int32_t id) {
    if (all_banned) return __uint_as_float(kNegInfBits);
    const double d = __dsub_rn(
        __dsub_rn(static_cast<double>(Sanitize(src[id])), static_cast<double>(z_max)), log_sum);
    return __double2float_rn(d);
  };

  const int32_t n_top = p.n_top_logprobs < vocab ? p.n_top_logprobs : vocab;
  int32_t n_found = 0;
  if (n_top > 0) {
    auto any_key = [&](int32_t i, uint64_t* key) {
      *key = RankKey(Sanitize(src[i]), i);
      return true;
    };
    const int32_t nth = SelectByMass<true>(any_key, UnitMass(), vocab, 0, kMaxRankKey,
                                           static_cast<uint64_t>(n_top), sh);
    if (tid == 0) sh.n_top = 0;
    __syncthreads();
    if (nth >= 0) {
      const uint64_t key_limit = RankKey(Sanitize(src[nth]), nth);
      for (int32_t i = tid; i < vocab; i += kThreads) {
        const uint64_t key = RankKey(Sanitize(src[i]), i);
        if (key <= key_limit) {
          const int32_t slot = atomicAdd(&sh.n_top, 1);
          if (slot < kGpuMaxTopLogprobs) {
            sh.top_ids[slot] = i;
            sh.top_keys[slot] = key;
          }
        }
      }
    }
    __syncthreads();
    n_found = sh.n_top < n_top ? sh.n_top : n_top;
    if (tid == 0) {  // insertion sort of at most 20 by key
      for (int32_t a = 1; a < n_found; ++a) {
        const unsigned long long key = sh.top_keys[a];
        const int32_t id = sh.top_ids[a];
        int32_t c = a - 1;
        for (; c >= 0 && sh.top_keys[c] > key; --c) {
          sh.top_keys[c + 1] = sh.top_keys[c];
          sh.top_ids[c + 1] = sh.top_ids[c];
        }
        sh.top_keys[c + 1] = key;
        sh.top_ids[c + 1] = id;
      }
    }
    __syncthreads();
  }
  if (tid < kGpuMaxTopLogprobs) {
    const bool has = tid < n_found;
    out_top_ids[tid] = has ? sh.top_ids[tid] : -1;
    out_top_logprobs[tid] = has ? logprob(sh.top_ids[tid]) : 0.0f;
  }
  if (tid == 0) *out_logprob = token >= 0 ? logprob(token) : 0.0f;
}

__global__ void __launch_bounds__(kThreads, 1)
    GpuSampleKernel(const GpuSamplingBatch b, float* z_copy /*[n_rows, vocab]*/) {
  __shared__ SharedState sh;
  const int tid = threadIdx.x;
  const int32_t row = static_cast<int32_t>(blockIdx.x);
  const int32_t vocab = b.vocab;
  const GpuSamplingRow p = b.rows[row];
  float* logits = b.logits + static_cast<int64_t>(row) * vocab;

  // Sampler::uses_repetition / uses_counts; the row needs a separate processed copy only when
  // raw logprobs must still read the unprocessed logits afterwards.
  const bool use_repetition = p.repetition_penalty != 1.0f && p.n_repetition > 0;
  const bool use_counts =
      (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && p.n_count > 0;
  const bool modifies = p.n_bias > 0 || use_repetition || use_counts;
  const bool raw_logprobs = p.logprobs != 0 && p.processed_logprobs == 0;
  float* z = modifies && raw_logprobs ? z_copy + static_cast<int64_t>(row) * vocab : logits;

  // 1. SanitizeAndMax into z; the greedy token.
  int32_t max_key = OrderKey(static_cast<int32_t>(kNegInfBits));
  unsigned long long best = 0;
  for (int32_t i = tid; i < vocab; i += kThreads) {
    const float v = logits[i];
    const float s = Sanitize(v);
    if (z != logits || __float_as_uint(s) != __float_as_uint(v)) z[i] = s;
    const int32_t key = OrderKey(__float_as_int(s));
    max_key = key > max_key ? key : max_key;
    const unsigned long long ak = ArgmaxKey(s, i);
    best = ak > best ? ak : best;
  }
  max_key = BlockReduce(max_key, Max(), sh.scratch_i32);
  best = BlockReduce(best, Max(), sh.scratch_u64);
  const float raw_max = __int_as_float(OrderKey(max_key));
  float z_max = raw_max;

  // 2. Bias and penalties, then sanitise again (they may overflow) and take the new maximum.
  if (modifies) {
    ApplyBiasAndPenalties(b, p, use_repetition, use_counts, z);
    max_key = OrderKey(static_cast<int32_t>(kNegInfBits));
    best = 0;
    for (int32_t i = tid; i < vocab; i += kThreads) {
      const float v = z[i];
      const float s = Sanitize(v);
      if (__float_as_uint(s) != __float_as_uint(v)) z[i] = s;
      const int32_t key = OrderKey(__float_as_int(s));
      max_key = key > max_key ? key : max_key;
      const unsigned long long ak = ArgmaxKey(s, i);
      best = ak > best ? ak : best;
    }
    max_key = BlockReduce(max_key, Max(), sh.scratch_i32);
    best = BlockReduce(best, Max(), sh.scratch_u64);
    z_max = __int_as_float(OrderKey(max_key));
  }
  const int32_t greedy = ArgmaxKeyId(best);

  // 3. Sampler::Draw: greedy for T == 0 (or a temperature so small that 1/T is not finite), or
  // when every token is banned (token 0 by the tie rule).
  const float inv_t = p.temperature == 0.0f ? 0.0f : __fdiv_rn(1.0f, p.temperature);
  const bool inv_t_finite = (__float_as_uint(inv_t) & kPosInfBits) != kPosInfBits;
  int32_t token = greedy;
  if (inv_t != 0.0f && inv_t_finite && __float_as_uint(z_max) != kNegInfBits) {
    token = SampleWithTemperature(z, vocab, p, z_max, greedy, inv_t, sh);
  }

  // 4. Log-probabilities of the raw logits (unchanged in `logits`, or sanitised in place when
  // nothing modified them) or of the processed ones.
  int32_t* top_ids = b.out_top_ids + static_cast<int64_t>(row) * kGpuMaxTopLogprobs;
  float* top_logprobs = b.out_top_logprobs + static_cast<int64_t>(row) * kGpuMaxTopLogprobs;
  if (p.logprobs != 0) {
    FillLogprobs(raw_logprobs ? logits : z, vocab, raw_logprobs ? raw_max : z_max, token, p,
                 b.out_logprob + row, top_ids, top_logprobs, sh);
  } else {
    if (tid < kGpuMaxTopLogprobs) {
      top_ids[tid] = -1;
      top_logprobs[tid] = 0.0f;
    }
    if (tid == 0) b.out_logprob[row] = 0.0f;
  }
  if (tid == 0) b.out_tokens[row] = token;
}

// Greedy-only batches: the argmax key (ArgmaxKey of Sanitize(z), as step 1 of GpuSampleKernel)
// of each of kGreedyChunks slices of a row, grid (chunk, row); then GreedyFinishKernel takes the
// largest of a row's slice keys. Max is associative and the key unique per token, so the token
// is the one GpuSampleKernel picks.
constexpr int kGreedyThreads = 256;
constexpr int kGreedyChunks = 32;

__global__ void __launch_bounds__(kGreedyThreads)
    GreedyPartialKernel(const float* __restrict__ logits /*[n_rows, vocab]*/, int32_t vocab,
                        unsigned long long* __restrict__ partial /*[n_rows, kGreedyChunks]*/) {
  __shared__ unsigned long long scratch[kGreedyThreads / 32];
  const int32_t row = static_cast<int32_t>(blockIdx.y);
  const int32_t per = (vocab + kGreedyChunks - 1) / kGreedyChunks;
  const int32_t begin = static_cast<int32_t>(blockIdx.x) * per;
  const int32_t end = min(vocab, begin + per);
  const float* z = logits + static_cast<int64_t>(row) * vocab;
  unsigned long long best = 0;  // below every real key
  for (int32_t i = begin + static_cast<int32_t>(threadIdx.x); i < end; i += kGreedyThreads) {
    const unsigned long long ak = ArgmaxKey(Sanitize(z[i]), i);
    best = ak > best ? ak : best;
  }
  best = WarpReduce(best, Max());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGreedyThreads / 32; ++w) best = scratch[w] > best ? scratch[w] : best;
    partial[static_cast<int64_t>(row) * kGreedyChunks + blockIdx.x] = best;
  }
}

// One warp per row.
__global__ void GreedyFinishKernel(const GpuSamplingBatch b,
                                   const unsigned long long* __restrict__ partial) {
  static_assert(kGreedyChunks <= 32 && kGpuMaxTopLogprobs <= 32);
  const int32_t row = static_cast<int32_t>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x);
  unsigned long long best =
      lane < kGreedyChunks ? partial[static_cast<int64_t>(row) * kGreedyChunks + lane] : 0;
  best = WarpReduce(best, Max());
  if (lane < kGpuMaxTopLogprobs) {
    b.out_top_ids[static_cast<int64_t>(row) * kGpuMaxTopLogprobs + lane] = -1;
    b.out_top_logprobs[static_cast<int64_t>(row) * kGpuMaxTopLogprobs + lane] = 0.0f;
  }
  if (lane == 0) {
    b.out_tokens[row] = ArgmaxKeyId(best);
    b.out_logprob[row] = 0.0f;
  }
}

size_t CopyBytes(int32_t rows, int32_t vocab) {
  return static_cast<size_t>(rows) * static_cast<size_t>(vocab) * sizeof(float);
}

}  // namespace

size_t GpuSamplingWorkspaceBytes(int32_t max_rows, int32_t vocab) {
  KCHECK(max_rows >= 0 && vocab > 0);
  return (CopyBytes(max_rows, vocab) + 255) / 256 * 256;
}

void GpuSample(const GpuSamplingBatch& batch, void* workspace, size_t workspace_bytes,
               cudaStream_t stream) {
  KCHECK(batch.vocab > 0 && batch.vocab <= kGpuSamplingMaxVocab);
  KCHECK(batch.n_rows >= 0);
  if (batch.n_rows == 0) return;
  KCHECK(batch.logits != nullptr && batch.rows != nullptr && batch.out_tokens != nullptr &&
         batch.out_logprob != nullptr && batch.out_top_ids != nullptr &&
         batch.out_top_logprobs != nullptr);
  KCHECK_MSG(workspace != nullptr && workspace_bytes >= CopyBytes(batch.n_rows, batch.vocab),
             "GpuSample workspace smaller than GpuSamplingWorkspaceBytes(n_rows, vocab)");
  const size_t partial_bytes =
      static_cast<size_t>(batch.n_rows) * kGreedyChunks * sizeof(unsigned long long);
  if (batch.greedy_only && partial_bytes <= workspace_bytes && batch.n_rows <= 65535) {
    auto* partial = static_cast<unsigned long long*>(workspace);
    GreedyPartialKernel<<<dim3(kGreedyChunks, static_cast<unsigned>(batch.n_rows)), kGreedyThreads,
                          0, stream>>>(batch.logits, batch.vocab, partial);
    KCUDA_CHECK_LAUNCH();
    GreedyFinishKernel<<<static_cast<unsigned>(batch.n_rows), 32, 0, stream>>>(batch, partial);
    KCUDA_CHECK_LAUNCH();
    return;
  }
  GpuSampleKernel<<<static_cast<unsigned>(batch.n_rows), kThreads, 0, stream>>>(
      batch, static_cast<float*>(workspace));
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
