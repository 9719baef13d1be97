// Transport: httplib set-up, routes, body limits, authentication, the error mapping of
// everything httplib answers by itself (404/405/413/...), /health, /v1/models and /metrics.
#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "server/server_state.h"
#include "server/task_queue.h"

namespace kestrel::server {
namespace {

constexpr const char* kChatPath = "/v1/chat/completions";
constexpr const char* kCompletionsPath = "/v1/completions";
constexpr const char* kResponsesPath = "/v1/responses";
constexpr const char* kMessagesPath = "/v1/messages";
constexpr const char* kCountTokensPath = "/v1/messages/count_tokens";
constexpr const char* kModelsPath = "/v1/models";

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Known paths and the methods they take (for 405 and its Allow header).
const char* AllowedMethods(const std::string& path) {
  if (path == kChatPath || path == kCompletionsPath || path == kResponsesPath ||
      path == kMessagesPath || path == kCountTokensPath) {
    return "POST";
  }
  if (path == kModelsPath || path == "/health" || path == "/metrics") return "GET, HEAD";
  if (StartsWith(path, "/v1/models/") && path.size() > 11) return "GET, HEAD";
  if (StartsWith(path, "/v1/responses/") && path.size() > 14) return "GET, HEAD, DELETE";
  return nullptr;
}

// The route label of /metrics: the server's patterns only, never a client-chosen path.
std::string RouteLabel(const std::string& path) {
  if (path == kChatPath || path == kCompletionsPath || path == kResponsesPath ||
      path == kMessagesPath || path == kCountTokensPath || path == kModelsPath ||
      path == "/health" || path == "/metrics") {
    return path;
  }
  if (StartsWith(path, "/v1/models/")) return "/v1/models/{id}";
  if (StartsWith(path, "/v1/responses/")) return "/v1/responses/{id}";
  return "other";
}

// Anthropic clients get Anthropic-shaped errors on their routes.
ErrorStyle StyleOf(const std::string& path) {
  return StartsWith(path, kMessagesPath) ? ErrorStyle::kAnthropic : ErrorStyle::kOpenAI;
}

// Compares every byte whatever the first difference, so the time taken does not reveal how
// much of a guessed key was right (only its length).
bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool EqualsIgnoreCase(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// A POST body must be declared JSON: a "simple" cross-origin request from a browser (text/plain,
// form encodings) can be sent without a CORS preflight, so it must not be acted on.
std::optional<ApiError> CheckJsonContentType(const httplib::Request& req) {
  std::string type = req.get_header_value("Content-Type");
  type = type.substr(0, type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  if (EqualsIgnoreCase(type, "application/json")) return std::nullopt;
  ApiError e = BadRequest("Content-Type must be application/json" +
                          (type.empty() ? std::string() : ", not " + type));
  e.status = 415;
  return e;
}

// nullopt when the request may use /v1/*: the key as `Authorization: Bearer KEY` (OpenAI
// clients) or, without an Authorization header, `x-api-key: KEY` (Anthropic clients).
std::optional<ApiError> CheckAuth(const HttpServer::State& s, const httplib::Request& req) {
  if (s.options.api_key.empty()) return std::nullopt;
  // "Authorization: Bearer KEY" (the scheme is case-insensitive, RFC 9110 11.1); Anthropic
  // clients send "x-api-key: KEY".
  const std::string header = req.get_header_value("Authorization");
  std::string key;
  const size_t space = header.find(' ');
  if (space != std::string::npos && EqualsIgnoreCase(header.substr(0, space), "bearer")) {
    key = header.substr(header.find_first_not_of(' ', space));
  } else if (header.empty()) {
    key = req.get_header_value("x-api-key");
  }
  if (key.empty()) return Unauthorized(/*key_given=*/!header.empty());
  if (!ConstantTimeEqual(key, s.options.api_key)) return Unauthorized(/*key_given=*/true);
  return std::nullopt;
}

// Reads the body through the content reader, so that no encoding (chunked, gzip) can grow it
// past the limit: httplib checks Content-Length itself (413), the receiver checks the rest.
std::optional<ApiError> ReadBody(const HttpServer::State& s, httplib::Response& res,
                                 const httplib::ContentReader& reader, std::string* body) {
  const size_t limit = s.options.max_body_bytes;
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body->size() + n > limit) {
      too_large = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (too_large || res.status == 413) {
    // The rest of the body is unread: the connection cannot carry another request.
    res.set_header("Connection", "close");
    return PayloadTooLarge(limit);
  }
  if (!ok) {
    res.set_header("Connection", "close");
    return BadRequest("Could not read the request body");
  }
  return std::nullopt;
}

Json ModelObject(const ServedModel& m) {
  Json j = Json::object();
  j["id"] = m.id;
  j["object"] = "model";
  j["created"] = m.created;
  j["owned_by"] = "kestrel";
  j["max_model_len"] = m.context_tokens;
  return j;
}

bool IsServedName(const ServedModel& m, const std::string& name) {
  return name == m.id || std::find(m.aliases.begin(), m.aliases.end(), name) != m.aliases.end();
}

using Handler = void (*)(HttpServer::State&, const std::string&, httplib::Response&);

void RegisterRoutes(HttpServer::State& s) {
  httplib::Server& http = s.http;
  auto post = [&s](Handler handle) {
    return [&s, handle](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) {
      const ErrorStyle style = StyleOf(req.path);
      std::string body;
      if (auto e = ReadBody(s, res, reader, &body)) return SendError(res, *e, style);
      if (auto e = CheckAuth(s, req)) return SendError(res, *e, style);
      if (auto e = CheckJsonContentType(req)) return SendError(res, *e, style);
      if (s.draining.load()) {
        res.set_header("Connection", "close");
        return SendError(res, ServiceUnavailable("The server is shutting down"), style);
      }
      handle(s, body, res);
      // HTTP/1.0 has no chunked coding (RFC 9112 7.1): stream close-delimited instead.
      if (req.version == "HTTP/1.0" && res.is_chunked_content_provider_) {
        res.is_chunked_content_provider_ = false;
        res.set_header("Connection", "close");
      }
    };
  };
  http.Post(kChatPath, post(HandleChat));
  http.Post(kCompletionsPath, post(HandleCompletion));
  http.Post(kResponsesPath, post(HandleResponses));
  http.Post(kMessagesPath, post(HandleAnthropicMessages));
  http.Post(kCountTokensPath, post(HandleAnthropicCountTokens));
  http.Get(R"(/v1/responses/([^/]+))", [&s](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckAuth(s, req)) return SendError(res, *e);
    HandleGetResponse(s, req.matches[1], res);
  });
  http.Delete(R"(/v1/responses/([^/]+))", [&s](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& reader) {
    std::string body;
    if (auto e = ReadBody(s, res, reader, &body)) return SendError(res, *e);
    if (auto e = CheckAuth(s, req)) return SendError(res, *e);
    HandleDeleteResponse(s, req.matches[1], res);
  });

  http.Get(kModelsPath, [&s](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckAuth(s, req)) return SendError(res, *e);
    SendJson(res, 200, Json{{"object", "list"}, {"data", Json::array({ModelObject(s.model)})}});
  });
  http.Get(R"(/v1/models/(.+))", [&s](const httplib::Request& req, httplib::Response& res) {
    if (auto e = CheckAuth(s, req)) return SendError(res, *e);
    const std::string name = req.matches[1];
    if (!IsServedName(s.model, name)) return SendError(res, ModelNotFound(name));
    SendJson(res, 200, ModelObject(s.model));
  });
  http.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    if (s.draining.load()) return SendJson(res, 503, Json{{"status", "shutting_down"}});
    SendJson(res, 200, Json{{"status", "ok"}});
  });
  http.Get("/metrics", [&s](const httplib::Request& req, httplib::Response& res) {
    if (s.options.protect_metrics) {
      if (auto e = CheckAuth(s, req)) return SendError(res, *e);
    }
    res.status = 200;
    res.set_content(FormatPrometheus(s.engine->Metrics(), s.counters.Snapshot()),
                    "text/plain; version=0.0.4");
  });

  // Every other request with a body: read it (bounded) before answering, so the connection
  // stays in sync, then 401 / 404 / 405.
  auto unknown = [&s](const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader) {
    const ErrorStyle style = StyleOf(req.path);
    std::string body;
    if (auto e = ReadBody(s, res, reader, &body)) return SendError(res, *e, style);
    if (req.path.rfind("/v1/", 0) == 0) {
      if (auto e = CheckAuth(s, req)) return SendError(res, *e, style);
    }
    if (const char* allowed = AllowedMethods(req.path)) {
      res.set_header("Allow", allowed);
      return SendError(res, MethodNotAllowed(req.method, req.path), style);
    }
    SendError(res, UnknownRoute(req.method, req.path), style);
  };
  http.Post(".*", unknown);
  http.Put(".*", unknown);
  http.Patch(".*", unknown);
  http.Delete(".*", unknown);

  // What httplib answers by itself (no route for a GET/OPTIONS, malformed request, 413 on
  // Content-Length, ...) gets an OpenAI error body. Our own errors already have one.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [&s](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e = FromHttpStatus(res.status);
        if (res.status == 404) {
          std::optional<ApiError> auth;
          if (req.path.rfind("/v1/", 0) == 0) auth = CheckAuth(s, req);
          if (auth) {
            e = *auth;
          } else if (const char* allowed = AllowedMethods(req.path)) {
            res.set_header("Allow", allowed);
            e = MethodNotAllowed(req.method, req.path);
          } else {
            e = UnknownRoute(req.method, req.path);
          }
        }
        SendError(res, e, StyleOf(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        SendError(res, InternalError("Internal error: " + what), StyleOf(req.path));
      });
  http.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    s.counters.Record(RouteLabel(req.path), res.status);
  });
}

}  // namespace

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& error, ErrorStyle style) {
  // The engine's queue is full: a client may come back soon (RFC 9110 15.5.29 / 10.2.3).
  if (error.status == 429) res.set_header("Retry-After", "1");
  SendJson(res, error.status, StyledErrorJson(error, style));
}

HttpServer::HttpServer(Engine* engine, const Tokenizer* tokenizer,
                       const ChatTemplate* chat_template, ServedModel model, ServerOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.engine = engine;
  s.tokenizer = tokenizer;
  s.chat_template = chat_template;
  s.model = std::move(model);
  s.options = std::move(options);
  s.parse_context.defaults = s.model.defaults;
  s.parse_context.vocab_size = s.model.vocab_size;
  s.parse_context.accepted_models.push_back(s.model.id);
  for (const std::string& alias : s.model.aliases) s.parse_context.accepted_models.push_back(alias);
  if (chat_template != nullptr) s.formats = DetectOutputFormats(*chat_template);
  s.grammars = std::make_unique<GrammarCache>(tokenizer);
  if (s.options.tool_call_format) s.formats.tool_calls = *s.options.tool_call_format;
  if (s.options.reasoning) s.formats.reasoning = *s.options.reasoning;
  // Byte budget: 64 KiB per stored response on average, at least 64 MiB.
  s.responses = std::make_unique<ResponseStore>(
      s.options.max_stored_responses,
      std::max<size_t>(size_t{64} << 20, s.options.max_stored_responses * (size_t{64} << 10)));

  const ServerOptions& o = s.options;
  const size_t n_threads = static_cast<size_t>(std::max(o.n_http_threads, 1));
  const size_t max_pending = static_cast<size_t>(std::max(o.max_pending_connections, 1));
  // A connection that finds every thread busy and the queue full is answered 503 at once.
  s.http.new_task_queue = [n_threads, max_pending] {
    return new BoundedTaskQueue(n_threads, max_pending, [](std::function<void()>& job) {
      HttpTransport::RejectNextOnThisThread(true);
      job();
      HttpTransport::RejectNextOnThisThread(false);
    });
  };
  s.http.set_limits(o.transport);
  s.http.set_payload_max_length(o.max_body_bytes);
  s.http.set_read_timeout(o.read_timeout_s, 0);
  s.http.set_write_timeout(o.write_timeout_s, 0);
  s.http.set_keep_alive_timeout(o.keep_alive_timeout_s);
  s.http.set_keep_alive_max_count(static_cast<size_t>(std::max(o.keep_alive_max_requests, 1)));
  s.http.set_tcp_nodelay(true);  // stream tokens as they come, not when Nagle allows
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half of the connections. SO_REUSEADDR only allows a quick restart.
  s.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  RegisterRoutes(s);
}

HttpServer::~HttpServer() {
  Stop();
}

Status HttpServer::Bind() {
  State& s = *state_;
  errno = 0;
  if (s.options.port == 0) {
    s.bound_port = s.http.bind_to_any_port(s.options.host);
  } else if (s.http.bind_to_port(s.options.host, s.options.port)) {
    s.bound_port = s.options.port;
  }
  if (s.bound_port <= 0) {
    const int err = errno;  // left by the failed getaddrinfo/bind/listen
    s.bound_port = -1;
    return IoError("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                   (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  }
  s.http.RaiseBacklog();
  s.running.store(true);  // from here on, until Run returns
  return Status::Ok();
}

OutputFormats HttpServer::output_formats() const {
  return state_->formats;
}

int HttpServer::port() const {
  return state_->bound_port;
}

void HttpServer::Run() {
  state_->http.listen_after_bind();
  state_->running.store(false);
}

bool HttpServer::running() const {
  return state_->running.load();
}

void HttpServer::BeginDrain() {
  state_->draining.store(true);
}

size_t HttpServer::active_requests() const {
  return state_->active.size();
}

void HttpServer::CancelActive() {
  state_->active.CancelAll();
}

void HttpServer::Stop() {
  state_->stopping.store(true);
  state_->active.CancelAll();
  state_->http.stop();
}

}  // namespace kestrel::server
