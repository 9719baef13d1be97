// An Earley chart over bytes for an Automaton: one item set per byte consumed.
//
// An item is (state, origin): a position inside one rule's DFA and the set where that rule was
// entered. The chart starts from one "bottom" item whose origin is kBottom; when the bottom item's
// rule can end, the set is marked BottomCompleted(). The matcher starts from the root rule's start
// (bottom completed = the grammar may terminate); the token-mask precomputation starts from any
// state to see what that rule alone accepts (bottom completed = control returns to the unknown
// caller).
//
// Prediction uses precomputed closures and Aycock–Horspool's nullable shortcut, so items whose
// origin is the current set never need processing of their own. Sets are never rewritten:
// Truncate() drops sets from the end, which is how the matcher rolls back tokens and how the mask
// search backtracks in the vocabulary trie.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grammar/automaton.h"

namespace kestrel::grammar {

struct EarleyItem {
  int32_t state;
  int32_t origin;  // set index where the item's rule was entered, or kBottom
};

class EarleyChart {
 public:
  static constexpr int32_t kBottom = -1;

  explicit EarleyChart(const Automaton* automaton) : a_(automaton) {}

  // Clears the chart and opens set 0 with the bottom item (state, kBottom) and its closure.
  void Start(int32_t state);
  // Scans `byte` from the last set. Returns true and appends the new set, or returns false and
  // leaves the chart as it was when no item can scan the byte.
  bool Advance(uint8_t byte);
  // Keeps the first n_sets sets (n_sets >= 1).
  void Truncate(size_t n_sets);

  size_t n_sets() const { return set_begin_.size(); }
  bool BottomCompleted() const { return bottom_completed_.back() != 0; }
  std::span<const EarleyItem> LastSet() const {
    return {items_.data() + set_begin_.back(), items_.data() + items_.size()};
  }
  int32_t last_set_index() const { return static_cast<int32_t>(set_begin_.size()) - 1; }
  // Bytes some item of the last set can scan.
  ByteSet NextBytes() const;

 private:
  void Add(int32_t state, int32_t origin);
  void Close(size_t begin, int32_t current);

  const Automaton* a_;
  std::vector<EarleyItem> items_;  // all sets, back to back
  // De-duplication without scanning the set: per item, the index of the previous item with the
  // same state (-1: none); per state, the index of its latest item.
  std::vector<int32_t> same_state_before_;
  std::vector<int32_t> latest_with_state_;  // [n_states]
  std::vector<uint32_t> set_begin_;         // [n_sets] first item of each set
  std::vector<uint8_t> bottom_completed_;   // [n_sets]
  size_t current_begin_ = 0;  // first item of the set being built (for de-duplication)
};

}  // namespace kestrel::grammar
