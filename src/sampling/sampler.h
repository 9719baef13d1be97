// Logits processors and samplers (CPU reference; GPU variants live in backends).
// Order of processing, as in HF transformers / vLLM:
//   NaN -> -inf -> logit_bias -> repetition penalty (prompt + generated) -> frequency, then
//   presence penalty (generated only, OpenAI/vLLM semantics) -> greedy if temperature == 0, else
//   temperature -> top-k -> top-p -> min-p -> draw from the per-request seeded RNG.
//
// Semantics of each step (weights w_i = exp((z_i - z_max) / T), so the most probable token has
// weight exactly 1; p_i = w_i / sum of the weights still kept):
//   logit_bias      z[id] += bias, entries applied one by one (a repeated id adds twice). -inf
//   bans. repetition      HF: for every distinct token of prompt + generated, z > 0 ? z / r : z *
//   r. frequency       vLLM: z -= frequency_penalty * count_in_generated. presence        vLLM: z
//   -= presence_penalty if the token was generated at least once. greedy          argmax of z; ties
//   go to the lowest token id. top-k           the k best tokens, ranked by (z descending, id
//   ascending): exactly k are kept
//                   even when the k-th value is tied (HF keeps every tie; this keeps top_k = 1
//                   identical to greedy). k >= vocab disables it.
//   top-p           HF: the smallest prefix of that ranking (within the top-k set) whose weight
//                   reaches top_p * (weight of the top-k set, or of the vocabulary). At least
//                   one token. Found by selecting on mass; no full sort.
//   min-p           keeps w_i >= min_p, i.e. p_i >= min_p * p_max after temperature. Because the
//                   most probable token survives top-k/top-p, this ratio test is the same whether
//                   it is taken before or after renormalising.
// Weights use sampling::ExpNonPositive (vectorisable, relative error < 3e-7, 0 below e^-87) and
// are summed as exact fixed-point integers W_i = round(w_i * 2^43) (logit_kernels.h), so every
// sum and comparison above is exact and independent of summation order.
//
// Random draw: every call of Sample, greedy included, takes exactly one 64-bit output x of a
// std::mt19937_64 seeded with params.seed, so draw n belongs to step n. With r = x >> 11 (53 bits)
// and W the total fixed-point weight of the kept tokens, target = floor(r * W / 2^53); walking
// the kept tokens in ascending id order, the chosen token is the first whose running sum of W_i
// exceeds target. Same seed + same logits -> same tokens, whichever internal path found the kept
// set. (std::uniform_real_distribution is avoided: it differs across standard libraries.)
//
// Non-finite logits: NaN (a model bug) is treated as -inf; +inf (from the model, or a penalty
// overflowing) is clamped to the largest float. When every logit is -inf (everything banned),
// token 0 is returned, as greedy's tie rule says.
//
// Log-probabilities (when params.logprobs): by default vLLM's "raw" logprobs, i.e.
// log_softmax of the model's logits BEFORE any processing (bias, penalties, temperature,
// truncation), for the chosen token and the n_top_logprobs best. LogprobMode::kProcessed reports
// log_softmax of the logits after bias and penalties, at temperature 1, before truncation. A
// banned/NaN token has logprob -inf; the server maps it to a finite JSON value.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kestrel {

enum class LogprobMode {
  kRaw,        // log_softmax of the model logits (vLLM default)
  kProcessed,  // log_softmax after logit_bias and penalties, at temperature 1
};

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 or negative = disabled
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // HF: logit/p if > 0 else logit*p, over prompt+generated
  float presence_penalty = 0.0f;    // OpenAI: -= p if the token was generated
  float frequency_penalty = 0.0f;   // OpenAI: -= f * count in generated
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias); -inf bans
  uint64_t seed = 0;           // callers without a client seed pass a random one
  int32_t n_top_logprobs = 0;  // alternatives to report (0..20)
  bool logprobs = false;
  LogprobMode logprob_mode = LogprobMode::kRaw;
};

// Checks a request's parameters (for the CLI and the server): temperature >= 0, top_p in (0, 1],
// min_p in [0, 1], repetition_penalty > 0, presence/frequency penalties in [-2, 2],
// n_top_logprobs in [0, 20] (and > 0 only with logprobs), logit_bias ids >= 0 and, when
// vocab_size >= 0 is given, < vocab_size, with values that are not NaN or +inf. Every float must
// be finite unless stated. Messages name the OpenAI field (top_logprobs for n_top_logprobs).
Status ValidateSamplingParams(const SamplingParams& params, int32_t vocab_size = -1);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // of the chosen token (when params.logprobs)
  std::vector<TokenLogprob> top;  // n_top_logprobs best, descending (ties: lower id first)
};

// One per sequence: holds the RNG and the token counts for penalties.
// Scratch space for one Sample call (candidate ids and weights, vocab-sized) is thread-local and
// shared by all samplers of a thread, so a sequence costs O(vocab) bytes only for the penalties
// it enables.
class Sampler {
 public:
  // params must have passed ValidateSamplingParams (checked again with KCHECK).
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Records prompt tokens (used by repetition_penalty only).
  void AddPromptTokens(std::span<const int32_t> tokens);
  // Records a generated token (used by all penalties). Called by Sample itself.
  void Accept(int32_t token);

  // Processes logits in place (vocab_size floats: NaN/inf handling, bias and penalties; not
  // temperature) and draws the next token, which it then Accepts.
  SampleResult Sample(std::span<float> logits);

  // Constrained decoding (grammars): at the next Sample only tokens whose bit is set in bitmask
  // ([ceil(vocab/32)] words, bit id % 32 of word id / 32) may be drawn; the others' logits become
  // -inf after bias and penalties, so processed log-probabilities are those of the constrained
  // distribution. At least one allowed token is required. Cleared by Sample.
  void SetAllowedTokens(std::span<const uint32_t> bitmask);
  bool has_token_mask() const { return has_mask_; }

  const SamplingParams& params() const { return params_; }

  // For samplers that run elsewhere (backends/cuda/sampling.h) in place of Sample, which then
  // Accept the token they chose. NextR53 takes this step's one random draw, exactly as Sample
  // would: (mt19937_64 output) >> 11. repetition_ids: the distinct ids of prompt + generated
  // (empty unless repetition_penalty != 1). generated_ids: the distinct generated ids (empty
  // unless a presence or frequency penalty is set), each occurring generated_count(id) times.
  uint64_t NextR53() { return rng_() >> 11; }
  std::span<const int32_t> repetition_ids() const { return seen_ids_; }
  std::span<const int32_t> generated_ids() const { return generated_ids_; }
  int32_t generated_count(int32_t id) const { return generated_count_[static_cast<size_t>(id)]; }

 private:
  bool uses_repetition() const { return params_.repetition_penalty != 1.0f; }
  bool uses_counts() const {
    return params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  }
  void ApplyBiasAndPenalties(std::span<float> logits) const;
  // z_max: the largest logit; r53: this step's 53 random bits.
  int32_t Draw(std::span<const float> logits, float z_max, uint64_t r53) const;
  void FillLogprobs(std::span<float> logits, SampleResult* result) const;

  SamplingParams params_;
  int32_t vocab_size_;
  std::vector<uint32_t> allowed_;  // the next Sample's token mask (has_mask_)
  bool has_mask_ = false;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_;             // [vocab] 1 if in prompt or generated (repetition)
  std::vector<int32_t> seen_ids_;         // distinct ids with seen_ set
  std::vector<int32_t> generated_count_;  // [vocab] occurrences in generated (presence/frequency)
  std::vector<int32_t> generated_ids_;    // distinct ids with generated_count_ > 0
  std::vector<float> raw_logits_;         // [vocab] copy for raw logprobs (only when needed)
};

}  // namespace kestrel
