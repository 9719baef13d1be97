// Scheduler without a model: admission, FIFO, chunked prefill under the token budget, the
// max_num_seqs cap, preemption by recompute and re-admission, prefix hits; and a randomized
// simulation whose fake KV store checks that every sequence only ever attends to its own
// prefix's K/V, ending with zero leaked blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/scheduler.h"

namespace kestrel {
namespace {

uint64_t Mix(uint64_t h, int32_t token) {
  h ^= static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ULL + (h << 6) +
       (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

// Stands in for the model: a slot holds the "K/V" of a token, which in a causal model depends on
// the whole prefix up to it, so we store a hash of that prefix. Every step writes the scheduled
// tokens, then checks that each scheduled sequence reads its own prefix at every position of its
// context through its block table, and that no written block is shared. The next token is a
// function of the whole context, like a greedy model's.
class FakeModel {
 public:
  explicit FakeModel(const KvCacheManager* kv)
      : kv_(kv), slots_(static_cast<size_t>(kv->capacity_tokens()), 0) {}

  // Returns the sampled token of each scheduled entry that samples (in order).
  std::vector<int32_t> Run(const SchedulerOutput& out) {
    for (const ScheduledSequence& s : out.scheduled) {
      const Sequence& seq = *s.seq;
      const std::vector<uint64_t> prefix = Prefix(seq);
      for (int32_t t = seq.n_computed_tokens; t < seq.n_computed_tokens + s.n_new_tokens; ++t) {
        const int32_t slot = kv_->SlotFor(seq.kv, t);
        EXPECT_EQ(kv_->pool().ref_count(slot / kv_->block_size_tokens()), 1)
            << "sequence " << seq.id() << " writes into a shared block at " << t;
        slots_[static_cast<size_t>(slot)] = prefix[static_cast<size_t>(t)];
      }
    }
    std::vector<int32_t> sampled;
    for (const ScheduledSequence& s : out.scheduled) {
      const Sequence& seq = *s.seq;
      const std::vector<uint64_t> prefix = Prefix(seq);
      const int32_t end = seq.n_computed_tokens + s.n_new_tokens;
      for (int32_t p = 0; p < end; ++p) {
        EXPECT_EQ(slots_[static_cast<size_t>(kv_->SlotFor(seq.kv, p))],
                  prefix[static_cast<size_t>(p)])
            << "sequence " << seq.id() << " reads foreign K/V at " << p;
      }
      if (s.samples) sampled.push_back(NextToken(prefix[static_cast<size_t>(end - 1)]));
    }
    return sampled;
  }

  static int32_t NextToken(uint64_t prefix_hash) { return static_cast<int32_t>(prefix_hash % 5); }

  static std::vector<uint64_t> Prefix(const Sequence& seq) {
    std::vector<uint64_t> h(seq.tokens().size());
    uint64_t acc = 7;
    for (size_t i = 0; i < h.size(); ++i) h[i] = acc = Mix(acc, seq.tokens()[i]);
    return h;
  }

 private:
  const KvCacheManager* kv_;
  std::vector<uint64_t> slots_;
};

struct Sim {
  Sim(int32_t n_blocks, int32_t block_size, SchedulerConfig config, bool caching = true)
      : kv(KvCacheConfig{n_blocks, block_size, caching, "sim"}), sched(config, &kv), model(&kv) {}
  ~Sim() {
    for (auto& s : seqs)
      if (s->status != SequenceStatus::kFinished) sched.Remove(s.get());
  }

  Sequence* Add(std::vector<int32_t> prompt, int32_t max_new) {
    seqs.push_back(std::make_unique<Sequence>(static_cast<int64_t>(seqs.size()), prompt, max_new));
    sched.Add(seqs.back().get());
    return seqs.back().get();
  }

  // One engine step; returns (sequence id, n_new_tokens) of what ran.
  std::vector<std::pair<int64_t, int32_t>> Step() {
    const SchedulerOutput& out = sched.Schedule();
    EXPECT_LE(out.n_tokens, sched.config().max_batched_tokens);
    EXPECT_LE(sched.n_running(), sched.config().max_num_seqs);
    last_preempted.clear();
    for (Sequence* p : out.preempted) last_preempted.push_back(p->id());
    std::vector<std::pair<int64_t, int32_t>> ran;
    for (const ScheduledSequence& s : out.scheduled) ran.emplace_back(s.seq->id(), s.n_new_tokens);
    if (out.empty()) return ran;
    const std::vector<int32_t> sampled = model.Run(out);
    sched.Commit();
    size_t i = 0;
    std::vector<Sequence*> done;
    for (const ScheduledSequence& s : out.scheduled) {
      if (!s.samples) continue;
      s.seq->AppendToken(sampled[i++]);
      if (s.seq->n_generated_tokens() == s.seq->max_new_tokens()) done.push_back(s.seq);
    }
    for (Sequence* s : done) sched.Remove(s);
    return ran;
  }

  void RunToCompletion(int max_steps = 100000) {
    for (int i = 0; i < max_steps && sched.has_work(); ++i) Step();
    ASSERT_FALSE(sched.has_work());
  }

  KvCacheManager kv;
  Scheduler sched;
  FakeModel model;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<int64_t> last_preempted;
};

std::vector<int32_t> Prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = 100 + (seed * 31 + i * 7) % 50;
  return p;
}

using Ran = std::vector<std::pair<int64_t, int32_t>>;

TEST(SchedulerTest, AdmitsFifoUpToMaxNumSeqs) {
  Sim sim(64, 4, SchedulerConfig{.max_num_seqs = 2, .max_batched_tokens = 100});
  sim.Add(Prompt(5, 0), 2);
  sim.Add(Prompt(6, 1), 3);
  sim.Add(Prompt(7, 2), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 5}, {1, 6}}));  // the cap holds the third back
  EXPECT_EQ(sim.sched.n_waiting(), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 1}}));  // 0 finishes (2 tokens)
  EXPECT_EQ(sim.Step(), (Ran{{1, 1}, {2, 7}}));  // 1 finishes; 2 is admitted
  EXPECT_EQ(sim.sched.n_running(), 0);           // 2 wanted one token
  EXPECT_FALSE(sim.sched.has_work());
  EXPECT_EQ(sim.kv.n_used_blocks(), 0);
}

TEST(SchedulerTest, ChunksLongPromptsUnderTheTokenBudget) {
  Sim sim(64, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 16});
  Sequence* a = sim.Add(Prompt(5, 0), 10);
  Sequence* b = sim.Add(Prompt(40, 1), 2);
  EXPECT_EQ(sim.Step(), (Ran{{0, 5}, {1, 11}}));
  EXPECT_EQ(b->n_computed_tokens, 11);
  EXPECT_EQ(b->n_generated_tokens(), 0);  // a partial chunk does not sample
  EXPECT_EQ(a->n_generated_tokens(), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 15}}));
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 14}}));  // b's last chunk samples
  EXPECT_EQ(b->n_generated_tokens(), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 1}}));
  EXPECT_EQ(b->status, SequenceStatus::kFinished);
  sim.RunToCompletion();
}

TEST(SchedulerTest, RunningSequencesComeFirstAndTheBudgetCapsAdmission) {
  Sim sim(64, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 8});
  sim.Add(Prompt(8, 0), 5);
  EXPECT_EQ(sim.Step(), (Ran{{0, 8}}));
  sim.Add(Prompt(20, 1), 1);
  sim.Add(Prompt(3, 2), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 7}}));  // 2 waits behind the chunked head
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 7}}));
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 6}, {2, 1}}));  // 1 remaining token of budget
  sim.RunToCompletion();
}

// While a sequence decodes, a step adds at most max_prefill_tokens_beside_decodes prompt tokens
// (chunks of running prompts and admissions together); with no decode it takes the whole budget.
TEST(SchedulerTest, PromptTokensBesideDecodesAreCapped) {
  Sim sim(64, 4,
          SchedulerConfig{
              .max_num_seqs = 8, .max_batched_tokens = 16, .max_prefill_tokens_beside_decodes = 5});
  sim.Add(Prompt(3, 0), 6);
  EXPECT_EQ(sim.Step(), (Ran{{0, 3}}));  // no decode yet: a prompt
  sim.Add(Prompt(12, 1), 1);
  sim.Add(Prompt(4, 2), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 5}}));  // beside 0's decode: 5 prompt tokens
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 5}}));
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 2}, {2, 3}}));  // 1's last chunk, then 3 of 2's 4
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {2, 1}}));
  sim.RunToCompletion();
  // Without decodes a long prompt takes the whole budget.
  Sim idle(64, 4,
           SchedulerConfig{
               .max_num_seqs = 8, .max_batched_tokens = 16, .max_prefill_tokens_beside_decodes = 5});
  idle.Add(Prompt(40, 3), 1);
  EXPECT_EQ(idle.Step(), (Ran{{0, 16}}));
  EXPECT_EQ(idle.Step(), (Ran{{0, 16}}));
  idle.RunToCompletion();
}

TEST(SchedulerTest, TheQueueHeadIsNeverOvertaken) {
  // 6 blocks of 4 tokens.
  Sim sim(6, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 64});
  sim.Add(Prompt(12, 0), 1);  // 3 blocks, finishes in the first step
  sim.Add(Prompt(8, 9), 4);   // 2 blocks, then 3 while it decodes
  sim.Step();
  EXPECT_EQ(sim.sched.n_running(), 1);
  sim.Add(Prompt(16, 1), 1);  // the head needs 4 blocks: only 3 are left
  sim.Add(Prompt(2, 2), 1);   // would fit, but must not overtake
  EXPECT_EQ(sim.Step(), (Ran{{1, 1}}));
  EXPECT_EQ(sim.Step(), (Ran{{1, 1}}));
  EXPECT_EQ(sim.sched.waiting().front()->id(), 2);
  sim.RunToCompletion();
  for (auto& s : sim.seqs) EXPECT_EQ(s->status, SequenceStatus::kFinished);
  EXPECT_EQ(sim.kv.n_used_blocks(), 0);
}

// Tokens of each prompt when it runs alone in a large pool.
std::vector<std::vector<int32_t>> SoloTokens(
    const std::vector<std::pair<std::vector<int32_t>, int32_t>>& reqs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& [prompt, max_new] : reqs) {
    Sim solo(256, 4, SchedulerConfig{.max_num_seqs = 1, .max_batched_tokens = 4096});
    Sequence* s = solo.Add(prompt, max_new);
    solo.RunToCompletion();
    out.emplace_back(s->tokens().begin(), s->tokens().end());
  }
  return out;
}

TEST(SchedulerTest, PreemptsTheMostRecentlyAdmittedAndReadmitsItFirst) {
  // 4 blocks of 4 tokens; no prefix caching so the arithmetic is plain.
  Sim sim(4, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 64}, /*caching=*/false);
  const std::vector<std::pair<std::vector<int32_t>, int32_t>> reqs = {
      {Prompt(7, 0), 9}, {Prompt(7, 1), 5}, {Prompt(1, 2), 1}};
  Sequence* a = sim.Add(reqs[0].first, reqs[0].second);
  Sequence* b = sim.Add(reqs[1].first, reqs[1].second);
  EXPECT_EQ(sim.Step(), (Ran{{0, 7}, {1, 7}}));  // 2 blocks each: the pool is full
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}, {1, 1}}));
  Sequence* c = sim.Add(reqs[2].first, reqs[2].second);
  // a's 9th slot needs a third block: b, admitted last, is preempted.
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}}));
  EXPECT_EQ(sim.last_preempted, (std::vector<int64_t>{1}));
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  EXPECT_EQ(b->n_computed_tokens, 0);
  EXPECT_EQ(b->n_tokens(), 9);  // its generated tokens are kept
  EXPECT_EQ(b->kv.n_blocks(), 0);
  EXPECT_EQ(b->n_preemptions, 1);
  EXPECT_EQ(sim.sched.n_preemptions(), 1u);
  ASSERT_EQ(sim.sched.n_waiting(), 2);
  EXPECT_EQ(sim.sched.waiting()[0], b);  // at the front, before c
  EXPECT_EQ(sim.sched.waiting()[1], c);
  // b comes back before c and recomputes its 9 tokens in one chunk, then samples.
  std::vector<Ran> steps;
  while (b->status == SequenceStatus::kWaiting) steps.push_back(sim.Step());
  ASSERT_FALSE(steps.back().empty());
  // Re-admitted first (c, if admitted in the same step, comes after it).
  const Ran& readmit = steps.back();
  const auto b_entry =
      std::find_if(readmit.begin(), readmit.end(), [](auto& e) { return e.first == 1; });
  ASSERT_NE(b_entry, readmit.end());
  EXPECT_EQ(b_entry->second, 9);
  EXPECT_NE(c->status, SequenceStatus::kWaiting);
  for (auto it = readmit.begin(); it != b_entry; ++it) EXPECT_NE(it->first, 2);
  EXPECT_EQ(a->n_preemptions, 0);
  sim.RunToCompletion();
  const auto solo = SoloTokens(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(std::vector<int32_t>(sim.seqs[i]->tokens().begin(), sim.seqs[i]->tokens().end()),
              solo[i])
        << i;
  }
  EXPECT_EQ(sim.kv.n_free_blocks(), 4);
}

TEST(SchedulerTest, ASequenceThatCannotGrowPreemptsItselfWhenItIsTheLast) {
  Sim sim(4, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 64}, /*caching=*/false);
  Sequence* a = sim.Add(Prompt(6, 0), 5);
  Sequence* b = sim.Add(Prompt(8, 1), 3);
  EXPECT_EQ(sim.Step(), (Ran{{0, 6}, {1, 8}}));
  EXPECT_EQ(sim.Step(), (Ran{{0, 1}}));  // b needs a third block: it is the victim itself
  EXPECT_EQ(sim.last_preempted, (std::vector<int64_t>{1}));
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  EXPECT_EQ(a->status, SequenceStatus::kRunning);
  sim.RunToCompletion();
  EXPECT_EQ(sim.kv.n_used_blocks(), 0);
}

TEST(SchedulerTest, AdmissionStartsAfterTheCachedPrefix) {
  Sim sim(32, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 64});
  Sequence* first = sim.Add(Prompt(10, 3), 1);
  EXPECT_EQ(sim.Step(), (Ran{{0, 10}}));
  EXPECT_EQ(first->n_cached_prompt_tokens, 0);
  Sequence* second = sim.Add(Prompt(10, 3), 2);
  EXPECT_EQ(sim.Step(), (Ran{{1, 2}}));  // 2 full blocks cached, the last 2 tokens computed
  EXPECT_EQ(second->n_cached_prompt_tokens, 8);
  EXPECT_EQ(second->n_computed_tokens, 10);
  Sequence* third = sim.Add(Prompt(8, 3), 1);  // fully cached prompt: its last block recomputed
  EXPECT_EQ(sim.Step(), (Ran{{1, 1}, {2, 4}}));
  EXPECT_EQ(third->n_cached_prompt_tokens, 4);
  sim.RunToCompletion();
  EXPECT_EQ(std::vector<int32_t>(second->generated().begin(), second->generated().begin() + 1),
            std::vector<int32_t>(first->generated().begin(), first->generated().end()));
}

TEST(SchedulerTest, RemoveFreesWaitingAndRunningSequences) {
  Sim sim(8, 4, SchedulerConfig{.max_num_seqs = 1, .max_batched_tokens = 64});
  Sequence* a = sim.Add(Prompt(9, 0), 10);
  Sequence* b = sim.Add(Prompt(9, 1), 10);
  sim.Step();
  EXPECT_EQ(sim.kv.n_used_blocks(), 3);
  sim.sched.Remove(b);  // waiting
  EXPECT_EQ(b->status, SequenceStatus::kFinished);
  sim.sched.Remove(a);  // running
  EXPECT_EQ(sim.kv.n_used_blocks(), 0);
  EXPECT_FALSE(sim.sched.has_work());
}

TEST(SchedulerDeathTest, MisuseIsCaught) {
  Sim sim(4, 4, SchedulerConfig{.max_num_seqs = 2, .max_batched_tokens = 8});
  Sequence too_big(99, Prompt(10, 0), 8);  // 17 slots > 16
  EXPECT_DEATH(sim.sched.Add(&too_big), "must be rejected before Add");
  sim.Add(Prompt(3, 0), 2);
  sim.sched.Schedule();
  EXPECT_DEATH(sim.sched.Schedule(), "without Commit");
  sim.sched.Commit();
}

// The engine learns that a sequence finished while the next step is already enqueued: Remove
// between Schedule and Commit frees it, and Commit skips it.
TEST(SchedulerTest, RemoveBetweenScheduleAndCommitIsSkippedByCommit) {
  Sim sim(8, 4, SchedulerConfig{.max_num_seqs = 4, .max_batched_tokens = 64});
  Sequence* a = sim.Add(Prompt(5, 0), 4);
  Sequence* b = sim.Add(Prompt(5, 1), 4);
  const SchedulerOutput& out = sim.sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  sim.sched.Remove(a);
  EXPECT_EQ(sim.kv.n_used_blocks(), 2);
  sim.sched.Commit();
  EXPECT_EQ(a->n_computed_tokens, 0);
  EXPECT_EQ(b->n_computed_tokens, 5);
  EXPECT_EQ(sim.sched.n_running(), 1);
}

// Asynchronous steps: a sampled token the host does not know yet (AppendPendingToken) is
// scheduled as that sequence's decode token, unless it is the sequence's last token; a sequence
// preempted while its token is pending is not re-admitted (nor does it let anyone overtake it)
// until the token is known.
TEST(SchedulerTest, PendingTokensAreDecodedButNeverLastNorReadmitted) {
  Sim sim(4, 4, SchedulerConfig{.max_num_seqs = 8, .max_batched_tokens = 64}, /*caching=*/false);
  Sequence* a = sim.Add(Prompt(3, 0), 2);
  Sequence* b = sim.Add(Prompt(7, 1), 1);
  {
    const SchedulerOutput& out = sim.sched.Schedule();
    ASSERT_EQ(out.scheduled.size(), 2u);
    sim.sched.Commit();
  }
  a->AppendPendingToken();
  b->AppendPendingToken();
  EXPECT_TRUE(a->last_token_pending());
  {
    // a decodes its pending token (its first of two); b's pending token is its last.
    const SchedulerOutput& out = sim.sched.Schedule();
    ASSERT_EQ(out.scheduled.size(), 1u);
    EXPECT_EQ(out.scheduled[0].seq, a);
    EXPECT_EQ(out.scheduled[0].n_new_tokens, 1);
    EXPECT_TRUE(out.scheduled[0].samples);
    a->ResolvePendingToken(3);  // arrives before the commit, as in the engine
    sim.sched.Commit();
  }
  EXPECT_EQ(a->tokens().back(), 3);
  EXPECT_EQ(a->n_computed_tokens, 4);
  b->ResolvePendingToken(4);
  sim.sched.Remove(b);
  sim.sched.Remove(a);

  // Preempted with a pending token: c waits at the head of the queue, d behind it.
  Sequence* c = sim.Add(Prompt(8, 2), 4);
  Sequence* d = sim.Add(Prompt(8, 3), 4);
  sim.sched.Schedule();  // both admitted: the pool (4 blocks) is full
  sim.sched.Commit();
  c->AppendPendingToken();
  d->AppendPendingToken();
  {
    const SchedulerOutput& out = sim.sched.Schedule();  // c's 9th slot: d is preempted
    ASSERT_EQ(out.preempted.size(), 1u);
    EXPECT_EQ(out.preempted[0], d);
    sim.sched.Commit();
  }
  c->ResolvePendingToken(1);
  sim.sched.Remove(c);
  EXPECT_TRUE(sim.sched.Schedule().empty());  // d's token is still pending
  d->ResolvePendingToken(2);
  const SchedulerOutput& out = sim.sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq, d);
  EXPECT_EQ(out.scheduled[0].n_new_tokens, 9);
  sim.sched.Commit();
}

// Thousands of steps with random arrivals and cancellations over a pool far too small for the
// load: the fake model checks every K/V read, each step respects the budget and the cap, a step
// that preempts admits nobody, finished sequences carry their solo tokens, nothing leaks.
TEST(SchedulerTest, RandomWorkloadKeepsKvExactAndLeaksNothing) {
  constexpr int32_t kBlocks = 40, kBs = 4;
  Sim sim(kBlocks, kBs, SchedulerConfig{.max_num_seqs = 6, .max_batched_tokens = 24});
  std::mt19937 gen(424242);
  std::vector<std::pair<std::vector<int32_t>, int32_t>> reqs;
  std::vector<bool> cancelled;
  int n_steps_with_preemption = 0;
  for (int step = 0; step < 4000; ++step) {
    if (step < 3000 && gen() % 3 == 0) {  // a new request, sharing one of 4 stems
      const int32_t stem = static_cast<int32_t>(gen() % 4);
      const int32_t n = 1 + static_cast<int32_t>(gen() % 60);
      std::vector<int32_t> prompt;
      for (int32_t i = 0; i < n; ++i) {
        prompt.push_back(i < 20 ? stem * 1000 + i : static_cast<int32_t>(gen() % 3));
      }
      const int32_t max_new =
          1 + static_cast<int32_t>(gen() % std::min<int32_t>(40, kBlocks * kBs - n));
      reqs.emplace_back(prompt, max_new);
      cancelled.push_back(false);
      sim.Add(prompt, max_new);
    }
    if (gen() % 25 == 0) {  // a client goes away
      const size_t i = gen() % sim.seqs.size();
      if (!sim.seqs.empty() && sim.seqs[i]->status != SequenceStatus::kFinished) {
        sim.sched.Remove(sim.seqs[i].get());
        cancelled[i] = true;
      }
    }
    std::vector<Sequence*> running_before = sim.sched.running();
    const SchedulerOutput& out = sim.sched.Schedule();
    const bool preempted = !out.preempted.empty();
    if (preempted) {
      ++n_steps_with_preemption;
      for (const ScheduledSequence& s : out.scheduled) {
        ASSERT_NE(std::find(running_before.begin(), running_before.end(), s.seq),
                  running_before.end())
            << "admitted in a step that preempted";
      }
    }
    // Undo: the Sim drives the step itself. Schedule is not re-entrant, so finish this one here.
    if (!out.empty()) {
      const std::vector<int32_t> sampled = sim.model.Run(out);
      sim.sched.Commit();
      size_t k = 0;
      std::vector<Sequence*> done;
      for (const ScheduledSequence& s : out.scheduled) {
        if (!s.samples) continue;
        s.seq->AppendToken(sampled[k++]);
        if (s.seq->n_generated_tokens() == s.seq->max_new_tokens()) done.push_back(s.seq);
      }
      for (Sequence* s : done) sim.sched.Remove(s);
    }
    ASSERT_LE(out.n_tokens, 24);
    // Blocks in use are exactly those of running sequences; waiting ones hold none.
    std::vector<bool> held(kBlocks, false);
    for (Sequence* s : sim.sched.running()) {
      ASSERT_GE(static_cast<int64_t>(s->kv.n_blocks()) * kBs, s->n_computed_tokens);
      for (int32_t b : s->kv.blocks()) held[static_cast<size_t>(b)] = true;
    }
    for (Sequence* s : sim.sched.waiting()) ASSERT_EQ(s->kv.n_blocks(), 0);
    ASSERT_EQ(std::count(held.begin(), held.end(), true), sim.kv.n_used_blocks());
    if (HasFailure()) return;
  }
  sim.RunToCompletion();
  EXPECT_EQ(sim.kv.n_used_blocks(), 0);
  EXPECT_EQ(sim.kv.n_free_blocks(), kBlocks);
  EXPECT_GT(n_steps_with_preemption, 20);
  EXPECT_GT(sim.sched.n_preemptions(), 20u);
  int n_hits = 0, n_cancelled = 0;
  const auto solo = SoloTokens(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Sequence& s = *sim.seqs[i];
    ASSERT_EQ(s.status, SequenceStatus::kFinished);
    n_hits += s.n_cached_prompt_tokens > 0;
    if (cancelled[i]) {
      ++n_cancelled;
      continue;
    }
    EXPECT_EQ(std::vector<int32_t>(s.tokens().begin(), s.tokens().end()), solo[i]) << i;
  }
  EXPECT_GT(n_hits, 50);
  EXPECT_GT(n_cancelled, 20);
  EXPECT_GT(reqs.size(), 800u);
}

}  // namespace
}  // namespace kestrel
