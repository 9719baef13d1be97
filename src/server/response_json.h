// OpenAI response objects built from engine events: chat.completion / text_completion bodies,
// their streaming chunks, usage and logprobs. Pure (no HTTP), so the shapes are unit-tested.
//
// A request has n choices (one engine sequence each), answered in the order their events come.
// Chat output goes through the output parser (choice_output.h): `reasoning_content`, `content`
// and `tool_calls` (ids "call_...", finish_reason "tool_calls"), streamed as deltas the way the
// OpenAI SDK accumulates them: a call's first delta carries index, id, type and name, later ones
// argument fragments.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/choice_output.h"
#include "server/openai_request.h"

namespace kestrel::server {

enum class ApiKind { kChat, kCompletion };

// What every object of one response repeats, and how logprobs are reported.
struct ResponseMeta {
  ApiKind kind = ApiKind::kChat;
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;       // chat: logprobs; completions: logprobs set
  int32_t top_logprobs = 0;    // alternatives per token
  bool include_usage = false;  // streaming: usage chunk at the end, "usage": null before
  bool continuous_usage = false;  // streaming, with include_usage: the usage so far in every chunk
  int32_t n_choices = 1;
  OutputParserOptions parsing;  // chat: how reasoning and tool calls are read from the text
  std::string echo;             // completions: prompt text shown before each choice's text
};

// Raw bytes of a token (may be a partial UTF-8 sequence); Tokenizer::TokenBytes in the server.
using TokenBytesFn = std::function<std::string(int32_t)>;

std::string NewResponseId(ApiKind kind);  // random, "chatcmpl-" / "cmpl-" + 24 alphanumerics
int64_t UnixSeconds();
// "stop" or "length" (a cancelled request has no finish reason a client can see).
const char* FinishReasonText(FinishReason reason);
// The finish reason of a choice: "tool_calls" when it stopped after calling tools.
const char* ChoiceFinishReason(const ChoiceOutput& choice);
Json UsageJson(const RequestUsage& usage);
// The usage of n choices of one prompt: the prompt (and its cached tokens) counted once, as
// OpenAI does, from the first choice; completion tokens summed.
RequestUsage CombinedUsage(const std::vector<const RequestUsage*>& choices);

// Logprobs of a run of tokens in the endpoint's format:
//   chat:        {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
//                 "refusal": null}
//   completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob} | null],
//                 "text_offset"}  (offsets in code points of the generated text)
// A -inf log-probability (a banned token) is reported as -9999.0, as OpenAI does.
class LogprobsBuilder {
 public:
  LogprobsBuilder(ApiKind kind, int32_t top_logprobs, TokenBytesFn token_bytes);
  // Appends the tokens of one event to the current run.
  void Add(const std::vector<SampleResult>& samples);
  // The run so far as JSON, then starts a new run (text offsets keep counting).
  Json Take();
  bool empty() const;

 private:
  ApiKind kind_;
  int32_t top_logprobs_;
  TokenBytesFn token_bytes_;
  Json entries_;                                  // chat: the "content" array
  Json tokens_, token_logprobs_, top_, offsets_;  // completions: parallel arrays
  int64_t text_offset_ = 0;
};

// Collects the events of a non-streaming request into its response body.
class ResponseAccumulator {
 public:
  ResponseAccumulator(ResponseMeta meta, TokenBytesFn token_bytes);
  void Add(const RequestOutput& event) { Add(0, event); }
  void Add(size_t choice, const RequestOutput& event);
  // Every choice has finished, or one failed.
  bool finished() const { return error_.has_value() || n_finished_ == choices_.size(); }
  // After a failed event: its error.
  const std::optional<ApiError>& error() const { return error_; }
  Json Build();  // chat.completion or text_completion

 private:
  struct Choice {
    ChoiceOutput output;
    LogprobsBuilder logprobs;
  };
  ResponseMeta meta_;
  std::vector<Choice> choices_;
  size_t n_finished_ = 0;
  std::optional<ApiError> error_;
};

// The error a finished event stands for: its Status, or a cancellation (which only the server
// causes while a client listens: shutdown after the grace period). nullopt for a normal finish.
std::optional<ApiError> EventError(const RequestOutput& event);

// The assistant message of a chat choice: content (null when the message is only tool calls),
// reasoning_content and tool_calls when there are any.
Json ChatMessageJson(const ChoiceOutput& choice);
// The delta of one output piece of choice output (a tool call's first delta: index, id, type,
// name and the first fragment; later ones: index and the fragment).
Json ChatDeltaJson(const OutputPiece& piece, const ChoiceOutput& choice);

// Streaming chunks of choice `index`; `logprobs` null or the builder's run.
Json ChatChunk(const ResponseMeta& meta, Json delta, Json logprobs, const char* finish_reason,
               size_t index = 0);
Json CompletionChunk(const ResponseMeta& meta, const std::string& text, Json logprobs,
                     const char* finish_reason, size_t index = 0);
Json UsageChunk(const ResponseMeta& meta, const RequestUsage& usage);

}  // namespace kestrel::server
