// TokenMaskCache: state equivalence for masks, and the trie walk that classifies every token.
#include "grammar/token_mask_cache.h"

#include <algorithm>
#include <unordered_map>

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

// Walks the trie from `state` (see token_mask_cache.h) and returns its entry.
StateMask Classify(const Automaton& a, const Vocabulary& v, int32_t state, EarleyChart* chart) {
  const int32_t rule = a.state_rule[state];
  const ByteSet& follow = a.follow[rule];
  const bool regular = a.rule_regular[rule] != 0;
  const int32_t max_depth = v.max_token_bytes();
  // Per depth of the current trie path.
  std::vector<int32_t> dfa_state(max_depth + 1, -1);  // regular rules: the DFA state
  std::vector<uint8_t> completed(max_depth + 1, 0);   // the rule can end after this byte
  std::vector<uint8_t> may_return(max_depth + 1, 0);  // it could end earlier, at byte >= 1
  // 0 rejected, 1 accepted, 2 uncertain, by position.
  std::vector<uint8_t> verdict(v.n_text_tokens(), 0);
  if (regular) {
    dfa_state[0] = state;
  } else {
    chart->Start(state);
  }
  StateMask mask;
  const int32_t n_nodes = v.n_nodes();
  for (int32_t i = 1; i < n_nodes;) {
    const int32_t d = v.node_depth(i);
    const uint8_t byte = v.node_byte(i);
    const bool returns = may_return[d - 1] || (d >= 2 && completed[d - 1] && follow.Has(byte));
    bool alive = false;
    if (regular) {
      const int32_t t = a.Next(dfa_state[d - 1], byte);
      alive = t >= 0;
      if (alive) {
        dfa_state[d] = t;
        completed[d] = a.state_final[t];
      }
    } else {
      chart->Truncate(d);
      alive = chart->Advance(byte);
      if (alive) completed[d] = chart->BottomCompleted();
    }
    if (!alive) {
      if (returns) {
        for (int32_t p = v.token_begin(i); p < v.token_begin(v.subtree_end(i)); ++p) {
          verdict[p] = 2;
          mask.uncertain.push_back(p);
        }
      }
      i = v.subtree_end(i);
      continue;
    }
    may_return[d] = returns;
    for (int32_t p = v.token_begin(i); p < v.token_begin(i + 1); ++p) verdict[p] = 1;
    ++i;
  }

  std::vector<int32_t> accepted;
  std::vector<int32_t> rejected;
  for (int32_t p = 0; p < v.n_text_tokens(); ++p) {
    if (verdict[p] == 1) accepted.push_back(v.token_at(p));
    if (verdict[p] == 0) rejected.push_back(v.token_at(p));
  }
  mask.n_accepted = static_cast<int32_t>(accepted.size());
  const size_t bitmask_words = v.bitmask_words();
  if (accepted.size() <= rejected.size() && accepted.size() <= bitmask_words) {
    mask.form = StateMask::Form::kAcceptedList;
    mask.tokens = std::move(accepted);
  } else if (rejected.size() <= bitmask_words) {
    mask.form = StateMask::Form::kRejectedList;
    mask.tokens = std::move(rejected);
  } else {
    mask.form = StateMask::Form::kBitmask;
    mask.bits.assign(bitmask_words, 0);
    for (int32_t id : accepted) mask.bits[id >> 5] |= uint32_t{1} << (id & 31);
  }
  std::sort(mask.tokens.begin(), mask.tokens.end());
  return mask;
}

}  // namespace

TokenMaskCache TokenMaskCache::Build(const Automaton& a, const Vocabulary& v) {
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

  TokenMaskCache cache;
  cache.entry_of_state_.assign(n, -1);
  std::unordered_map<int32_t, int32_t> entry_of_class;
  EarleyChart chart(&a);
  for (int32_t s = 0; s < n; ++s) {
    if (!kernel[s]) continue;
    auto it = entry_of_class.find(cls[s]);
    if (it == entry_of_class.end()) {
      it = entry_of_class.emplace(cls[s], static_cast<int32_t>(cache.entries_.size())).first;
      cache.entries_.push_back(Classify(a, v, s, &chart));
    }
    cache.entry_of_state_[s] = it->second;
  }
  return cache;
}

}  // namespace kestrel::grammar
