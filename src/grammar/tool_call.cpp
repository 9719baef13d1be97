// Tool-call grammars (see tool_call.h): the call object as one JSON schema (anyOf over the tools,
// each with its name as a const), wrapped in the syntax's literals by a new root rule.
#include "grammar/tool_call.h"

#include <utility>
#include <vector>

namespace kestrel::grammar {

Result<Grammar> ToolCallGrammar(ToolCallSyntax syntax, std::span<const ToolSpec> tools,
                                bool parallel, const JsonSchemaOptions& options) {
  if (tools.empty()) return InvalidArgument("a forced tool call needs at least one tool");
  const char* args_key = syntax == ToolCallSyntax::kHermes ? "arguments" : "parameters";
  nlohmann::ordered_json alternatives = nlohmann::ordered_json::array();
  for (const ToolSpec& t : tools) {
    nlohmann::ordered_json params = t.parameters;
    if (params.is_null() || (params.is_object() && params.empty())) {
      params = nlohmann::ordered_json{{"type", "object"}, {"additionalProperties", true}};
    }
    nlohmann::ordered_json call = {{"type", "object"}};
    call["properties"] = nlohmann::ordered_json::object();
    call["properties"]["name"] = {{"const", t.name}};
    call["properties"][args_key] = params;
    call["required"] = {"name", args_key};
    call["additionalProperties"] = false;
    // Each tool's schema alone first, so an error names the tool.
    Result<Grammar> alone = JsonSchemaValueToGrammar(call, options);
    if (!alone.ok()) {
      return Status(alone.status().code(),
                    "tool '" + t.name + "' parameters: " + alone.status().message());
    }
    alternatives.push_back(std::move(call));
  }
  const nlohmann::ordered_json schema =
      alternatives.size() == 1 ? alternatives[0] : nlohmann::ordered_json{{"anyOf", alternatives}};
  KASSIGN(Grammar g, JsonSchemaValueToGrammar(schema, options));
  const int32_t call = g.root();
  Expr root;
  if (syntax == ToolCallSyntax::kHermes) {
    const Expr block = Expr::Sequence(
        {Expr::Literal("<tool_call>\n"), Expr::Ref(call), Expr::Literal("\n</tool_call>")});
    // At most kMaxParallelToolCalls calls: a weak model must not loop on calls until max_tokens.
    const Expr more =
        Expr::Repeat(Expr::Sequence({Expr::Literal("\n"), block}), 0, kMaxParallelToolCalls - 1);
    root = parallel ? Expr::Sequence({block, more}) : block;
  } else {
    root = Expr::Ref(call);
  }
  g.set_root(g.AddRule("tool_calls", std::move(root)));
  return g;
}

}  // namespace kestrel::grammar
