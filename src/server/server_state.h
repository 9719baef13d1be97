// Internal to src/server: the state the transport (http_server.cpp) and the generation
// handlers (generation.cpp) share, and the helpers both use to answer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <httplib.h>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/http_transport.h"
#include "server/openai_request.h"
#include "server/prometheus.h"
#include "server/response_json.h"

namespace kestrel::server {

// Engine requests in flight, so that a shutdown can wait for them or cancel them.
class ActiveRequests {
 public:
  uint64_t Add(std::shared_ptr<RequestHandle> handle);
  void Remove(uint64_t id);
  size_t size() const;
  void CancelAll();

 private:
  mutable std::mutex mu_;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<RequestHandle>> handles_;
};

struct HttpServer::State {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  ServedModel model;
  ServerOptions options;
  ParseContext parse_context;
  HttpTransport http;  // httplib under Kestrel's connection layer
  HttpCounters counters;
  ActiveRequests active;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};  // Stop() called: waiting handlers give up
  std::atomic<bool> running{false};
  int bound_port = -1;
};

void SendJson(httplib::Response& res, int status, const Json& body);
void SendError(httplib::Response& res, const ApiError& error);

// POST /v1/chat/completions and /v1/completions, after the body was read and the client
// authenticated: parse, build the prompt, submit, answer (JSON or SSE).
void HandleGeneration(HttpServer::State& state, ApiKind kind, const std::string& body,
                      httplib::Response& res);

}  // namespace kestrel::server
