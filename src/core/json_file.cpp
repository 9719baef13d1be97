#include "core/json_file.h"

#include <algorithm>

#include <exception>

#include "core/mapped_file.h"

namespace kestrel {

TextPosition PositionOfByte(std::string_view text, size_t offset) {
  TextPosition pos;
  const size_t end = offset < text.size() ? offset : text.size();
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++pos.line;
      pos.column = 1;
    } else {
      ++pos.column;
    }
  }
  return pos;
}

Result<nlohmann::json> ParseJsonText(std::string_view text, const std::string& what) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based: the byte at which the parser gave up.
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    const TextPosition pos = PositionOfByte(text, offset);
    std::string reason = e.what();
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 1, column 2: <why>";
    // keep only <why>, since the position is reported in our own words.
    const size_t colon = reason.find(": ");
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    return InvalidArgument(what + ": invalid JSON at line " + std::to_string(pos.line) +
                           ", column " + std::to_string(pos.column) + ": " + reason);
  } catch (const std::exception& e) {
    return InvalidArgument(what + ": invalid JSON: " + e.what());
  }
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  if (!FileExists(path)) return NotFound(path + ": no such file");
  KASSIGN(std::string text, ReadFileToString(path));
  return ParseJsonText(text, path);
}

std::string JsonTypeName(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "object";
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::string:
      return "string";
    case nlohmann::json::value_t::boolean:
      return "boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "integer";
    case nlohmann::json::value_t::number_float:
      return "number";
    case nlohmann::json::value_t::binary:
      return "binary";
    case nlohmann::json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

std::string JsonExcerpt(const nlohmann::json& j, size_t max_chars) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars && max_chars >= 3) s = s.substr(0, max_chars - 3) + "...";
  return s;
}

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace kestrel
