// Internal to src/server: the state the transport (http_server.cpp) and the generation
// handlers (generation.cpp) share, and the helpers both use to answer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <httplib.h>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/http_transport.h"
#include "server/openai_request.h"
#include "server/prometheus.h"
#include "server/response_json.h"
#include "server/structured_output.h"
#include "server/response_store.h"

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
  OutputFormats formats;  // how the model writes tool calls and reasoning
  std::unique_ptr<GrammarCache> grammars;  // structured output (response_format, tool_choice)
  std::unique_ptr<ResponseStore> responses;
  HttpTransport http;  // httplib under Kestrel's connection layer
  HttpCounters counters;
  ActiveRequests active;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};  // Stop() called: waiting handlers give up
  std::atomic<bool> running{false};
  int bound_port = -1;
};

void SendJson(httplib::Response& res, int status, const Json& body);
void SendError(httplib::Response& res, const ApiError& error,
               ErrorStyle style = ErrorStyle::kOpenAI);

// Turns the engine events of a request's choices into the bytes of its answer: SSE frames as
// they come (streaming) or one body at the end. Pure; one implementation per API.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual std::string Begin() = 0;  // written first (e.g. role chunks); may be empty
  // The bytes an event of choice `choice` adds (possibly none).
  virtual std::string Add(size_t choice, const RequestOutput& event) = 0;
  // Everything is written (every choice ended, or one failed).
  virtual bool finished() const = 0;
};

// A request ready to run: one engine request per choice, and its writer.
struct Generation {
  std::vector<EngineRequest> requests;
  std::unique_ptr<ResponseWriter> writer;
  bool stream = false;
  std::string prompt_param;  // names the prompt in an error of Submit
  ErrorStyle error_style = ErrorStyle::kOpenAI;
};

// Submits every choice and answers through the writer (chunked, with disconnect checks), or
// sends the error of a refused submission.
void RunGeneration(HttpServer::State& state, Generation generation, httplib::Response& res);

// A chat request's prompt ids and how its output is parsed: tools are rendered unless
// tool_choice is none, tool calls are parsed when tools are rendered, reasoning when the model
// writes it (starting inside <think> when the prompt opened it).
struct ChatPrompt {
  std::vector<int32_t> ids;
  OutputParserOptions parsing;
};
std::variant<ChatPrompt, ApiError> BuildChatPrompt(const HttpServer::State& state,
                                                   const ChatRequest& request);

// One engine request per choice (n): max_tokens resolved against the context, seeds drawn or
// derived (seed + i) so that sampled choices differ.
std::variant<std::vector<EngineRequest>, ApiError> MakeEngineRequests(
    const HttpServer::State& state, std::vector<int32_t> prompt_ids,
    const GenerationOptions& options, const std::string& prompt_param);

// The endpoints, after the body was read and the client authenticated.
// The grammar a request's output must follow (structured_output.h), set on every choice's
// engine request: `constraint` from response_format / structured_outputs, or a forced tool call
// (chat: tool_choice required / named). Both at once is a 400.
std::optional<ApiError> AttachGrammar(HttpServer::State& state, const OutputConstraint& constraint,
                                      const ChatRequest* chat,
                                      std::vector<EngineRequest>* requests);

void HandleChat(HttpServer::State& state, const std::string& body, httplib::Response& res);
void HandleCompletion(HttpServer::State& state, const std::string& body, httplib::Response& res);
void HandleAnthropicMessages(HttpServer::State& state, const std::string& body,
                             httplib::Response& res);
void HandleAnthropicCountTokens(HttpServer::State& state, const std::string& body,
                                httplib::Response& res);
void HandleResponses(HttpServer::State& state, const std::string& body, httplib::Response& res);
void HandleGetResponse(HttpServer::State& state, const std::string& id, httplib::Response& res);
void HandleDeleteResponse(HttpServer::State& state, const std::string& id, httplib::Response& res);

}  // namespace kestrel::server
