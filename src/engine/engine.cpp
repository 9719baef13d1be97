#include "engine/engine.h"

#include <algorithm>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "core/check.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/stop_matcher.h"
#include "grammar/jump_forward.h"
#include "grammar/matcher.h"
#include "kv/kv_cache_manager.h"

namespace kestrel {

// ---------------------------------------------------------------- RequestHandle

bool RequestHandle::Next(RequestOutput* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return false;
  *out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestHandle::Cancel() {
  cancelled_.store(true, std::memory_order_relaxed);
}

bool RequestHandle::cancelled() const {
  return cancelled_.load(std::memory_order_relaxed);
}

void RequestHandle::Push(RequestOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(out));
  }
  cv_.notify_one();
}

// ---------------------------------------------------------------- Engine

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Everything the engine keeps per request beside the scheduler's view of it. Built on the
// submitting thread, so the engine thread allocates nothing for a new request. Shared: a
// sequence that finishes or is cancelled while a step that holds it is still in flight stays
// alive until that step's results are processed.
struct EngineSequence : Sequence, std::enable_shared_from_this<EngineSequence> {
  EngineSequence(int64_t id, const EngineRequest& request, int32_t vocab,
                 const Tokenizer* tokenizer, StopMatcher stop_matcher,
                 std::shared_ptr<RequestHandle> request_handle,
                 const std::vector<int32_t>& eos_ids)
      : Sequence(id, request.prompt_ids, request.max_new_tokens),
        handle(std::move(request_handle)),
        sampler(request.sampling, vocab),
        detok(tokenizer),
        stop(std::move(stop_matcher)),
        ignore_eos(request.ignore_eos),
        submitted(Clock::now()) {
    sampler.AddPromptTokens(request.prompt_ids);
    if (request.grammar) {
      matcher.emplace(request.grammar, eos_ids);
      mask.assign((static_cast<size_t>(vocab) + 31) / 32, 0u);
    }
  }

  std::shared_ptr<RequestHandle> handle;
  Sampler sampler;
  StreamingDetokenizer detok;
  StopMatcher stop;
  bool ignore_eos;
  Clock::time_point submitted;
  Clock::time_point last_token;
  bool admission_counted = false;
  int32_t pending_row = -1;  // row of the in-flight sampling that is choosing the pending token
  // Structured output: the grammar's state after the generated tokens, the next step's mask,
  // and whether the grammar allowed nothing at the last mask (the request then fails).
  std::optional<grammar::GrammarMatcher> matcher;
  std::vector<uint32_t> mask;
  bool grammar_dead_end = false;

  RequestUsage Usage() const {
    RequestUsage u;
    u.prompt_tokens = n_prompt_tokens();
    u.completion_tokens = n_generated_tokens() - (last_token_pending() ? 1 : 0);
    u.cached_tokens = std::max(n_cached_prompt_tokens, 0);
    return u;
  }
};

SamplingParams GreedyParams() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// Names the model and its numerics, so a cached block is never reused across models.
std::string ModelFingerprint(const Model& m) {
  const ModelConfig& c = m.config();
  std::string key = "kestrel-kv-v1";
  for (int64_t v : {static_cast<int64_t>(c.arch), c.vocab_size, c.hidden_size, c.intermediate_size,
                    c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, m.n_parameters(),
                    m.weight_bytes(), int64_t{m.block_size_tokens()}}) {
    key += '/' + std::to_string(v);
  }
  return key + '/' + m.kernels_name();
}

KvCacheConfig MakeKvCacheConfig(const Model& m, const EngineConfig& cfg) {
  KvCacheConfig kv{m.n_kv_blocks(), m.block_size_tokens(), cfg.prefix_caching, ModelFingerprint(m)};
  if (m.cache_spec().has_recurrent_state()) {
    KCHECK_MSG(m.n_state_slots() >= cfg.max_num_seqs,
               "the model has fewer state slots than EngineConfig::max_num_seqs: load it with "
               "ModelLoadOptions::max_num_seqs >= that");
    kv.n_live_state_slots = cfg.max_num_seqs;
    kv.n_snapshot_slots = m.n_state_slots() - cfg.max_num_seqs;
  }
  return kv;
}

}  // namespace

struct Engine::Impl {
  Impl(std::shared_ptr<Model> m, const Tokenizer* tok, std::vector<int32_t> eos,
       const EngineConfig& cfg);

  Status Validate(const EngineRequest& request) const;
  void Loop();
  void Step();
  void BuildBatch(const SchedulerOutput& out);
  // Starts sampling the step's logits rows; each live sampled sequence gets a pending token.
  void LaunchSampling(const SchedulerOutput& out);
  // Waits for the sampling in flight (if any) and processes its tokens: resolve the pending
  // tokens, stop checks, text, events, finished sequences out.
  void FinishSampling();
  void ProcessSample(EngineSequence* seq, SampleResult sample);
  // Text, stop checks and the event of the token the event holds (the sequence's last); true
  // when it ended the request.
  bool EmitToken(EngineSequence* seq, RequestOutput event, Clock::time_point now);
  // Structured output: appends the tokens the grammar forces after the last one.
  void JumpForward(EngineSequence* seq, Clock::time_point now);
  void CheckCancellations();
  // Takes seq out of the scheduler and `active`, and sends its finished event.
  void Finish(EngineSequence* seq, RequestOutput event);
  // Publishes the waiting and running counts Submit admits from, `finishing` running sequences
  // (whose last event is about to go out) not counted.
  void PublishAdmissionCounts(int32_t finishing);
  void RemoveFromActive(EngineSequence* seq);
  void CancelAll(const Status& why);
  void PublishMetrics();

  std::shared_ptr<Model> model;
  const Tokenizer* tokenizer;
  std::vector<int32_t> eos_ids;
  EngineConfig config;
  std::atomic<bool> async_scheduling;
  int32_t vocab;
  KvCacheManager kv;
  Scheduler scheduler;

  // Shared with the submitting threads, under mu.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<EngineSequence>> incoming;
  bool accepting = true;
  bool cancel_all = false;
  bool started = false;
  std::atomic<int64_t> next_id{0};
  std::atomic<int32_t> n_waiting_published{0};
  std::atomic<int32_t> n_running_published{0};
  std::atomic<uint64_t> n_rejected{0};

  std::mutex join_mu;  // one joiner at a time
  std::thread thread;

  mutable std::mutex metrics_mu;
  EngineMetrics published;  // under metrics_mu
  EngineMetrics live;       // engine thread only

  // Engine-thread state. Batch vectors keep their capacity from step to step.
  std::vector<std::shared_ptr<EngineSequence>> active;
  std::vector<int32_t> token_ids, positions, slots, seq_starts, context_lens, block_tables,
      logits_indices, sampled_rows, state_slots;
  std::vector<StateCopy> state_copies;
  std::vector<StateSnapshot> state_snapshots;
  std::vector<PlannedSnapshot> planned;
  // The step being built: its scheduled sequences, held until the step is committed and its
  // sampling launched (FinishSampling may retire some of them in between).
  std::vector<std::shared_ptr<EngineSequence>> step_refs;
  // The sampling in flight: the sequence of each row (null where the sequence had finished by
  // launch time, sampled with `scratch_sampler`), the samplers handed to the model, the results.
  bool sampling_in_flight = false;
  // The step whose sampling is in flight: when it was launched, whether it carried prompt
  // chunks, its tokens; when the last step ended (EngineMetrics::decode_step / mixed_step).
  Clock::time_point in_flight_launched, last_step_done;
  bool in_flight_mixed = false, any_step_done = false;
  int32_t in_flight_tokens = 0;
  std::vector<std::shared_ptr<EngineSequence>> sampled_seqs;
  std::vector<Sampler*> sampled_samplers;
  std::vector<SampleResult> sampled_results;
  Sampler scratch_sampler;
  std::vector<EngineSequence*> finished_this_step;
};

Engine::Impl::Impl(std::shared_ptr<Model> m, const Tokenizer* tok, std::vector<int32_t> eos,
                   const EngineConfig& cfg)
    : model(std::move(m)),
      tokenizer(tok),
      eos_ids(std::move(eos)),
      config(cfg),
      async_scheduling(cfg.async_scheduling),
      vocab(static_cast<int32_t>(model->config().vocab_size)),
      kv(MakeKvCacheConfig(*model, cfg)),
      scheduler(SchedulerConfig{cfg.max_num_seqs, cfg.max_batched_tokens,
                                cfg.max_prefill_tokens_beside_decodes},
                &kv),
      scratch_sampler(GreedyParams(), vocab) {
  KCHECK(config.max_num_seqs >= 1 && config.max_batched_tokens >= 1 && config.max_waiting >= 0);
  const size_t max_tokens = static_cast<size_t>(config.max_batched_tokens);
  const size_t max_seqs = static_cast<size_t>(config.max_num_seqs);
  for (auto* v : {&token_ids, &positions, &slots, &sampled_rows}) v->reserve(max_tokens);
  for (auto* v : {&seq_starts, &context_lens, &logits_indices, &state_slots}) {
    v->reserve(max_seqs + 1);
  }
  state_copies.reserve(max_seqs);
  state_snapshots.reserve(max_tokens);
  planned.reserve(max_tokens);
  step_refs.reserve(max_seqs);
  sampled_seqs.reserve(max_seqs);
  sampled_samplers.reserve(max_seqs);
  sampled_results.reserve(max_seqs);
  block_tables.reserve(max_seqs *
                       static_cast<size_t>(std::min<int64_t>(
                           kv.n_blocks(), kv.BlocksFor(model->config().max_position_embeddings))));
  finished_this_step.reserve(max_seqs);
  active.reserve(max_seqs + static_cast<size_t>(std::min(config.max_waiting, 4096)));
  published.kv_blocks_total = live.kv_blocks_total = kv.n_blocks();
  published.state_snapshot_slots = live.state_snapshot_slots = kv.state_slots().n_snapshots();
}

Status Engine::Impl::Validate(const EngineRequest& r) const {
  if (r.prompt_ids.empty()) return InvalidArgument("the prompt is empty");
  if (r.max_new_tokens < 1) return InvalidArgument("max_new_tokens must be at least 1");
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || id >= vocab) {
      return InvalidArgument("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
    }
  }
  KTRY(ValidateSamplingParams(r.sampling, vocab));
  KTRY(StopMatcher::Validate(r.stop));
  if (r.grammar) {
    if (model->device() != Device::kCpu) {
      return InvalidArgument("structured output (grammars, JSON schemas, forced tool calls) runs "
                             "on --device cpu in this version");
    }
    if (r.grammar->vocab() == nullptr || r.grammar->vocab()->vocab_size() > vocab) {
      return InvalidArgument("the grammar was compiled without the model's vocabulary");
    }
  }
  if (!r.stop.empty() && tokenizer == nullptr) {
    return InvalidArgument("stop strings need a tokenizer");
  }
  const int64_t total = static_cast<int64_t>(r.prompt_ids.size()) + r.max_new_tokens;
  const int64_t context = model->config().max_position_embeddings;
  const std::string what = "prompt (" + std::to_string(r.prompt_ids.size()) + " tokens) plus " +
                           std::to_string(r.max_new_tokens) + " new tokens";
  if (context > 0 && total > context) {
    return InvalidArgument(what + " exceeds the context length of " + std::to_string(context) +
                           " tokens");
  }
  if (total > kv.capacity_tokens()) {
    return InvalidArgument(what + " exceeds the KV cache capacity of " +
                           std::to_string(kv.capacity_tokens()) + " tokens");
  }
  return Status::Ok();
}

void Engine::Impl::Loop() {
  for (;;) {
    bool stop_now = false;
    bool draining = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] {
        return !incoming.empty() || !accepting || scheduler.has_work() || sampling_in_flight;
      });
      for (std::shared_ptr<EngineSequence>& seq : incoming) {
        scheduler.Add(seq.get());
        active.push_back(std::move(seq));
      }
      incoming.clear();
      stop_now = !accepting && cancel_all;
      draining = !accepting;
    }
    if (stop_now) {
      FinishSampling();
      CancelAll(Unavailable("the server is shutting down"));
      break;
    }
    CheckCancellations();
    if (scheduler.has_work()) {
      Step();
    } else {
      FinishSampling();  // nothing left to overlap with
    }
    PublishMetrics();
    if (draining && !scheduler.has_work() && !sampling_in_flight) {
      std::lock_guard<std::mutex> lock(mu);
      if (incoming.empty()) break;
    }
  }
  FinishSampling();
  PublishMetrics();
}

// One step: schedule and enqueue step N (its decode tokens may still be pending: the device
// feeds them from step N-1's sampling), then process step N-1's tokens while step N runs, then
// commit step N and launch its sampling. Without async_scheduling the sampling is waited for at
// once, so no token is ever pending at Schedule.
void Engine::Impl::Step() {
  const SchedulerOutput& out = scheduler.Schedule();
  live.preemptions += out.preempted.size();
  if (out.empty()) {
    // Everything preempted itself, or every running sequence waits for its last token:
    // process the sampling in flight so the next Schedule sees its tokens.
    FinishSampling();
    return;
  }
  step_refs.clear();
  for (const ScheduledSequence& s : out.scheduled) {
    auto* seq = static_cast<EngineSequence*>(s.seq);
    step_refs.push_back(seq->shared_from_this());
    if (!seq->admission_counted) {
      seq->admission_counted = true;
      live.prompt_tokens += static_cast<uint64_t>(seq->n_prompt_tokens());
      live.prompt_tokens_cached += static_cast<uint64_t>(seq->n_cached_prompt_tokens);
    }
  }
  BuildBatch(out);
  Batch batch;
  batch.token_ids = token_ids;
  batch.positions = positions;
  batch.slot_mapping = slots;
  batch.seq_starts = seq_starts;
  batch.context_lens = context_lens;
  batch.block_tables = block_tables;
  batch.max_blocks_per_seq = static_cast<int32_t>(block_tables.size() / out.scheduled.size());
  batch.logits_indices = logits_indices;
  batch.sampled_rows = sampled_rows;
  batch.state_slots = state_slots;
  batch.state_copies = state_copies;
  batch.state_snapshots = state_snapshots;
  // The logits stay with the model (on the GPU for CUDA); only token ids (and logprobs) return.
  const Clock::time_point launched = Clock::now();
  model->Forward(batch, nullptr);
  FinishSampling();  // step N-1's tokens, while step N runs
  scheduler.Commit();
  ++live.steps;
  LaunchSampling(out);
  in_flight_launched = launched;
  in_flight_mixed = out.n_tokens > static_cast<int32_t>(out.scheduled.size());
  in_flight_tokens = out.n_tokens;
  if (!async_scheduling.load(std::memory_order_relaxed)) FinishSampling();
  step_refs.clear();
}

void Engine::Impl::BuildBatch(const SchedulerOutput& out) {
  token_ids.clear();
  positions.clear();
  slots.clear();
  seq_starts.clear();
  context_lens.clear();
  logits_indices.clear();
  sampled_rows.clear();
  state_slots.clear();
  state_copies.clear();
  state_snapshots.clear();
  int32_t max_blocks = 1;
  bool any_pending = false;
  for (const ScheduledSequence& s : out.scheduled) {
    max_blocks = std::max(max_blocks, s.seq->kv.n_blocks());
    any_pending = any_pending || s.seq->last_token_pending();
  }
  block_tables.assign(out.scheduled.size() * static_cast<size_t>(max_blocks), -1);
  seq_starts.push_back(0);
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledSequence& s = out.scheduled[i];
    const auto& seq = *static_cast<const EngineSequence*>(s.seq);
    const int32_t begin = seq.n_computed_tokens;
    const int32_t end = begin + s.n_new_tokens;
    const int32_t first_row = static_cast<int32_t>(token_ids.size());
    for (int32_t t = begin; t < end; ++t) {
      // A pending token is the last one: the device takes it from the sampling in flight.
      const bool pending = seq.last_token_pending() && t == seq.n_tokens() - 1;
      token_ids.push_back(pending ? 0 : seq.tokens()[static_cast<size_t>(t)]);
      if (any_pending) sampled_rows.push_back(pending ? seq.pending_row : -1);
      positions.push_back(t);
      slots.push_back(kv.SlotFor(seq.kv, t));
    }
    if (kv.has_state()) {
      // Its live state slot, the snapshot to restore into it after a prefix-cache hit, and the
      // block boundaries inside this chunk whose state the prefix cache keeps.
      SeqBlocks& blocks = s.seq->kv;
      state_slots.push_back(blocks.state_slot());
      if (const int32_t src = kv.TakeStateRestore(blocks); src >= 0) {
        state_copies.push_back(StateCopy{src, blocks.state_slot()});
      }
      const size_t n_known = seq.tokens().size() - (seq.last_token_pending() ? 1 : 0);
      planned.clear();
      kv.PlanStateSnapshots(blocks, seq.tokens().first(n_known), begin, end, &planned);
      for (const PlannedSnapshot& p : planned) {
        state_snapshots.push_back(
            StateSnapshot{first_row + static_cast<int32_t>(p.position - begin), p.slot});
      }
    }
    seq_starts.push_back(static_cast<int32_t>(token_ids.size()));
    context_lens.push_back(end);
    if (s.samples) logits_indices.push_back(static_cast<int32_t>(token_ids.size()) - 1);
    std::copy(seq.kv.blocks().begin(), seq.kv.blocks().end(),
              block_tables.begin() + static_cast<std::ptrdiff_t>(i * max_blocks));
  }
}

void Engine::Impl::LaunchSampling(const SchedulerOutput& out) {
  KCHECK(!sampling_in_flight);
  sampled_seqs.clear();
  sampled_samplers.clear();
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledSequence& s = out.scheduled[i];
    if (!s.samples) continue;
    auto* seq = static_cast<EngineSequence*>(s.seq);
    if (seq->status == SequenceStatus::kFinished) {
      // Finished while this step was being enqueued: its row is computed and thrown away.
      sampled_seqs.push_back(nullptr);
      sampled_samplers.push_back(&scratch_sampler);
      continue;
    }
    if (seq->n_computed_tokens < seq->n_tokens()) {
      // Jump-forward appended tokens after this step was planned: its logits come before them,
      // so the row is computed and thrown away; the next step computes the forced tokens.
      sampled_seqs.push_back(nullptr);
      sampled_samplers.push_back(&scratch_sampler);
      continue;
    }
    if (seq->matcher) {
      // The mask of what the grammar allows after the tokens so far (all known here: the
      // previous step's sampling has been processed).
      const grammar::MaskResult r = seq->matcher->FillNextTokenBitmask(seq->mask);
      if (r.dead_end) {
        // Nothing may come next: draw any token (the row must be sampled) and fail the
        // request when it is processed.
        seq->grammar_dead_end = true;
      } else {
        seq->sampler.SetAllowedTokens(seq->mask);
      }
    }
    seq->pending_row = static_cast<int32_t>(sampled_seqs.size());
    seq->AppendPendingToken();
    sampled_seqs.push_back(step_refs[i]);
    sampled_samplers.push_back(&seq->sampler);
  }
  sampled_results.resize(sampled_samplers.size());
  model->LaunchSampling(sampled_samplers);
  sampling_in_flight = true;
}

void Engine::Impl::FinishSampling() {
  if (!sampling_in_flight) return;
  model->FinishSampling(sampled_results);
  sampling_in_flight = false;
  const Clock::time_point done = Clock::now();
  const Clock::time_point began =
      any_step_done ? std::max(in_flight_launched, last_step_done) : in_flight_launched;
  (in_flight_mixed ? live.mixed_step : live.decode_step).Observe(Seconds(done - began));
  if (in_flight_mixed) live.mixed_step_tokens += static_cast<uint64_t>(in_flight_tokens);
  last_step_done = done;
  any_step_done = true;
  finished_this_step.clear();
  for (size_t row = 0; row < sampled_seqs.size(); ++row) {
    EngineSequence* seq = sampled_seqs[row].get();
    // Null: finished before launch. Finished: cancelled (or shut down) since.
    if (seq == nullptr || seq->status == SequenceStatus::kFinished) continue;
    ProcessSample(seq, std::move(sampled_results[row]));
  }
  for (EngineSequence* seq : finished_this_step) {
    scheduler.Remove(seq);
    RemoveFromActive(seq);
  }
  sampled_seqs.clear();  // the last references to sequences retired meanwhile
}

void Engine::Impl::ProcessSample(EngineSequence* seq, SampleResult sample) {
  RequestOutput event;
  const int32_t token = sample.token;
  seq->ResolvePendingToken(token);
  seq->pending_row = -1;
  event.token_ids.push_back(token);
  event.samples.push_back(std::move(sample));

  const Clock::time_point now = Clock::now();
  if (seq->matcher && (seq->grammar_dead_end || !seq->matcher->AcceptToken(token))) {
    // The grammar allowed no token (or, a bug, not the sampled one): end with an error rather
    // than emit output that does not follow it.
    event.token_ids.clear();
    event.samples.clear();
    event.error = InvalidArgument(
        "the output grammar allows no continuation here (the schema or grammar cannot be "
        "completed from this point)");
    Finish(seq, std::move(event));
    return;
  }
  if (seq->n_generated_tokens() == 1) {
    live.time_to_first_token.Observe(Seconds(now - seq->submitted));
  } else {
    live.inter_token_latency.Observe(Seconds(now - seq->last_token));
  }
  seq->last_token = now;
  ++live.generation_tokens;
  if (EmitToken(seq, std::move(event), now)) return;
  if (config.jump_forward) JumpForward(seq, now);
}

bool Engine::Impl::EmitToken(EngineSequence* seq, RequestOutput event, Clock::time_point now) {
  const int32_t token = event.token_ids.back();
  // EOS (unless ignored), then stop strings on the text; text deltas hold back what could still
  // become a stop string.
  // With a grammar, the grammar decides: an EOS id it accepted ends the output.
  const bool is_eos =
      seq->matcher ? seq->matcher->IsTerminated()
                   : !seq->ignore_eos &&
                         std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  bool stopped = false;
  if (tokenizer != nullptr && !is_eos) {
    StopMatcher::Output o = seq->stop.Push(seq->detok.Push(token));
    event.text = std::move(o.text);
    stopped = o.stopped;
    event.stop_index = o.stop_index;
  }
  const bool last = is_eos || stopped || seq->n_generated_tokens() == seq->max_new_tokens();
  if (last && !stopped && tokenizer != nullptr) {
    StopMatcher::Output o = seq->stop.Push(seq->detok.Finish());
    event.text += o.text;
    stopped = o.stopped;
    event.stop_index = o.stop_index;
    if (!stopped) event.text += seq->stop.Finish();
  }
  event.usage = seq->Usage();
  if (last) {
    event.finished = true;
    event.finish_reason = is_eos || stopped ? FinishReason::kStop : FinishReason::kLength;
    ++(event.finish_reason == FinishReason::kStop ? live.requests_finished_stop
                                                  : live.requests_finished_length);
    live.e2e_latency.Observe(Seconds(now - seq->submitted));
    finished_this_step.push_back(seq);
    // Still running in the scheduler until the end of the step, but its place is free.
    PublishAdmissionCounts(static_cast<int32_t>(finished_this_step.size()));
  }
  seq->handle->Push(std::move(event));
  return last;
}

void Engine::Impl::JumpForward(EngineSequence* seq, Clock::time_point now) {
  if (!seq->matcher || tokenizer == nullptr) return;
  // The tokens the grammar forces next (keys, punctuation, the rest of an enum value) are
  // appended at once: the next step computes them as one chunk instead of a decode step each.
  // Each takes the random draw and the penalty bookkeeping masked sampling would have, so the
  // sampler continues as if it had drawn them.
  const grammar::JumpForward jf = grammar::ComputeJumpForward(*seq->matcher, *tokenizer);
  for (int32_t forced : jf.tokens) {
    if (seq->n_generated_tokens() >= seq->max_new_tokens()) return;
    if (!seq->matcher->AcceptToken(forced)) return;
    seq->AppendToken(forced);
    seq->sampler.NextR53();
    seq->sampler.Accept(forced);
    ++live.generation_tokens;
    ++live.jump_forward_tokens;
    RequestOutput event;
    event.token_ids.push_back(forced);
    SampleResult r;
    r.token = forced;
    r.logprob = 0.0f;  // the only token the grammar allowed
    event.samples.push_back(std::move(r));
    if (EmitToken(seq, std::move(event), now)) return;
  }
}

void Engine::Impl::RemoveFromActive(EngineSequence* seq) {
  auto it =
      std::find_if(active.begin(), active.end(),
                   [seq](const std::shared_ptr<EngineSequence>& p) { return p.get() == seq; });
  KCHECK(it != active.end());
  std::swap(*it, active.back());
  active.pop_back();
}

void Engine::Impl::Finish(EngineSequence* seq, RequestOutput event) {
  if (seq->status != SequenceStatus::kFinished) scheduler.Remove(seq);
  PublishAdmissionCounts(0);
  event.finished = true;
  event.usage = seq->Usage();
  seq->handle->Push(std::move(event));
  RemoveFromActive(seq);
}

void Engine::Impl::PublishAdmissionCounts(int32_t finishing) {
  // Submit admits from these; they are published before a finished sequence's last event, so
  // that a client sending its next request on seeing the end of a stream finds the place free.
  n_waiting_published.store(scheduler.n_waiting());
  n_running_published.store(std::max(scheduler.n_running() - finishing, 0));
}

void Engine::Impl::CheckCancellations() {
  for (size_t i = 0; i < active.size();) {
    EngineSequence* seq = active[i].get();
    if (!seq->handle->cancelled()) {
      ++i;
      continue;
    }
    RequestOutput event;
    event.finish_reason = FinishReason::kCancelled;
    ++live.requests_cancelled;
    Finish(seq, std::move(event));  // swaps the last sequence into slot i
  }
}

void Engine::Impl::CancelAll(const Status& why) {
  while (!active.empty()) {
    RequestOutput event;
    event.finish_reason = FinishReason::kCancelled;
    event.error = why;
    ++live.requests_cancelled;
    Finish(active.back().get(), std::move(event));
  }
}

void Engine::Impl::PublishMetrics() {
  live.waiting = scheduler.n_waiting();
  live.running = scheduler.n_running();
  live.kv_blocks_used = kv.n_used_blocks();
  live.kv_blocks_cached_free = kv.n_cached_free_blocks();
  live.state_snapshots = kv.n_state_snapshots();
  live.state_snapshot_bytes = live.state_snapshots * model->cache_spec().state_bytes_per_slot();
  live.state_snapshot_evictions = kv.state_slots().n_evictions();
  PublishAdmissionCounts(0);
  std::lock_guard<std::mutex> lock(metrics_mu);
  published = live;
}

Engine::Engine(std::shared_ptr<Model> model, const Tokenizer* tokenizer,
               std::vector<int32_t> eos_ids, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(std::move(model), tokenizer, std::move(eos_ids), config)) {}

Engine::~Engine() {
  Shutdown(/*cancel_running=*/true);
}

void Engine::Start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  KCHECK_MSG(!impl_->started, "Engine::Start called twice");
  if (!impl_->accepting) return;  // shut down before it started
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->Loop(); });
}

Result<std::shared_ptr<RequestHandle>> Engine::Submit(EngineRequest request) {
  Impl& m = *impl_;
  KTRY(m.Validate(request));
  Result<StopMatcher> stop = StopMatcher::Create(std::move(request.stop));
  if (!stop.ok()) return stop.status();
  auto handle = std::make_shared<RequestHandle>();
  auto seq = std::make_shared<EngineSequence>(m.next_id.fetch_add(1), request, m.vocab, m.tokenizer,
                                              std::move(*stop), handle, m.eos_ids);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.accepting) {
      m.n_rejected.fetch_add(1);
      return Unavailable("the server is shutting down");
    }
    // max_waiting counts only what waits beyond the running capacity: a burst of up to
    // max_num_seqs + max_waiting requests is always admitted.
    const int64_t in_engine = static_cast<int64_t>(m.incoming.size()) +
                              m.n_waiting_published.load(std::memory_order_relaxed) +
                              m.n_running_published.load(std::memory_order_relaxed);
    const int64_t capacity = int64_t{m.config.max_num_seqs} + m.config.max_waiting;
    if (in_engine >= capacity) {
      m.n_rejected.fetch_add(1);
      return ResourceExhausted(std::to_string(in_engine) + " requests running or queued, " +
                               std::to_string(m.config.max_num_seqs) + " run at once and " +
                               std::to_string(m.config.max_waiting) + " may wait");
    }
    m.incoming.push_back(std::move(seq));
  }
  m.cv.notify_one();
  return handle;
}

void Engine::Shutdown(bool cancel_running) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.accepting = false;
    m.cancel_all = m.cancel_all || cancel_running;
  }
  m.cv.notify_one();
  std::lock_guard<std::mutex> join_lock(m.join_mu);
  if (m.thread.joinable()) m.thread.join();
  // Never started (or already joined): nothing will run what is still queued.
  std::vector<std::shared_ptr<EngineSequence>> left;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    left.swap(m.incoming);
  }
  for (std::shared_ptr<EngineSequence>& seq : left) {
    RequestOutput event;
    event.finished = true;
    event.finish_reason = FinishReason::kCancelled;
    event.error = Unavailable("the server is shutting down");
    event.usage = seq->Usage();
    seq->handle->Push(std::move(event));
    ++m.live.requests_cancelled;
  }
  if (!left.empty()) m.PublishMetrics();
}

void Engine::set_async_scheduling(bool on) {
  impl_->async_scheduling.store(on, std::memory_order_relaxed);
}

EngineMetrics Engine::Metrics() const {
  EngineMetrics snapshot;
  {
    std::lock_guard<std::mutex> lock(impl_->metrics_mu);
    snapshot = impl_->published;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  snapshot.waiting += static_cast<int64_t>(impl_->incoming.size());
  snapshot.requests_rejected = impl_->n_rejected.load();
  return snapshot;
}

const ModelConfig& Engine::model_config() const {
  return impl_->model->config();
}

int64_t Engine::kv_capacity_tokens() const {
  return impl_->kv.capacity_tokens();
}

}  // namespace kestrel
