// CompiledGrammar::Compile: automaton, then (with a vocabulary) the token mask cache.
#include "grammar/compiled_grammar.h"

#include <chrono>

namespace kestrel::grammar {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab,
    const CompileOptions& options) {
  auto compiled = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  auto start = std::chrono::steady_clock::now();
  KASSIGN(compiled->automaton_, BuildAutomaton(grammar, options.limits));
  compiled->stats_.automaton_ms = MillisecondsSince(start);
  compiled->stats_.n_states = compiled->automaton_.n_states();
  compiled->vocab_ = std::move(vocab);
  if (compiled->vocab_ != nullptr) {
    start = std::chrono::steady_clock::now();
    compiled->masks_ = TokenMaskCache::Build(compiled->automaton_, *compiled->vocab_, options.pool);
    compiled->stats_.masks_ms = MillisecondsSince(start);
    compiled->stats_.n_mask_entries = compiled->masks_.n_entries();
    for (int32_t i = 0; i < compiled->masks_.n_entries(); ++i) {
      compiled->stats_.n_uncertain +=
          static_cast<int64_t>(compiled->masks_.entry(i).uncertain.size());
    }
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

}  // namespace kestrel::grammar
