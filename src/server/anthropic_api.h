// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens): the request
// converted to a chat request (system, text / tool_use / tool_result / thinking blocks, tools,
// tool_choice), and the answer built from the engine's events: a `message` object, or its SSE
// events (message_start, content_block_start / _delta / _stop with text_delta,
// input_json_delta and thinking_delta, message_delta, message_stop; a ping after the start).
// Pure (no HTTP, no engine), so the conversions and event sequences are unit-tested.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/openai_request.h"

namespace kestrel::server {

struct AnthropicRequest {
  ChatRequest chat;  // messages and tools as the chat template takes them; options
};

// count_tokens: max_tokens is not required (the body of /v1/messages/count_tokens).
std::optional<ApiError> ParseAnthropicRequest(const Json& body, const ParseContext& ctx,
                                              AnthropicRequest* out, bool count_tokens = false);

// What every event of one answer repeats.
struct AnthropicMeta {
  std::string id;  // "msg_..."
  std::string model;
  std::vector<std::string> stop_sequences;  // to name the one that ended the message
  OutputParserOptions parsing;
  int32_t n_prompt_tokens = 0;  // for message_start (cache reads are known at the end)
};

// stop_reason: "tool_use" (stopped after tool calls), "stop_sequence", "max_tokens", "end_turn".
const char* AnthropicStopReason(const ChoiceOutput& choice);
// {input_tokens (not read from the cache), output_tokens, cache_creation_input_tokens: 0,
//  cache_read_input_tokens}
Json AnthropicUsage(const RequestUsage& usage);
// The `message` object of a finished choice.
Json AnthropicMessageJson(const AnthropicMeta& meta, const ChoiceOutput& choice);

// "event: <type>\ndata: <json>\n\n"
std::string AnthropicEventFrame(const Json& event);

// The SSE events of one streamed message. Content blocks open in the order the output pieces
// come: a thinking block, a text block, one tool_use block per call (a kind change closes the
// open block). A failed request ends with an `error` event.
class AnthropicStreamEncoder {
 public:
  explicit AnthropicStreamEncoder(AnthropicMeta meta);
  std::string Start();  // message_start, ping
  std::string Add(const RequestOutput& event);
  bool finished() const { return finished_; }

 private:
  std::string OpenBlock(const OutputPiece& piece);
  std::string CloseBlock();

  AnthropicMeta meta_;
  ChoiceOutput output_;
  int32_t block_index_ = -1;  // the open block, -1 when none
  OutputPiece::Kind block_kind_ = OutputPiece::Kind::kContent;
  int32_t block_tool_ = -1;  // the open tool_use block's call
  int32_t n_blocks_ = 0;
  bool finished_ = false;
};

// A non-streamed message: the body once the choice finished (or its error).
class AnthropicAccumulator {
 public:
  explicit AnthropicAccumulator(AnthropicMeta meta);
  void Add(const RequestOutput& event);
  bool finished() const { return finished_; }
  const std::optional<ApiError>& error() const { return error_; }
  Json Build() const;

 private:
  AnthropicMeta meta_;
  ChoiceOutput output_;
  bool finished_ = false;
  std::optional<ApiError> error_;
};

}  // namespace kestrel::server
