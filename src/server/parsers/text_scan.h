// Small incremental scanners shared by the output parsers: held-back tag prefixes, the head of a
// JSON tool call ({"name": "f", "arguments": ...), the extent of a JSON value, and the parse of a
// whole JSON tool-call object. All work on text that may still grow: kNeedMore means "cannot
// tell yet", never "no".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/parsers/parsed_output.h"

namespace kestrel::server::parsers {

bool IsJsonSpace(char c);  // ' ', '\t', '\n', '\r'
size_t SkipSpace(std::string_view s, size_t pos);

// Length of the longest suffix of `text` that is a proper prefix of `tag`: the bytes to hold back
// because the next delta may complete the tag.
size_t PartialTagSuffix(std::string_view text, std::string_view tag);

// Position of the first complete occurrence of `tag`, or npos; *hold gets the bytes at the end of
// `text` that must wait (a partial tag) when there is none.
size_t FindTag(std::string_view text, std::string_view tag, size_t* hold);

enum class Match { kNeedMore, kYes, kNo };

// The head of a JSON tool call, up to the opening brace of its arguments:
//   ws { ws "name" ws : ws "<name>" ws , ws "arguments"|"parameters" ws : ws {
// Only this key order streams its arguments; anything else is kNo (the caller then waits for the
// whole object and uses ToolCallFromJson). Heads longer than kMaxHeadBytes are kNo.
struct CallHead {
  std::string name;        // decoded; non-empty
  size_t args_offset = 0;  // offset of the arguments' '{' in the text
};
inline constexpr size_t kMaxHeadBytes = 1024;
Match MatchJsonCallHead(std::string_view s, CallHead* out);

// Finds where one JSON object or array ends, fed in pieces. Strings and escapes are tracked, so
// brackets inside strings do not count. Starts before the opening bracket, or inside `depth`
// open brackets (the rest of an object whose head was read).
class JsonValueScanner {
 public:
  explicit JsonValueScanner(int64_t depth = 0) : depth_(depth) {}
  // Consumes bytes of `s` up to and including the one that closes the value; returns how many.
  size_t Scan(std::string_view s);
  bool done() const { return done_; }
  bool started() const { return depth_ > 0 || done_; }

 private:
  int64_t depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool done_ = false;
};

// A whole tool-call object: {"name": "<non-empty string>", "arguments"|"parameters": <object,
// or a string holding a JSON object>} (arguments may be missing: {}). Any key order; other keys
// are ignored. The arguments are re-serialized compactly. nullopt when the text is not that.
std::optional<ParsedToolCall> ToolCallFromJson(std::string_view text);

}  // namespace kestrel::server::parsers
