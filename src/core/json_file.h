// Reading small JSON files (config.json, tokenizer.json, index files) into nlohmann::json,
// and typed look-ups whose errors name the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel {

// Reads and parses `path`. A parse error becomes InvalidArgument
// "<path>: invalid JSON at line L, column C: <reason>"; a missing file NotFound; a read error
// IoError.
Result<nlohmann::json> ReadJsonFile(const std::string& path);

// Parses `text`; `what` names the source in errors (a path, "request body").
Result<nlohmann::json> ParseJsonText(std::string_view text, const std::string& what);

// 1-based line and column of byte `offset` in `text` (offset past the end counts as the end).
struct TextPosition {
  int64_t line = 1;
  int64_t column = 1;
};
TextPosition PositionOfByte(std::string_view text, size_t offset);

// The JSON type as a word for messages: "string", "integer", "number", "object", ...
std::string JsonTypeName(const nlohmann::json& j);

// Compact text of `j` for an error message, cut to about `max_chars` (never throws, even on
// strings that are not valid UTF-8).
std::string JsonExcerpt(const nlohmann::json& j, size_t max_chars = 40);

// Deepest nesting of arrays/objects in JSON text, brackets inside strings skipped; stops counting
// once it passes `limit`. Checked before parsing so that untrusted text bounds the parser's work
// and stack (safetensors headers, HTTP request bodies).
int JsonNestingDepth(std::string_view text, int limit);

}  // namespace kestrel
