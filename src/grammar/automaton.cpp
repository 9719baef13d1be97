// Grammar → Automaton: UTF-8 lowering, Thompson NFAs, subset construction, trimming and the
// analyses the matcher needs (see automaton.h).
#include "grammar/automaton.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>

#include "core/check.h"

namespace kestrel::grammar {

int ByteSet::Count() const {
  int n = 0;
  for (uint64_t w : words) n += std::popcount(w);
  return n;
}

namespace {

struct ByteRange {
  uint8_t lo;
  uint8_t hi;
};
using ByteSequence = std::vector<ByteRange>;

// Splits [lo, hi] (one UTF-8 length, no surrogates) into sequences of byte ranges whose cross
// product is exactly the encodings of [lo, hi].
void AppendUtf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteSequence>* out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  // Split at encoding-length boundaries and around the surrogates.
  for (uint32_t end : kLengthEnds) {
    if (lo <= end && hi > end) {
      AppendUtf8Sequences(lo, end, out);
      AppendUtf8Sequences(end + 1, hi, out);
      return;
    }
  }
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) AppendUtf8Sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) AppendUtf8Sequences(0xE000, hi, out);
    return;
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int n_bytes = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  // Align so that every continuation position ranges over a full or a single prefix.
  for (int i = 1; i < n_bytes; ++i) {
    const uint32_t mask = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        AppendUtf8Sequences(lo, lo | mask, out);
        AppendUtf8Sequences((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        AppendUtf8Sequences(lo, (hi & ~mask) - 1, out);
        AppendUtf8Sequences(hi & ~mask, hi, out);
        return;
      }
    }
  }
  std::string a;
  std::string b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  ByteSequence seq;
  for (int i = 0; i < n_bytes; ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  out->push_back(std::move(seq));
}

// ---- NFA ----

struct NfaEdge {
  enum class Kind : uint8_t { kEpsilon, kBytes, kRule };
  Kind kind;
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t rule = -1;
  int32_t target;
  int32_t next;  // next edge of the same source state, -1 at the end
};

class Nfa {
 public:
  explicit Nfa(int64_t max_states) : max_states_(max_states) {}

  Result<int32_t> NewState() {
    if (static_cast<int64_t>(head_.size()) >= max_states_) {
      return InvalidArgument("grammar too large: its automaton exceeds " +
                             std::to_string(max_states_) + " NFA states (large repeat counts?)");
    }
    head_.push_back(-1);
    return static_cast<int32_t>(head_.size() - 1);
  }
  void AddEdge(int32_t from, NfaEdge e) {
    e.next = head_[from];
    head_[from] = static_cast<int32_t>(edges_.size());
    edges_.push_back(e);
  }
  void Epsilon(int32_t from, int32_t to) {
    AddEdge(from, {NfaEdge::Kind::kEpsilon, 0, 0, -1, to, -1});
  }
  void Bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    AddEdge(from, {NfaEdge::Kind::kBytes, lo, hi, -1, to, -1});
  }
  void RuleRef(int32_t from, int32_t rule, int32_t to) {
    AddEdge(from, {NfaEdge::Kind::kRule, 0, 0, rule, to, -1});
  }
  int32_t head(int32_t s) const { return head_[s]; }
  const NfaEdge& edge(int32_t e) const { return edges_[e]; }
  const std::vector<NfaEdge>& edges() const { return edges_; }
  void Clear() {
    head_.clear();
    edges_.clear();
  }

 private:
  int64_t max_states_;
  std::vector<int32_t> head_;
  std::vector<NfaEdge> edges_;
};

struct Fragment {
  int32_t start;
  int32_t end;
};

Result<Fragment> BuildFragment(const Expr& e, Nfa* nfa) {
  KASSIGN(int32_t start, nfa->NewState());
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      return Fragment{start, start};
    case Expr::Kind::kLiteral: {
      int32_t cur = start;
      for (char c : e.literal) {
        KASSIGN(int32_t next, nfa->NewState());
        nfa->Bytes(cur, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
        cur = next;
      }
      return Fragment{start, cur};
    }
    case Expr::Kind::kClass: {
      KASSIGN(int32_t end, nfa->NewState());
      std::vector<ByteSequence> sequences;
      for (const CodepointRange& r : e.chars.ranges()) AppendUtf8Sequences(r.lo, r.hi, &sequences);
      for (const ByteSequence& seq : sequences) {
        int32_t cur = start;
        for (size_t i = 0; i < seq.size(); ++i) {
          int32_t next = end;
          if (i + 1 < seq.size()) {
            KASSIGN(next, nfa->NewState());
          }
          nfa->Bytes(cur, seq[i].lo, seq[i].hi, next);
          cur = next;
        }
      }
      return Fragment{start, end};
    }
    case Expr::Kind::kRuleRef: {
      KASSIGN(int32_t end, nfa->NewState());
      nfa->RuleRef(start, e.rule, end);
      return Fragment{start, end};
    }
    case Expr::Kind::kSequence: {
      int32_t cur = start;
      for (const Expr& child : e.children) {
        KASSIGN(Fragment f, BuildFragment(child, nfa));
        nfa->Epsilon(cur, f.start);
        cur = f.end;
      }
      return Fragment{start, cur};
    }
    case Expr::Kind::kChoice: {
      KASSIGN(int32_t end, nfa->NewState());
      for (const Expr& child : e.children) {
        KASSIGN(Fragment f, BuildFragment(child, nfa));
        nfa->Epsilon(start, f.start);
        nfa->Epsilon(f.end, end);
      }
      return Fragment{start, end};
    }
    case Expr::Kind::kRepeat: {
      const Expr& child = e.children[0];
      int32_t cur = start;
      for (uint32_t i = 0; i < e.min; ++i) {
        KASSIGN(Fragment f, BuildFragment(child, nfa));
        nfa->Epsilon(cur, f.start);
        cur = f.end;
      }
      if (e.max == kUnbounded) {
        KASSIGN(int32_t loop, nfa->NewState());
        KASSIGN(Fragment f, BuildFragment(child, nfa));
        nfa->Epsilon(cur, loop);
        nfa->Epsilon(loop, f.start);
        nfa->Epsilon(f.end, loop);
        return Fragment{start, loop};
      }
      KASSIGN(int32_t end, nfa->NewState());
      nfa->Epsilon(cur, end);
      for (uint32_t i = e.min; i < e.max; ++i) {
        KASSIGN(Fragment f, BuildFragment(child, nfa));
        nfa->Epsilon(cur, f.start);
        nfa->Epsilon(f.end, end);
        cur = f.end;
      }
      return Fragment{start, end};
    }
  }
  return Internal("unknown expression kind");
}

void CollectRuleRefs(const Expr& e, std::vector<int32_t>* out) {
  if (e.kind == Expr::Kind::kRuleRef) out->push_back(e.rule);
  for (const Expr& c : e.children) CollectRuleRefs(c, out);
}

void CollectByteBoundaries(const Expr& e, std::array<bool, 257>* boundary) {
  if (e.kind == Expr::Kind::kLiteral) {
    for (char c : e.literal) {
      (*boundary)[static_cast<uint8_t>(c)] = true;
      (*boundary)[static_cast<uint8_t>(c) + 1] = true;
    }
  } else if (e.kind == Expr::Kind::kClass) {
    std::vector<ByteSequence> sequences;
    for (const CodepointRange& r : e.chars.ranges()) AppendUtf8Sequences(r.lo, r.hi, &sequences);
    for (const ByteSequence& seq : sequences) {
      for (const ByteRange& br : seq) {
        (*boundary)[br.lo] = true;
        (*boundary)[br.hi + 1] = true;
      }
    }
  }
  for (const Expr& c : e.children) CollectByteBoundaries(c, boundary);
}

// One rule's DFA, states numbered from 0 (the start).
struct RuleDfa {
  std::vector<uint8_t> final;
  std::vector<int32_t> transitions;  // [n * n_classes]
  std::vector<std::vector<RuleEdge>> rule_edges;
};

class SubsetBuilder {
 public:
  SubsetBuilder(const Nfa& nfa, int32_t n_classes, const std::array<uint8_t, 256>& byte_class)
      : nfa_(nfa), n_classes_(n_classes), byte_class_(byte_class) {}

  Result<RuleDfa> Build(int32_t start, int32_t end, int64_t max_states) {
    end_ = end;
    RuleDfa dfa;
    std::unordered_map<std::vector<int32_t>, int32_t, IntVectorHash> ids;
    std::vector<std::vector<int32_t>> sets;
    auto intern = [&](std::vector<int32_t> seeds) -> Result<int32_t> {
      std::vector<int32_t> key = Closure(std::move(seeds));
      auto it = ids.find(key);
      if (it != ids.end()) return it->second;
      if (static_cast<int64_t>(sets.size()) >= max_states) {
        return InvalidArgument("grammar too large: a rule's automaton exceeds " +
                               std::to_string(max_states) + " DFA states");
      }
      const int32_t id = static_cast<int32_t>(sets.size());
      ids.emplace(key, id);
      sets.push_back(std::move(key));
      return id;
    };
    KASSIGN(int32_t start_id, intern({start}));
    KCHECK(start_id == 0);
    std::vector<std::vector<int32_t>> moves(n_classes_);
    std::map<int32_t, std::vector<int32_t>> rule_moves;
    for (size_t d = 0; d < sets.size(); ++d) {
      for (auto& m : moves) m.clear();
      rule_moves.clear();
      bool final = false;
      for (int32_t s : sets[d]) {
        if (s == end_) final = true;
        for (int32_t e = nfa_.head(s); e >= 0; e = nfa_.edge(e).next) {
          const NfaEdge& edge = nfa_.edge(e);
          if (edge.kind == NfaEdge::Kind::kBytes) {
            for (int c = byte_class_[edge.lo]; c <= byte_class_[edge.hi]; ++c) {
              moves[c].push_back(edge.target);
            }
          } else if (edge.kind == NfaEdge::Kind::kRule) {
            rule_moves[edge.rule].push_back(edge.target);
          }
        }
      }
      dfa.final.push_back(final);
      dfa.transitions.resize(dfa.final.size() * n_classes_, -1);
      dfa.rule_edges.emplace_back();
      for (int c = 0; c < n_classes_; ++c) {
        if (moves[c].empty()) continue;
        KASSIGN(int32_t t, intern(std::move(moves[c])));
        dfa.transitions[d * n_classes_ + c] = t;
      }
      for (auto& [rule, targets] : rule_moves) {
        KASSIGN(int32_t t, intern(std::move(targets)));
        dfa.rule_edges[d].push_back({rule, t});
      }
    }
    return dfa;
  }

 private:
  // ε-closure, keeping only states that matter for the DFA state's identity: those with a
  // non-ε edge, and the end.
  std::vector<int32_t> Closure(std::vector<int32_t> stack) {
    std::vector<int32_t> out;
    ++epoch_;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (static_cast<size_t>(s) >= stamp_.size()) stamp_.resize(s + 1024, 0);
      if (stamp_[s] == epoch_) continue;
      stamp_[s] = epoch_;
      bool important = s == end_;
      for (int32_t e = nfa_.head(s); e >= 0; e = nfa_.edge(e).next) {
        const NfaEdge& edge = nfa_.edge(e);
        if (edge.kind == NfaEdge::Kind::kEpsilon) {
          stack.push_back(edge.target);
        } else {
          important = true;
        }
      }
      if (important) out.push_back(s);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  const Nfa& nfa_;
  int32_t n_classes_;
  const std::array<uint8_t, 256>& byte_class_;
  int32_t end_ = -1;
  std::vector<uint32_t> stamp_;  // visited marks of Closure, by NFA state
  uint32_t epoch_ = 0;
};

// Marks rules reachable from the root; checks that every reference names a rule.
Result<std::vector<uint8_t>> ReachableRules(const Grammar& g) {
  const int32_t n_rules = static_cast<int32_t>(g.rules().size());
  std::vector<uint8_t> reachable(n_rules, 0);
  std::vector<int32_t> stack = {g.root()};
  reachable[g.root()] = 1;
  std::vector<int32_t> refs;
  while (!stack.empty()) {
    const int32_t r = stack.back();
    stack.pop_back();
    refs.clear();
    CollectRuleRefs(g.rule(r).body, &refs);
    for (int32_t ref : refs) {
      if (ref < 0 || ref >= n_rules) {
        return Internal("rule '" + g.rule(r).name + "' references rule #" + std::to_string(ref) +
                        ", which does not exist");
      }
      if (!reachable[ref]) {
        reachable[ref] = 1;
        stack.push_back(ref);
      }
    }
  }
  return reachable;
}

// The automaton before trimming: every rule's DFA numbered globally.
struct RawAutomaton {
  std::vector<int32_t> state_rule;
  std::vector<uint8_t> final;
  std::vector<int32_t> transitions;
  std::vector<std::vector<RuleEdge>> rule_edges;
  std::vector<int32_t> rule_start;  // -1: rule not built
};

// Keeps the states that are reachable from the root and can reach their rule's end, and the
// references to rules that derive some string; renumbers them into `out`.
Status TrimInto(const RawAutomaton& raw, int32_t n_rules, int32_t root, Automaton* out) {
  const int32_t n = static_cast<int32_t>(raw.state_rule.size());
  const int32_t n_classes = out->n_classes;
  // Backward: live = can reach the end of its rule.
  std::vector<std::vector<int32_t>> byte_preds(n);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> rule_preds(n);  // target → (source, rule)
  std::vector<std::vector<std::pair<int32_t, int32_t>>> edges_by_rule(n_rules);  // (source, target)
  for (int32_t s = 0; s < n; ++s) {
    for (int c = 0; c < n_classes; ++c) {
      const int32_t t = raw.transitions[static_cast<size_t>(s) * n_classes + c];
      if (t >= 0 && (byte_preds[t].empty() || byte_preds[t].back() != s))
        byte_preds[t].push_back(s);
    }
    for (const RuleEdge& e : raw.rule_edges[s]) {
      rule_preds[e.target].push_back({s, e.rule});
      edges_by_rule[e.rule].push_back({s, e.target});
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<uint8_t> productive(n_rules, 0);
  std::vector<int32_t> work;
  auto mark = [&](int32_t s) {
    if (!live[s]) {
      live[s] = 1;
      work.push_back(s);
    }
  };
  for (int32_t s = 0; s < n; ++s) {
    if (raw.final[s]) mark(s);
  }
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t s : byte_preds[t]) mark(s);
    for (auto [s, rule] : rule_preds[t]) {
      if (productive[rule]) mark(s);
    }
    const int32_t rule = raw.state_rule[t];
    if (raw.rule_start[rule] == t && !productive[rule]) {
      productive[rule] = 1;
      for (auto [s, target] : edges_by_rule[rule]) {
        if (live[target]) mark(s);
      }
    }
  }
  if (!productive[root]) return InvalidArgument("the grammar matches no string");

  // Forward from the root over live states and productive references.
  std::vector<uint8_t> keep(n, 0);
  work = {raw.rule_start[root]};
  keep[raw.rule_start[root]] = 1;
  auto visit = [&](int32_t s) {
    if (live[s] && !keep[s]) {
      keep[s] = 1;
      work.push_back(s);
    }
  };
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (int c = 0; c < n_classes; ++c) {
      const int32_t t = raw.transitions[static_cast<size_t>(s) * n_classes + c];
      if (t >= 0) visit(t);
    }
    for (const RuleEdge& e : raw.rule_edges[s]) {
      if (!productive[e.rule] || !live[e.target]) continue;
      visit(e.target);
      visit(raw.rule_start[e.rule]);
    }
  }
  // A kept rule's start is kept (it is how the rule is entered), so it stays first.
  std::vector<int32_t> new_id(n, -1);
  int32_t n_kept = 0;
  for (int32_t s = 0; s < n; ++s) {
    if (keep[s]) new_id[s] = n_kept++;
  }
  out->state_rule.resize(n_kept);
  out->state_final.resize(n_kept);
  out->transitions.assign(static_cast<size_t>(n_kept) * n_classes, -1);
  out->rule_edge_begin.assign(n_kept + 1, 0);
  out->rule_start.assign(n_rules, -1);
  out->rule_end.assign(n_rules, -1);
  for (int32_t s = 0; s < n; ++s) {
    const int32_t id = new_id[s];
    if (id < 0) continue;
    const int32_t rule = raw.state_rule[s];
    out->state_rule[id] = rule;
    out->state_final[id] = raw.final[s];
    if (raw.rule_start[rule] == s) out->rule_start[rule] = id;
    out->rule_end[rule] = id + 1;
    for (int c = 0; c < n_classes; ++c) {
      const int32_t t = raw.transitions[static_cast<size_t>(s) * n_classes + c];
      if (t >= 0 && new_id[t] >= 0)
        out->transitions[static_cast<size_t>(id) * n_classes + c] = new_id[t];
    }
    for (const RuleEdge& e : raw.rule_edges[s]) {
      if (!productive[e.rule] || new_id[e.target] < 0) continue;
      out->rule_edges.push_back({e.rule, new_id[e.target]});
    }
    out->rule_edge_begin[id + 1] = static_cast<uint32_t>(out->rule_edges.size());
  }
  out->root_rule = root;
  return Status::Ok();
}

void Analyse(Automaton* a) {
  const int32_t n = a->n_states();
  const int32_t n_rules = static_cast<int32_t>(a->rule_start.size());

  a->next_bytes.assign(n, ByteSet{});
  for (int32_t s = 0; s < n; ++s) {
    for (int b = 0; b < 256; ++b) {
      if (a->Next(s, static_cast<uint8_t>(b)) >= 0) a->next_bytes[s].Set(static_cast<uint8_t>(b));
    }
  }
  a->rule_regular.assign(n_rules, 1);
  for (int32_t s = 0; s < n; ++s) {
    if (!a->RuleEdges(s).empty()) a->rule_regular[a->state_rule[s]] = 0;
  }

  // Nullable: the start reaches an end through references to nullable rules only.
  a->rule_nullable.assign(n_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n_rules; ++r) {
      if (a->rule_start[r] < 0 || a->rule_nullable[r]) continue;
      std::vector<int32_t> stack = {a->rule_start[r]};
      std::vector<uint8_t> seen(a->rule_end[r] - a->rule_start[r], 0);
      while (!stack.empty() && !a->rule_nullable[r]) {
        const int32_t s = stack.back();
        stack.pop_back();
        if (seen[s - a->rule_start[r]]) continue;
        seen[s - a->rule_start[r]] = 1;
        if (a->state_final[s]) {
          a->rule_nullable[r] = 1;
          changed = true;
        }
        for (const RuleEdge& e : a->RuleEdges(s)) {
          if (a->rule_nullable[e.rule]) stack.push_back(e.target);
        }
      }
    }
  }

  // Prediction closure of each rule: its start, the starts it predicts in turn, and the states
  // reached over nullable references — all with origin "here".
  a->prediction_begin.assign(n_rules + 1, 0);
  a->prediction_states.clear();
  std::vector<uint32_t> stamp(n, UINT32_MAX);
  for (int32_t r = 0; r < n_rules; ++r) {
    a->prediction_begin[r] = static_cast<uint32_t>(a->prediction_states.size());
    if (a->rule_start[r] >= 0) {
      const size_t begin = a->prediction_states.size();
      auto add = [&](int32_t s) {
        if (stamp[s] != static_cast<uint32_t>(r)) {
          stamp[s] = static_cast<uint32_t>(r);
          a->prediction_states.push_back(s);
        }
      };
      add(a->rule_start[r]);
      for (size_t i = begin; i < a->prediction_states.size(); ++i) {
        const int32_t s = a->prediction_states[i];
        for (const RuleEdge& e : a->RuleEdges(s)) {
          add(a->rule_start[e.rule]);
          if (a->rule_nullable[e.rule]) add(e.target);
        }
      }
    }
  }
  a->prediction_begin[n_rules] = static_cast<uint32_t>(a->prediction_states.size());

  // FIRST of each state and whether it can end its rule without consuming a byte.
  std::vector<ByteSet> first = a->next_bytes;
  std::vector<uint8_t> ends_empty(a->state_final.begin(), a->state_final.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = n - 1; s >= 0; --s) {
      for (const RuleEdge& e : a->RuleEdges(s)) {
        changed |= first[s].Merge(first[a->rule_start[e.rule]]);
        if (a->rule_nullable[e.rule]) {
          changed |= first[s].Merge(first[e.target]);
          if (ends_empty[e.target] && !ends_empty[s]) {
            ends_empty[s] = 1;
            changed = true;
          }
        }
      }
    }
  }
  // FOLLOW of each rule: what comes after a reference to it, and after its caller when the
  // reference can end the caller.
  a->follow.assign(n_rules, ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      const int32_t caller = a->state_rule[s];
      for (const RuleEdge& e : a->RuleEdges(s)) {
        changed |= a->follow[e.rule].Merge(first[e.target]);
        if (ends_empty[e.target]) changed |= a->follow[e.rule].Merge(a->follow[caller]);
      }
    }
  }
}

}  // namespace

Result<Automaton> BuildAutomaton(const Grammar& grammar, const AutomatonLimits& limits) {
  const int32_t n_rules = static_cast<int32_t>(grammar.rules().size());
  if (grammar.root() < 0 || grammar.root() >= n_rules) {
    return InvalidArgument("the grammar has no root rule");
  }
  KASSIGN(std::vector<uint8_t> reachable, ReachableRules(grammar));

  Automaton a;
  std::array<bool, 257> boundary{};
  boundary[0] = true;
  for (int32_t r = 0; r < n_rules; ++r) {
    if (reachable[r]) CollectByteBoundaries(grammar.rule(r).body, &boundary);
  }
  int32_t c = -1;
  for (int b = 0; b < 256; ++b) {
    if (boundary[b]) ++c;
    a.byte_class[b] = static_cast<uint8_t>(c);
  }
  a.n_classes = c + 1;

  RawAutomaton raw;
  raw.rule_start.assign(n_rules, -1);
  Nfa nfa(limits.max_nfa_states);
  int64_t n_total = 0;
  for (int32_t r = 0; r < n_rules; ++r) {
    if (!reachable[r]) continue;
    nfa.Clear();
    KASSIGN(Fragment f, BuildFragment(grammar.rule(r).body, &nfa));
    SubsetBuilder builder(nfa, a.n_classes, a.byte_class);
    KASSIGN(RuleDfa dfa, builder.Build(f.start, f.end, limits.max_dfa_states - n_total));
    const int32_t offset = static_cast<int32_t>(raw.state_rule.size());
    const int32_t n_dfa = static_cast<int32_t>(dfa.final.size());
    n_total += n_dfa;
    raw.rule_start[r] = offset;
    for (int32_t s = 0; s < n_dfa; ++s) {
      raw.state_rule.push_back(r);
      raw.final.push_back(dfa.final[s]);
      std::vector<RuleEdge> edges = dfa.rule_edges[s];
      for (RuleEdge& e : edges) e.target += offset;
      raw.rule_edges.push_back(std::move(edges));
    }
    for (int32_t t : dfa.transitions) raw.transitions.push_back(t < 0 ? -1 : t + offset);
  }
  nfa.Clear();
  KTRY(TrimInto(raw, n_rules, grammar.root(), &a));
  Analyse(&a);
  return a;
}

}  // namespace kestrel::grammar
