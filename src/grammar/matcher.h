// GrammarMatcher: the per-sequence state of constrained decoding over one CompiledGrammar.
//
//   matcher.FillNextTokenBitmask(bitmask)  // before sampling: which tokens may come next
//   matcher.AcceptToken(sampled)           // after sampling
//   matcher.Rollback(n)                    // speculative decoding: undo the last n steps
//
// A step is one AcceptToken or one AcceptBytes call; every step can be rolled back. The matcher
// consumes bytes, so a token that ends inside a multi-byte UTF-8 character leaves the parse inside
// that character and the next token must complete it. Not thread-safe (one per sequence); the
// CompiledGrammar it shares is.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/earley.h"

namespace kestrel::grammar {

struct MaskResult {
  // No token is allowed: the grammar cannot continue with this vocabulary and cannot end (or has
  // ended: see IsTerminated). The bitmask is all zero; the caller must finish the sequence.
  bool dead_end = false;
  int32_t n_checked = 0;  // tokens the mask cache left uncertain, checked against the parse
};

class GrammarMatcher {
 public:
  // stop_token_ids end generation: they are allowed, and accepted, only where the grammar may end.
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                          std::vector<int32_t> stop_token_ids = {});

  // False (state unchanged) when the token cannot come next.
  bool AcceptToken(int32_t token_id);
  // False (state unchanged) unless every byte can come next. Counts as one step.
  bool AcceptBytes(std::string_view bytes);

  // bitmask: at least vocab->bitmask_words() words; bit (id % 32) of word id / 32 is set when
  // token id may come next. Words past the vocabulary (a model's padded vocab) are zeroed.
  MaskResult FillNextTokenBitmask(std::span<uint32_t> bitmask);

  // The bytes so far form a complete match: a stop token may come next.
  bool CanTerminate() const;
  // A stop token has been accepted; nothing more is.
  bool IsTerminated() const;

  // Undoes the last n steps (n <= n_steps()).
  void Rollback(int32_t n);
  void Reset();
  int32_t n_steps() const { return static_cast<int32_t>(steps_.size()); }

  // The longest byte string every continuation starts with (empty where the grammar may end or
  // where two bytes are possible). E.g. `{"name": "` right after the start of an object whose
  // first key is fixed. May end inside a UTF-8 character.
  std::string ForcedBytes() const;

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  bool IsStopToken(int32_t id) const;
  // Advances the chart over bytes; on failure restores it and returns false.
  bool AdvanceAll(std::string_view bytes);
  void CheckUncertain(const std::vector<int32_t>& positions, std::span<uint32_t> bitmask,
                      MaskResult* result);

  struct Step {
    uint32_t n_sets;  // chart sets after the step
    bool stop;        // the step accepted a stop token
  };

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> stop_tokens_;
  // Mutable: ForcedBytes() extends the chart and truncates it back.
  mutable EarleyChart chart_;
  std::vector<Step> steps_;

  // Scratch of FillNextTokenBitmask, kept to avoid allocation per call.
  std::vector<int32_t> entries_;
  std::vector<int32_t> uncertain_;
  std::vector<uint32_t> scratch_bits_;
  std::vector<int32_t> path_;
  std::vector<int32_t> chain_;
};

}  // namespace kestrel::grammar
