// OpenAI-style API errors: {"error": {"message", "type", "param", "code"}} with an HTTP status.
// Every bad request becomes one of these at the server boundary; nothing a client sends is
// allowed to reach a KCHECK.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::server {

struct ApiError {
  int status = 400;                            // HTTP status code
  std::string type = "invalid_request_error";  // OpenAI error type
  std::string message;
  std::string param;  // the offending request field ("" = null)
  std::string code;   // machine-readable code ("" = null)
};

// 400 invalid_request_error naming `param`.
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");
ApiError NotFoundError(std::string message, std::string code = "");
ApiError MethodNotAllowed(const std::string& method, const std::string& path);
ApiError UnknownRoute(const std::string& method, const std::string& path);
ApiError Unauthorized(bool key_given);
ApiError PayloadTooLarge(size_t max_bytes);
ApiError ServiceUnavailable(std::string message);
ApiError InternalError(std::string message);
ApiError ModelNotFound(const std::string& model);

// The error object for a status httplib produced itself (bad request line, 414, 415, ...).
ApiError FromHttpStatus(int status);

// Maps an engine Status (Submit or a failure after admission) to an API error:
// InvalidArgument/OutOfRange -> 400, ResourceExhausted -> 429, Unavailable/Cancelled -> 503,
// anything else -> 500. `param` names the field an InvalidArgument most likely refers to.
ApiError FromStatus(const Status& status, const std::string& param = "");

nlohmann::ordered_json ErrorJson(const ApiError& e);
std::string ErrorBody(const ApiError& e);  // ErrorJson serialized

// Error bodies differ per API family: OpenAI's {"error": {message, type, param, code}}, or
// Anthropic's {"type": "error", "error": {"type", "message"}} on /v1/messages, whose type follows
// the status (invalid_request_error, authentication_error, not_found_error, request_too_large,
// rate_limit_error, api_error, overloaded_error).
enum class ErrorStyle { kOpenAI, kAnthropic };
const char* AnthropicErrorType(int status);
nlohmann::ordered_json AnthropicErrorJson(const ApiError& e);
nlohmann::ordered_json StyledErrorJson(const ApiError& e, ErrorStyle style);

// JSON text that never throws: invalid UTF-8 becomes U+FFFD, non-ASCII is kept raw.
std::string Dump(const nlohmann::ordered_json& j);

}  // namespace kestrel::server
