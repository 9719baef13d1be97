// OpenAI request schemas: parsing and validation of /v1/chat/completions and /v1/completions
// bodies into what the engine needs. Pure functions (no engine, no HTTP), so every field and
// every error is unit-tested.
//
// Conventions (as the OpenAI API and vLLM behave):
//   - unknown fields are ignored; a field set to null is the same as an omitted one;
//   - a field of the wrong type is a 400 whose `param` names the field ("messages[2].content");
//   - integer fields accept integral numbers written as floats (5.0), not 5.5 or "5";
//   - omitted sampling fields take the model's generation_config.json defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/sampler.h"
#include "server/api_error.h"

namespace kestrel::server {

using Json = nlohmann::ordered_json;  // keeps the client's key order (tool schemas are printed)

// What the parsers need to know about the served model.
struct ParseContext {
  SamplingParams defaults;  // generation_config.json (DefaultSampling)
  int32_t vocab_size = 0;   // logit_bias and prompt token ids are checked against it
  std::vector<std::string> accepted_models;  // "model" must be one of these (or omitted)
};

// Choices per request (`n`): each is its own engine sequence (they share the prompt's cached
// blocks).
inline constexpr int64_t kMaxChoices = 16;

// The grammar a chat or completion request's output must follow (response_format /
// structured_outputs; ParseOutputConstraint in structured_output.h).
struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kNone;
  std::string text;                  // the schema (as sent), the regex or the GBNF text
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the request field it came from (for errors)
};

// Fields shared by both endpoints.
struct GenerationOptions {
  std::string model;                  // as sent ("" when omitted)
  SamplingParams sampling;            // validated (ValidateSamplingParams)
  bool seed_given = false;            // false: the caller draws a random seed
  std::optional<int64_t> max_tokens;  // >= 1 when set; default: the rest of the context
  std::vector<std::string> stop;      // validated (StopMatcher::Validate)
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM extension, with include_usage): every chunk
  // carries the usage so far, and every sampled token gets a chunk (empty text while a partial
  // UTF-8 sequence or a possible stop string holds the text back).
  bool continuous_usage = false;
  bool ignore_eos = false;      // vLLM extension
  int32_t n = 1;                // choices, 1..kMaxChoices
  OutputConstraint constraint;  // response_format / structured_outputs
};

// What the model may or must call (`tool_choice`). kRequired and kFunction are validated (a
// named function must be one of the tools) and enforced by a forced tool-call grammar
// (AttachGrammar, server_state.h).
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: the name
};

struct ChatRequest {
  GenerationOptions options;
  Json messages;  // normalized for the chat template (content as a string, arguments parsed)
  Json tools;     // null or the array as sent (validated)
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;        // false: only the first tool call of a message is kept
  Json template_kwargs = Json::object();  // chat_template_kwargs
  bool add_generation_prompt = true;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

struct CompletionRequest {
  GenerationOptions options;
  std::variant<std::string, std::vector<int32_t>> prompt;
  std::optional<int32_t> logprobs;  // number of alternatives (0..20) when set
  bool echo = false;                // the prompt's text is prepended to each choice's text
};

// Bytes of a request body -> JSON object. 400 for invalid UTF-8, nesting deeper than
// kMaxJsonDepth, malformed JSON, or a top level that is not an object.
inline constexpr int kMaxJsonDepth = 64;
std::optional<ApiError> ParseJsonBody(std::string_view body, Json* out);

std::optional<ApiError> ParseChatRequest(const Json& body, const ParseContext& ctx,
                                         ChatRequest* out);
std::optional<ApiError> ParseCompletionRequest(const Json& body, const ParseContext& ctx,
                                               CompletionRequest* out);

// The completion budget of a request whose prompt has n_prompt_tokens, for a model with
// context_tokens positions (the smaller of the context length and the KV pool):
// 400 context_length_exceeded when the prompt leaves no room, or when an explicit max_tokens
// does not fit; the rest of the context when max_tokens is omitted. `prompt_param` names the
// field in the error ("messages" or "prompt").
std::variant<int32_t, ApiError> ResolveMaxTokens(int64_t n_prompt_tokens,
                                                 std::optional<int64_t> max_tokens,
                                                 int64_t context_tokens,
                                                 const std::string& prompt_param);

// An OpenAI chat `tools` array: [{"type": "function", "function": {"name": non-empty string,
// "description"?: string, "parameters"?: object, "strict"?: bool}}], names unique. `param` names
// the field in errors ("tools").
std::optional<ApiError> ValidateTools(const Json& tools, const std::string& param);
// The names of the functions of a validated tools array.
std::vector<std::string> ToolNames(const Json& tools);
// A kFunction choice must name one of the tools; kRequired needs at least one tool.
std::optional<ApiError> ValidateToolChoice(const ToolChoice& choice, const Json& tools,
                                           const std::string& param);

namespace detail {
// Shared field readers (request_fields.cpp), exposed for chat_request.cpp and
// completion_request.cpp. Each returns an error naming `param` when the field has the wrong
// type or range; a missing or null field leaves *out untouched.
std::optional<ApiError> ReadBool(const Json& obj, const char* key, const std::string& param,
                                 bool* out);
std::optional<ApiError> IntValue(const Json& value, const std::string& param, int64_t min_value,
                                 int64_t max_value, int64_t* out);
std::optional<ApiError> ReadInt(const Json& obj, const char* key, const std::string& param,
                                int64_t min_value, int64_t max_value, std::optional<int64_t>* out);
std::optional<ApiError> ReadString(const Json& obj, const char* key, const std::string& param,
                                   std::optional<std::string>* out);
// "'param' must be <expected>, got <type>" (400 naming param).
ApiError WrongType(const std::string& param, const char* expected, const Json& got);
// "base[i]": the parameter name of an array element.
std::string Index(const std::string& base, size_t i);
// "'param' is required" (400 naming param).
ApiError Required(const std::string& param);
// The string forms of tool_choice: "auto", "none", "required"; false for anything else.
bool ToolChoiceModeOf(const std::string& text, ToolChoice::Mode* mode);
// model, sampling fields, max_tokens / max_completion_tokens, stop, n, stream, stream_options,
// ignore_eos, response_format, user. Logprob fields differ per endpoint and are read by the
// callers.
// max_completion_tokens wins over max_tokens when both are set (as in vLLM).
std::optional<ApiError> ParseCommonFields(const Json& body, const ParseContext& ctx,
                                          GenerationOptions* out);
// Final check of the sampling parameters (after the endpoint has set the logprob fields).
std::optional<ApiError> ValidateSampling(const SamplingParams& params, int32_t vocab_size);
const char* TypeName(const Json& j);  // "string", "number", ... for error messages
}  // namespace detail

}  // namespace kestrel::server
