// Running a generation for any API: prompt building for chat-shaped requests, one engine request
// per choice, Engine::Submit, then the events of every choice through the API's ResponseWriter,
// as one JSON body or as SSE. Both answers go through httplib's chunked content provider, so that
// a waiting handler notices a client that went away (the socket stops being writable) and
// cancels its engine requests within one poll interval; the engine then frees the sequences
// within one step. The OpenAI chat and completions endpoints are at the end of the file.
#include <chrono>
#include <random>
#include <variant>

#include "server/server_state.h"
#include "server/sse.h"

namespace kestrel::server {
namespace {

using PromptIds = std::vector<int32_t>;

// While several choices run, a waiting handler sleeps on one of them for at most this long
// before looking at the others (a single choice waits the whole poll interval).
constexpr std::chrono::milliseconds kChoiceSlice{2};

// One admitted request and what answering it needs; owned by the content provider.
struct Job {
  HttpServer::State* state = nullptr;
  std::vector<std::shared_ptr<RequestHandle>> handles;  // one per choice
  std::vector<uint64_t> active_ids;
  std::vector<bool> done;  // the choice's finished event was read
  size_t next = 0;         // round-robin start of the next wait
  bool started = false;
  std::chrono::steady_clock::time_point last_client_check = std::chrono::steady_clock::now();
  std::unique_ptr<ResponseWriter> writer;
};

// Takes the next event of any unfinished choice, in round-robin order so that none starves.
bool NextEvent(Job& job, std::chrono::milliseconds wait, size_t* choice, RequestOutput* out) {
  const size_t n = job.handles.size();
  size_t n_open = 0, first_open = n;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (job.next + k) % n;
    if (job.done[i]) continue;
    ++n_open;
    if (first_open == n) first_open = i;
    if (n > 1 && job.handles[i]->Next(out, std::chrono::milliseconds(0))) {
      *choice = i;
      job.next = (i + 1) % n;
      return true;
    }
  }
  if (n_open == 0) return false;
  const auto timeout = n_open == 1 ? wait : std::min(wait, kChoiceSlice);
  if (!job.handles[first_open]->Next(out, timeout)) return false;
  *choice = first_open;
  job.next = (first_open + 1) % n;
  return true;
}

// Waits for the next event of the job's choices. At least once per poll interval, whether
// events flow or not (a non-streaming answer writes nothing until the end), it checks that the
// client is still connected and that the server is not stopping. False: give up (the caller
// cancels).
bool WaitEvent(Job& job, httplib::DataSink& sink, size_t* choice, RequestOutput* out) {
  const HttpServer::State& s = *job.state;
  for (;;) {
    const bool got = NextEvent(job, s.options.poll_interval, choice, out);
    const auto now = std::chrono::steady_clock::now();
    if (now - job.last_client_check >= s.options.poll_interval) {
      job.last_client_check = now;
      if (s.stopping.load() || !sink.is_writable()) return false;
    }
    if (got) {
      if (out->finished) job.done[*choice] = true;
      return true;
    }
  }
}

bool Write(httplib::DataSink& sink, const std::string& data) {
  return data.empty() || sink.write(data.data(), data.size());
}

void CancelAll(Job& job) {
  for (auto& handle : job.handles) handle->Cancel();
}

// One call of the chunked content provider: at most one event, written at once.
bool Provide(Job& job, httplib::DataSink& sink) {
  if (!job.started) {
    job.started = true;
    return Write(sink, job.writer->Begin());
  }
  size_t choice = 0;
  RequestOutput event;
  if (!WaitEvent(job, sink, &choice, &event)) return false;
  if (!Write(sink, job.writer->Add(choice, event))) return false;
  if (job.writer->finished()) {
    CancelAll(job);  // choices still running after a failure of another
    sink.done();
  }
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

// The OpenAI writers: StreamEncoder and ResponseAccumulator behind the writer interface.
class OpenAIStreamWriter final : public ResponseWriter {
 public:
  OpenAIStreamWriter(ResponseMeta meta, TokenBytesFn token_bytes)
      : encoder_(std::move(meta), std::move(token_bytes)) {}
  std::string Begin() override { return encoder_.Start(); }
  std::string Add(size_t choice, const RequestOutput& event) override {
    return encoder_.Add(choice, event);
  }
  bool finished() const override { return encoder_.finished(); }

 private:
  StreamEncoder encoder_;
};

class OpenAIBodyWriter final : public ResponseWriter {
 public:
  OpenAIBodyWriter(ResponseMeta meta, TokenBytesFn token_bytes)
      : accumulator_(std::move(meta), std::move(token_bytes)) {}
  std::string Begin() override { return ""; }
  std::string Add(size_t choice, const RequestOutput& event) override {
    accumulator_.Add(choice, event);
    if (!accumulator_.finished()) return "";
    // The status line (200) is already sent: a failure after admission is reported in the body.
    const std::optional<ApiError>& error = accumulator_.error();
    return error ? ErrorBody(*error) : Dump(accumulator_.Build());
  }
  bool finished() const override { return accumulator_.finished(); }

 private:
  ResponseAccumulator accumulator_;
};

std::variant<PromptIds, ApiError> CompletionPromptIds(const HttpServer::State& s,
                                                      const CompletionRequest& req) {
  if (const auto* ids = std::get_if<PromptIds>(&req.prompt)) return *ids;
  return s.tokenizer->Encode(std::get<std::string>(req.prompt), /*add_special_tokens=*/true);
}

ResponseMeta OpenAIMeta(const HttpServer::State& s, ApiKind kind,
                        const GenerationOptions& options) {
  ResponseMeta meta;
  meta.kind = kind;
  meta.id = NewResponseId(kind);
  meta.created = UnixSeconds();
  meta.model = s.model.id;
  meta.logprobs = options.sampling.logprobs;
  meta.top_logprobs = options.sampling.n_top_logprobs;
  meta.include_usage = options.include_usage;
  meta.continuous_usage = options.continuous_usage;
  meta.n_choices = options.n;
  return meta;
}

std::unique_ptr<ResponseWriter> OpenAIWriter(const HttpServer::State& s, ResponseMeta meta,
                                             bool stream) {
  const Tokenizer* tokenizer = s.tokenizer;
  TokenBytesFn token_bytes = [tokenizer](int32_t id) { return tokenizer->TokenBytes(id); };
  if (stream) return std::make_unique<OpenAIStreamWriter>(std::move(meta), std::move(token_bytes));
  return std::make_unique<OpenAIBodyWriter>(std::move(meta), std::move(token_bytes));
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

std::variant<ChatPrompt, ApiError> BuildChatPrompt(const HttpServer::State& s,
                                                   const ChatRequest& req) {
  if (s.chat_template == nullptr) {
    return BadRequest("This model has no chat template; use /v1/completions", "messages");
  }
  // tool_choice "none": the model is not told about the tools, and nothing is parsed as a call.
  const bool use_tools =
      req.tools.is_array() && !req.tools.empty() && req.tool_choice.mode != ToolChoice::Mode::kNone;
  const Json no_tools;
  Result<std::string> rendered =
      s.chat_template->Render(req.messages, use_tools ? req.tools : no_tools,
                              req.add_generation_prompt, req.template_kwargs);
  if (!rendered.ok()) {
    return BadRequest("The chat template rejected the messages: " + rendered.status().message(),
                      "messages");
  }
  ChatPrompt prompt;
  prompt.parsing.tool_calls = use_tools ? s.formats.tool_calls : ToolCallFormat::kNone;
  prompt.parsing.reasoning = s.formats.reasoning;
  prompt.parsing.starts_in_reasoning = s.formats.reasoning && PromptOpensReasoning(*rendered);
  prompt.parsing.parallel_tool_calls = req.parallel_tool_calls;
  if (use_tools) prompt.parsing.tools = req.tools;
  // The template writes the special tokens (BOS included) itself.
  prompt.ids = s.tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
  return prompt;
}

std::variant<std::vector<EngineRequest>, ApiError> MakeEngineRequests(
    const HttpServer::State& s, PromptIds prompt_ids, const GenerationOptions& options,
    const std::string& prompt_param) {
  if (prompt_ids.empty()) {
    return BadRequest("The prompt is empty after tokenization", prompt_param);
  }
  std::variant<int32_t, ApiError> max_tokens =
      ResolveMaxTokens(static_cast<int64_t>(prompt_ids.size()), options.max_tokens,
                       s.model.context_tokens, prompt_param);
  if (const ApiError* e = std::get_if<ApiError>(&max_tokens)) return *e;
  EngineRequest request;
  request.prompt_ids = std::move(prompt_ids);
  request.max_new_tokens = std::get<int32_t>(max_tokens);
  request.sampling = options.sampling;
  request.ignore_eos = options.ignore_eos;
  request.stop = options.stop;
  std::vector<EngineRequest> requests(static_cast<size_t>(std::max(options.n, 1)), request);
  thread_local std::mt19937_64 seeds{std::random_device{}()};
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.seed =
        options.seed_given ? options.sampling.seed + static_cast<uint64_t>(i) : seeds();
  }
  return requests;
}

std::optional<ApiError> AttachGrammar(HttpServer::State& s, const OutputConstraint& constraint,
                                      const ChatRequest* chat,
                                      std::vector<EngineRequest>* requests) {
  std::shared_ptr<const grammar::CompiledGrammar> g;
  auto take = [&g](std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> r)
      -> std::optional<ApiError> {
    if (const ApiError* e = std::get_if<ApiError>(&r)) return *e;
    g = std::get<0>(std::move(r));
    return std::nullopt;
  };
  if (auto e = take(s.grammars->ForConstraint(constraint))) return e;
  if (chat != nullptr && chat->tool_choice.mode != ToolChoice::Mode::kAuto &&
      chat->tool_choice.mode != ToolChoice::Mode::kNone) {
    if (g != nullptr) {
      return BadRequest("tool_choice '" +
                            std::string(chat->tool_choice.mode == ToolChoice::Mode::kRequired
                                            ? "required"
                                            : "function") +
                            "' and " + constraint.param + " cannot both constrain the output",
                        "tool_choice");
    }
    if (auto e = take(s.grammars->ForToolChoice(s.formats.tool_calls, chat->tools,
                                                chat->tool_choice, chat->parallel_tool_calls))) {
      return e;
    }
  }
  for (EngineRequest& r : *requests) r.grammar = g;
  return std::nullopt;
}

void RunGeneration(HttpServer::State& s, Generation gen, httplib::Response& res) {
  if (s.draining.load()) {
    return SendError(res, ServiceUnavailable("The server is shutting down"), gen.error_style);
  }
  auto job = std::make_shared<Job>();
  job->state = &s;
  job->writer = std::move(gen.writer);
  for (EngineRequest& request : gen.requests) {
    Result<std::shared_ptr<RequestHandle>> submitted = s.engine->Submit(std::move(request));
    if (!submitted.ok()) {
      // All or nothing: the choices already queued are withdrawn.
      for (size_t i = 0; i < job->handles.size(); ++i) {
        job->handles[i]->Cancel();
        s.active.Remove(job->active_ids[i]);
      }
      return SendError(res, FromStatus(submitted.status(), gen.prompt_param), gen.error_style);
    }
    job->handles.push_back(std::move(submitted).value());
    job->active_ids.push_back(s.active.Add(job->handles.back()));
  }
  job->done.assign(job->handles.size(), false);

  // Runs when the response is destroyed, whatever happened: choices that did not run to their
  // end (client gone, write failed, server stopping) are cancelled so the engine frees them.
  auto release = [job](bool /*success*/) {
    for (size_t i = 0; i < job->handles.size(); ++i) {
      if (!job->done[i]) job->handles[i]->Cancel();
      job->state->active.Remove(job->active_ids[i]);
    }
  };
  auto provider = [job](size_t /*offset*/, httplib::DataSink& sink) {
    return Guarded([&] { return Provide(*job, sink); });
  };
  res.status = 200;
  if (gen.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // reverse proxies: do not buffer the stream
    res.set_chunked_content_provider("text/event-stream", provider, release);
  } else {
    res.set_chunked_content_provider("application/json", provider, release);
  }
}

void HandleChat(HttpServer::State& s, const std::string& body, httplib::Response& res) {
  Json json;
  if (auto e = ParseJsonBody(body, &json)) return SendError(res, *e);
  ChatRequest req;
  if (auto e = ParseChatRequest(json, s.parse_context, &req)) return SendError(res, *e);
  std::variant<ChatPrompt, ApiError> prompt = BuildChatPrompt(s, req);
  if (const ApiError* e = std::get_if<ApiError>(&prompt)) return SendError(res, *e);
  ChatPrompt& p = std::get<ChatPrompt>(prompt);
  auto requests = MakeEngineRequests(s, std::move(p.ids), req.options, "messages");
  if (const ApiError* e = std::get_if<ApiError>(&requests)) return SendError(res, *e);
  if (auto e = AttachGrammar(s, req.options.constraint, &req,
                             &std::get<std::vector<EngineRequest>>(requests))) {
    return SendError(res, *e);
  }

  ResponseMeta meta = OpenAIMeta(s, ApiKind::kChat, req.options);
  meta.parsing = std::move(p.parsing);
  Generation gen;
  gen.requests = std::move(std::get<std::vector<EngineRequest>>(requests));
  gen.writer = OpenAIWriter(s, std::move(meta), req.options.stream);
  gen.stream = req.options.stream;
  gen.prompt_param = "messages";
  RunGeneration(s, std::move(gen), res);
}

void HandleCompletion(HttpServer::State& s, const std::string& body, httplib::Response& res) {
  Json json;
  if (auto e = ParseJsonBody(body, &json)) return SendError(res, *e);
  CompletionRequest req;
  if (auto e = ParseCompletionRequest(json, s.parse_context, &req)) return SendError(res, *e);
  std::variant<PromptIds, ApiError> ids = CompletionPromptIds(s, req);
  if (const ApiError* e = std::get_if<ApiError>(&ids)) return SendError(res, *e);
  ResponseMeta meta = OpenAIMeta(s, ApiKind::kCompletion, req.options);
  if (req.echo) {
    // The prompt as text: as sent, or the ids decoded (special tokens included).
    if (const auto* text = std::get_if<std::string>(&req.prompt)) {
      meta.echo = *text;
    } else {
      meta.echo = s.tokenizer->Decode(std::get<PromptIds>(ids));
    }
  }
  auto requests = MakeEngineRequests(s, std::move(std::get<PromptIds>(ids)), req.options, "prompt");
  if (const ApiError* e = std::get_if<ApiError>(&requests)) return SendError(res, *e);
  if (auto e = AttachGrammar(s, req.options.constraint, nullptr,
                             &std::get<std::vector<EngineRequest>>(requests))) {
    return SendError(res, *e);
  }

  Generation gen;
  gen.requests = std::move(std::get<std::vector<EngineRequest>>(requests));
  gen.writer = OpenAIWriter(s, std::move(meta), req.options.stream);
  gen.stream = req.options.stream;
  gen.prompt_param = "prompt";
  RunGeneration(s, std::move(gen), res);
}

}  // namespace kestrel::server
