// The output parser of one generated message: reasoning (<think>...</think>) first, then tool
// calls in the content that follows, in whichever formats the model writes them. One parser per
// choice; fed the engine's text deltas in order (see tool_call_parser.h for the guarantees).
//
// Which formats a model uses is read from its chat template (DetectOutputFormats): the template
// is rendered once with a probe conversation holding a tool call and reasoning, and the way it
// writes them back names the format. `kestrel serve --tool-call-parser / --reasoning-parser`
// override it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/parsers/parsed_output.h"
#include "server/parsers/tool_call_parser.h"

namespace kestrel {
class ChatTemplate;
}

namespace kestrel::server {

// How the served model writes tool calls and reasoning.
struct OutputFormats {
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  bool reasoning = false;  // <think>...</think>
};

// kNone / false when the template renders neither (or cannot be rendered with the probe).
OutputFormats DetectOutputFormats(const ChatTemplate& chat_template);

// True when the rendered prompt ends inside an open <think> block (templates that start the
// model's reasoning themselves, e.g. Qwen3-Thinking, DeepSeek-R1): the output then begins as
// reasoning.
bool PromptOpensReasoning(std::string_view prompt);

// <think>...</think> at the start of the output (after spaces) becomes reasoning; spaces after
// </think> are dropped; everything else is content. Output that does not start with <think> is
// content throughout, unless the prompt opened the block (starts_in_reasoning).
class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);
  void Feed(std::string_view text, OutputPieces* out);
  void Finish(OutputPieces* out);

 private:
  bool Step(OutputPieces* out);
  enum class State { kStart, kReasoning, kAfterReasoning, kContent };
  State state_;
  std::string buf_;
};

struct OutputParserOptions {
  ToolCallFormat tool_calls = ToolCallFormat::kNone;  // kNone: tool calls are not parsed
  bool reasoning = false;
  bool starts_in_reasoning = false;  // PromptOpensReasoning (only with reasoning)
  bool parallel_tool_calls = true;   // false: calls after the first are dropped
  nlohmann::ordered_json tools;      // the request's tools (typed XML parameters)
};

class OutputParser {
 public:
  explicit OutputParser(const OutputParserOptions& options);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  void Feed(std::string_view text, OutputPieces* out);
  void Finish(OutputPieces* out);
  int32_t n_tool_calls() const { return n_tool_calls_; }

 private:
  void Route(const OutputPieces& pieces, OutputPieces* out);   // after the reasoning stage
  void Filter(const OutputPieces& pieces, OutputPieces* out);  // after the tool-call stage

  bool parallel_tool_calls_;
  std::unique_ptr<ReasoningParser> reasoning_;  // null: no reasoning parsing
  std::unique_ptr<ToolCallParser> tools_;       // null: no tool-call parsing
  // With tool parsing, trailing spaces of the content wait: they are dropped around tool calls
  // (a message that is only calls has no content) and shown before more text.
  std::string pending_space_;
  int32_t n_tool_calls_ = 0;
  OutputPieces scratch_a_, scratch_b_;
};

}  // namespace kestrel::server
