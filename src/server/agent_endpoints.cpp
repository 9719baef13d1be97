// The endpoints of agent clients beside chat completions: Anthropic's POST /v1/messages and
// /v1/messages/count_tokens, and OpenAI's Responses API (POST /v1/responses, GET and DELETE
// /v1/responses/{id}). Each converts its request to a chat request (anthropic_api.h,
// responses_api.h), builds the prompt like /v1/chat/completions, and answers through its own
// ResponseWriter; errors on /v1/messages are Anthropic-shaped.
#include "server/anthropic_api.h"
#include "server/responses_api.h"
#include "server/server_state.h"

namespace kestrel::server {
namespace {

class AnthropicStreamWriter final : public ResponseWriter {
 public:
  explicit AnthropicStreamWriter(AnthropicMeta meta) : encoder_(std::move(meta)) {}
  std::string Begin() override { return encoder_.Start(); }
  std::string Add(size_t /*choice*/, const RequestOutput& event) override {
    return encoder_.Add(event);
  }
  bool finished() const override { return encoder_.finished(); }

 private:
  AnthropicStreamEncoder encoder_;
};

class AnthropicBodyWriter final : public ResponseWriter {
 public:
  explicit AnthropicBodyWriter(AnthropicMeta meta) : accumulator_(std::move(meta)) {}
  std::string Begin() override { return ""; }
  std::string Add(size_t /*choice*/, const RequestOutput& event) override {
    accumulator_.Add(event);
    if (!accumulator_.finished()) return "";
    const std::optional<ApiError>& error = accumulator_.error();
    return Dump(error ? AnthropicErrorJson(*error) : accumulator_.Build());
  }
  bool finished() const override { return accumulator_.finished(); }

 private:
  AnthropicAccumulator accumulator_;
};

class ResponsesWriter final : public ResponseWriter {
 public:
  ResponsesWriter(ResponsesMeta meta, bool stream) : encoder_(std::move(meta), stream) {}
  std::string Begin() override { return encoder_.Start(); }
  std::string Add(size_t /*choice*/, const RequestOutput& event) override {
    return encoder_.Add(event);
  }
  bool finished() const override { return encoder_.finished(); }

 private:
  ResponsesEncoder encoder_;
};

// Parses an Anthropic body and builds its prompt; false after sending the error.
bool AnthropicPrompt(HttpServer::State& s, const std::string& body, bool count_tokens,
                     httplib::Response& res, AnthropicRequest* req, ChatPrompt* prompt) {
  constexpr ErrorStyle kStyle = ErrorStyle::kAnthropic;
  Json json;
  if (auto e = ParseJsonBody(body, &json)) {
    SendError(res, *e, kStyle);
    return false;
  }
  if (auto e = ParseAnthropicRequest(json, s.parse_context, req, count_tokens)) {
    SendError(res, *e, kStyle);
    return false;
  }
  std::variant<ChatPrompt, ApiError> p = BuildChatPrompt(s, req->chat);
  if (const ApiError* e = std::get_if<ApiError>(&p)) {
    SendError(res, *e, kStyle);
    return false;
  }
  *prompt = std::move(std::get<ChatPrompt>(p));
  return true;
}

}  // namespace

void HandleAnthropicMessages(HttpServer::State& s, const std::string& body,
                             httplib::Response& res) {
  AnthropicRequest req;
  ChatPrompt prompt;
  if (!AnthropicPrompt(s, body, /*count_tokens=*/false, res, &req, &prompt)) return;
  const int32_t n_prompt_tokens = static_cast<int32_t>(prompt.ids.size());
  auto requests = MakeEngineRequests(s, std::move(prompt.ids), req.chat.options, "messages");
  if (const ApiError* e = std::get_if<ApiError>(&requests)) {
    return SendError(res, *e, ErrorStyle::kAnthropic);
  }
  // tool_choice any / tool: a forced call.
  if (auto e = AttachGrammar(s, OutputConstraint{}, &req.chat,
                             &std::get<std::vector<EngineRequest>>(requests))) {
    return SendError(res, *e, ErrorStyle::kAnthropic);
  }
  AnthropicMeta meta;
  meta.id = RandomId("msg_");
  meta.model = s.model.id;
  meta.stop_sequences = req.chat.options.stop;
  meta.parsing = std::move(prompt.parsing);
  meta.n_prompt_tokens = n_prompt_tokens;
  Generation gen;
  gen.requests = std::move(std::get<std::vector<EngineRequest>>(requests));
  gen.stream = req.chat.options.stream;
  if (gen.stream) {
    gen.writer = std::make_unique<AnthropicStreamWriter>(std::move(meta));
  } else {
    gen.writer = std::make_unique<AnthropicBodyWriter>(std::move(meta));
  }
  gen.prompt_param = "messages";
  gen.error_style = ErrorStyle::kAnthropic;
  RunGeneration(s, std::move(gen), res);
}

void HandleAnthropicCountTokens(HttpServer::State& s, const std::string& body,
                                httplib::Response& res) {
  AnthropicRequest req;
  ChatPrompt prompt;
  if (!AnthropicPrompt(s, body, /*count_tokens=*/true, res, &req, &prompt)) return;
  SendJson(res, 200, Json{{"input_tokens", prompt.ids.size()}});
}

void HandleResponses(HttpServer::State& s, const std::string& body, httplib::Response& res) {
  Json json;
  if (auto e = ParseJsonBody(body, &json)) return SendError(res, *e);
  ResponsesRequest req;
  if (auto e = ParseResponsesRequest(json, s.parse_context, *s.responses, &req)) {
    return SendError(res, *e);
  }
  std::variant<ChatPrompt, ApiError> prompt = BuildChatPrompt(s, req.chat);
  if (const ApiError* e = std::get_if<ApiError>(&prompt)) return SendError(res, *e);
  ChatPrompt& p = std::get<ChatPrompt>(prompt);
  auto requests = MakeEngineRequests(s, std::move(p.ids), req.chat.options, "input");
  if (const ApiError* e = std::get_if<ApiError>(&requests)) return SendError(res, *e);
  if (auto e = AttachGrammar(s, OutputConstraint{}, &req.chat,
                             &std::get<std::vector<EngineRequest>>(requests))) {
    return SendError(res, *e);
  }

  ResponsesMeta meta;
  meta.id = RandomId("resp_");
  meta.created_at = UnixSeconds();
  meta.model = s.model.id;
  meta.echo = std::move(req.echo);
  meta.parsing = std::move(p.parsing);
  meta.conversation = std::move(req.conversation);
  meta.store = req.store ? s.responses.get() : nullptr;
  Generation gen;
  gen.requests = std::move(std::get<std::vector<EngineRequest>>(requests));
  gen.stream = req.chat.options.stream;
  gen.writer = std::make_unique<ResponsesWriter>(std::move(meta), gen.stream);
  gen.prompt_param = "input";
  RunGeneration(s, std::move(gen), res);
}

void HandleGetResponse(HttpServer::State& s, const std::string& id, httplib::Response& res) {
  std::shared_ptr<const ResponseStore::Entry> entry = s.responses->Get(id);
  if (entry == nullptr) {
    return SendError(res, NotFoundError("No response found with id '" + id + "'."));
  }
  SendJson(res, 200, entry->response);
}

void HandleDeleteResponse(HttpServer::State& s, const std::string& id, httplib::Response& res) {
  if (!s.responses->Erase(id)) {
    return SendError(res, NotFoundError("No response found with id '" + id + "'."));
  }
  SendJson(res, 200, Json{{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace kestrel::server
