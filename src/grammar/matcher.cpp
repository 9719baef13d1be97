// GrammarMatcher: steps over the Earley chart, token masks from the cache plus run-time checks.
#include "grammar/matcher.h"

#include <algorithm>

#include "core/check.h"

namespace kestrel::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                               std::vector<int32_t> stop_token_ids)
    : grammar_(std::move(grammar)),
      stop_tokens_(std::move(stop_token_ids)),
      chart_(&grammar_->automaton()) {
  Reset();
}

void GrammarMatcher::Reset() {
  const Automaton& a = grammar_->automaton();
  chart_.Start(a.rule_start[a.root_rule]);
  steps_.clear();
}

bool GrammarMatcher::IsStopToken(int32_t id) const {
  return std::find(stop_tokens_.begin(), stop_tokens_.end(), id) != stop_tokens_.end();
}

bool GrammarMatcher::CanTerminate() const {
  return !IsTerminated() && chart_.BottomCompleted();
}

bool GrammarMatcher::IsTerminated() const {
  return !steps_.empty() && steps_.back().stop;
}

bool GrammarMatcher::AdvanceAll(std::string_view bytes) {
  const size_t base = chart_.n_sets();
  for (char c : bytes) {
    if (!chart_.Advance(static_cast<uint8_t>(c))) {
      chart_.Truncate(base);
      return false;
    }
  }
  return true;
}

bool GrammarMatcher::AcceptToken(int32_t token_id) {
  if (IsTerminated()) return false;
  if (IsStopToken(token_id)) {
    if (!chart_.BottomCompleted()) return false;
    steps_.push_back({static_cast<uint32_t>(chart_.n_sets()), true});
    return true;
  }
  const Vocabulary* vocab = grammar_->vocab();
  KCHECK_MSG(vocab != nullptr, "AcceptToken needs a grammar compiled with a vocabulary");
  if (token_id < 0 || token_id >= vocab->vocab_size() || !vocab->is_text(token_id)) return false;
  if (!AdvanceAll(vocab->token_bytes(token_id))) return false;
  steps_.push_back({static_cast<uint32_t>(chart_.n_sets()), false});
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (IsTerminated()) return false;
  if (!AdvanceAll(bytes)) return false;
  steps_.push_back({static_cast<uint32_t>(chart_.n_sets()), false});
  return true;
}

void GrammarMatcher::Rollback(int32_t n) {
  KCHECK(n >= 0 && n <= n_steps());
  steps_.resize(steps_.size() - n);
  chart_.Truncate(steps_.empty() ? 1 : steps_.back().n_sets);
}

std::string GrammarMatcher::ForcedBytes() const {
  std::string out;
  if (IsTerminated()) return out;
  constexpr size_t kMaxForcedBytes = 1 << 16;
  const size_t base = chart_.n_sets();
  while (out.size() < kMaxForcedBytes && !chart_.BottomCompleted()) {
    const ByteSet next = chart_.NextBytes();
    if (next.Count() != 1) break;
    int byte = 0;
    while (!next.Has(static_cast<uint8_t>(byte))) ++byte;
    const bool advanced = chart_.Advance(static_cast<uint8_t>(byte));
    KCHECK(advanced);
    out += static_cast<char>(byte);
  }
  chart_.Truncate(base);
  return out;
}

MaskResult GrammarMatcher::FillNextTokenBitmask(std::span<uint32_t> bitmask) {
  const Vocabulary* vocab = grammar_->vocab();
  KCHECK_MSG(vocab != nullptr, "token masks need a grammar compiled with a vocabulary");
  const size_t n_words = vocab->bitmask_words();
  KCHECK(bitmask.size() >= n_words);
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  MaskResult result;
  if (IsTerminated()) {
    result.dead_end = true;
    return result;
  }

  // Entries of the kernel items (entered before this set, or the bottom item).
  const TokenMaskCache& cache = grammar_->masks();
  const int32_t current = chart_.last_set_index();
  entries_.clear();
  for (const EarleyItem& item : chart_.LastSet()) {
    if (item.origin == current) continue;
    const int32_t e = cache.entry_of(item.state);
    KCHECK(e >= 0);
    if (std::find(entries_.begin(), entries_.end(), e) == entries_.end()) entries_.push_back(e);
  }

  // Accepted tokens of every entry. A rejected-list entry allows every text token that it neither
  // rejects nor leaves uncertain (the uncertain ones are decided below).
  const std::vector<uint32_t>& text_mask = vocab->text_mask();
  for (int32_t e : entries_) {
    const StateMask& m = cache.entry(e);
    switch (m.form) {
      case StateMask::Form::kAcceptedList:
        for (int32_t id : m.tokens) bitmask[id >> 5] |= uint32_t{1} << (id & 31);
        break;
      case StateMask::Form::kBitmask:
        for (size_t w = 0; w < n_words; ++w) bitmask[w] |= m.bits[w];
        break;
      case StateMask::Form::kRejectedList: {
        const bool alone = entries_.size() == 1;
        std::span<uint32_t> target = bitmask;
        if (!alone) {
          scratch_bits_.resize(n_words);
          target = scratch_bits_;
        }
        std::copy(text_mask.begin(), text_mask.end(), target.begin());
        for (int32_t id : m.tokens) target[id >> 5] &= ~(uint32_t{1} << (id & 31));
        for (int32_t p : m.uncertain) {
          const int32_t id = vocab->token_at(p);
          target[id >> 5] &= ~(uint32_t{1} << (id & 31));
        }
        if (!alone) {
          for (size_t w = 0; w < n_words; ++w) bitmask[w] |= scratch_bits_[w];
        }
        break;
      }
    }
  }

  // Uncertain tokens, in vocabulary order (one trie walk), unless another entry accepted them.
  if (entries_.size() == 1) {
    CheckUncertain(cache.entry(entries_[0]).uncertain, bitmask, &result);
  } else {
    uncertain_.clear();
    for (int32_t e : entries_) {
      const std::vector<int32_t>& u = cache.entry(e).uncertain;
      uncertain_.insert(uncertain_.end(), u.begin(), u.end());
    }
    std::sort(uncertain_.begin(), uncertain_.end());
    uncertain_.erase(std::unique(uncertain_.begin(), uncertain_.end()), uncertain_.end());
    CheckUncertain(uncertain_, bitmask, &result);
  }

  if (chart_.BottomCompleted()) {
    for (int32_t id : stop_tokens_) {
      if (id >= 0 && static_cast<size_t>(id >> 5) < bitmask.size()) {
        bitmask[id >> 5] |= uint32_t{1} << (id & 31);
      }
    }
  }
  result.dead_end = std::all_of(bitmask.begin(), bitmask.end(), [](uint32_t w) { return w == 0; });
  return result;
}

// Runs each uncertain token through the chart. Positions are in trie preorder, so the walk keeps
// the chart sets of the current trie path and only advances over the bytes below it; a byte that
// fails prunes every later token under that node.
void GrammarMatcher::CheckUncertain(const std::vector<int32_t>& positions,
                                    std::span<uint32_t> bitmask, MaskResult* result) {
  const Vocabulary& v = *grammar_->vocab();
  const size_t base = chart_.n_sets();
  path_.clear();
  int32_t skip_below = -1;  // nodes < skip_below lie in a subtree that already failed
  for (int32_t p : positions) {
    const int32_t id = v.token_at(p);
    if ((bitmask[id >> 5] >> (id & 31)) & 1) continue;
    const int32_t node = v.node_at(p);
    if (node < skip_below) continue;
    ++result->n_checked;
    while (!path_.empty() && !(path_.back() <= node && node < v.subtree_end(path_.back()))) {
      path_.pop_back();
    }
    chart_.Truncate(base + path_.size());
    const int32_t top = path_.empty() ? 0 : path_.back();
    chain_.clear();
    for (int32_t x = node; x != top; x = v.node_parent(x)) chain_.push_back(x);
    bool alive = true;
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it) {
      if (!chart_.Advance(v.node_byte(*it))) {
        skip_below = v.subtree_end(*it);
        alive = false;
        break;
      }
      path_.push_back(*it);
    }
    if (alive) bitmask[id >> 5] |= uint32_t{1} << (id & 31);
  }
  chart_.Truncate(base);
}

}  // namespace kestrel::grammar
