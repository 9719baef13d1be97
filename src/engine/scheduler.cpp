#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace kestrel {

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {
  KCHECK(config_.max_num_seqs >= 1 && config_.max_batched_tokens >= 1 &&
         config_.max_prefill_tokens_beside_decodes >= 0);
  KCHECK(kv_ != nullptr);
  running_.reserve(static_cast<size_t>(config_.max_num_seqs));
  output_.scheduled.reserve(static_cast<size_t>(config_.max_num_seqs));
  output_.preempted.reserve(static_cast<size_t>(config_.max_num_seqs));
}

void Scheduler::Add(Sequence* seq) {
  KCHECK(seq->status == SequenceStatus::kWaiting);
  KCHECK(seq->n_computed_tokens == 0 && seq->kv.n_blocks() == 0);
  KCHECK_MSG(seq->max_kv_tokens() <= kv_->capacity_tokens(),
             "a sequence that cannot fit the whole KV pool must be rejected before Add");
  waiting_.push_back(seq);
}

void Scheduler::Emit(Sequence* seq, int32_t n_new_tokens) {
  const bool samples = seq->n_computed_tokens + n_new_tokens == seq->n_tokens();
  output_.scheduled.push_back(ScheduledSequence{seq, n_new_tokens, samples});
  output_.n_tokens += n_new_tokens;
  output_.n_samples += samples ? 1 : 0;
}

void Scheduler::PreemptLast() {
  Sequence* victim = running_.back();
  running_.pop_back();
  kv_->Free(victim->kv);
  victim->n_computed_tokens = 0;
  victim->status = SequenceStatus::kWaiting;
  ++victim->n_preemptions;
  ++n_preemptions_;
  waiting_.push_front(victim);
  output_.preempted.push_back(victim);
}

const SchedulerOutput& Scheduler::Schedule() {
  KCHECK_MSG(!pending_commit_, "Schedule called twice without Commit");
  output_.scheduled.clear();
  output_.preempted.clear();
  output_.n_tokens = 0;
  output_.n_samples = 0;
  int32_t budget = config_.max_batched_tokens;
  auto finishing = [](const Sequence* seq) {  // its pending token is its last
    return seq->last_token_pending() && seq->n_generated_tokens() >= seq->max_new_tokens();
  };
  // Prompt tokens this step may take: capped while a decode runs beside them.
  int32_t prefill_budget = budget;
  if (config_.max_prefill_tokens_beside_decodes > 0) {
    for (const Sequence* seq : running_) {
      if (!finishing(seq) && seq->n_tokens() - seq->n_computed_tokens == 1) {
        prefill_budget = config_.max_prefill_tokens_beside_decodes;
        break;
      }
    }
  }

  // 1. Running sequences: a decode token or the next prefill chunk each.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (finishing(seq)) {
      ++i;  // it finishes when its pending token arrives
      continue;
    }
    const int32_t n_missing = seq->n_tokens() - seq->n_computed_tokens;
    KCHECK(n_missing > 0);
    const int32_t n_new = n_missing == 1 ? 1 : std::min({n_missing, budget, prefill_budget});
    if (n_new <= 0) {
      ++i;  // a prompt chunk with no prompt budget left: it waits for a later step
      continue;
    }
    bool preempted_itself = false;
    while (!kv_->Allocate(seq->kv, 0, int64_t{seq->n_computed_tokens} + n_new)) {
      preempted_itself = running_.back() == seq;
      PreemptLast();
      if (preempted_itself) break;
    }
    if (preempted_itself) break;
    Emit(seq, n_new);
    budget -= n_new;
    if (n_missing > 1) prefill_budget -= n_new;
    ++i;
  }

  // 2. Waiting sequences, first in first out, after their cached prefix.
  if (output_.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && prefill_budget > 0 &&
           n_running() < config_.max_num_seqs) {
      Sequence* seq = waiting_.front();
      if (seq->last_token_pending()) break;  // preempted while its token was being sampled
      const int32_t n_cached = kv_->FindCachedPrefix(seq->kv, seq->tokens());
      const int32_t n_new = std::min({seq->n_tokens() - n_cached, budget, prefill_budget});
      if (!kv_->Allocate(seq->kv, n_cached, int64_t{n_cached} + n_new)) break;
      waiting_.pop_front();
      running_.push_back(seq);
      seq->status = SequenceStatus::kRunning;
      seq->n_computed_tokens = n_cached;
      if (seq->n_cached_prompt_tokens < 0) seq->n_cached_prompt_tokens = n_cached;
      Emit(seq, n_new);
      budget -= n_new;
      prefill_budget -= n_new;
    }
  }
  pending_commit_ = !output_.empty();
  return output_;
}

void Scheduler::Commit() {
  KCHECK(pending_commit_);
  for (const ScheduledSequence& s : output_.scheduled) {
    Sequence* seq = s.seq;
    if (seq->status != SequenceStatus::kRunning) continue;  // removed since Schedule
    seq->n_computed_tokens += s.n_new_tokens;
    KCHECK(seq->n_computed_tokens <= seq->n_tokens());
    kv_->CacheFullBlocks(seq->kv, seq->tokens(), seq->n_computed_tokens);
  }
  pending_commit_ = false;
}

void Scheduler::Remove(Sequence* seq) {
  if (seq->status == SequenceStatus::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    KCHECK(it != running_.end());
    running_.erase(it);
  } else if (seq->status == SequenceStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    KCHECK(it != waiting_.end());
    waiting_.erase(it);
  } else {
    KCHECK_MSG(false, "sequence removed twice");
  }
  kv_->Free(seq->kv);
  seq->status = SequenceStatus::kFinished;
}

}  // namespace kestrel
