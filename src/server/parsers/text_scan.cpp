#include "server/parsers/text_scan.h"

#include <nlohmann/json.hpp>

#include "core/json_file.h"

namespace kestrel::server::parsers {
namespace {

using Json = nlohmann::ordered_json;

// Models write tool calls shallowly; deeper text is not parsed (it stays text).
constexpr int kMaxArgumentsDepth = 64;

// A cursor over text that may still grow.
struct Cursor {
  std::string_view s;
  size_t pos = 0;

  void Space() { pos = SkipSpace(s, pos); }
  bool AtEnd() const { return pos >= s.size(); }
  // The next byte must be c: kYes (consumed), kNo, or kNeedMore at the end.
  Match Char(char c) {
    Space();
    if (AtEnd()) return Match::kNeedMore;
    if (s[pos] != c) return Match::kNo;
    ++pos;
    return Match::kYes;
  }
  // A JSON string literal, decoded.
  Match String(std::string* out) {
    Space();
    if (AtEnd()) return Match::kNeedMore;
    if (s[pos] != '"') return Match::kNo;
    bool escape = false;
    for (size_t i = pos + 1; i < s.size(); ++i) {
      const char c = s[i];
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        const Json parsed = Json::parse(s.substr(pos, i + 1 - pos), nullptr, false);
        if (!parsed.is_string()) return Match::kNo;
        *out = parsed.get<std::string>();
        pos = i + 1;
        return Match::kYes;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return Match::kNo;  // raw control characters are not allowed in JSON strings
      }
    }
    return Match::kNeedMore;
  }
};

}  // namespace

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t SkipSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsJsonSpace(s[pos])) ++pos;
  return pos;
}

size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  const size_t max_len = std::min(text.size(), tag.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

size_t FindTag(std::string_view text, std::string_view tag, size_t* hold) {
  const size_t pos = text.find(tag);
  *hold = pos == std::string_view::npos ? PartialTagSuffix(text, tag) : 0;
  return pos;
}

Match MatchJsonCallHead(std::string_view s, CallHead* out) {
  Cursor c{s.substr(0, std::min(s.size(), kMaxHeadBytes))};
  const bool truncated = s.size() > kMaxHeadBytes;
  // Each step: kNo ends the match; kNeedMore too, unless more text could still arrive.
  auto step = [&](Match m) { return m == Match::kNeedMore && truncated ? Match::kNo : m; };
  std::string key, name;
  Match m;
  if ((m = step(c.Char('{'))) != Match::kYes) return m;
  if ((m = step(c.String(&key))) != Match::kYes) return m;
  if (key != "name") return Match::kNo;
  if ((m = step(c.Char(':'))) != Match::kYes) return m;
  if ((m = step(c.String(&name))) != Match::kYes) return m;
  if (name.empty()) return Match::kNo;
  if ((m = step(c.Char(','))) != Match::kYes) return m;
  if ((m = step(c.String(&key))) != Match::kYes) return m;
  if (key != "arguments" && key != "parameters") return Match::kNo;
  if ((m = step(c.Char(':'))) != Match::kYes) return m;
  c.Space();
  if (c.AtEnd()) return step(Match::kNeedMore);
  if (s[c.pos] != '{') return Match::kNo;
  out->name = std::move(name);
  out->args_offset = c.pos;
  return Match::kYes;
}

size_t JsonValueScanner::Scan(std::string_view s) {
  size_t i = 0;
  for (; i < s.size() && !done_; ++i) {
    const char c = s[i];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ <= 0) done_ = true;
    }
  }
  return i;
}

std::optional<ParsedToolCall> ToolCallFromJson(std::string_view text) {
  if (JsonNestingDepth(text, kMaxArgumentsDepth + 1) > kMaxArgumentsDepth) return std::nullopt;
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  Json arguments = Json::object();
  if (args != j.end() && !args->is_null()) {
    if (args->is_object()) {
      arguments = *args;
    } else if (args->is_string()) {
      // Some models write the arguments as a JSON string holding the object.
      const std::string& inner = args->get_ref<const std::string&>();
      if (JsonNestingDepth(inner, kMaxArgumentsDepth + 1) > kMaxArgumentsDepth) return std::nullopt;
      arguments = Json::parse(inner, nullptr, false);
      if (!arguments.is_object()) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  return ParsedToolCall{name->get<std::string>(),
                        arguments.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

}  // namespace kestrel::server::parsers
