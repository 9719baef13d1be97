// GPU sampling: the CPU Sampler (sampling/sampler.h) run on the device, one thread block per row,
// choosing exactly the token Sampler::Sample would choose for the same logits, parameters,
// penalty state and random bits, and log-probabilities within 1e-5 of the CPU's. Only the token
// ids and the requested log-probabilities need to cross to the host.
//
// How it stays exact: every float operation the CPU sampler does (sanitising, bias, penalties,
// (z - z_max) * (1 / T), sampling::ExpNonPositive, the fixed-point weights round(w * 2^43)) is
// repeated with the same operations in the same order, rounded to nearest without FMA
// contraction; everything after the weights is exact integer arithmetic. The kept set is the
// CPU's by definition, not by algorithm:
//   candidates  tokens with x = (z - z_max) / T >= -32 (every other token has fixed weight 0, so
//               it can neither be drawn nor end a top-p prefix; they all rank below candidates).
//   top-k       the k best by (z desc, id asc): a radix select on that ranking key, by count.
//   top-p       the smallest ranking prefix (of the top-k set, or of the CPU's weight band
//               w >= e^-4 / e^-12 / e^-24 / denorm_min, whichever is the first to hold top_p of
//               the mass) whose fixed-point mass reaches ceil(top_p * total): a radix select on
//               the ranking key, by mass.
//   min-p       w >= min_p.
//   draw        target = floor(r53 * W / 2^53), then the first kept token in id order whose
//               running mass exceeds it: segment sums, a block scan, one warp walks the segment.
// Log-probabilities: log_softmax in double of the raw (or processed) logits, as FillLogprobs; the
// n best by a radix select on the same ranking key.
//
// Includable from plain C++ (no CUDA language features).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kestrel::cuda {

inline constexpr int32_t kGpuMaxTopLogprobs = 20;
// Token ids must fit the 20 id bits of the ranking key (the CPU's kMaxFixedWeightTokens).
inline constexpr int32_t kGpuSamplingMaxVocab = int32_t{1} << 20;

// The weight bands of the CPU's top-p over the whole vocabulary: the bits of std::exp(-4.0f),
// std::exp(-12.0f), std::exp(-24.0f) (sampler.cpp, TopPOfVocab; checked by the tests).
inline constexpr uint32_t kTopPBandCutBits[3] = {0x3C960AAEu, 0x36CE2A62u, 0x2E26083Cu};

// One per logits row, uploaded each step. Plain data: fill it from SamplingParams and the
// Sampler's state (see tests/cuda/sampling_test.cpp, MakeRow, for the exact mapping).
struct GpuSamplingRow {
  float temperature;  // 0 = greedy
  float top_p;
  float min_p;
  int32_t top_k;  // <= 0 or >= vocab: disabled
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  int32_t n_top_logprobs;  // 0..kGpuMaxTopLogprobs (only with logprobs)
  // This step's random bits: Sampler::NextR53(), i.e. (mt19937_64 output) >> 11, the one draw
  // Sampler::Sample would take (greedy included).
  uint64_t r53;
  // Ranges in GpuSamplingBatch's arrays:
  int32_t repetition_offset, n_repetition;  // Sampler::repetition_ids()
  int32_t count_offset, n_count;            // Sampler::generated_ids() and their counts
  int32_t bias_offset, n_bias;              // SamplingParams::logit_bias, in order
  int32_t logprobs;                         // 1: fill out_logprob (and the top list)
  int32_t processed_logprobs;               // 1: LogprobMode::kProcessed, 0: kRaw
};

struct GpuSamplingBatch {
  // [n_rows, vocab] device f32. Processed in place: NaN/inf sanitised, and (unless raw logprobs
  // are asked for, which keep the input and use the workspace) bias and penalties applied.
  float* logits;
  int32_t n_rows;
  int32_t vocab;
  const GpuSamplingRow* rows;     // [n_rows] device
  const int32_t* repetition_ids;  // [sum n_repetition] distinct ids of prompt + generated
  const int32_t* count_ids;       // [sum n_count] distinct generated ids
  const int32_t* count_values;    // [sum n_count] occurrences of count_ids in the generated
  const int32_t* bias_ids;        // [sum n_bias] (a repeated id adds twice, in order)
  const float* bias_values;       // [sum n_bias]
  int32_t* out_tokens;            // [n_rows] device
  float* out_logprob;             // [n_rows] device: of the chosen token (0 without logprobs)
  int32_t* out_top_ids;           // [n_rows, kGpuMaxTopLogprobs]: best first, -1 past the end
  float* out_top_logprobs;        // [n_rows, kGpuMaxTopLogprobs]: 0 past the end
  // Host-side promise that IsPlainGreedy holds for every row: GpuSample then takes the argmax
  // with many blocks per row (a 152k-entry row is ~608 KB; one block per row reads it at one
  // SM's bandwidth) and leaves the logits as they are (no in-place sanitising). Same tokens.
  bool greedy_only = false;
};

// A row whose token is the argmax of its sanitised logits and that wants no log-probabilities:
// temperature 0, no bias, no penalty that changes anything (GpuSampleKernel's `modifies`).
inline bool IsPlainGreedy(const GpuSamplingRow& r) {
  const bool repetition = r.repetition_penalty != 1.0f && r.n_repetition > 0;
  const bool counts = (r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f) && r.n_count > 0;
  return r.temperature == 0.0f && r.n_bias == 0 && !repetition && !counts && r.logprobs == 0;
}

// Device scratch for GpuSample with up to max_rows rows (a copy of the logits for rows that ask
// for raw logprobs while bias or penalties change them).
size_t GpuSamplingWorkspaceBytes(int32_t max_rows, int32_t vocab);

// Samples every row of the batch on `stream` (asynchronous). Requires 0 < vocab <=
// kGpuSamplingMaxVocab, workspace_bytes >= GpuSamplingWorkspaceBytes(n_rows, vocab), parameters
// that pass ValidateSamplingParams and penalty/bias ids in [0, vocab).
void GpuSample(const GpuSamplingBatch& batch, void* workspace, size_t workspace_bytes,
               cudaStream_t stream);

}  // namespace kestrel::cuda
