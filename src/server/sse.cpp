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

StreamEncoder::StreamEncoder(ResponseMeta meta, TokenBytesFn token_bytes) : meta_(std::move(meta)) {
  choices_.reserve(static_cast<size_t>(meta_.n_choices));
  for (int32_t i = 0; i < meta_.n_choices; ++i) {
    choices_.push_back(Choice{ChoiceOutput(meta_.parsing, "call_"),
                              LogprobsBuilder(meta_.kind, meta_.top_logprobs, token_bytes)});
  }
}

std::string StreamEncoder::Start() {
  std::string frames;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (meta_.kind == ApiKind::kChat) {
      frames += SseJsonFrame(
          ChatChunk(meta_, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, i));
    } else if (!meta_.echo.empty()) {
      frames += SseJsonFrame(CompletionChunk(meta_, meta_.echo, nullptr, nullptr, i));
    }
  }
  return frames;
}

std::string StreamEncoder::Add(size_t index, const RequestOutput& event) {
  if (finished_) return "";
  Choice& c = choices_.at(index);
  if (c.output.finished()) return "";
  std::string frames;
  const OutputPieces& pieces = c.output.Add(event);
  if (meta_.logprobs) c.logprobs.Add(event.samples);
  // The event's logprobs travel with its first chunk.
  Json lp = meta_.logprobs && !c.logprobs.empty() ? c.logprobs.Take() : Json();
  const bool chat = meta_.kind == ApiKind::kChat;
  for (const OutputPiece& piece : pieces) {
    if (chat) {
      frames += SseJsonFrame(
          ChatChunk(meta_, ChatDeltaJson(piece, c.output), std::move(lp), nullptr, index));
    } else {
      frames += SseJsonFrame(CompletionChunk(meta_, piece.text, std::move(lp), nullptr, index));
    }
    lp = Json();
  }
  if (!lp.is_null()) {
    frames +=
        chat ? SseJsonFrame(ChatChunk(meta_, Json{{"content", ""}}, std::move(lp), nullptr, index))
             : SseJsonFrame(CompletionChunk(meta_, "", std::move(lp), nullptr, index));
  }
  if (!event.finished) return frames;

  if (std::optional<ApiError> error = EventError(event)) {
    finished_ = true;
    return frames + SseErrorFrames(*error);
  }
  const char* reason = ChoiceFinishReason(c.output);
  frames += chat ? SseJsonFrame(ChatChunk(meta_, Json::object(), nullptr, reason, index))
                 : SseJsonFrame(CompletionChunk(meta_, "", nullptr, reason, index));
  if (++n_finished_ < choices_.size()) return frames;

  finished_ = true;
  if (meta_.include_usage) {
    std::vector<const RequestUsage*> usages;
    for (const Choice& ch : choices_) usages.push_back(&ch.output.usage());
    frames += SseJsonFrame(UsageChunk(meta_, CombinedUsage(usages)));
  }
  frames += SseDone();
  return frames;
}

}  // namespace kestrel::server
