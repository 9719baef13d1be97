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

RequestUsage StreamEncoder::UsageSoFar() const {
  std::vector<const RequestUsage*> usages;
  for (const Choice& ch : choices_) usages.push_back(&ch.output.usage());
  return CombinedUsage(usages);
}

std::string StreamEncoder::Add(size_t index, const RequestOutput& event) {
  if (finished_) return "";
  Choice& c = choices_.at(index);
  if (c.output.finished()) return "";
  std::vector<Json> chunks;
  const OutputPieces& pieces = c.output.Add(event);
  if (meta_.logprobs) c.logprobs.Add(event.samples);
  // The event's logprobs travel with its first chunk.
  Json lp = meta_.logprobs && !c.logprobs.empty() ? c.logprobs.Take() : Json();
  const bool chat = meta_.kind == ApiKind::kChat;
  for (const OutputPiece& piece : pieces) {
    chunks.push_back(chat ? ChatChunk(meta_, ChatDeltaJson(piece, c.output), std::move(lp),
                                      nullptr, index)
                          : CompletionChunk(meta_, piece.text, std::move(lp), nullptr, index));
    lp = Json();
  }
  // An event that only carries logprobs, or (with continuous usage) tokens whose text is held
  // back, still gets a chunk.
  const bool token_chunk = meta_.continuous_usage && !event.token_ids.empty() && !event.finished;
  if (chunks.empty() && (!lp.is_null() || token_chunk)) {
    chunks.push_back(chat ? ChatChunk(meta_, Json{{"content", ""}}, std::move(lp), nullptr, index)
                          : CompletionChunk(meta_, "", std::move(lp), nullptr, index));
  }
  // The chunks as frames (with continuous usage, each carrying the usage so far).
  std::string frames;
  auto emit = [&] {
    if (meta_.continuous_usage && !chunks.empty()) {
      const Json usage = UsageJson(UsageSoFar());
      for (Json& chunk : chunks) chunk["usage"] = usage;
    }
    for (const Json& chunk : chunks) frames += SseJsonFrame(chunk);
    chunks.clear();
  };
  if (!event.finished) {
    emit();
    return frames;
  }

  if (std::optional<ApiError> error = EventError(event)) {
    emit();
    finished_ = true;
    return frames + SseErrorFrames(*error);
  }
  const char* reason = ChoiceFinishReason(c.output);
  chunks.push_back(chat ? ChatChunk(meta_, Json::object(), nullptr, reason, index)
                        : CompletionChunk(meta_, "", nullptr, reason, index));
  emit();
  if (++n_finished_ < choices_.size()) return frames;

  finished_ = true;
  if (meta_.include_usage) frames += SseJsonFrame(UsageChunk(meta_, UsageSoFar()));
  frames += SseDone();
  return frames;
}

}  // namespace kestrel::server
