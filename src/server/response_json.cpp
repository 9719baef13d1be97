#include "server/response_json.h"

#include <chrono>
#include <cmath>

#include "tokenizer/unicode.h"

namespace kestrel::server {
namespace {

double FiniteLogprob(float lp) {
  return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0;
}

Json BytesJson(const std::string& bytes) {
  Json out = Json::array();
  for (char c : bytes) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The fields every object of a response starts with, in OpenAI's order.
Json Header(const ResponseMeta& meta, const char* object) {
  Json j = Json::object();
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

Json NullableReason(const char* finish_reason) {
  return finish_reason == nullptr ? Json() : Json(finish_reason);
}

}  // namespace

std::string NewResponseId(ApiKind kind) {
  return RandomId(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* FinishReasonText(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

const char* ChoiceFinishReason(const ChoiceOutput& choice) {
  return choice.ended_with_tool_calls() ? "tool_calls" : FinishReasonText(choice.finish_reason());
}

RequestUsage CombinedUsage(const std::vector<const RequestUsage*>& choices) {
  RequestUsage total;
  if (choices.empty()) return total;
  total.prompt_tokens = choices[0]->prompt_tokens;
  total.cached_tokens = choices[0]->cached_tokens;
  for (const RequestUsage* u : choices) total.completion_tokens += u->completion_tokens;
  return total;
}

Json UsageJson(const RequestUsage& usage) {
  Json j = Json::object();
  j["prompt_tokens"] = usage.prompt_tokens;
  j["completion_tokens"] = usage.completion_tokens;
  j["total_tokens"] = static_cast<int64_t>(usage.prompt_tokens) + usage.completion_tokens;
  j["prompt_tokens_details"] = Json{{"cached_tokens", usage.cached_tokens}};
  return j;
}

LogprobsBuilder::LogprobsBuilder(ApiKind kind, int32_t top_logprobs, TokenBytesFn token_bytes)
    : kind_(kind), top_logprobs_(top_logprobs), token_bytes_(std::move(token_bytes)) {
  Take();
}

void LogprobsBuilder::Add(const std::vector<SampleResult>& samples) {
  for (const SampleResult& s : samples) {
    const std::string bytes = token_bytes_(s.token);
    const std::string text = tok::Utf8Lossy(bytes);
    if (kind_ == ApiKind::kChat) {
      Json entry = Json::object();
      entry["token"] = text;
      entry["logprob"] = FiniteLogprob(s.logprob);
      entry["bytes"] = BytesJson(bytes);
      Json top = Json::array();
      for (size_t i = 0; i < s.top.size() && i < static_cast<size_t>(top_logprobs_); ++i) {
        const std::string alt_bytes = token_bytes_(s.top[i].token);
        Json alt = Json::object();
        alt["token"] = tok::Utf8Lossy(alt_bytes);
        alt["logprob"] = FiniteLogprob(s.top[i].logprob);
        alt["bytes"] = BytesJson(alt_bytes);
        top.push_back(std::move(alt));
      }
      entry["top_logprobs"] = std::move(top);
      entries_.push_back(std::move(entry));
    } else {
      tokens_.push_back(text);
      token_logprobs_.push_back(FiniteLogprob(s.logprob));
      if (top_logprobs_ > 0) {
        Json top = Json::object();
        for (size_t i = 0; i < s.top.size() && i < static_cast<size_t>(top_logprobs_); ++i) {
          top[tok::Utf8Lossy(token_bytes_(s.top[i].token))] = FiniteLogprob(s.top[i].logprob);
        }
        top_.push_back(std::move(top));
      } else {
        top_.push_back(nullptr);
      }
      offsets_.push_back(text_offset_);
      text_offset_ += CodePoints(text);
    }
  }
}

bool LogprobsBuilder::empty() const {
  return kind_ == ApiKind::kChat ? entries_.empty() : tokens_.empty();
}

Json LogprobsBuilder::Take() {
  Json out = Json::object();
  if (kind_ == ApiKind::kChat) {
    out["content"] = std::move(entries_);
    out["refusal"] = nullptr;
  } else {
    out["tokens"] = std::move(tokens_);
    out["token_logprobs"] = std::move(token_logprobs_);
    out["top_logprobs"] = std::move(top_);
    out["text_offset"] = std::move(offsets_);
  }
  entries_ = Json::array();
  tokens_ = Json::array();
  token_logprobs_ = Json::array();
  top_ = Json::array();
  offsets_ = Json::array();
  return out;
}

std::optional<ApiError> EventError(const RequestOutput& event) {
  if (!event.error.ok()) return FromStatus(event.error);
  if (event.finished && event.finish_reason == FinishReason::kCancelled) {
    return ServiceUnavailable("The request was cancelled: the server is shutting down");
  }
  return std::nullopt;
}

ResponseAccumulator::ResponseAccumulator(ResponseMeta meta, TokenBytesFn token_bytes)
    : meta_(std::move(meta)) {
  choices_.reserve(static_cast<size_t>(meta_.n_choices));
  for (int32_t i = 0; i < meta_.n_choices; ++i) {
    choices_.push_back(Choice{ChoiceOutput(meta_.parsing, "call_"),
                              LogprobsBuilder(meta_.kind, meta_.top_logprobs, token_bytes)});
  }
}

void ResponseAccumulator::Add(size_t index, const RequestOutput& event) {
  Choice& c = choices_.at(index);
  if (c.output.finished() || error_) return;
  c.output.Add(event);
  if (meta_.logprobs) c.logprobs.Add(event.samples);
  if (event.finished) {
    ++n_finished_;
    error_ = EventError(event);
  }
}

Json ResponseAccumulator::Build() {
  const bool chat = meta_.kind == ApiKind::kChat;
  Json j = Header(meta_, chat ? "chat.completion" : "text_completion");
  j["choices"] = Json::array();
  std::vector<const RequestUsage*> usages;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    Json choice = Json::object();
    choice["index"] = i;
    if (chat) {
      choice["message"] = ChatMessageJson(c.output);
    } else {
      choice["text"] = meta_.echo + c.output.message().content;
    }
    choice["logprobs"] = meta_.logprobs ? c.logprobs.Take() : Json();
    choice["finish_reason"] = ChoiceFinishReason(c.output);
    j["choices"].push_back(std::move(choice));
    usages.push_back(&c.output.usage());
  }
  j["usage"] = UsageJson(CombinedUsage(usages));
  return j;
}

Json ChatMessageJson(const ChoiceOutput& choice) {
  const ParsedMessage& m = choice.message();
  Json message = Json::object();
  message["role"] = "assistant";
  if (m.content.empty() && !m.tool_calls.empty()) {
    message["content"] = nullptr;
  } else {
    message["content"] = m.content;
  }
  if (!m.reasoning.empty()) message["reasoning_content"] = m.reasoning;
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      Json call = Json::object();
      call["id"] = choice.tool_call_id(i);
      call["type"] = "function";
      call["function"] =
          Json{{"name", m.tool_calls[i].name}, {"arguments", m.tool_calls[i].arguments}};
      calls.push_back(std::move(call));
    }
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

Json ChatDeltaJson(const OutputPiece& piece, const ChoiceOutput& choice) {
  switch (piece.kind) {
    case OutputPiece::Kind::kReasoning:
      return Json{{"reasoning_content", piece.text}};
    case OutputPiece::Kind::kContent:
      return Json{{"content", piece.text}};
    case OutputPiece::Kind::kToolCall:
      break;
  }
  Json call = Json::object();
  call["index"] = piece.tool_index;
  if (piece.starts_call()) {
    call["id"] = choice.tool_call_id(static_cast<size_t>(piece.tool_index));
    call["type"] = "function";
    call["function"] = Json{{"name", piece.tool_name}, {"arguments", piece.text}};
  } else {
    call["function"] = Json{{"arguments", piece.text}};
  }
  return Json{{"tool_calls", Json::array({std::move(call)})}};
}

Json ChatChunk(const ResponseMeta& meta, Json delta, Json logprobs, const char* finish_reason,
               size_t index) {
  Json j = Header(meta, "chat.completion.chunk");
  Json choice = Json::object();
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = NullableReason(finish_reason);
  j["choices"] = Json::array({std::move(choice)});
  if (meta.include_usage) j["usage"] = nullptr;
  return j;
}

Json CompletionChunk(const ResponseMeta& meta, const std::string& text, Json logprobs,
                     const char* finish_reason, size_t index) {
  Json j = Header(meta, "text_completion");
  Json choice = Json::object();
  choice["index"] = index;
  choice["text"] = text;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = NullableReason(finish_reason);
  j["choices"] = Json::array({std::move(choice)});
  if (meta.include_usage) j["usage"] = nullptr;
  return j;
}

Json UsageChunk(const ResponseMeta& meta, const RequestUsage& usage) {
  Json j = Header(meta, meta.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = Json::array();
  j["usage"] = UsageJson(usage);
  return j;
}

}  // namespace kestrel::server
