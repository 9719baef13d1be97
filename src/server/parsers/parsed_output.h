// What the output parsers make of generated text: an ordered list of pieces (reasoning text,
// content text, tool-call starts and argument fragments), and the whole message they add up to.
//
// Streaming answers turn each Feed's pieces into deltas (OpenAI chunks, Anthropic content-block
// events, Responses events); non-streaming answers accumulate every piece into a ParsedMessage.
// Both come from the same pieces, so a stream always reassembles to the non-streamed message.
// Tool-call ids are not the parsers' business: each API writes its own ("call_...", "toolu_...").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel::server {

struct OutputPiece {
  enum class Kind {
    kReasoning,  // text of a <think> block
    kContent,    // visible answer text
    kToolCall,   // a tool call: its start (name set) or a fragment of its JSON arguments
  };
  Kind kind = Kind::kContent;
  std::string text;         // reasoning/content text, or an arguments fragment (may be empty)
  int32_t tool_index = -1;  // kToolCall: 0, 1, ... in the order the calls start
  std::string tool_name;    // kToolCall: set on the first piece of a call only
  bool starts_call() const { return kind == Kind::kToolCall && !tool_name.empty(); }
};

using OutputPieces = std::vector<OutputPiece>;

// Appends a piece, merging it into the last one when both continue the same stream (text after
// text of the same kind, or argument fragments of the same call). Empty text pieces that do not
// start a call are dropped.
void AppendPiece(OutputPieces* pieces, OutputPiece piece);
void AppendText(OutputPieces* pieces, OutputPiece::Kind kind, std::string_view text);
void AppendToolStart(OutputPieces* pieces, int32_t index, std::string name);
void AppendToolArguments(OutputPieces* pieces, int32_t index, std::string_view fragment);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments object (as the model wrote it)
  bool operator==(const ParsedToolCall&) const = default;
};

struct ParsedMessage {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;

  void Add(const OutputPiece& piece);
  void Add(const OutputPieces& pieces) {
    for (const OutputPiece& p : pieces) Add(p);
  }
  bool operator==(const ParsedMessage&) const = default;
};

}  // namespace kestrel::server
