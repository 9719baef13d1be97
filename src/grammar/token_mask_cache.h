// Precomputed token masks per grammar position, in the spirit of XGrammar's adaptive token mask.
//
// At run time the matcher's last Earley set holds "kernel" items: items whose rule was entered in
// an earlier set (or the bottom item). Every way a token can continue the parse starts inside one
// kernel item's rule, and runs in that rule (and the rules it calls) until either the token ends —
// then the token is accepted whatever the caller is — or the kernel rule ends first and the caller,
// unknown here, must take the rest. So for each state s and each text token, looking at s's rule
// alone classifies the token as
//   accepted   the rule alone consumes all of it: allowed in every context;
//   rejected   it dies inside the rule before the rule could end at a byte k >= 1 followed by a
//              byte in FOLLOW(rule): never allowed (an end at k = 0 is covered by the caller's own
//              kernel item, which is in the same set);
//   uncertain  otherwise: the matcher checks it against the full chart at run time.
// The classification walks the vocabulary trie depth-first from s (an Earley chart started at s,
// or a plain DFA walk for rules without references), pruning a subtree at the first byte that
// kills the parse.
//
// States share one entry when they behave alike for as many bytes as the longest token (bounded
// Moore refinement over the automaton), so a string with maxLength 1000 costs about as many entries
// as the longest token has bytes, not one per character position.
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/vocabulary.h"

namespace kestrel {
class ThreadPool;
}

namespace kestrel::grammar {

// One entry: the classification of every text token from one state. Accepted tokens are stored
// in whichever form is smallest.
struct StateMask {
  enum class Form : uint8_t {
    kAcceptedList,  // `tokens` holds the accepted ids
    kRejectedList,  // `tokens` holds the rejected ids: all other non-uncertain text tokens pass
    kBitmask,       // `bits` is the bitmask of accepted ids
  };
  Form form = Form::kAcceptedList;
  std::vector<int32_t> tokens;     // ids, ascending
  std::vector<uint32_t> bits;      // [bitmask_words] for kBitmask
  std::vector<int32_t> uncertain;  // vocabulary positions (ascending) to check at run time
};

class TokenMaskCache {
 public:
  // pool: optional; the entries are computed on its threads.
  static TokenMaskCache Build(const Automaton& automaton, const Vocabulary& vocab,
                              ThreadPool* pool = nullptr);

  // Entry of a state that can be a kernel item; -1 for the others.
  int32_t entry_of(int32_t state) const { return entry_of_state_[state]; }
  const StateMask& entry(int32_t i) const { return entries_[i]; }
  int32_t n_entries() const { return static_cast<int32_t>(entries_.size()); }

 private:
  std::vector<int32_t> entry_of_state_;  // [n_states]
  std::vector<StateMask> entries_;
};

}  // namespace kestrel::grammar
