#include "server/sse.h"

namespace kestrel::server {

std::string SseFrame(std::string_view payload) {
  std::string frame;
  frame.reserve(payload.size() + 8);
  frame += "data: ";
  frame += payload;
  frame += "\n\n";
  return frame;
}

std::string SseJsonFrame(const Json& payload) {
  return SseFrame(std::string_view(Dump(payload)));
}

std::string SseDone() {
  return "data: [DONE]\n\n";
}

std::string SseErrorFrames(const ApiError& error) {
  return SseJsonFrame(ErrorJson(error)) + SseDone();
}

StreamEncoder::StreamEncoder(ResponseMeta meta, TokenBytesFn token_bytes)
    : meta_(std::move(meta)), logprobs_(meta_.kind, meta_.top_logprobs, std::move(token_bytes)) {}

std::string StreamEncoder::Start() {
  if (meta_.kind != ApiKind::kChat) return "";
  return SseJsonFrame(
      ChatChunk(meta_, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
}

std::string StreamEncoder::Add(const RequestOutput& event) {
  if (finished_) return "";
  std::string frames;
  if (meta_.logprobs) logprobs_.Add(event.samples);
  const bool has_logprobs = meta_.logprobs && !logprobs_.empty();
  if (!event.text.empty() || has_logprobs) {
    Json lp = has_logprobs ? logprobs_.Take() : Json();
    if (meta_.kind == ApiKind::kChat) {
      frames +=
          SseJsonFrame(ChatChunk(meta_, Json{{"content", event.text}}, std::move(lp), nullptr));
    } else {
      frames += SseJsonFrame(CompletionChunk(meta_, event.text, std::move(lp), nullptr));
    }
  }
  if (!event.finished) return frames;

  finished_ = true;
  if (std::optional<ApiError> error = EventError(event)) {
    return frames + SseErrorFrames(*error);
  }
  const char* reason = FinishReasonText(event.finish_reason);
  if (meta_.kind == ApiKind::kChat) {
    frames += SseJsonFrame(ChatChunk(meta_, Json::object(), nullptr, reason));
  } else {
    frames += SseJsonFrame(CompletionChunk(meta_, "", nullptr, reason));
  }
  if (meta_.include_usage) frames += SseJsonFrame(UsageChunk(meta_, event.usage));
  frames += SseDone();
  return frames;
}

}  // namespace kestrel::server
