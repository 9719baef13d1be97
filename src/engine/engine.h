// The serving engine (DESIGN.md "One engine step"): one engine thread owns the model, the KV
// pool and the scheduler; HTTP threads Submit requests and read their events from a
// RequestHandle. Each step: schedule (token budget; prefill chunks and decode tokens mixed) →
// forward → sample → stop checks → free or cache blocks → publish events. With
// async_scheduling the host runs one step ahead: step N+1 is scheduled and enqueued while the
// device still samples step N, whose tokens are placeholders on the host until they arrive.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/metrics.h"
#include "grammar/compiled_grammar.h"
#include "models/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {

struct EngineConfig {
  int32_t max_num_seqs = 64;          // running sequences at most
  int32_t max_batched_tokens = 2048;  // token budget of one step (prefill chunks + decodes)
  // Prompt tokens a step may add beside running decodes (0: the whole budget); see
  // SchedulerConfig::max_prefill_tokens_beside_decodes.
  int32_t max_prefill_tokens_beside_decodes = 0;
  int32_t max_waiting = 1024;         // queued requests beyond this are refused (HTTP 429)
  bool prefix_caching = true;
  // Plan and enqueue step N+1 before step N's tokens reach the host (they go from the sampler to
  // the next step on the device), so the host's per-step work (stop checks, detokenising, events,
  // scheduling, staging) overlaps the device's. Same tokens either way.
  bool async_scheduling = true;
  // Structured output: append the tokens a grammar forces (keys, punctuation) without a decode
  // step each (docs/structured-output.md).
  bool jump_forward = true;
};

enum class FinishReason { kStop, kLength, kCancelled };
const char* FinishReasonName(FinishReason r);  // "stop", "length", "cancelled"

struct EngineRequest {
  std::vector<int32_t> prompt_ids;
  // Structured output: every generated token is drawn from what this grammar allows next (the
  // model's EOS ids end it where the grammar may end); the request finishes with kStop when the
  // grammar is complete, and with an error if it ever allows nothing. CPU models only.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  SamplingParams sampling;  // seed: per request; Submit re-checks (ValidateSamplingParams)
  int32_t max_new_tokens = 256;
  bool ignore_eos = false;
  std::vector<std::string> stop;  // Submit re-checks (StopMatcher::Validate)
};

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// One event of a request, in order. Tokens are delivered as soon as they are sampled: one event
// per sampled token (token_ids and samples of size 1), the last one with finished set. A request
// ends with exactly one finished event:
//   kStop       an EOS id (unless ignore_eos) or a stop string; the stop string and what follows
//               it are never in `text`; the token that completed it is in token_ids
//   kLength     max_new_tokens generated
//   kCancelled  RequestHandle::Cancel (error ok), or Shutdown(cancel_running = true), or a
//               Shutdown before Start (error = Unavailable); token_ids is empty then
struct RequestOutput {
  std::vector<int32_t> token_ids;     // tokens sampled since the previous event
  std::vector<SampleResult> samples;  // one per token (logprobs when asked)
  std::string text;                   // text delta: whole code points, stop strings held back
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  int32_t stop_index = -1;  // kStop by a stop string: its index in EngineRequest::stop, else -1
  RequestUsage usage;       // so far; final on the finished event
  Status error;             // a failure after admission (rare; finished is set)
};

// Shared by the HTTP thread (reader) and the engine thread (writer).
class RequestHandle {
 public:
  // Waits up to `timeout` for the next event; false on time-out (check Cancel / client).
  bool Next(RequestOutput* out, std::chrono::milliseconds timeout);
  // The client went away: the engine frees the sequence within one step and answers with a
  // finished kCancelled event. Thread-safe, idempotent; no effect after the finished event.
  void Cancel();
  bool cancelled() const;  // an atomic load: the engine polls it every step

  // Engine side.
  void Push(RequestOutput out);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> events_;
  std::atomic<bool> cancelled_{false};
};

class Engine {
 public:
  // tokenizer: detokenizing for text deltas and stop strings. eos_ids: stop tokens.
  // Recurrent-state models must have been loaded with at least config.max_num_seqs live state
  // slots (ModelLoadOptions::max_num_seqs); the slots beyond hold prefix-cache snapshots. The
  // engine thread is the only user of the model while the engine runs.
  Engine(std::shared_ptr<Model> model, const Tokenizer* tokenizer, std::vector<int32_t> eos_ids,
         const EngineConfig& config);
  ~Engine();  // Shutdown(/*cancel_running=*/true) if still running
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Start();  // launches the engine thread (once)

  // Thread-safe. Validates and queues; the handle then yields the request's events.
  // Errors: InvalidArgument (prompt empty, ids outside the vocabulary, max_new_tokens < 1,
  // prompt + max_new_tokens beyond the context or the whole KV pool, sampling parameters or stop
  // strings that ValidateSamplingParams / StopMatcher::Validate refuse, stop strings without a
  // tokenizer), ResourceExhausted (max_waiting requests already queued), Unavailable (Shutdown
  // has begun).
  Result<std::shared_ptr<RequestHandle>> Submit(EngineRequest request);

  // Thread-safe, idempotent. Stops accepting; then either lets running and queued requests
  // finish, or cancels them (finished kCancelled events carrying an Unavailable error); joins.
  // Before Start, queued requests are always cancelled.
  void Shutdown(bool cancel_running);

  // Thread-safe; takes effect at the next step (EngineConfig::async_scheduling).
  void set_async_scheduling(bool on);

  EngineMetrics Metrics() const;  // a consistent snapshot, safe from any thread
  const ModelConfig& model_config() const;
  int64_t kv_capacity_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
