// The Qwen3-Coder / Qwen3.5 XML tool-call format:
//
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   Paris
//   </parameter>
//   <parameter=days>
//   3
//   </parameter>
//   </function>
//   </tool_call>
//
// becomes get_weather({"city": "Paris", "days": 3}): one newline after the opening and before the
// closing parameter tag is dropped, and values are typed by the tool's JSON schema. The arguments
// stream one parameter at a time ('{"city": "Paris"', then ', "days": 3', then '}'). As in vLLM,
// a bare <function=...> without <tool_call> is a call too, and a parameter ends at the next
// <parameter= or </function> when its closing tag is missing.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "core/json_file.h"
#include "server/parsers/text_scan.h"
#include "server/parsers/tool_call_parser.h"

namespace kestrel::server::parsers {
namespace {

using Json = nlohmann::ordered_json;
using Kind = OutputPiece::Kind;

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";
// A function or parameter name longer than this (or spanning lines) is not one.
constexpr size_t kMaxNameBytes = 256;
constexpr int kMaxValueDepth = 64;

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The type names a parameter schema allows: "type" as a string or a list, and the types of its
// anyOf / oneOf alternatives.
void CollectTypes(const Json& schema, std::vector<std::string>* types) {
  if (!schema.is_object()) return;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) types->push_back(Lower(t->get<std::string>()));
    if (t->is_array()) {
      for (const Json& e : *t) {
        if (e.is_string()) types->push_back(Lower(e.get<std::string>()));
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (auto alts = schema.find(key); alts != schema.end() && alts->is_array()) {
      for (const Json& alt : *alts) CollectTypes(alt, types);
    }
  }
}

bool Has(const std::vector<std::string>& types, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (std::find(types.begin(), types.end(), n) != types.end()) return true;
  }
  return false;
}

// Function name -> parameter name -> schema, from an OpenAI tools array.
using ParameterSchemas = std::map<std::string, std::map<std::string, Json>, std::less<>>;

ParameterSchemas SchemasOf(const Json& tools) {
  ParameterSchemas out;
  if (!tools.is_array()) return out;
  for (const Json& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    auto& params = out[name->get<std::string>()];
    auto schema = fn->find("parameters");
    if (schema == fn->end() || !schema->is_object()) continue;
    auto props = schema->find("properties");
    if (props == schema->end() || !props->is_object()) continue;
    for (const auto& [key, value] : props->items()) params[key] = value;
  }
  return out;
}

class Qwen3CoderParser final : public ToolCallParser {
 public:
  explicit Qwen3CoderParser(const Json& tools) : schemas_(SchemasOf(tools)) {}

  void Feed(std::string_view text, OutputPieces* out) override {
    buf_.append(text);
    while (Step(out)) {
    }
  }

  void Finish(OutputPieces* out) override {
    switch (state_) {
      case State::kText:
        AppendText(out, Kind::kContent, buf_);
        break;
      case State::kCallOpen:
      case State::kFunctionName:
        AppendText(out, Kind::kContent, opening_ + buf_);  // never became a call
        break;
      case State::kParameterValue:
        EmitParameter(buf_, out);  // truncated: the value so far
        [[fallthrough]];
      case State::kFunctionBody:
      case State::kParameterName:
        CloseArguments(out);
        break;
      case State::kAfterFunction:
        break;
    }
    buf_.clear();
    state_ = State::kText;
  }

 private:
  enum class State {
    kText,            // content; looking for <tool_call> or <function=
    kCallOpen,        // after <tool_call>: expecting <function=
    kFunctionName,    // after <function=: the name up to '>'
    kFunctionBody,    // expecting <parameter= or </function>
    kParameterName,   // after <parameter=: the name up to '>'
    kParameterValue,  // the value up to </parameter> (or <parameter= / </function>)
    kAfterFunction,   // after </function>: an optional </tool_call>
  };

  bool Step(OutputPieces* out) {
    switch (state_) {
      case State::kText: {
        size_t hold_call = 0, hold_function = 0;
        const size_t call = FindTag(buf_, kToolCallOpen, &hold_call);
        const size_t function = FindTag(buf_, kFunctionOpen, &hold_function);
        const size_t pos = std::min(call, function);
        if (pos == std::string::npos) {
          const size_t keep = std::max(hold_call, hold_function);
          AppendText(out, Kind::kContent, std::string_view(buf_).substr(0, buf_.size() - keep));
          buf_.erase(0, buf_.size() - keep);
          return false;
        }
        AppendText(out, Kind::kContent, std::string_view(buf_).substr(0, pos));
        const std::string_view tag = pos == call ? kToolCallOpen : kFunctionOpen;
        buf_.erase(0, pos + tag.size());
        opening_ = std::string(tag);
        in_tool_call_ = pos == call;
        state_ = pos == call ? State::kCallOpen : State::kFunctionName;
        return true;
      }
      case State::kCallOpen: {
        const size_t i = SkipSpace(buf_, 0);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.starts_with(kFunctionOpen)) {
          opening_ += buf_.substr(0, i + kFunctionOpen.size());
          buf_.erase(0, i + kFunctionOpen.size());
          state_ = State::kFunctionName;
          return true;
        }
        if (rest.size() < kFunctionOpen.size() && kFunctionOpen.starts_with(rest)) return false;
        // Not this format after all: the tag is text.
        AppendText(out, Kind::kContent, opening_);
        state_ = State::kText;
        return true;
      }
      case State::kFunctionName: {
        std::string name;
        switch (ReadName(&name)) {
          case Match::kNeedMore:
            return false;
          case Match::kNo:
            AppendText(out, Kind::kContent, opening_);
            state_ = State::kText;
            return true;
          case Match::kYes:
            break;
        }
        function_ = name;
        n_parameters_ = 0;
        AppendToolStart(out, n_calls_, std::move(name));
        state_ = State::kFunctionBody;
        return true;
      }
      case State::kFunctionBody: {
        const size_t i = SkipSpace(buf_, 0);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.starts_with(kParameterOpen)) {
          buf_.erase(0, i + kParameterOpen.size());
          state_ = State::kParameterName;
          return true;
        }
        if (rest.starts_with(kFunctionClose)) {
          buf_.erase(0, i + kFunctionClose.size());
          CloseArguments(out);
          state_ = State::kAfterFunction;
          return true;
        }
        if ((rest.size() < kParameterOpen.size() && kParameterOpen.starts_with(rest)) ||
            (rest.size() < kFunctionClose.size() && kFunctionClose.starts_with(rest))) {
          return false;
        }
        // Stray text between parameters is dropped, up to the next tag.
        const size_t next = buf_.find('<', i + 1);
        buf_.erase(0, next == std::string::npos ? buf_.size() : next);
        return !buf_.empty();
      }
      case State::kParameterName: {
        std::string name;
        switch (ReadName(&name)) {
          case Match::kNeedMore:
            return false;
          case Match::kNo:  // a broken parameter tag: skip it
            state_ = State::kFunctionBody;
            return true;
          case Match::kYes:
            break;
        }
        parameter_ = std::move(name);
        state_ = State::kParameterValue;
        return true;
      }
      case State::kParameterValue: {
        // The value is typed as a whole, so it waits for its end: the earliest of the tags that
        // can end it (none is a substring of another, so a later complete one never hides an
        // earlier partial one).
        size_t end = std::string::npos, skip = 0;
        for (std::string_view tag : {kParameterClose, kParameterOpen, kFunctionClose}) {
          const size_t pos = buf_.find(tag);
          if (pos < end) {
            end = pos;
            skip = tag == kParameterClose ? tag.size() : 0;
          }
        }
        if (end == std::string::npos) return false;
        EmitParameter(std::string_view(buf_).substr(0, end), out);
        buf_.erase(0, end + skip);
        state_ = State::kFunctionBody;
        return true;
      }
      case State::kAfterFunction: {
        if (in_tool_call_) {
          const size_t i = SkipSpace(buf_, 0);
          const std::string_view rest = std::string_view(buf_).substr(i);
          if (rest.starts_with(kToolCallClose)) {
            buf_.erase(0, i + kToolCallClose.size());
          } else if (rest.size() < kToolCallClose.size() && kToolCallClose.starts_with(rest)) {
            return false;
          }
        }
        ++n_calls_;
        state_ = State::kText;
        return true;
      }
    }
    return false;
  }

  // A tag name up to '>': kNo when it is empty, too long or spans lines.
  Match ReadName(std::string* name) {
    const size_t end = buf_.find('>');
    const size_t newline = buf_.find('\n');
    if (newline < end || (end == std::string::npos && buf_.size() > kMaxNameBytes)) {
      return Match::kNo;
    }
    if (end == std::string::npos) return Match::kNeedMore;
    std::string_view n = std::string_view(buf_).substr(0, end);
    while (!n.empty() && IsJsonSpace(n.front())) n.remove_prefix(1);
    while (!n.empty() && IsJsonSpace(n.back())) n.remove_suffix(1);
    if (n.empty() || end > kMaxNameBytes) return Match::kNo;
    *name = std::string(n);
    buf_.erase(0, end + 1);
    return Match::kYes;
  }

  void EmitParameter(std::string_view value, OutputPieces* out) {
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    Json schema;
    if (auto fn = schemas_.find(function_); fn != schemas_.end()) {
      if (auto p = fn->second.find(parameter_); p != fn->second.end()) schema = p->second;
    }
    std::string fragment = n_parameters_++ == 0 ? "{" : ", ";
    fragment += Dump(Json(parameter_));
    fragment += ": ";
    fragment += Dump(TypedParameterValue(value, schema));
    AppendToolArguments(out, n_calls_, fragment);
  }

  void CloseArguments(OutputPieces* out) {
    AppendToolArguments(out, n_calls_, n_parameters_ == 0 ? "{}" : "}");
  }

  ParameterSchemas schemas_;
  State state_ = State::kText;
  std::string buf_;
  std::string opening_;  // the tags read before the call is certain (shown if it is not one)
  bool in_tool_call_ = false;
  std::string function_, parameter_;
  int32_t n_parameters_ = 0;
  int32_t n_calls_ = 0;
};

}  // namespace

Json TypedParameterValue(std::string_view text, const Json& schema) {
  std::vector<std::string> types;
  CollectTypes(schema, &types);
  if (types.empty() || (types.size() == 1 && types[0] == "string")) return Json(std::string(text));
  const std::string lower = Lower(std::string(text));
  if (Has(types, {"null"}) && lower == "null") return Json();
  if (Has(types, {"boolean", "bool"}) && (lower == "true" || lower == "false")) {
    return Json(lower == "true");
  }
  const bool want_int = Has(types, {"integer", "int"});
  const bool want_number = Has(types, {"number", "float"});
  const bool want_object = Has(types, {"object", "dict"});
  const bool want_array = Has(types, {"array", "list"});
  if (want_int || want_number || want_object || want_array) {
    Json parsed;
    if (JsonNestingDepth(text, kMaxValueDepth + 1) <= kMaxValueDepth) {
      parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    }
    if (want_int && parsed.is_number_float()) {
      const double d = parsed.get<double>();
      if (d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.2e18 && d < 9.2e18) {
        return Json(static_cast<int64_t>(d));  // "3.0" for an integer
      }
    }
    if ((want_int && parsed.is_number_integer()) || (want_number && parsed.is_number()) ||
        (want_object && parsed.is_object()) || (want_array && parsed.is_array())) {
      return parsed;
    }
  }
  return Json(std::string(text));
}

std::unique_ptr<ToolCallParser> MakeQwen3CoderParser(const Json& tools) {
  return std::make_unique<Qwen3CoderParser>(tools);
}

}  // namespace kestrel::server::parsers
