// Logits processors and samplers (CPU reference; GPU variants live in backends).
// Order of processing, as in HF transformers / vLLM:
//   logit_bias -> repetition penalty (prompt + generated) -> presence/frequency penalties
//   (generated only, OpenAI semantics) -> greedy if temperature == 0, else temperature ->
//   top-k -> top-p -> min-p -> draw from the per-request seeded RNG.
// Log-probabilities are reported from the processed distribution before truncation
// (log_softmax of the penalised logits at temperature 1), as OpenAI and vLLM do.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace kestrel {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 or negative = disabled
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;  // HF: logit/p if > 0 else logit*p, over prompt+generated
  float presence_penalty = 0.0f;    // OpenAI: -= p if the token was generated
  float frequency_penalty = 0.0f;   // OpenAI: -= f * count in generated
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  int32_t n_top_logprobs = 0;  // alternatives to report (0..20)
  bool logprobs = false;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                 // of the chosen token (when params.logprobs)
  std::vector<TokenLogprob> top;        // n_top_logprobs best, descending
};

// One per sequence: holds the RNG and the token counts for penalties.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Records prompt tokens (used by repetition_penalty only).
  void AddPromptTokens(std::span<const int32_t> tokens);
  // Records a generated token (used by all penalties). Called by Sample itself.
  void Accept(int32_t token);

  // Processes logits in place (vocab_size floats) and draws the next token.
  SampleResult Sample(std::span<float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_prompt_or_generated_;      // [vocab] for repetition penalty
  std::unordered_map<int32_t, int32_t> generated_counts_;  // for presence / frequency
  std::vector<int32_t> scratch_idx_;
  std::vector<float> scratch_prob_;
};

}  // namespace kestrel
