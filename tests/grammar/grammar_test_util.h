// Helpers of the grammar tests: compile a grammar, match whole strings, small vocabularies, the
// real Qwen3 tokenizer (tests/data/npm/qwen3, fetched by scripts/setup.sh).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/front_ends.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::grammar::testing {

inline std::string SourcePath(const std::string& relative) {
  return std::string(KESTREL_SOURCE_DIR) + "/" + relative;
}

// Compiles without a vocabulary (byte matching only); fails the test on error.
inline std::shared_ptr<const CompiledGrammar> CompileOrDie(
    const Grammar& g, std::shared_ptr<const Vocabulary> vocab = nullptr) {
  auto compiled = CompiledGrammar::Compile(g, std::move(vocab));
  EXPECT_TRUE(compiled.ok()) << compiled.status().message() << "\n" << g.ToGbnf();
  return compiled.ok() ? *compiled : nullptr;
}

// The whole text is a match.
inline bool FullMatch(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanTerminate();
}

// The text is a prefix of some match.
inline bool PrefixMatch(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.AcceptBytes(text);
}

// Loads the real Qwen3 tokenizer once per test binary; nullptr (and a failure) when missing.
const Tokenizer* Qwen3Tokenizer();

}  // namespace kestrel::grammar::testing
