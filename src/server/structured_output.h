// Structured output in the API (docs/structured-output.md, docs/server.md): which grammar a
// request's output must follow, from
//   response_format         {"type": "text" | "json_object" | "json_schema",
//                            "json_schema": {"name", "schema", "strict"}}      (OpenAI)
//   structured_outputs      {"json": schema | "regex": str | "choice": [str] | "grammar": GBNF
//                            | "json_object": true}                           (vLLM's names)
//   tool_choice             "required" / a named function: a tool call in the model's syntax
//                           with schema-valid arguments (grammar/tool_call.h)
// compiled once per distinct request (an LRU of compiled grammars) over the served tokenizer's
// vocabulary, and handed to the engine (EngineRequest::grammar).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/vocabulary.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/parsers/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::server {

// Reads response_format and structured_outputs from a chat or completion body. Two constraints
// at once, or a malformed one, is a 400 naming the field.
std::optional<ApiError> ParseOutputConstraint(const Json& body, OutputConstraint* out);

// Compiled grammars by their source, least recently used evicted past `capacity`. The token trie
// of the tokenizer's vocabulary is built at the first grammar (tens of milliseconds at 150k
// tokens), not at start-up.
class GrammarCache {
 public:
  explicit GrammarCache(const Tokenizer* tokenizer, size_t capacity = 64);

  // The grammar for a response_format / structured_outputs constraint (nullptr for kNone), or a
  // 400 naming what the schema, regex or grammar gets wrong.
  std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> ForConstraint(
      const OutputConstraint& c);
  // A forced tool call (tool_choice required / named) over `tools` in the model's syntax; nullptr
  // when the syntax has no tool-call grammar (docs/server.md says which).
  std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> ForToolChoice(
      ToolCallFormat format, const Json& tools, const ToolChoice& choice, bool parallel);

  size_t size() const;

 private:
  using Build = std::function<Result<grammar::Grammar>()>;
  Result<std::shared_ptr<const grammar::CompiledGrammar>> Get(const std::string& key,
                                                              const Build& build);

  const grammar::Vocabulary* vocabulary();  // null without a tokenizer

  const Tokenizer* tokenizer_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const grammar::Vocabulary> vocabulary_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace kestrel::server
