#include "server/responses_api.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include "core/json_file.h"
#include "server/response_json.h"
#include "server/sse.h"
#include "tokenizer/unicode.h"

namespace kestrel::server {
namespace {

using detail::Index;
using detail::ReadBool;
using detail::ReadInt;
using detail::ReadString;
using detail::Required;
using detail::TypeName;
using detail::WrongType;

// Arguments text as the chat templates take it: a JSON object when it is one (as vLLM does).
Json ArgumentsForTemplate(const std::string& text) {
  Json parsed;
  if (JsonNestingDepth(text, kMaxJsonDepth + 1) <= kMaxJsonDepth) {
    parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  }
  return parsed.is_object() ? parsed : Json(text);
}

// Message content: a string, or parts of type input_text / output_text / text joined with
// newlines. Images and files are refused.
std::optional<ApiError> ContentText(const Json& content, const std::string& param,
                                    std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return WrongType(param, "a string or an array of content parts", content);
  out->clear();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string pp = Index(param, i);
    if (!part.is_object()) return WrongType(pp, "an object", part);
    std::optional<std::string> type, text;
    if (auto e = ReadString(part, "type", pp + ".type", &type)) return e;
    const std::string t = type.value_or("");
    if (t != "input_text" && t != "output_text" && t != "text" && t != "refusal") {
      return BadRequest(
          "Content part type '" + tok::Utf8Lossy(t) + "' is not supported; only text parts are",
          pp + ".type");
    }
    const char* key = t == "refusal" ? "refusal" : "text";
    if (auto e = ReadString(part, key, pp + "." + key, &text)) return e;
    if (!text) return Required(pp + "." + key);
    if (i > 0) *out += '\n';
    *out += *text;
  }
  return std::nullopt;
}

// Input items -> chat messages. Function calls join the assistant message just before them
// (an output message and its calls are one assistant turn); reasoning items go to the next
// assistant message.
class InputConverter {
 public:
  explicit InputConverter(Json* messages) : messages_(messages) {}

  std::optional<ApiError> Item(const Json& item, const std::string& param) {
    if (!item.is_object()) return WrongType(param, "an object", item);
    std::optional<std::string> type;
    if (auto e = ReadString(item, "type", param + ".type", &type)) return e;
    if (!type && item.contains("role")) type = "message";
    if (!type) return Required(param + ".type");
    if (*type == "message") return Message(item, param);
    if (*type == "function_call") return FunctionCall(item, param);
    if (*type == "function_call_output") return FunctionCallOutput(item, param);
    if (*type == "reasoning") return Reasoning(item, param);
    return BadRequest("Input item type '" + tok::Utf8Lossy(*type) + "' is not supported",
                      param + ".type");
  }

 private:
  std::optional<ApiError> Message(const Json& item, const std::string& param) {
    std::optional<std::string> role;
    if (auto e = ReadString(item, "role", param + ".role", &role)) return e;
    if (!role) return Required(param + ".role");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant") {
      return BadRequest("Invalid role '" + tok::Utf8Lossy(*role) +
                            "'; expected user, assistant, system or developer",
                        param + ".role");
    }
    auto content = item.find("content");
    if (content == item.end() || content->is_null()) return Required(param + ".content");
    std::string text;
    if (auto e = ContentText(*content, param + ".content", &text)) return e;
    Json m = Json{{"role", *role}, {"content", text}};
    if (*role == "assistant") AttachReasoning(&m);
    messages_->push_back(std::move(m));
    return std::nullopt;
  }

  std::optional<ApiError> FunctionCall(const Json& item, const std::string& param) {
    std::optional<std::string> call_id, name, arguments;
    if (auto e = ReadString(item, "call_id", param + ".call_id", &call_id)) return e;
    if (auto e = ReadString(item, "name", param + ".name", &name)) return e;
    if (auto e = ReadString(item, "arguments", param + ".arguments", &arguments)) return e;
    if (!call_id) return Required(param + ".call_id");
    if (!name || name->empty()) return Required(param + ".name");
    tool_names_[*call_id] = *name;
    Json call =
        Json{{"id", *call_id},
             {"type", "function"},
             {"function",
              Json{{"name", *name}, {"arguments", ArgumentsForTemplate(arguments.value_or(""))}}}};
    if (messages_->empty() || (*messages_)[messages_->size() - 1]["role"] != "assistant") {
      Json m = Json{{"role", "assistant"}, {"content", ""}};
      AttachReasoning(&m);
      messages_->push_back(std::move(m));
    }
    Json& last = (*messages_)[messages_->size() - 1];
    if (!last.contains("tool_calls")) last["tool_calls"] = Json::array();
    last["tool_calls"].push_back(std::move(call));
    return std::nullopt;
  }

  std::optional<ApiError> FunctionCallOutput(const Json& item, const std::string& param) {
    std::optional<std::string> call_id;
    if (auto e = ReadString(item, "call_id", param + ".call_id", &call_id)) return e;
    if (!call_id) return Required(param + ".call_id");
    auto output = item.find("output");
    if (output == item.end() || output->is_null()) return Required(param + ".output");
    std::string text;
    if (auto e = ContentText(*output, param + ".output", &text)) return e;
    Json m = Json{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", text}};
    if (auto n = tool_names_.find(*call_id); n != tool_names_.end()) m["name"] = n->second;
    messages_->push_back(std::move(m));
    return std::nullopt;
  }

  std::optional<ApiError> Reasoning(const Json& item, const std::string& param) {
    for (const char* key : {"content", "summary"}) {
      auto parts = item.find(key);
      if (parts == item.end() || parts->is_null()) continue;
      if (!parts->is_array()) return WrongType(param + "." + key, "an array", *parts);
      for (const Json& part : *parts) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          pending_reasoning_ += part["text"].get<std::string>();
        }
      }
      if (!pending_reasoning_.empty()) break;  // the full text when there is one, else summary
    }
    return std::nullopt;
  }

  void AttachReasoning(Json* m) {
    if (pending_reasoning_.empty()) return;
    (*m)["reasoning_content"] = pending_reasoning_;
    pending_reasoning_.clear();
  }

  Json* messages_;
  std::string pending_reasoning_;
  std::map<std::string, std::string> tool_names_;
};

// Responses function tools ({type, name, description, parameters, strict}) -> chat tools.
std::optional<ApiError> ConvertTools(const Json& tools, Json* out) {
  if (!tools.is_array()) return WrongType("tools", "an array", tools);
  *out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = Index("tools", i);
    if (!tool.is_object()) return WrongType(param, "an object", tool);
    std::optional<std::string> type, name;
    if (auto e = ReadString(tool, "type", param + ".type", &type)) return e;
    if (type.value_or("") != "function") {
      return BadRequest("Tool type '" + tok::Utf8Lossy(type.value_or("")) +
                            "' is not supported; only 'function' tools are",
                        param + ".type");
    }
    Json fn = Json::object();
    for (const char* key : {"name", "description", "parameters", "strict"}) {
      if (auto it = tool.find(key); it != tool.end() && !it->is_null()) fn[key] = *it;
    }
    out->push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  if (auto e = ValidateTools(*out, "tools")) {
    // Name the field as the client wrote it (tools[i].name, not tools[i].function.name).
    const std::string from = ".function.";
    if (size_t pos = e->param.find(from); pos != std::string::npos) {
      e->param.replace(pos, from.size(), ".");
    }
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadToolChoice(const Json& body, ChatRequest* out) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  ToolChoice& tc = out->tool_choice;
  if (it->is_string()) {
    const std::string c = it->get<std::string>();
    if (!detail::ToolChoiceModeOf(c, &tc.mode)) {
      return BadRequest("Invalid tool_choice '" + tok::Utf8Lossy(c) + "'", "tool_choice");
    }
  } else if (it->is_object()) {
    std::optional<std::string> type, name;
    if (auto e = ReadString(*it, "type", "tool_choice.type", &type)) return e;
    if (type.value_or("") != "function") {
      return BadRequest("tool_choice type '" + tok::Utf8Lossy(type.value_or("")) +
                            "' is not supported; use a function",
                        "tool_choice.type");
    }
    if (auto e = ReadString(*it, "name", "tool_choice.name", &name)) return e;
    if (!name || name->empty()) return Required("tool_choice.name");
    tc.mode = ToolChoice::Mode::kFunction;
    tc.function = *name;
  } else {
    return WrongType("tool_choice", "a string or an object", *it);
  }
  return ValidateToolChoice(tc, out->tools, "tool_choice");
}

std::optional<ApiError> ReadOptions(const Json& body, const ParseContext& ctx,
                                    ResponsesRequest* out) {
  GenerationOptions& o = out->chat.options;
  std::optional<std::string> model;
  if (auto e = ReadString(body, "model", "model", &model)) return e;
  if (model && !model->empty()) {
    const auto& names = ctx.accepted_models;
    if (std::find(names.begin(), names.end(), *model) == names.end()) {
      return ModelNotFound(tok::Utf8Lossy(*model));
    }
    o.model = *model;
  }
  if (auto e = ReadInt(body, "max_output_tokens", "max_output_tokens", 1,
                       std::numeric_limits<int64_t>::max(), &o.max_tokens)) {
    return e;
  }
  SamplingParams& p = o.sampling;
  p = ctx.defaults;
  for (auto [key, field] : {std::pair{"temperature", &p.temperature}, {"top_p", &p.top_p}}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number()) return WrongType(key, "a number", *it);
    *field = static_cast<float>(it->get<double>());
  }
  p.logprobs = false;
  p.n_top_logprobs = 0;
  if (auto e = ReadBool(body, "stream", "stream", &o.stream)) return e;
  if (auto e = ReadBool(body, "store", "store", &out->store)) return e;
  bool background = false;
  if (auto e = ReadBool(body, "background", "background", &background)) return e;
  if (background) return BadRequest("Background responses are not supported", "background");
  std::optional<int64_t> top_logprobs;
  if (auto e = ReadInt(body, "top_logprobs", "top_logprobs", 0, 20, &top_logprobs)) return e;
  if (top_logprobs.value_or(0) > 0) {
    return BadRequest("'top_logprobs' is not supported on /v1/responses", "top_logprobs");
  }
  if (auto text = body.find("text"); text != body.end() && !text->is_null()) {
    if (!text->is_object()) return WrongType("text", "an object", *text);
    if (auto format = text->find("format"); format != text->end() && !format->is_null()) {
      if (!format->is_object()) return WrongType("text.format", "an object", *format);
      std::optional<std::string> type;
      if (auto e = ReadString(*format, "type", "text.format.type", &type)) return e;
      if (type.value_or("text") != "text") {
        return BadRequest("text.format type '" + tok::Utf8Lossy(*type) +
                              "' is not supported (structured outputs are not implemented)",
                          "text.format.type");
      }
    }
  }
  if (auto md = body.find("metadata"); md != body.end() && !md->is_null() && !md->is_object()) {
    return WrongType("metadata", "an object", *md);
  }
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) return WrongType("chat_template_kwargs", "an object", *kw);
    out->chat.template_kwargs = *kw;
  }
  return detail::ValidateSampling(p, ctx.vocab_size);
}

// A float setting as the number a person wrote (0.7, not 0.699999988079071).
double ShortDouble(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(v));
  return std::strtod(buf, nullptr);
}

// What the response object repeats of the request (as OpenAI's does).
Json EchoFields(const Json& body, const ResponsesRequest& req) {
  Json echo = Json::object();
  auto field = [&](const char* key, Json fallback) {
    auto it = body.find(key);
    echo[key] = it == body.end() || it->is_null() ? std::move(fallback) : *it;
  };
  field("instructions", nullptr);
  field("max_output_tokens", nullptr);
  field("metadata", Json::object());
  echo["parallel_tool_calls"] = req.chat.parallel_tool_calls;
  field("previous_response_id", nullptr);
  field("reasoning", Json{{"effort", nullptr}, {"summary", nullptr}});
  echo["store"] = req.store;
  echo["temperature"] = ShortDouble(req.chat.options.sampling.temperature);
  field("text", Json{{"format", Json{{"type", "text"}}}});
  field("tool_choice", "auto");
  field("tools", Json::array());
  echo["top_p"] = ShortDouble(req.chat.options.sampling.top_p);
  field("truncation", "disabled");
  field("user", nullptr);
  return echo;
}

}  // namespace

std::optional<ApiError> ParseResponsesRequest(const Json& body, const ParseContext& ctx,
                                              ResponseStore& store, ResponsesRequest* out) {
  ChatRequest& chat = out->chat;
  if (auto e = ReadOptions(body, ctx, out)) return e;

  // The conversation: the previous response's, then this input.
  out->conversation = Json::array();
  std::optional<std::string> previous;
  if (auto e = ReadString(body, "previous_response_id", "previous_response_id", &previous)) {
    return e;
  }
  if (previous) {
    std::shared_ptr<const ResponseStore::Entry> entry = store.Get(*previous);
    if (entry == nullptr) {
      return BadRequest("Previous response with id '" + tok::Utf8Lossy(*previous) + "' not found.",
                        "previous_response_id", "previous_response_not_found");
    }
    out->previous_response_id = *previous;
    out->conversation = entry->messages;
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) return Required("input");
  if (input->is_string()) {
    out->conversation.push_back(Json{{"role", "user"}, {"content", input->get<std::string>()}});
  } else if (input->is_array()) {
    InputConverter converter(&out->conversation);
    for (size_t i = 0; i < input->size(); ++i) {
      if (auto e = converter.Item((*input)[i], Index("input", i))) return e;
    }
  } else {
    return WrongType("input", "a string or an array of input items", *input);
  }
  if (out->conversation.empty()) return BadRequest("'input' must not be empty", "input");

  chat.messages = Json::array();
  std::optional<std::string> instructions;
  if (auto e = ReadString(body, "instructions", "instructions", &instructions)) return e;
  if (instructions) chat.messages.push_back(Json{{"role", "system"}, {"content", *instructions}});
  for (const Json& m : out->conversation) chat.messages.push_back(m);

  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (auto e = ConvertTools(*tools, &chat.tools)) return e;
  }
  if (auto e = ReadToolChoice(body, &chat)) return e;
  if (auto e =
          ReadBool(body, "parallel_tool_calls", "parallel_tool_calls", &chat.parallel_tool_calls)) {
    return e;
  }
  out->echo = EchoFields(body, *out);
  return std::nullopt;
}

// ---- the answer ----

struct ResponsesEncoder::Item {
  OutputPiece::Kind kind = OutputPiece::Kind::kContent;
  std::string id;       // rs_ / msg_ / fc_
  std::string call_id;  // function_call: "call_..."
  std::string name;
  std::string text;  // reasoning or message text, or the arguments
  bool done = false;
};

ResponsesEncoder::ResponsesEncoder(ResponsesMeta meta, bool stream)
    : meta_(std::move(meta)), stream_(stream), output_(meta_.parsing, "call_") {}

ResponsesEncoder::~ResponsesEncoder() = default;

std::string ResponsesEncoder::Event(Json event) {
  event["sequence_number"] = sequence_++;
  std::string frame = "event: " + event["type"].get<std::string>() + "\n";
  return frame + SseJsonFrame(event);
}

Json ResponsesEncoder::ItemJson(const Item& item, bool done) const {
  const char* status = done ? "completed" : "in_progress";
  switch (item.kind) {
    case OutputPiece::Kind::kReasoning: {
      Json content = Json::array();
      if (done) content.push_back(Json{{"type", "reasoning_text"}, {"text", item.text}});
      return Json{{"id", item.id},
                  {"type", "reasoning"},
                  {"summary", Json::array()},
                  {"content", std::move(content)}};
    }
    case OutputPiece::Kind::kContent: {
      Json content = Json::array();
      if (done) {
        content.push_back(Json{{"type", "output_text"},
                               {"text", item.text},
                               {"annotations", Json::array()},
                               {"logprobs", Json::array()}});
      }
      return Json{{"id", item.id},
                  {"type", "message"},
                  {"status", status},
                  {"role", "assistant"},
                  {"content", std::move(content)}};
    }
    case OutputPiece::Kind::kToolCall:
      break;
  }
  return Json{{"id", item.id},           {"type", "function_call"},
              {"status", status},        {"arguments", done ? item.text : std::string()},
              {"call_id", item.call_id}, {"name", item.name}};
}

Json ResponsesEncoder::ResponseJson() const {
  Json j = Json::object();
  j["id"] = meta_.id;
  j["object"] = "response";
  j["created_at"] = meta_.created_at;
  j["status"] = status_;
  j["error"] = nullptr;
  j["incomplete_details"] =
      status_ == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json();
  j["model"] = meta_.model;
  Json output = Json::array();
  for (const Item& item : items_) {
    if (item.done) output.push_back(ItemJson(item, true));
  }
  j["output"] = std::move(output);
  for (const auto& [key, value] : meta_.echo.items()) j[key] = value;
  if (finished_) {
    const RequestUsage& u = output_.usage();
    j["usage"] = Json{{"input_tokens", u.prompt_tokens},
                      {"input_tokens_details", Json{{"cached_tokens", u.cached_tokens}}},
                      {"output_tokens", u.completion_tokens},
                      {"output_tokens_details", Json{{"reasoning_tokens", 0}}},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  } else {
    j["usage"] = nullptr;
  }
  return j;
}

std::string ResponsesEncoder::Start() {
  if (!stream_) return "";
  std::string frames = Event(Json{{"type", "response.created"}, {"response", ResponseJson()}});
  frames += Event(Json{{"type", "response.in_progress"}, {"response", ResponseJson()}});
  return frames;
}

std::string ResponsesEncoder::OpenItem(const OutputPiece& piece) {
  Item item;
  item.kind = piece.kind;
  switch (piece.kind) {
    case OutputPiece::Kind::kReasoning:
      item.id = RandomId("rs_");
      break;
    case OutputPiece::Kind::kContent:
      item.id = RandomId("msg_");
      break;
    case OutputPiece::Kind::kToolCall:
      item.id = RandomId("fc_");
      item.call_id = output_.tool_call_id(static_cast<size_t>(piece.tool_index));
      item.name = piece.tool_name;
      break;
  }
  items_.push_back(std::move(item));
  item_open_ = true;
  if (!stream_) return "";
  const Item& it = items_.back();
  const int64_t index = static_cast<int64_t>(items_.size()) - 1;
  std::string frames = Event(Json{{"type", "response.output_item.added"},
                                  {"output_index", index},
                                  {"item", ItemJson(it, false)}});
  if (it.kind == OutputPiece::Kind::kContent) {
    frames += Event(Json{{"type", "response.content_part.added"},
                         {"item_id", it.id},
                         {"output_index", index},
                         {"content_index", 0},
                         {"part", Json{{"type", "output_text"},
                                       {"text", ""},
                                       {"annotations", Json::array()},
                                       {"logprobs", Json::array()}}}});
  } else if (it.kind == OutputPiece::Kind::kReasoning) {
    frames += Event(Json{{"type", "response.content_part.added"},
                         {"item_id", it.id},
                         {"output_index", index},
                         {"content_index", 0},
                         {"part", Json{{"type", "reasoning_text"}, {"text", ""}}}});
  }
  return frames;
}

std::string ResponsesEncoder::CloseItem() {
  if (!item_open_) return "";
  item_open_ = false;
  Item& it = items_.back();
  it.done = true;
  if (!stream_) return "";
  const int64_t index = static_cast<int64_t>(items_.size()) - 1;
  std::string frames;
  switch (it.kind) {
    case OutputPiece::Kind::kReasoning:
      frames += Event(Json{{"type", "response.reasoning_text.done"},
                           {"item_id", it.id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"text", it.text}});
      frames += Event(Json{{"type", "response.content_part.done"},
                           {"item_id", it.id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"part", Json{{"type", "reasoning_text"}, {"text", it.text}}}});
      break;
    case OutputPiece::Kind::kContent: {
      Json part = Json{{"type", "output_text"},
                       {"text", it.text},
                       {"annotations", Json::array()},
                       {"logprobs", Json::array()}};
      frames += Event(Json{{"type", "response.output_text.done"},
                           {"item_id", it.id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"text", it.text},
                           {"logprobs", Json::array()}});
      frames += Event(Json{{"type", "response.content_part.done"},
                           {"item_id", it.id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"part", std::move(part)}});
      break;
    }
    case OutputPiece::Kind::kToolCall:
      frames += Event(Json{{"type", "response.function_call_arguments.done"},
                           {"item_id", it.id},
                           {"output_index", index},
                           {"name", it.name},
                           {"arguments", it.text}});
      break;
  }
  frames += Event(Json{{"type", "response.output_item.done"},
                       {"output_index", index},
                       {"item", ItemJson(it, true)}});
  return frames;
}

std::string ResponsesEncoder::Add(const RequestOutput& event) {
  if (finished_) return "";
  std::string frames;
  for (const OutputPiece& piece : output_.Add(event)) {
    const bool same_item = item_open_ && items_.back().kind == piece.kind && !piece.starts_call();
    if (!same_item) {
      frames += CloseItem();
      frames += OpenItem(piece);
    }
    if (piece.text.empty()) continue;
    Item& it = items_.back();
    it.text += piece.text;
    if (!stream_) continue;
    const int64_t index = static_cast<int64_t>(items_.size()) - 1;
    switch (piece.kind) {
      case OutputPiece::Kind::kReasoning:
        frames += Event(Json{{"type", "response.reasoning_text.delta"},
                             {"item_id", it.id},
                             {"output_index", index},
                             {"content_index", 0},
                             {"delta", piece.text}});
        break;
      case OutputPiece::Kind::kContent:
        frames += Event(Json{{"type", "response.output_text.delta"},
                             {"item_id", it.id},
                             {"output_index", index},
                             {"content_index", 0},
                             {"delta", piece.text},
                             {"logprobs", Json::array()}});
        break;
      case OutputPiece::Kind::kToolCall:
        frames += Event(Json{{"type", "response.function_call_arguments.delta"},
                             {"item_id", it.id},
                             {"output_index", index},
                             {"delta", piece.text}});
        break;
    }
  }
  if (!event.finished) return frames;

  finished_ = true;
  if (std::optional<ApiError> error = EventError(event)) {
    if (!stream_) return ErrorBody(*error);
    Json e = Json{{"type", "error"},
                  {"code", error->code.empty() ? Json() : Json(error->code)},
                  {"message", error->message},
                  {"param", nullptr}};
    e["error"] = ErrorJson(*error)["error"];  // what the SDK raises
    return frames + Event(std::move(e));
  }
  frames += CloseItem();
  status_ = output_.finish_reason() == FinishReason::kLength ? "incomplete" : "completed";
  const Json response = ResponseJson();
  Store(response);
  if (!stream_) return Dump(response);
  return frames +
         Event(Json{{"type", status_ == "completed" ? "response.completed" : "response.incomplete"},
                    {"response", response}});
}

void ResponsesEncoder::Store(const Json& response) const {
  if (meta_.store == nullptr) return;
  const ParsedMessage& m = output_.message();
  Json assistant = Json{{"role", "assistant"}, {"content", m.content}};
  if (!m.reasoning.empty()) assistant["reasoning_content"] = m.reasoning;
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      calls.push_back(
          Json{{"id", output_.tool_call_id(i)},
               {"type", "function"},
               {"function", Json{{"name", m.tool_calls[i].name},
                                 {"arguments", ArgumentsForTemplate(m.tool_calls[i].arguments)}}}});
    }
    assistant["tool_calls"] = std::move(calls);
  }
  ResponseStore::Entry entry;
  entry.response = response;
  entry.messages = meta_.conversation;
  entry.messages.push_back(std::move(assistant));
  meta_.store->Put(meta_.id, std::move(entry));
}

}  // namespace kestrel::server
