// One choice of a generation as every API sees it: the engine's events run through the output
// parser (reasoning, tool calls), the message they add up to, tool-call ids, and how the choice
// ended. Shared by the OpenAI chat / completions, Anthropic messages and Responses writers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/parsers/output_parser.h"

namespace kestrel::server {

// "<prefix>" + 24 random alphanumerics (ids of responses, messages and tool calls).
std::string RandomId(const std::string& prefix);

class ChoiceOutput {
 public:
  // tool_id_prefix: "call_" (OpenAI) or "toolu_" (Anthropic).
  ChoiceOutput(const OutputParserOptions& options, std::string tool_id_prefix);

  // Parses the event's text (and ends the parse on the finished event): the new pieces, also
  // added to message(). Valid until the next call.
  const OutputPieces& Add(const RequestOutput& event);

  const ParsedMessage& message() const { return message_; }
  const std::string& tool_call_id(size_t i) const { return tool_ids_.at(i); }
  bool finished() const { return finished_; }
  FinishReason finish_reason() const { return finish_reason_; }
  int32_t stop_index() const { return stop_index_; }  // RequestOutput::stop_index
  const RequestUsage& usage() const { return usage_; }
  bool has_tool_calls() const { return !message_.tool_calls.empty(); }
  // Stopped (not cut by the length limit) after calling tools.
  bool ended_with_tool_calls() const {
    return has_tool_calls() && finish_reason_ == FinishReason::kStop;
  }

 private:
  OutputParser parser_;
  std::string tool_id_prefix_;
  OutputPieces pieces_;
  ParsedMessage message_;
  std::vector<std::string> tool_ids_;
  bool finished_ = false;
  FinishReason finish_reason_ = FinishReason::kLength;
  int32_t stop_index_ = -1;
  RequestUsage usage_;
};

}  // namespace kestrel::server
