// Single-sequence generation over the paged KV cache: chunked prefill, then one decode token
// per forward, sampling, EOS and stop-string checks, streaming text deltas.
// Used by the CLI verbs (generate, logits, bench); the server's multi-sequence engine loop
// builds the same Batch format for many sequences at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"
#include "models/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_new_tokens = 256;
  bool ignore_eos = false;
  std::vector<int32_t> eos_ids;
  std::vector<std::string> stop;       // stop strings, matched on text across tokens
  int32_t prefill_chunk_tokens = 512;  // tokens per prefill forward
};

enum class FinishReason { kStop, kLength, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerationEvent {
  int32_t token = 0;
  std::string text_delta;  // complete UTF-8 that is safe to show (stop strings held back)
  SampleResult sample;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the stop-string token included)
  std::string text;             // generated text without the stop string
  FinishReason finish = FinishReason::kLength;
  int32_t n_prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first sampled token to the last
};

class Generator {
 public:
  // tokenizer may be null when no text is needed (then stop strings are refused).
  Generator(Model* model, const Tokenizer* tokenizer);

  // on_event returns false to cancel. Bad requests (empty prompt, prompt beyond the
  // context or KV capacity) return a Status before any forward runs.
  Result<GenerationResult> Run(const GenerationRequest& request,
                               const std::function<bool(const GenerationEvent&)>& on_event);

  // Logits at every position of ids ([n, vocab] row-major) from one prefill.
  Result<std::vector<float>> AllLogits(const std::vector<int32_t>& ids);

 private:
  Status CheckPrompt(const std::vector<int32_t>& ids, int64_t extra_tokens) const;
  // Runs tokens [begin, end) of `ids` at positions begin.. through the KV cache; writes logits of
  // the rows in want_rows (indices relative to begin) into logits, or keeps them with the model
  // for sampling when logits is nullptr.
  void ForwardRange(const std::vector<int32_t>& ids, int64_t begin, int64_t end,
                    const std::vector<int32_t>& want_rows, float* logits);

  Model* model_;
  const Tokenizer* tokenizer_;
  BlockPool pool_;
  BlockTable table_;
  // Batch scratch (one sequence).
  std::vector<int32_t> positions_, slots_, seq_starts_, context_lens_, block_tables_;
};

}  // namespace kestrel
