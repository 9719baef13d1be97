// Server-sent events as OpenAI streams them: `data: <one-line JSON>\n\n` frames, ended by
// `data: [DONE]\n\n`. StreamEncoder turns the engine's events of one request into those frames.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/response_json.h"

namespace kestrel::server {

std::string SseFrame(std::string_view payload);  // "data: " + payload + "\n\n"
std::string SseDone();                           // "data: [DONE]\n\n"
std::string SseJsonFrame(const Json& payload);   // serialized on one line (JSON escapes newlines)
// An error after the stream started: the error object as a frame, then [DONE].
std::string SseErrorFrames(const ApiError& error);

// Frames of one streamed request, in order:
//   chat: a first chunk per choice with delta {"role": "assistant", "content": ""};
//   completions with echo: a first chunk per choice with the prompt's text;
//   per event, a chunk per output piece (reasoning_content, content or a tool_calls delta), or
//   one with empty content when the event only carries logprobs;
//   per choice, when it ends, a chunk with an empty delta and its finish_reason;
//   after the last choice, with include_usage, a chunk with "choices": [] and the usage;
//   with continuous_usage, every chunk carries the usage so far, and an event whose text is held
//   back (a partial UTF-8 sequence, a possible stop string) gets a chunk with empty text, so a
//   client sees when each token was sampled;
//   data: [DONE].
// Text deltas come from the engine whole-code-point and with stop strings already removed.
// A failed or cancelled choice ends the stream with an error frame and [DONE].
class StreamEncoder {
 public:
  StreamEncoder(ResponseMeta meta, TokenBytesFn token_bytes);

  std::string Start();  // role chunks (chat), echo chunks (completions)
  std::string Add(const RequestOutput& event) { return Add(0, event); }
  std::string Add(size_t choice, const RequestOutput& event);  // frames, possibly none
  bool finished() const { return finished_; }

 private:
  struct Choice {
    ChoiceOutput output;
    LogprobsBuilder logprobs;
  };
  RequestUsage UsageSoFar() const;  // every choice's usage combined, as the final chunk reports

  ResponseMeta meta_;
  std::vector<Choice> choices_;
  size_t n_finished_ = 0;
  bool finished_ = false;
};

}  // namespace kestrel::server
