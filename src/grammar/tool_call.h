// Grammars that force a tool call (`tool_choice: "required"` or a named function) in the syntax
// the model's chat template uses, with arguments that validate against each tool's JSON schema:
//   kHermes      <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
//                (Qwen2.5 / Qwen3 / Hermes templates); with parallel calls, up to
//                kMaxParallelToolCalls blocks, each after "\n"
//   kLlama3Json  {"name": "NAME", "parameters": {...}}   (Llama 3.x JSON tool calls; one call)
//   kXml         <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
//                </function>\n</tool_call>   (Qwen3-Coder / Qwen3.5): the schema's properties in
//                declared order, required ones always, optional ones at most once; a string
//                VALUE is any text without "</" or "<<" (so a value cannot hold a closing tag;
//                minLength / maxLength bound its characters), any other
//                VALUE is JSON that validates against the property's schema
// The call object's keys come in that order; `arguments` / `parameters` is the tool's
// `parameters` schema (an object; an empty schema admits any object), under the same JSON Schema
// subset and whitespace policy as response_format (front_ends.h).
#pragma once

#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/front_ends.h"
#include "grammar/grammar.h"

namespace kestrel::grammar {

enum class ToolCallSyntax { kHermes, kLlama3Json, kXml };

// Calls one forced answer may hold with parallel tool calls.
inline constexpr uint32_t kMaxParallelToolCalls = 8;

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // JSON schema; null or {} for any object
};

// tools: the functions the call may name (one for a named tool_choice). parallel: more than one
// call may follow (kHermes only). Errors: an empty tool list, or a parameters schema outside the
// supported subset (InvalidArgument / Unsupported naming the tool).
Result<Grammar> ToolCallGrammar(ToolCallSyntax syntax, std::span<const ToolSpec> tools,
                                bool parallel, const JsonSchemaOptions& options = {});

}  // namespace kestrel::grammar
