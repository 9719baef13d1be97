// Streaming tool-call parsers: they split the content stream of a model into visible text and
// tool calls, one format per model family (docs/server.md "Tool calls and reasoning"):
//
//   kHermes      Qwen2.5/Qwen3, Hermes:  <tool_call>\n{"name": "f", "arguments":
//   {...}}\n</tool_call> kQwen3Coder  Qwen3-Coder, Qwen3.5:
//   <tool_call>\n<function=f>\n<parameter=p>\nvalue\n
//                                        </parameter>\n</function>\n</tool_call>
//                                        (values typed by the tool's JSON schema)
//   kLlama3Json  Llama 3.x:              [<|python_tag|>]{"name": "f", "parameters": {...}}
//                                        (at the start of the output; several joined by ';')
//
// Feed() takes text deltas in any split and appends pieces as soon as they are certain: a partial
// tag is held back, never shown as content. The pieces depend only on the text, not on how it was
// split, so a stream reassembles to the message of one Feed (tested at every split position).
// JSON arguments stream as the model writes them when the call starts with its name
// ({"name": ..., "arguments": {); other key orders wait for the whole object and are
// re-serialized. A call that cannot be read is shown as content.
#pragma once

#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/parsers/parsed_output.h"

namespace kestrel::server {

enum class ToolCallFormat { kNone, kHermes, kQwen3Coder, kLlama3Json };

const char* ToolCallFormatName(ToolCallFormat f);  // "none", "hermes", "qwen3_coder", "llama3_json"
// The inverse of ToolCallFormatName; false for an unknown name.
bool ParseToolCallFormat(std::string_view name, ToolCallFormat* out);

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // The next delta of the content stream: appends content and tool-call pieces.
  virtual void Feed(std::string_view text, OutputPieces* out) = 0;
  // The end of the output: releases what was held back; an unfinished call becomes a (possibly
  // truncated) call when its name is known, else content.
  virtual void Finish(OutputPieces* out) = 0;
};

// tools: the request's OpenAI tools array (or null); kQwen3Coder types parameter values with it.
// kNone: nullptr.
std::unique_ptr<ToolCallParser> MakeToolCallParser(ToolCallFormat format,
                                                   const nlohmann::ordered_json& tools);

namespace parsers {
std::unique_ptr<ToolCallParser> MakeHermesParser();
std::unique_ptr<ToolCallParser> MakeLlama3JsonParser();
std::unique_ptr<ToolCallParser> MakeQwen3CoderParser(const nlohmann::ordered_json& tools);

// A Qwen3-Coder parameter value (the text between the tags) as JSON, typed by `schema` (the
// parameter's JSON schema, or null): integer / number / boolean / null / object / array values
// are parsed when the text is one; everything else stays a string.
nlohmann::ordered_json TypedParameterValue(std::string_view text,
                                           const nlohmann::ordered_json& schema);
}  // namespace parsers

}  // namespace kestrel::server
