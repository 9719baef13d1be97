#include "server/response_json.h"

#include <chrono>
#include <cmath>
#include <random>

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
  static constexpr char kAlphabet[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* FinishReasonText(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
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
    : meta_(std::move(meta)), logprobs_(meta_.kind, meta_.top_logprobs, std::move(token_bytes)) {}

void ResponseAccumulator::Add(const RequestOutput& event) {
  text_ += event.text;
  if (meta_.logprobs) logprobs_.Add(event.samples);
  if (event.finished) {
    finished_ = true;
    finish_reason_ = event.finish_reason;
    usage_ = event.usage;
    error_ = EventError(event);
  }
}

Json ResponseAccumulator::Build() {
  const bool chat = meta_.kind == ApiKind::kChat;
  Json j = Header(meta_, chat ? "chat.completion" : "text_completion");
  Json choice = Json::object();
  choice["index"] = 0;
  if (chat) {
    choice["message"] = Json{{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  choice["logprobs"] = meta_.logprobs ? logprobs_.Take() : Json();
  choice["finish_reason"] = FinishReasonText(finish_reason_);
  j["choices"] = Json::array({std::move(choice)});
  j["usage"] = UsageJson(usage_);
  return j;
}

Json ChatChunk(const ResponseMeta& meta, Json delta, Json logprobs, const char* finish_reason) {
  Json j = Header(meta, "chat.completion.chunk");
  Json choice = Json::object();
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = NullableReason(finish_reason);
  j["choices"] = Json::array({std::move(choice)});
  if (meta.include_usage) j["usage"] = nullptr;
  return j;
}

Json CompletionChunk(const ResponseMeta& meta, const std::string& text, Json logprobs,
                     const char* finish_reason) {
  Json j = Header(meta, "text_completion");
  Json choice = Json::object();
  choice["index"] = 0;
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
