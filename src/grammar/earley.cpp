// Earley chart: scan, predict (precomputed closures, nullable shortcut) and complete.
#include "grammar/earley.h"

#include "core/check.h"

namespace kestrel::grammar {

void EarleyChart::Start(int32_t state) {
  items_.clear();
  same_state_before_.clear();
  latest_with_state_.assign(a_->n_states(), -1);
  set_begin_.assign(1, 0);
  bottom_completed_.assign(1, 0);
  current_begin_ = 0;
  Add(state, kBottom);
  Close(0, 0);
}

bool EarleyChart::Advance(uint8_t byte) {
  const size_t prev_begin = set_begin_.back();
  const size_t prev_end = items_.size();
  const int32_t current = static_cast<int32_t>(set_begin_.size());
  current_begin_ = prev_end;
  for (size_t i = prev_begin; i < prev_end; ++i) {
    const int32_t t = a_->Next(items_[i].state, byte);
    if (t >= 0) Add(t, items_[i].origin);
  }
  if (items_.size() == prev_end) return false;
  set_begin_.push_back(static_cast<uint32_t>(prev_end));
  bottom_completed_.push_back(0);
  Close(prev_end, current);
  return true;
}

void EarleyChart::Truncate(size_t n_sets) {
  KCHECK(n_sets >= 1 && n_sets <= set_begin_.size());
  if (n_sets == set_begin_.size()) return;
  items_.resize(set_begin_[n_sets]);
  same_state_before_.resize(set_begin_[n_sets]);
  set_begin_.resize(n_sets);
  bottom_completed_.resize(n_sets);
}

ByteSet EarleyChart::NextBytes() const {
  ByteSet bytes;
  for (const EarleyItem& item : LastSet()) bytes.Merge(a_->next_bytes[item.state]);
  return bytes;
}

void EarleyChart::Add(int32_t state, int32_t origin) {
  // Items of the set being built with this state form a chain through same_state_before_; a link
  // that leaves the set, or that truncation made stale (another state there now), ends it.
  const int64_t begin = static_cast<int64_t>(current_begin_);
  for (int64_t i = latest_with_state_[state];
       i >= begin && i < static_cast<int64_t>(items_.size()) && items_[i].state == state;
       i = same_state_before_[i]) {
    if (items_[i].origin == origin) return;
  }
  // A latest index at or past the end was truncated away: not a link (links must point back).
  const int32_t latest = latest_with_state_[state];
  same_state_before_.push_back(latest < static_cast<int32_t>(items_.size()) ? latest : -1);
  latest_with_state_[state] = static_cast<int32_t>(items_.size());
  items_.push_back({state, origin});
}

void EarleyChart::Close(size_t begin, int32_t current) {
  current_begin_ = begin;
  for (size_t i = begin; i < items_.size(); ++i) {
    const EarleyItem item = items_[i];
    // Items entered here come from a prediction closure, which already holds everything they
    // predict; they can only complete a nullable rule, handled where the rule was predicted.
    if (item.origin == current) continue;
    for (const RuleEdge& e : a_->RuleEdges(item.state)) {
      for (int32_t p : a_->Prediction(e.rule)) Add(p, current);
      if (a_->rule_nullable[e.rule]) Add(e.target, item.origin);
    }
    if (!a_->state_final[item.state]) continue;
    if (item.origin == kBottom) {
      bottom_completed_[current] = 1;
      continue;
    }
    // Complete: advance every item of the origin set that waits for this rule.
    const int32_t rule = a_->state_rule[item.state];
    const size_t origin_end = static_cast<size_t>(item.origin) + 1 < set_begin_.size()
                                  ? set_begin_[item.origin + 1]
                                  : items_.size();
    for (size_t j = set_begin_[item.origin]; j < origin_end; ++j) {
      const EarleyItem parent = items_[j];
      for (const RuleEdge& e : a_->RuleEdges(parent.state)) {
        if (e.rule == rule) Add(e.target, parent.origin);
      }
    }
  }
}

}  // namespace kestrel::grammar
