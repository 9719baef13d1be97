// TokenMaskCache: state equivalence for masks, and the trie walk that classifies every token.
#include "grammar/token_mask_cache.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "core/thread_pool.h"
#include "grammar/earley.h"

namespace kestrel::grammar {
namespace {

// Moore partition refinement, stopped after max_rounds rounds (max_rounds < 0: until stable).
// Each round looks one symbol further (a byte, or a reference to a rule, which consumes at least
// one byte unless the rule is nullable), so after k rounds two states of one class are
// indistinguishable by any path of at most k bytes — enough for tokens of at most k bytes.
std::vector<int32_t> EquivalenceClasses(const Automaton& a, int32_t max_rounds) {
  const int32_t n = a.n_states();
  std::vector<int32_t> cls(n);
  int32_t n_classes = 0;
  {
    std::unordered_map<std::vector<int32_t>, int32_t, IntVectorHash> ids;
    for (int32_t s = 0; s < n; ++s) {
      auto [it, inserted] = ids.emplace(std::vector<int32_t>{a.state_rule[s], a.state_final[s]},
                                        static_cast<int32_t>(ids.size()));
      cls[s] = it->second;
    }
    n_classes = static_cast<int32_t>(ids.size());
  }
  std::vector<int32_t> next(n);
  std::vector<int32_t> signature;
  for (int32_t round = 0; max_rounds < 0 || round < max_rounds; ++round) {
    std::unordered_map<std::vector<int32_t>, int32_t, IntVectorHash> ids;
    for (int32_t s = 0; s < n; ++s) {
      signature.clear();
      signature.push_back(cls[s]);
      for (int32_t c = 0; c < a.n_classes; ++c) {
        const int32_t t = a.transitions[static_cast<size_t>(s) * a.n_classes + c];
        signature.push_back(t < 0 ? -1 : cls[t]);
      }
      for (const RuleEdge& e : a.RuleEdges(s)) {
        signature.push_back(e.rule);
        signature.push_back(cls[e.target]);
      }
      auto [it, inserted] = ids.emplace(signature, static_cast<int32_t>(ids.size()));
      next[s] = it->second;
    }
    const bool stable = static_cast<int32_t>(ids.size()) == n_classes;
    n_classes = static_cast<int32_t>(ids.size());
    cls.swap(next);
    if (stable) break;
  }
  return cls;
}

// Ascending positions as runs [begin, end): accepted tokens come in long runs (a string state
// accepts most of the vocabulary), so this stays small where a list of positions would not.
class PositionRuns {
 public:
  void Add(int32_t begin, int32_t end) {
    if (begin >= end) return;
    if (!runs_.empty() && runs_.back().second == begin) {
      runs_.back().second = end;
    } else {
      runs_.push_back({begin, end});
    }
    count_ += end - begin;
  }
  int64_t count() const { return count_; }
  const std::vector<std::pair<int32_t, int32_t>>& runs() const { return runs_; }

 private:
  std::vector<std::pair<int32_t, int32_t>> runs_;
  int64_t count_ = 0;
};

// Stores the smaller of the accepted and the rejected ids, or a bitmask when both are large.
StateMask Finish(const Vocabulary& v, const PositionRuns& accepted,
                 std::vector<int32_t> uncertain) {
  StateMask mask;
  mask.uncertain = std::move(uncertain);
  const size_t n_accepted = accepted.count();
  const size_t n_rejected = v.n_text_tokens() - n_accepted - mask.uncertain.size();
  const size_t bitmask_words = v.bitmask_words();
  if (n_accepted <= n_rejected && n_accepted <= bitmask_words) {
    mask.form = StateMask::Form::kAcceptedList;
    for (auto [begin, end] : accepted.runs()) {
      for (int32_t p = begin; p < end; ++p) mask.tokens.push_back(v.token_at(p));
    }
  } else if (n_rejected <= bitmask_words) {
    // Rejected: the gaps between accepted runs, less the uncertain positions.
    mask.form = StateMask::Form::kRejectedList;
    size_t next_uncertain = 0;
    auto add_gap = [&](int32_t begin, int32_t end) {
      for (int32_t p = begin; p < end; ++p) {
        while (next_uncertain < mask.uncertain.size() && mask.uncertain[next_uncertain] < p) {
          ++next_uncertain;
        }
        if (next_uncertain < mask.uncertain.size() && mask.uncertain[next_uncertain] == p) continue;
        mask.tokens.push_back(v.token_at(p));
      }
    };
    int32_t previous_end = 0;
    for (auto [begin, end] : accepted.runs()) {
      add_gap(previous_end, begin);
      previous_end = end;
    }
    add_gap(previous_end, v.n_text_tokens());
  } else {
    mask.form = StateMask::Form::kBitmask;
    mask.bits.assign(bitmask_words, 0);
    for (auto [begin, end] : accepted.runs()) {
      for (int32_t p = begin; p < end; ++p) {
        const int32_t id = v.token_at(p);
        mask.bits[id >> 5] |= uint32_t{1} << (id & 31);
      }
    }
  }
  std::sort(mask.tokens.begin(), mask.tokens.end());
  return mask;
}

// Appends the positions of every token in node i's subtree.
void AppendSubtree(const Vocabulary& v, int32_t i, std::vector<int32_t>* out) {
  for (int32_t p = v.token_begin(i); p < v.token_begin(v.subtree_end(i)); ++p) out->push_back(p);
}

// Walks the trie from `state` of a rule with references (see token_mask_cache.h), on an Earley
// chart started at the state.
StateMask ClassifyWithChart(const Automaton& a, const Vocabulary& v, int32_t state,
                            EarleyChart* chart) {
  const ByteSet& follow = a.follow[a.state_rule[state]];
  const int32_t max_depth = v.max_token_bytes();
  // Per depth of the current trie path.
  std::vector<uint8_t> completed(max_depth + 1, 0);   // the rule can end after this byte
  std::vector<uint8_t> may_return(max_depth + 1, 0);  // it could end earlier, at byte >= 1
  PositionRuns accepted;
  std::vector<int32_t> uncertain;  // positions, ascending (preorder)
  chart->Start(state);
  for (int32_t i = 1; i < v.n_nodes();) {
    const int32_t d = v.node_depth(i);
    const uint8_t byte = v.node_byte(i);
    const bool returns = may_return[d - 1] || (d >= 2 && completed[d - 1] && follow.Has(byte));
    chart->Truncate(d);
    if (!chart->Advance(byte)) {
      if (returns) AppendSubtree(v, i, &uncertain);
      i = v.subtree_end(i);
      continue;
    }
    completed[d] = chart->BottomCompleted();
    may_return[d] = returns;
    accepted.Add(v.token_begin(i), v.token_begin(i + 1));
    ++i;
  }
  return Finish(v, accepted, std::move(uncertain));
}

// The same for several states of one rule without references, in one walk: each state is a plain
// DFA state, and the walk carries the list of states still alive on the current trie path.
std::vector<StateMask> ClassifyRegular(const Automaton& a, const Vocabulary& v,
                                       const std::vector<int32_t>& states) {
  const ByteSet& follow = a.follow[a.state_rule[states[0]]];
  struct Live {
    int32_t entry;      // index into states
    int32_t state;      // DFA state after this byte
    uint8_t completed;  // the rule can end here
    uint8_t returns;    // it could end earlier, at byte >= 1, with the next byte in FOLLOW
  };
  std::vector<std::vector<Live>> live(v.max_token_bytes() + 1);  // by depth
  for (size_t e = 0; e < states.size(); ++e) {
    live[0].push_back({static_cast<int32_t>(e), states[e], a.state_final[states[e]], 0});
  }
  std::vector<PositionRuns> accepted(states.size());
  std::vector<std::vector<int32_t>> uncertain(states.size());
  for (int32_t i = 1; i < v.n_nodes();) {
    const int32_t d = v.node_depth(i);
    const uint8_t byte = v.node_byte(i);
    const bool follows = d >= 2 && follow.Has(byte);
    std::vector<Live>& here = live[d];
    here.clear();
    for (const Live& parent : live[d - 1]) {
      const bool returns = parent.returns || (follows && parent.completed);
      const int32_t t = a.Next(parent.state, byte);
      if (t < 0) {
        if (returns) AppendSubtree(v, i, &uncertain[parent.entry]);
        continue;
      }
      here.push_back({parent.entry, t, a.state_final[t], returns});
    }
    if (here.empty()) {
      i = v.subtree_end(i);
      continue;
    }
    if (v.token_begin(i) < v.token_begin(i + 1)) {
      for (const Live& l : here) accepted[l.entry].Add(v.token_begin(i), v.token_begin(i + 1));
    }
    ++i;
  }
  std::vector<StateMask> masks;
  for (size_t e = 0; e < states.size(); ++e) {
    masks.push_back(Finish(v, accepted[e], std::move(uncertain[e])));
  }
  return masks;
}

}  // namespace

TokenMaskCache TokenMaskCache::Build(const Automaton& a, const Vocabulary& v, ThreadPool* pool) {
  const int32_t n = a.n_states();
  // Kernel items are entered by a transition or a rule edge (scan, completion, nullable
  // shortcut), except the root's bottom item.
  std::vector<uint8_t> kernel(n, 0);
  bool nullable_reference = false;
  kernel[a.rule_start[a.root_rule]] = 1;
  for (int32_t s = 0; s < n; ++s) {
    for (int32_t c = 0; c < a.n_classes; ++c) {
      const int32_t t = a.transitions[static_cast<size_t>(s) * a.n_classes + c];
      if (t >= 0) kernel[t] = 1;
    }
    for (const RuleEdge& e : a.RuleEdges(s)) {
      kernel[e.target] = 1;
      nullable_reference |= a.rule_nullable[e.rule] != 0;
    }
  }
  // A nullable reference can be crossed without a byte: refine until stable.
  const std::vector<int32_t> cls =
      EquivalenceClasses(a, nullable_reference ? -1 : std::max(v.max_token_bytes(), 1));

  // One entry per class of kernel states, computed from its first state.
  TokenMaskCache cache;
  cache.entry_of_state_.assign(n, -1);
  std::unordered_map<int32_t, int32_t> entry_of_class;
  std::vector<int32_t> representative;
  for (int32_t s = 0; s < n; ++s) {
    if (!kernel[s]) continue;
    auto [it, inserted] =
        entry_of_class.emplace(cls[s], static_cast<int32_t>(representative.size()));
    if (inserted) representative.push_back(s);
    cache.entry_of_state_[s] = it->second;
  }
  cache.entries_.resize(representative.size());

  // Jobs: each entry of a rule with references, and each reference-free rule (all its entries in
  // one walk). With a pool, threads take jobs from a shared counter (their costs differ widely).
  std::vector<std::vector<int32_t>> jobs;
  std::vector<std::vector<int32_t>> regular_entries(a.rule_start.size());
  for (size_t e = 0; e < representative.size(); ++e) {
    const int32_t rule = a.state_rule[representative[e]];
    if (a.rule_regular[rule]) {
      regular_entries[rule].push_back(static_cast<int32_t>(e));
    } else {
      jobs.push_back({static_cast<int32_t>(e)});
    }
  }
  for (std::vector<int32_t>& entries : regular_entries) {
    if (!entries.empty()) jobs.push_back(std::move(entries));
  }
  auto run_jobs = [&](std::atomic<size_t>* next) {
    EarleyChart chart(&a);
    for (size_t j; (j = next->fetch_add(1)) < jobs.size();) {
      const std::vector<int32_t>& entries = jobs[j];
      const int32_t first = representative[entries[0]];
      if (!a.rule_regular[a.state_rule[first]]) {
        cache.entries_[entries[0]] = ClassifyWithChart(a, v, first, &chart);
        continue;
      }
      std::vector<int32_t> states;
      for (int32_t e : entries) states.push_back(representative[e]);
      std::vector<StateMask> masks = ClassifyRegular(a, v, states);
      for (size_t k = 0; k < entries.size(); ++k) cache.entries_[entries[k]] = std::move(masks[k]);
    }
  };
  std::atomic<size_t> next{0};
  if (pool == nullptr || pool->n_threads() <= 1) {
    run_jobs(&next);
  } else {
    pool->ParallelFor(pool->n_threads(), 1, [&](int64_t, int64_t, int) { run_jobs(&next); });
  }
  return cache;
}

}  // namespace kestrel::grammar
