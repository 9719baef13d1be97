// A Grammar compiled for one vocabulary: the automaton plus the per-state token mask cache.
// Immutable once built; share it (shared_ptr) between every GrammarMatcher that uses the same
// grammar, across threads.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/token_mask_cache.h"
#include "grammar/vocabulary.h"

namespace kestrel::grammar {

struct CompileStats {
  int32_t n_states = 0;        // automaton states
  int32_t n_mask_entries = 0;  // precomputed token-mask entries
  int64_t n_uncertain = 0;     // sum over entries of tokens left to run time
  double automaton_ms = 0;     // Grammar → Automaton
  double masks_ms = 0;         // token mask precomputation
};

struct CompileOptions {
  AutomatonLimits limits;
  // Computes the token mask cache on this pool's threads (optional). Not the engine's pool:
  // ThreadPool runs one ParallelFor at a time.
  ThreadPool* pool = nullptr;
};

class CompiledGrammar {
 public:
  // vocab may be null: the grammar can then match bytes (AcceptBytes) but not tokens or masks.
  static Result<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab,
      const CompileOptions& options = {});

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary* vocab() const { return vocab_.get(); }
  const TokenMaskCache& masks() const { return masks_; }
  const CompileStats& stats() const { return stats_; }

 private:
  CompiledGrammar() = default;

  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  TokenMaskCache masks_;
  CompileStats stats_;
};

}  // namespace kestrel::grammar
