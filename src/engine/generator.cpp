#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "engine/stop_matcher.h"

namespace kestrel {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Generator::Generator(Model* model, const Tokenizer* tokenizer)
    : model_(model),
      tokenizer_(tokenizer),
      pool_(model->n_kv_blocks()),
      table_(&pool_, model->block_size_tokens()) {}

Status Generator::CheckPrompt(const std::vector<int32_t>& ids, int64_t extra_tokens) const {
  if (ids.empty()) return InvalidArgument("the prompt is empty");
  const ModelConfig& cfg = model_->config();
  for (int32_t id : ids) {
    if (id < 0 || id >= cfg.vocab_size) {
      return InvalidArgument("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                             std::to_string(cfg.vocab_size) + ")");
    }
  }
  int64_t total = static_cast<int64_t>(ids.size()) + extra_tokens;
  if (cfg.max_position_embeddings > 0 && total > cfg.max_position_embeddings) {
    return OutOfRange("prompt (" + std::to_string(ids.size()) + " tokens) plus " +
                      std::to_string(extra_tokens) + " new tokens exceeds the context length " +
                      std::to_string(cfg.max_position_embeddings));
  }
  int64_t capacity = static_cast<int64_t>(model_->n_kv_blocks()) * model_->block_size_tokens();
  if (total > capacity) {
    return ResourceExhausted("prompt plus new tokens (" + std::to_string(total) +
                             ") exceeds the KV cache capacity of " + std::to_string(capacity) +
                             " tokens");
  }
  return Status::Ok();
}

void Generator::ForwardRange(const std::vector<int32_t>& ids, int64_t begin, int64_t end,
                             const std::vector<int32_t>& want_rows, float* logits) {
  KCHECK(begin < end);
  KCHECK(table_.EnsureCapacity(end).ok());  // CheckPrompt sized the request against the pool
  int64_t n = end - begin;
  positions_.resize(static_cast<size_t>(n));
  slots_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    positions_[i] = static_cast<int32_t>(begin + i);
    slots_[i] = table_.SlotFor(begin + i);
  }
  seq_starts_ = {0, static_cast<int32_t>(n)};
  context_lens_ = {static_cast<int32_t>(end)};
  block_tables_ = table_.blocks();
  Batch batch;
  batch.token_ids = std::span<const int32_t>(ids.data() + begin, static_cast<size_t>(n));
  batch.positions = positions_;
  batch.slot_mapping = slots_;
  batch.seq_starts = seq_starts_;
  batch.context_lens = context_lens_;
  batch.block_tables = block_tables_;
  batch.max_blocks_per_seq = static_cast<int32_t>(block_tables_.size());
  batch.logits_indices = want_rows;
  model_->Forward(batch, logits);
}

Result<std::vector<float>> Generator::AllLogits(const std::vector<int32_t>& ids) {
  KTRY(CheckPrompt(ids, 0));
  table_.Clear();
  int64_t vocab = model_->config().vocab_size;
  std::vector<float> logits(ids.size() * static_cast<size_t>(vocab));
  std::vector<int32_t> rows(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) rows[i] = static_cast<int32_t>(i);
  ForwardRange(ids, 0, static_cast<int64_t>(ids.size()), rows, logits.data());
  table_.Clear();
  return logits;
}

Result<GenerationResult> Generator::Run(
    const GenerationRequest& request,
    const std::function<bool(const GenerationEvent&)>& on_event) {
  using Clock = std::chrono::steady_clock;
  if (request.max_new_tokens < 1) return InvalidArgument("max_new_tokens must be at least 1");
  if (!request.stop.empty() && tokenizer_ == nullptr) {
    return InvalidArgument("stop strings need a tokenizer");
  }
  KTRY(CheckPrompt(request.prompt_ids, request.max_new_tokens));
  Result<StopMatcher> stop_or = StopMatcher::Create(request.stop);
  if (!stop_or.ok()) return stop_or.status();
  StopMatcher& stop = *stop_or;

  const int64_t vocab = model_->config().vocab_size;
  Sampler sampler(request.sampling, static_cast<int32_t>(vocab));
  sampler.AddPromptTokens(request.prompt_ids);
  // The logits stay with the model (on the GPU for CUDA); only the token (and logprobs) come back.
  Sampler* const sampler_ptr = &sampler;
  std::vector<int32_t> ids = request.prompt_ids;
  ids.reserve(ids.size() + static_cast<size_t>(request.max_new_tokens));

  GenerationResult result;
  result.n_prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
  table_.Clear();

  // Prefill in chunks; only the last chunk's last row needs logits.
  auto t0 = Clock::now();
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  const int64_t chunk = std::max<int32_t>(request.prefill_chunk_tokens, 1);
  for (int64_t begin = 0; begin < n_prompt; begin += chunk) {
    int64_t end = std::min(n_prompt, begin + chunk);
    std::vector<int32_t> rows;
    if (end == n_prompt) rows.push_back(static_cast<int32_t>(end - begin - 1));
    ForwardRange(ids, begin, end, rows, nullptr);
  }
  auto t1 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  StreamingDetokenizer detok(tokenizer_);
  result.finish = FinishReason::kLength;
  for (int32_t step = 0; step < request.max_new_tokens; ++step) {
    if (step > 0) {
      std::vector<int32_t> rows{0};
      int64_t pos = static_cast<int64_t>(ids.size()) - 1;
      ForwardRange(ids, pos, pos + 1, rows, nullptr);
    }
    GenerationEvent event;
    model_->SampleLastLogits(std::span<Sampler* const>(&sampler_ptr, 1),
                             std::span<SampleResult>(&event.sample, 1));
    event.token = event.sample.token;
    ids.push_back(event.token);
    result.tokens.push_back(event.token);

    bool is_eos = !request.ignore_eos &&
                  std::find(request.eos_ids.begin(), request.eos_ids.end(), event.token) !=
                      request.eos_ids.end();
    bool stopped = false;
    if (tokenizer_ != nullptr && !is_eos) {
      StopMatcher::Output out = stop.Push(detok.Push(event.token));
      event.text_delta = std::move(out.text);
      stopped = out.stopped;
    }
    bool last = is_eos || stopped || step + 1 == request.max_new_tokens;
    if (last && !stopped && tokenizer_ != nullptr) {
      StopMatcher::Output out = stop.Push(detok.Finish());
      event.text_delta += out.text;
      stopped = out.stopped;
      if (!stopped) event.text_delta += stop.Finish();
    }
    result.text += event.text_delta;
    bool keep_going = on_event(event);
    if (is_eos || stopped) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (!keep_going) {
      result.finish = FinishReason::kCancelled;
      break;
    }
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  table_.Clear();
  return result;
}

}  // namespace kestrel
