// Token-budget scheduler (vLLM v1 style): no prefill or decode phases. Each step
//   1. running sequences, in admission order, get what they still lack: their next prefill chunk
//      or their one decode token, while the step's token budget lasts. When the KV pool cannot
//      hold a sequence's new tokens, the most recently admitted running sequence is preempted
//      (recompute: its blocks are freed, n_computed_tokens reset, and it goes back to the FRONT
//      of the waiting queue keeping its tokens) until the sequence fits or is itself preempted;
//   2. then, unless step 1 preempted, waiting sequences are admitted first-in first-out while
//      the budget and max_num_seqs allow, each starting after its longest cached prefix and
//      taking a chunk of at most the remaining budget. The queue head blocks the queue: nobody
//      overtakes it when it does not fit (FIFO).
// The scheduler owns no sequence; the caller keeps them alive until Remove.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"

namespace kestrel {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;          // running sequences at most
  int32_t max_batched_tokens = 2048;  // tokens computed by one step
  // Prompt tokens a step may compute beside running decodes (0: up to max_batched_tokens). A
  // step that carries a long prompt chunk makes every decode in it wait for the chunk; capping
  // the chunk while decodes run keeps their inter-token latency, and a step without decodes
  // (an idle server's prompt) still takes the whole budget.
  int32_t max_prefill_tokens_beside_decodes = 0;
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t n_new_tokens = 0;  // computes tokens [seq->n_computed_tokens, + n_new_tokens)
  bool samples = false;      // the chunk ends at the last known token: its logits are sampled
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;  // running ones first, then the newly admitted
  std::vector<Sequence*> preempted;          // preempted by this step
  int32_t n_tokens = 0;                      // sum of n_new_tokens
  int32_t n_samples = 0;                     // scheduled entries with samples
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence (status kWaiting, no blocks, nothing computed). It must fit the whole
  // pool (max_kv_tokens() <= capacity): the caller rejects bigger requests.
  void Add(Sequence* seq);

  // Plans the next step. The result stays valid until the next Schedule.
  const SchedulerOutput& Schedule();
  // The planned step was enqueued: advances n_computed_tokens and registers the newly full
  // blocks in the prefix cache (a later step that hits them runs after this one on the device).
  // Every token the step computes must be known by then (no pending token among them). Call
  // before appending the step's sampled tokens. Sequences removed since Schedule are skipped.
  void Commit();

  // Takes a sequence out (finished or cancelled), wherever it is, and frees its blocks. Allowed
  // between Schedule and Commit (the engine learns of finished sequences there when steps
  // overlap); a step already enqueued may still write the freed blocks, which is harmless
  // because every later use of them is ordered after it on the device.
  void Remove(Sequence* seq);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  uint64_t n_preemptions() const { return n_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void PreemptLast();  // the most recently admitted running sequence
  void Emit(Sequence* seq, int32_t n_new_tokens);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  SchedulerOutput output_;
  bool pending_commit_ = false;
  uint64_t n_preemptions_ = 0;
};

}  // namespace kestrel
