// JSON in and out of template values. In: JSON objects keep their key order when given as
// nlohmann::ordered_json (Python's json.loads keeps it, and tojson output depends on it).
// Out: Python's json.dumps, which is what transformers' tojson filter calls.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

Value FromJson(const nlohmann::ordered_json& j);
Value FromJson(const nlohmann::json& j);

// Template value -> JSON (for callers that need data back out of a template value).
nlohmann::ordered_json ToJsonValue(const Value& v);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;          // nullopt: single line
  std::optional<std::string> item_separator;  // default ", " (or "," with indent)
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(v, ...). Throws Error for values JSON cannot hold (Undefined, callables, ...).
std::string DumpJson(const Value& v, const JsonDumpOptions& options);

}  // namespace kestrel::jinja
