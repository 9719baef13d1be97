// The OpenAI-compatible HTTP server (transport): routes, limits, authentication, error
// mapping, and the drain/stop sequence of a graceful shutdown. Requests are parsed by
// openai_request.h, run on the Engine, and answered by response_json.h / sse.h.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (+ GET and
// DELETE /v1/responses/{id}), POST /v1/messages (Anthropic; + /v1/messages/count_tokens),
// GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics. See docs/server.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "sampling/sampler.h"
#include "server/http_transport.h"
#include "server/parsers/output_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0 = any free port (see HttpServer::port)
  std::string api_key;  // non-empty: /v1/* needs "Authorization: Bearer KEY" (or x-api-key)
  bool protect_metrics = false;             // with api_key: /metrics needs the key too
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413
  int n_http_threads = 64;                  // connections served at once (streams hold one each)
  int max_pending_connections = 256;        // accepted, waiting for a thread; then accept waits
  int read_timeout_s = 10;                  // per read of a request body
  int write_timeout_s = 30;                 // per write of a response
  int keep_alive_timeout_s = 5;
  int keep_alive_max_requests = 1000;
  TransportLimits transport;  // request-head deadline and size, listen backlog
  // How often a request waiting for tokens checks that its client is still connected.
  std::chrono::milliseconds poll_interval{50};
  // How the model writes tool calls and reasoning; nullopt: read from the chat template
  // (DetectOutputFormats).
  std::optional<ToolCallFormat> tool_call_format;
  std::optional<bool> reasoning;
  size_t max_stored_responses = 1024;  // /v1/responses kept for previous_response_id (LRU)
};

// The model as the API shows it.
struct ServedModel {
  std::string id;                    // --served-model-name, else the directory name
  std::vector<std::string> aliases;  // also accepted in a request's "model" (the directory name)
  int64_t created = 0;               // Unix seconds (server start)
  int64_t context_tokens = 0;        // prompt + completion limit: min(context length, KV pool)
  int32_t vocab_size = 0;
  SamplingParams defaults;  // generation_config.json
};

class HttpServer {
 public:
  // chat_template may be null (a model without one): chat requests then get a 400.
  HttpServer(Engine* engine, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
             ServedModel model, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status Bind();  // binds host:port (the port in use is then port())
  int port() const;
  void Run();            // blocks, serving, until Stop()
  bool running() const;  // false once Run has returned (after Stop, or a failed accept loop)

  // How the served model's tool calls and reasoning are parsed (detected or set).
  OutputFormats output_formats() const;

  // Graceful shutdown, in order: BeginDrain (new requests get 503, /health 503), wait for
  // active_requests() to reach 0 (or CancelActive after a grace period), then Stop.
  void BeginDrain();
  size_t active_requests() const;
  void CancelActive();
  void Stop();

  struct State;  // shared by the transport and the generation handlers (server_state.h)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace kestrel::server
