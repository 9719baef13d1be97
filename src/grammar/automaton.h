// The compiled form of a Grammar that the Earley matcher runs: one DFA per rule over an alphabet of
// byte classes and rule references, all states numbered globally.
//
// Each rule's body is lowered to a Thompson NFA (code point classes become UTF-8 byte-range
// sequences, so the matcher only ever sees bytes and handles a character split across tokens like
// any other prefix), determinised by subset construction and trimmed: states that cannot reach the
// rule's end and references to rules that derive no string are removed, so every live Earley item
// can still be completed (a prefix the matcher accepts always extends to a full match).
//
// Analyses kept for the matcher and the token-mask precomputation:
//   nullable[rule]            the rule derives the empty string (Aycock–Horspool prediction)
//   prediction[rule]          states predicted (origin = here) when the rule is predicted
//   follow[rule]              bytes that can come right after the rule in any context
//   next_bytes[state]         bytes the state itself can scan (forced-byte detection)
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kestrel::grammar {

// 256-bit byte set.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  void Set(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  bool Has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  bool Merge(const ByteSet& o) {  // returns true when this grew
    bool grew = false;
    for (int i = 0; i < 4; ++i) {
      const uint64_t w = words[i] | o.words[i];
      grew |= w != words[i];
      words[i] = w;
    }
    return grew;
  }
  int Count() const;
  bool operator==(const ByteSet&) const = default;
};

// FNV-1a over a vector of ints: key hash for interning DFA state sets and state signatures.
struct IntVectorHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    size_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return h;
  }
};

struct RuleEdge {
  int32_t rule;
  int32_t target;
};

struct Automaton {
  // ---- alphabet ----
  int32_t n_classes = 0;
  std::array<uint8_t, 256> byte_class{};  // byte → class; classes are contiguous byte intervals

  // ---- states (global numbering; a rule's states are contiguous, its start first) ----
  std::vector<int32_t> state_rule;        // [n_states]
  std::vector<uint8_t> state_final;       // [n_states] the rule may end here
  std::vector<int32_t> transitions;       // [n_states * n_classes] target or -1
  std::vector<uint32_t> rule_edge_begin;  // [n_states + 1] into rule_edges
  std::vector<RuleEdge> rule_edges;       // outgoing rule references, by state
  std::vector<ByteSet> next_bytes;        // [n_states] bytes with a transition

  // ---- rules (indices of the source Grammar; unreachable rules have start -1) ----
  std::vector<int32_t> rule_start;         // [n_rules]
  std::vector<int32_t> rule_end;           // [n_rules] one past the rule's last state
  std::vector<uint8_t> rule_nullable;      // [n_rules]
  std::vector<uint8_t> rule_regular;       // [n_rules] no state has a rule edge
  std::vector<uint32_t> prediction_begin;  // [n_rules + 1] into prediction_states
  std::vector<int32_t> prediction_states;  // states added (origin = here) by predicting a rule
  std::vector<ByteSet> follow;             // [n_rules]
  int32_t root_rule = -1;

  int32_t n_states() const { return static_cast<int32_t>(state_rule.size()); }
  int32_t Next(int32_t state, uint8_t byte) const {
    return transitions[static_cast<size_t>(state) * n_classes + byte_class[byte]];
  }
  std::span<const RuleEdge> RuleEdges(int32_t state) const {
    return {rule_edges.data() + rule_edge_begin[state],
            rule_edges.data() + rule_edge_begin[state + 1]};
  }
  std::span<const int32_t> Prediction(int32_t rule) const {
    return {prediction_states.data() + prediction_begin[rule],
            prediction_states.data() + prediction_begin[rule + 1]};
  }
};

// Bounds on the work a grammar may cause (a request's schema must not exhaust the server).
struct AutomatonLimits {
  int64_t max_nfa_states = 1'000'000;  // per rule
  int64_t max_dfa_states = 100'000;    // all rules together
};

// Builds the automaton of the rules reachable from grammar.root(). Errors: no root, a grammar that
// matches no string, or one past the limits.
Result<Automaton> BuildAutomaton(const Grammar& grammar, const AutomatonLimits& limits = {});

}  // namespace kestrel::grammar
