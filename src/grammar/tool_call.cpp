// Tool-call grammars (see tool_call.h): the call object as one JSON schema (anyOf over the tools,
// each with its name as a const), wrapped in the syntax's literals by a new root rule.
#include "grammar/tool_call.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kestrel::grammar {

namespace {

// One XML call: <function=NAME>\n then each parameter in declared order.
Result<Expr> XmlCall(const ToolSpec& t, const JsonSchemaOptions& options, Grammar* g) {
  std::vector<Expr> parts = {Expr::Literal("<function=" + t.name + ">\n")};
  const nlohmann::ordered_json& schema = t.parameters;
  if (schema.is_object() && schema.contains("properties")) {
    const nlohmann::ordered_json& props = schema["properties"];
    if (!props.is_object()) return InvalidArgument("'properties' must be an object");
    std::vector<std::string> required;
    if (schema.contains("required") && schema["required"].is_array()) {
      for (const auto& r : schema["required"]) {
        if (r.is_string()) required.push_back(r.get<std::string>());
      }
    }
    // A string value: any text without "</" (a character other than '<', or '<' not before '/').
    const Expr text_char = Expr::Choice(
        {Expr::Class(CodepointSet::Single('<').Complement()),
         Expr::Sequence({Expr::Char('<'),
                         Expr::Class(CodepointSet::Of({{'/', '/'}, {'<', '<'}}).Complement())})});
    for (const auto& [name, prop] : props.items()) {
      Expr value;
      const bool is_string = prop.is_object() && prop.value("type", "") == "string" &&
                             !prop.contains("enum") && !prop.contains("const");
      if (is_string) {
        // minLength / maxLength bound the characters (a '<' and the one after it count once).
        const uint32_t lo = prop.contains("minLength") && prop["minLength"].is_number_unsigned()
                                ? prop["minLength"].get<uint32_t>()
                                : 0;
        const uint32_t hi = prop.contains("maxLength") && prop["maxLength"].is_number_unsigned()
                                ? std::min(prop["maxLength"].get<uint32_t>(), kMaxRepeatCount)
                                : kUnbounded;
        if (hi < lo) return InvalidArgument("'" + name + "': maxLength below minLength");
        value = Expr::Repeat(text_char, std::min(lo, kMaxRepeatCount), hi);
      } else {
        KASSIGN(Grammar v, JsonSchemaValueToGrammar(prop, options));
        value = Expr::Ref(g->Import(v));
      }
      Expr param = Expr::Sequence({Expr::Literal("<parameter=" + name + ">\n"), std::move(value),
                                   Expr::Literal("\n</parameter>\n")});
      const bool req = std::find(required.begin(), required.end(), name) != required.end();
      parts.push_back(req ? std::move(param) : Expr::Optional(std::move(param)));
    }
  }
  parts.push_back(Expr::Literal("</function>"));
  return Expr::Sequence(std::move(parts));
}

// <tool_call>\nCALL\n</tool_call>, and with parallel calls up to kMaxParallelToolCalls of them,
// each after "\n" (a bound: a weak model must not loop on calls until max_tokens).
Expr ToolCallBlocks(int32_t call, bool parallel) {
  const Expr block = Expr::Sequence(
      {Expr::Literal("<tool_call>\n"), Expr::Ref(call), Expr::Literal("\n</tool_call>")});
  if (!parallel) return block;
  const Expr more =
      Expr::Repeat(Expr::Sequence({Expr::Literal("\n"), block}), 0, kMaxParallelToolCalls - 1);
  return Expr::Sequence({block, more});
}

}  // namespace

Result<Grammar> ToolCallGrammar(ToolCallSyntax syntax, std::span<const ToolSpec> tools,
                                bool parallel, const JsonSchemaOptions& options) {
  if (tools.empty()) return InvalidArgument("a forced tool call needs at least one tool");
  if (syntax == ToolCallSyntax::kXml) {
    Grammar g;
    std::vector<Expr> calls;
    for (const ToolSpec& t : tools) {
      Result<Expr> call = XmlCall(t, options, &g);
      if (!call.ok()) {
        return Status(call.status().code(),
                      "tool '" + t.name + "' parameters: " + call.status().message());
      }
      calls.push_back(std::move(*call));
    }
    const int32_t call = g.AddRule("xml_call", Expr::Choice(std::move(calls)));
    g.set_root(g.AddRule("tool_calls", ToolCallBlocks(call, parallel)));
    return g;
  }
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
    root = ToolCallBlocks(call, parallel);
  } else {
    root = Expr::Ref(call);
  }
  g.set_root(g.AddRule("tool_calls", std::move(root)));
  return g;
}

}  // namespace kestrel::grammar
