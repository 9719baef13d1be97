#include "server/api_error.h"

#include <utility>

namespace kestrel::server {
namespace {

ApiError Make(int status, std::string type, std::string message, std::string param,
              std::string code) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

}  // namespace

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return Make(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

ApiError NotFoundError(std::string message, std::string code) {
  return Make(404, "invalid_request_error", std::move(message), "", std::move(code));
}

ApiError MethodNotAllowed(const std::string& method, const std::string& path) {
  return Make(405, "invalid_request_error", "Method " + method + " is not allowed on " + path, "",
              "method_not_allowed");
}

ApiError UnknownRoute(const std::string& method, const std::string& path) {
  return Make(404, "invalid_request_error", "Invalid URL (" + method + " " + path + ")", "",
              "unknown_url");
}

ApiError Unauthorized(bool key_given) {
  return Make(401, "invalid_request_error",
              key_given ? "Incorrect API key provided."
                        : "You didn't provide an API key. Pass it in the Authorization header "
                          "(Authorization: Bearer YOUR_KEY) or the x-api-key header.",
              "", "invalid_api_key");
}

ApiError PayloadTooLarge(size_t max_bytes) {
  return Make(413, "invalid_request_error",
              "The request body exceeds the limit of " + std::to_string(max_bytes) + " bytes", "",
              "request_too_large");
}

ApiError ServiceUnavailable(std::string message) {
  return Make(503, "server_error", std::move(message), "", "service_unavailable");
}

ApiError InternalError(std::string message) {
  return Make(500, "server_error", std::move(message), "", "internal_error");
}

ApiError ModelNotFound(const std::string& model) {
  return Make(404, "invalid_request_error",
              "The model '" + model + "' does not exist or you do not have access to it.", "model",
              "model_not_found");
}

ApiError FromHttpStatus(int status) {
  switch (status) {
    case 400:
      return BadRequest("Malformed HTTP request");
    case 404:
      return Make(404, "invalid_request_error", "Not found", "", "unknown_url");
    case 413:
      return Make(413, "invalid_request_error", "The request body is too large", "",
                  "request_too_large");
    case 414:
      return Make(414, "invalid_request_error", "The request URI is too long", "", "");
    case 415:
      return Make(415, "invalid_request_error", "Unsupported Content-Encoding", "", "");
    case 416:
      return Make(416, "invalid_request_error", "Invalid Range header", "", "");
    default:
      break;
  }
  if (status >= 500) return InternalError("Internal server error");
  return Make(status, "invalid_request_error", "HTTP error " + std::to_string(status), "", "");
}

ApiError FromStatus(const Status& status, const std::string& param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return BadRequest(status.message(), param);
    case StatusCode::kResourceExhausted:
      return Make(429, "rate_limit_error",
                  "The server is at capacity (" + status.message() + "); retry later", "",
                  "rate_limit_exceeded");
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled:
      return ServiceUnavailable(status.message());
    default:
      return InternalError(status.message());
  }
}

nlohmann::ordered_json ErrorJson(const ApiError& e) {
  nlohmann::ordered_json inner;
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.param);
  inner["code"] = e.code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.code);
  nlohmann::ordered_json out;
  out["error"] = std::move(inner);
  return out;
}

std::string ErrorBody(const ApiError& e) {
  return Dump(ErrorJson(e));
}

const char* AnthropicErrorType(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::ordered_json AnthropicErrorJson(const ApiError& e) {
  nlohmann::ordered_json inner;
  inner["type"] = AnthropicErrorType(e.status);
  inner["message"] = e.message;
  nlohmann::ordered_json out;
  out["type"] = "error";
  out["error"] = std::move(inner);
  return out;
}

nlohmann::ordered_json StyledErrorJson(const ApiError& e, ErrorStyle style) {
  return style == ErrorStyle::kAnthropic ? AnthropicErrorJson(e) : ErrorJson(e);
}

std::string Dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace kestrel::server
