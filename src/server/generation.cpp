// The two generation endpoints: request -> prompt ids -> Engine::Submit -> events -> the
// response, as one JSON body or as SSE. Both answers go through httplib's chunked content
// provider, so that a waiting handler notices a client that went away (the socket stops being
// writable) and cancels its engine request within one poll interval; the engine then frees the
// sequence within one step.
#include <chrono>
#include <random>
#include <variant>

#include "server/server_state.h"
#include "server/sse.h"

namespace kestrel::server {
namespace {

using PromptIds = std::vector<int32_t>;

std::variant<PromptIds, ApiError> ChatPromptIds(const HttpServer::State& s,
                                                const ChatRequest& req) {
  if (s.chat_template == nullptr) {
    return BadRequest("This model has no chat template; use /v1/completions", "messages");
  }
  Result<std::string> rendered = s.chat_template->Render(
      req.messages, req.tools, req.add_generation_prompt, req.template_kwargs);
  if (!rendered.ok()) {
    return BadRequest("The chat template rejected the messages: " + rendered.status().message(),
                      "messages");
  }
  // The template writes the special tokens (BOS included) itself.
  return s.tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
}

std::variant<PromptIds, ApiError> CompletionPromptIds(const HttpServer::State& s,
                                                      const CompletionRequest& req) {
  if (const auto* ids = std::get_if<PromptIds>(&req.prompt)) return *ids;
  return s.tokenizer->Encode(std::get<std::string>(req.prompt), /*add_special_tokens=*/true);
}

// One admitted request and what answering it needs; owned by the content provider.
struct Job {
  HttpServer::State* state = nullptr;
  std::shared_ptr<RequestHandle> handle;
  uint64_t active_id = 0;
  bool started = false;
  std::chrono::steady_clock::time_point last_client_check = std::chrono::steady_clock::now();
  std::unique_ptr<StreamEncoder> stream;         // streaming
  std::unique_ptr<ResponseAccumulator> collect;  // non-streaming
};

// Waits for the next event of the job's request. At least once per poll interval, whether
// events flow or not (a non-streaming answer writes nothing until the end), it checks that the
// client is still connected and that the server is not stopping. False: give up (the caller
// cancels).
bool WaitEvent(Job& job, httplib::DataSink& sink, RequestOutput* out) {
  const HttpServer::State& s = *job.state;
  for (;;) {
    const bool got = job.handle->Next(out, s.options.poll_interval);
    const auto now = std::chrono::steady_clock::now();
    if (!got || now - job.last_client_check >= s.options.poll_interval) {
      job.last_client_check = now;
      if (s.stopping.load() || !sink.is_writable()) return false;
    }
    if (got) return true;
  }
}

bool Write(httplib::DataSink& sink, const std::string& data) {
  return data.empty() || sink.write(data.data(), data.size());
}

// One call of the chunked content provider: at most one event, written at once.
bool ProvideStream(Job& job, httplib::DataSink& sink) {
  if (!job.started) {
    job.started = true;
    return Write(sink, job.stream->Start());
  }
  RequestOutput event;
  if (!WaitEvent(job, sink, &event)) return false;
  if (!Write(sink, job.stream->Add(event))) return false;
  if (job.stream->finished()) sink.done();
  return true;
}

bool ProvideCollected(Job& job, httplib::DataSink& sink) {
  RequestOutput event;
  if (!WaitEvent(job, sink, &event)) return false;
  job.collect->Add(event);
  if (!job.collect->finished()) return true;
  // The status line (200) is already sent: a failure after admission is reported in the body.
  const std::optional<ApiError>& error = job.collect->error();
  if (!Write(sink, error ? ErrorBody(*error) : Dump(job.collect->Build()))) return false;
  sink.done();
  return true;
}

// Content providers run outside httplib's exception handling (while the response is written):
// an exception there (only bad_alloc is possible) ends the response instead of the process; the
// releaser then cancels the request.
template <class F>
bool Guarded(F&& provide) {
  try {
    return provide();
  } catch (const std::exception&) {
    return false;
  }
}

bool JobFinished(const Job& job) {
  return job.stream ? job.stream->finished() : job.collect->finished();
}

}  // namespace

uint64_t ActiveRequests::Add(std::shared_ptr<RequestHandle> handle) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  handles_.emplace(id, std::move(handle));
  return id;
}

void ActiveRequests::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  handles_.erase(id);
}

size_t ActiveRequests::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handles_.size();
}

void ActiveRequests::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, handle] : handles_) handle->Cancel();
}

void HandleGeneration(HttpServer::State& s, ApiKind kind, const std::string& body,
                      httplib::Response& res) {
  Json json;
  if (auto e = ParseJsonBody(body, &json)) return SendError(res, *e);

  const bool chat = kind == ApiKind::kChat;
  const std::string prompt_param = chat ? "messages" : "prompt";
  ChatRequest chat_req;
  CompletionRequest completion_req;
  std::variant<PromptIds, ApiError> ids;
  if (chat) {
    if (auto e = ParseChatRequest(json, s.parse_context, &chat_req)) return SendError(res, *e);
    ids = ChatPromptIds(s, chat_req);
  } else {
    if (auto e = ParseCompletionRequest(json, s.parse_context, &completion_req)) {
      return SendError(res, *e);
    }
    ids = CompletionPromptIds(s, completion_req);
  }
  if (const ApiError* e = std::get_if<ApiError>(&ids)) return SendError(res, *e);
  const GenerationOptions& options = chat ? chat_req.options : completion_req.options;

  EngineRequest request;
  request.prompt_ids = std::move(std::get<PromptIds>(ids));
  if (request.prompt_ids.empty()) {
    return SendError(res, BadRequest("The prompt is empty after tokenization", prompt_param));
  }
  std::variant<int32_t, ApiError> max_tokens =
      ResolveMaxTokens(static_cast<int64_t>(request.prompt_ids.size()), options.max_tokens,
                       s.model.context_tokens, prompt_param);
  if (const ApiError* e = std::get_if<ApiError>(&max_tokens)) return SendError(res, *e);
  request.max_new_tokens = std::get<int32_t>(max_tokens);
  request.sampling = options.sampling;
  if (!options.seed_given) {
    thread_local std::mt19937_64 seeds{std::random_device{}()};
    request.sampling.seed = seeds();
  }
  request.ignore_eos = options.ignore_eos;
  request.stop = options.stop;

  ResponseMeta meta;
  meta.kind = kind;
  meta.id = NewResponseId(kind);
  meta.created = UnixSeconds();
  meta.model = s.model.id;
  meta.logprobs = options.sampling.logprobs;
  meta.top_logprobs = options.sampling.n_top_logprobs;
  meta.include_usage = options.include_usage;
  const Tokenizer* tokenizer = s.tokenizer;
  TokenBytesFn token_bytes = [tokenizer](int32_t id) { return tokenizer->TokenBytes(id); };
  auto job = std::make_shared<Job>();
  job->state = &s;
  if (options.stream) {
    job->stream = std::make_unique<StreamEncoder>(std::move(meta), std::move(token_bytes));
  } else {
    job->collect = std::make_unique<ResponseAccumulator>(std::move(meta), std::move(token_bytes));
  }

  if (s.draining.load()) {
    return SendError(res, ServiceUnavailable("The server is shutting down"));
  }
  Result<std::shared_ptr<RequestHandle>> submitted = s.engine->Submit(std::move(request));
  if (!submitted.ok()) return SendError(res, FromStatus(submitted.status(), prompt_param));
  job->handle = std::move(submitted).value();
  job->active_id = s.active.Add(job->handle);

  // Runs when the response is destroyed, whatever happened: a request that did not run to its
  // end (client gone, write failed, server stopping) is cancelled so the engine frees it.
  auto release = [job](bool /*success*/) {
    if (!JobFinished(*job)) job->handle->Cancel();
    job->state->active.Remove(job->active_id);
  };
  res.status = 200;
  if (options.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // reverse proxies: do not buffer the stream
    res.set_chunked_content_provider(
        "text/event-stream",
        [job](size_t /*offset*/, httplib::DataSink& sink) {
          return Guarded([&] { return ProvideStream(*job, sink); });
        },
        release);
  } else {
    res.set_chunked_content_provider(
        "application/json",
        [job](size_t /*offset*/, httplib::DataSink& sink) {
          return Guarded([&] { return ProvideCollected(*job, sink); });
        },
        release);
  }
}

}  // namespace kestrel::server
