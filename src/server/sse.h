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
//   chat: a first chunk with delta {"role": "assistant", "content": ""};
//   a chunk per event that carries text (or tokens, when logprobs are asked for);
//   a final chunk with an empty delta and the finish_reason;
//   with include_usage, a chunk with "choices": [] and the usage;
//   data: [DONE].
// Text deltas come from the engine whole-code-point and with stop strings already removed.
// A failed or cancelled request ends with an error frame and [DONE] instead.
class StreamEncoder {
 public:
  StreamEncoder(ResponseMeta meta, TokenBytesFn token_bytes);

  std::string Start();                          // the role chunk (chat), nothing for completions
  std::string Add(const RequestOutput& event);  // frames for one event, possibly none
  bool finished() const { return finished_; }

 private:
  ResponseMeta meta_;
  LogprobsBuilder logprobs_;
  bool finished_ = false;
};

}  // namespace kestrel::server
