// Structured output in the API (see structured_output.h).
#include "server/structured_output.h"

#include <utility>

#include "grammar/front_ends.h"
#include "grammar/tool_call.h"

namespace kestrel::server {
namespace {

std::optional<ApiError> Conflict(const std::string& a, const std::string& b) {
  return BadRequest("Only one of " + a + " and " + b + " may constrain the output", b);
}

std::optional<ApiError> ParseResponseFormat(const Json& rf, OutputConstraint* out) {
  if (!rf.is_object()) return BadRequest("response_format must be an object", "response_format");
  const auto type = rf.find("type");
  if (type == rf.end() || !type->is_string()) {
    return BadRequest("response_format.type must be 'text', 'json_object' or 'json_schema'",
                      "response_format.type");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    out->kind = OutputConstraint::Kind::kJsonObject;
    out->param = "response_format";
    return std::nullopt;
  }
  if (t != "json_schema") {
    return BadRequest(
        "response_format.type must be 'text', 'json_object' or 'json_schema', not '" + t + "'",
        "response_format.type");
  }
  const auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object()) {
    return BadRequest("response_format.json_schema must be an object with a 'schema'",
                      "response_format.json_schema");
  }
  const auto schema = js->find("schema");
  if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
    return BadRequest("response_format.json_schema.schema must be a JSON schema object",
                      "response_format.json_schema.schema");
  }
  out->kind = OutputConstraint::Kind::kJsonSchema;
  out->text = schema->dump();
  out->param = "response_format.json_schema.schema";
  return std::nullopt;
}

std::optional<ApiError> ParseStructuredOutputs(const Json& so, OutputConstraint* out) {
  if (!so.is_object()) {
    return BadRequest("structured_outputs must be an object", "structured_outputs");
  }
  int n = 0;
  for (const auto& [key, value] : so.items()) {
    const std::string param = "structured_outputs." + key;
    if (key == "json") {
      if (!(value.is_object() || value.is_string())) {
        return BadRequest(param + " must be a JSON schema (object or string)", param);
      }
      out->kind = OutputConstraint::Kind::kJsonSchema;
      out->text = value.is_string() ? value.get<std::string>() : value.dump();
    } else if (key == "json_object") {
      if (!value.is_boolean()) return BadRequest(param + " must be true or false", param);
      if (!value.get<bool>()) continue;
      out->kind = OutputConstraint::Kind::kJsonObject;
    } else if (key == "regex" || key == "grammar") {
      if (!value.is_string()) return BadRequest(param + " must be a string", param);
      out->kind =
          key == "regex" ? OutputConstraint::Kind::kRegex : OutputConstraint::Kind::kGrammar;
      out->text = value.get<std::string>();
    } else if (key == "choice") {
      if (!value.is_array() || value.empty()) {
        return BadRequest(param + " must be a non-empty list of strings", param);
      }
      for (const Json& c : value) {
        if (!c.is_string()) return BadRequest(param + " must be a list of strings", param);
        out->choices.push_back(c.get<std::string>());
      }
      out->kind = OutputConstraint::Kind::kChoice;
    } else {
      return BadRequest(
          "Unknown field " + param + " (json, json_object, regex, choice, grammar are supported)",
          param);
    }
    out->param = param;
    ++n;
  }
  if (n > 1) {
    return BadRequest("structured_outputs takes one of json, json_object, regex, choice, grammar",
                      "structured_outputs");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseOutputConstraint(const Json& body, OutputConstraint* out) {
  *out = OutputConstraint{};
  if (!body.is_object()) return std::nullopt;
  const auto rf = body.find("response_format");
  if (rf != body.end() && !rf->is_null()) {
    if (auto e = ParseResponseFormat(*rf, out)) return e;
  }
  const auto so = body.find("structured_outputs");
  if (so != body.end() && !so->is_null()) {
    OutputConstraint other;
    if (auto e = ParseStructuredOutputs(*so, &other)) return e;
    if (other.kind != OutputConstraint::Kind::kNone) {
      if (out->kind != OutputConstraint::Kind::kNone) {
        return Conflict("response_format", "structured_outputs");
      }
      *out = std::move(other);
    }
  }
  return std::nullopt;
}

GrammarCache::GrammarCache(const Tokenizer* tokenizer, size_t capacity)
    : tokenizer_(tokenizer), capacity_(std::max<size_t>(capacity, 1)) {}

const grammar::Vocabulary* GrammarCache::vocabulary() {
  if (tokenizer_ == nullptr) return nullptr;
  std::call_once(vocabulary_once_,
                 [this] { vocabulary_ = grammar::Vocabulary::FromTokenizer(*tokenizer_); });
  return vocabulary_.get();
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

Result<std::shared_ptr<const grammar::CompiledGrammar>> GrammarCache::Get(const std::string& key,
                                                                          const Build& build) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock (tens of milliseconds for a large schema): requests with other
  // grammars are not held up; two identical first requests may both compile.
  KASSIGN(grammar::Grammar g, build());
  KASSIGN(std::shared_ptr<const grammar::CompiledGrammar> compiled,
          grammar::CompiledGrammar::Compile(g, vocabulary_));
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.find(key) == index_.end()) {
    lru_.emplace_front(key, compiled);
    index_[key] = lru_.begin();
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
  return compiled;
}

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> GrammarCache::ForConstraint(
    const OutputConstraint& c) {
  using Kind = OutputConstraint::Kind;
  if (c.kind == Kind::kNone) return std::shared_ptr<const grammar::CompiledGrammar>();
  if (vocabulary() == nullptr) {
    return BadRequest("Structured output needs the model's tokenizer", c.param);
  }
  std::string key;
  Build build;
  switch (c.kind) {
    case Kind::kJsonObject:
      key = "json_object";
      build = [] { return Result<grammar::Grammar>(grammar::JsonObjectGrammar()); };
      break;
    case Kind::kJsonSchema:
      key = "json_schema:" + c.text;
      build = [&c]() -> Result<grammar::Grammar> {
        const nlohmann::ordered_json schema =
            nlohmann::ordered_json::parse(c.text, nullptr, /*allow_exceptions=*/false);
        if (schema.is_discarded()) return InvalidArgument("the schema is not valid JSON");
        return grammar::JsonSchemaValueToGrammar(schema);
      };
      break;
    case Kind::kRegex:
      key = "regex:" + c.text;
      build = [&c] { return grammar::RegexToGrammar(c.text); };
      break;
    case Kind::kChoice:
      key = "choice:" + Json(c.choices).dump();
      build = [&c] { return grammar::ChoiceGrammar(c.choices); };
      break;
    case Kind::kGrammar:
      key = "gbnf:" + c.text;
      build = [&c] { return grammar::ParseGbnf(c.text); };
      break;
    case Kind::kNone:
      break;
  }
  Result<std::shared_ptr<const grammar::CompiledGrammar>> g = Get(key, build);
  if (!g.ok()) return BadRequest("Invalid " + c.param + ": " + g.status().message(), c.param);
  return *g;
}

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> GrammarCache::ForToolChoice(
    ToolCallFormat format, const Json& tools, const ToolChoice& choice, bool parallel) {
  using Mode = ToolChoice::Mode;
  if (choice.mode != Mode::kRequired && choice.mode != Mode::kFunction) {
    return std::shared_ptr<const grammar::CompiledGrammar>();
  }
  grammar::ToolCallSyntax syntax;
  if (format == ToolCallFormat::kHermes) {
    syntax = grammar::ToolCallSyntax::kHermes;
  } else if (format == ToolCallFormat::kLlama3Json) {
    syntax = grammar::ToolCallSyntax::kLlama3Json;
  } else if (format == ToolCallFormat::kQwen3Coder) {
    syntax = grammar::ToolCallSyntax::kXml;
  } else {
    return std::shared_ptr<const grammar::CompiledGrammar>();  // not enforced (docs/server.md)
  }
  if (vocabulary() == nullptr) {
    return BadRequest("A forced tool call needs the model's tokenizer", "tool_choice");
  }
  std::vector<grammar::ToolSpec> specs;
  Json key_tools = Json::array();
  for (const Json& t : tools) {
    const Json& f = t.contains("function") ? t["function"] : t;
    const std::string name = f.value("name", "");
    if (choice.mode == Mode::kFunction && name != choice.function) continue;
    grammar::ToolSpec spec;
    spec.name = name;
    if (f.contains("parameters")) {
      spec.parameters = nlohmann::ordered_json::parse(f["parameters"].dump());
    }
    key_tools.push_back({name, f.contains("parameters") ? f["parameters"] : Json()});
    specs.push_back(std::move(spec));
  }
  const std::string key =
      "tools:" + std::to_string(static_cast<int>(syntax)) +
      (parallel && syntax != grammar::ToolCallSyntax::kLlama3Json ? ":p:" : ":1:") +
      key_tools.dump();
  Result<std::shared_ptr<const grammar::CompiledGrammar>> g =
      Get(key, [&] { return grammar::ToolCallGrammar(syntax, specs, parallel); });
  if (!g.ok()) return BadRequest("Invalid tools: " + g.status().message(), "tools");
  return *g;
}

}  // namespace kestrel::server
