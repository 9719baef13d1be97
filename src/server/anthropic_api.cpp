#include "server/anthropic_api.h"

#include <algorithm>
#include <limits>
#include <map>

#include "core/json_file.h"
#include "engine/stop_matcher.h"
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

// Text of a string or an array of {"type": "text", "text"} blocks, joined with newlines
// (system prompts, tool results).
std::optional<ApiError> TextOf(const Json& value, const std::string& param, std::string* out) {
  if (value.is_string()) {
    *out = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array()) return WrongType(param, "a string or an array of text blocks", value);
  out->clear();
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& block = value[i];
    const std::string bp = Index(param, i);
    if (!block.is_object()) return WrongType(bp, "an object", block);
    std::optional<std::string> type, text;
    if (auto e = ReadString(block, "type", bp + ".type", &type)) return e;
    if (type.value_or("") != "text") {
      return BadRequest("Block type '" + tok::Utf8Lossy(type.value_or("")) +
                            "' is not supported here; only text blocks are",
                        bp + ".type");
    }
    if (auto e = ReadString(block, "text", bp + ".text", &text)) return e;
    if (!text) return Required(bp + ".text");
    if (i > 0) *out += '\n';
    *out += *text;
  }
  return std::nullopt;
}

// One Anthropic message -> chat messages (a user message with tool results becomes tool
// messages, then a user message with its text). `tool_names` maps tool_use ids to names.
std::optional<ApiError> ConvertMessage(const Json& msg, size_t i,
                                       std::map<std::string, std::string>* tool_names, Json* out) {
  const std::string param = Index("messages", i);
  if (!msg.is_object()) return WrongType(param, "an object", msg);
  std::optional<std::string> role;
  if (auto e = ReadString(msg, "role", param + ".role", &role)) return e;
  if (!role) return Required(param + ".role");
  if (*role != "user" && *role != "assistant") {
    return BadRequest("Invalid role '" + tok::Utf8Lossy(*role) + "'; expected user or assistant",
                      param + ".role");
  }
  const bool assistant = *role == "assistant";
  auto content = msg.find("content");
  if (content == msg.end() || content->is_null()) return Required(param + ".content");
  if (content->is_string()) {
    out->push_back(Json{{"role", *role}, {"content", content->get<std::string>()}});
    return std::nullopt;
  }
  if (!content->is_array()) {
    return WrongType(param + ".content", "a string or an array of content blocks", *content);
  }
  std::string text, reasoning;
  bool has_text = false;
  Json tool_calls = Json::array();
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& block = (*content)[j];
    const std::string bp = Index(param + ".content", j);
    if (!block.is_object()) return WrongType(bp, "an object", block);
    std::optional<std::string> type;
    if (auto e = ReadString(block, "type", bp + ".type", &type)) return e;
    if (!type) return Required(bp + ".type");
    if (*type == "text") {
      std::optional<std::string> t;
      if (auto e = ReadString(block, "text", bp + ".text", &t)) return e;
      if (!t) return Required(bp + ".text");
      if (has_text) text += '\n';
      text += *t;
      has_text = true;
    } else if (*type == "tool_use" && assistant) {
      std::optional<std::string> id, name;
      if (auto e = ReadString(block, "id", bp + ".id", &id)) return e;
      if (auto e = ReadString(block, "name", bp + ".name", &name)) return e;
      if (!id) return Required(bp + ".id");
      if (!name || name->empty()) return Required(bp + ".name");
      Json input = Json::object();
      if (auto in = block.find("input"); in != block.end() && !in->is_null()) {
        if (!in->is_object()) return WrongType(bp + ".input", "an object", *in);
        input = *in;
      }
      (*tool_names)[*id] = *name;
      tool_calls.push_back(Json{{"id", *id},
                                {"type", "function"},
                                {"function", Json{{"name", *name}, {"arguments", input}}}});
    } else if (*type == "tool_result" && !assistant) {
      std::optional<std::string> id;
      if (auto e = ReadString(block, "tool_use_id", bp + ".tool_use_id", &id)) return e;
      if (!id) return Required(bp + ".tool_use_id");
      std::string result;
      if (auto c = block.find("content"); c != block.end() && !c->is_null()) {
        if (auto e = TextOf(*c, bp + ".content", &result)) return e;
      }
      bool is_error = false;
      if (auto e = ReadBool(block, "is_error", bp + ".is_error", &is_error)) return e;
      Json tool = Json{{"role", "tool"}, {"tool_call_id", *id}, {"content", result}};
      if (auto n = tool_names->find(*id); n != tool_names->end()) tool["name"] = n->second;
      out->push_back(std::move(tool));
    } else if (*type == "thinking" && assistant) {
      std::optional<std::string> t;
      if (auto e = ReadString(block, "thinking", bp + ".thinking", &t)) return e;
      reasoning += t.value_or("");
    } else if (*type == "redacted_thinking" && assistant) {
      // Encrypted by Anthropic: nothing a local model can read.
    } else {
      return BadRequest("Content block type '" + tok::Utf8Lossy(*type) + "' is not supported in " +
                            *role + " messages",
                        bp + ".type");
    }
  }
  if (assistant) {
    Json m = Json{{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    out->push_back(std::move(m));
  } else if (has_text || out->empty() || out->back()["role"] != "tool") {
    out->push_back(Json{{"role", "user"}, {"content", text}});
  }
  return std::nullopt;
}

// Anthropic tools -> OpenAI chat tools. Server tools (web_search_..., bash_..., ...) are
// Anthropic's own and are refused.
std::optional<ApiError> ConvertTools(const Json& tools, Json* out) {
  if (!tools.is_array()) return WrongType("tools", "an array", tools);
  *out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = Index("tools", i);
    if (!tool.is_object()) return WrongType(param, "an object", tool);
    std::optional<std::string> type, name, description;
    if (auto e = ReadString(tool, "type", param + ".type", &type)) return e;
    if (type.value_or("custom") != "custom") {
      return BadRequest("Tool type '" + tok::Utf8Lossy(*type) +
                            "' is not supported; only custom tools (name, input_schema) are",
                        param + ".type");
    }
    if (auto e = ReadString(tool, "name", param + ".name", &name)) return e;
    if (!name || name->empty()) return Required(param + ".name");
    if (auto e = ReadString(tool, "description", param + ".description", &description)) return e;
    auto schema = tool.find("input_schema");
    if (schema == tool.end() || schema->is_null()) return Required(param + ".input_schema");
    if (!schema->is_object()) return WrongType(param + ".input_schema", "an object", *schema);
    Json fn = Json::object();
    fn["name"] = *name;
    if (description) fn["description"] = *description;
    fn["parameters"] = *schema;
    out->push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  if (auto e = ValidateTools(*out, "tools")) {
    // Name the field as the client wrote it (tools[i].name, not tools[i].function.name).
    for (auto [from, to] :
         {std::pair{".function.parameters", ".input_schema"}, std::pair{".function.", "."}}) {
      if (size_t pos = e->param.find(from); pos != std::string::npos) {
        e->param.replace(pos, std::string_view(from).size(), to);
      }
    }
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadToolChoice(const Json& body, ChatRequest* out) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return WrongType("tool_choice", "an object", *it);
  std::optional<std::string> type, name;
  if (auto e = ReadString(*it, "type", "tool_choice.type", &type)) return e;
  if (!type) return Required("tool_choice.type");
  ToolChoice& tc = out->tool_choice;
  if (*type == "auto") {
    tc.mode = ToolChoice::Mode::kAuto;
  } else if (*type == "any") {
    tc.mode = ToolChoice::Mode::kRequired;
  } else if (*type == "none") {
    tc.mode = ToolChoice::Mode::kNone;
  } else if (*type == "tool") {
    if (auto e = ReadString(*it, "name", "tool_choice.name", &name)) return e;
    if (!name || name->empty()) return Required("tool_choice.name");
    tc.mode = ToolChoice::Mode::kFunction;
    tc.function = *name;
  } else {
    return BadRequest("Invalid tool_choice type '" + tok::Utf8Lossy(*type) +
                          "'; expected auto, any, tool or none",
                      "tool_choice.type");
  }
  bool disable_parallel = false;
  if (auto e = ReadBool(*it, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use",
                        &disable_parallel)) {
    return e;
  }
  out->parallel_tool_calls = !disable_parallel;
  return ValidateToolChoice(tc, out->tools, "tool_choice");
}

std::optional<ApiError> ReadSampling(const Json& body, const ParseContext& ctx,
                                     GenerationOptions* out) {
  SamplingParams& p = out->sampling;
  p = ctx.defaults;
  auto number = [&](const char* key, double lo, double hi,
                    float* field) -> std::optional<ApiError> {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) return WrongType(key, "a number", *it);
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi)) {
      return BadRequest(std::string(key) + ": must be between " + Dump(Json(lo)) + " and " +
                            Dump(Json(hi)) + ", got " + it->dump(),
                        key);
    }
    *field = static_cast<float>(v);
    return std::nullopt;
  };
  if (auto e = number("temperature", 0.0, 1.0, &p.temperature)) return e;
  if (auto e = number("top_p", 0.0, 1.0, &p.top_p)) return e;
  if (p.top_p <= 0.0f) return BadRequest("top_p: must be greater than 0", "top_p");
  std::optional<int64_t> top_k;
  if (auto e = ReadInt(body, "top_k", "top_k", 0, std::numeric_limits<int32_t>::max(), &top_k)) {
    return e;
  }
  if (top_k) p.top_k = static_cast<int32_t>(*top_k);
  p.logprobs = false;
  p.n_top_logprobs = 0;
  return detail::ValidateSampling(p, ctx.vocab_size);
}

}  // namespace

std::optional<ApiError> ParseAnthropicRequest(const Json& body, const ParseContext& ctx,
                                              AnthropicRequest* out, bool count_tokens) {
  ChatRequest& chat = out->chat;
  GenerationOptions& o = chat.options;
  std::optional<std::string> model;
  if (auto e = ReadString(body, "model", "model", &model)) return e;
  if (!model || model->empty()) return Required("model");
  const auto& names = ctx.accepted_models;
  if (std::find(names.begin(), names.end(), *model) == names.end()) {
    return ModelNotFound(tok::Utf8Lossy(*model));
  }
  o.model = *model;

  std::optional<int64_t> max_tokens;
  if (auto e = ReadInt(body, "max_tokens", "max_tokens", 1, std::numeric_limits<int64_t>::max(),
                       &max_tokens)) {
    return e;
  }
  if (!max_tokens && !count_tokens) return Required("max_tokens");
  o.max_tokens = max_tokens;

  // system, then the messages.
  chat.messages = Json::array();
  if (auto sys = body.find("system"); sys != body.end() && !sys->is_null()) {
    std::string text;
    if (auto e = TextOf(*sys, "system", &text)) return e;
    chat.messages.push_back(Json{{"role", "system"}, {"content", text}});
  }
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) return Required("messages");
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  if (messages->empty()) return BadRequest("'messages' must not be empty", "messages");
  std::map<std::string, std::string> tool_names;
  for (size_t i = 0; i < messages->size(); ++i) {
    if (auto e = ConvertMessage((*messages)[i], i, &tool_names, &chat.messages)) return e;
  }

  // A final assistant message is a prefill: the answer continues it (as Anthropic's API does).
  const Json& last = chat.messages[chat.messages.size() - 1];
  if (last["role"] == "assistant" && !last.contains("tool_calls") &&
      !last["content"].get<std::string>().empty()) {
    chat.template_kwargs["continue_final_message"] = true;
    chat.add_generation_prompt = false;
  }

  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (auto e = ConvertTools(*tools, &chat.tools)) return e;
  }
  if (auto e = ReadToolChoice(body, &chat)) return e;

  // Extended thinking maps onto the template's switch (Qwen3: enable_thinking).
  if (auto thinking = body.find("thinking"); thinking != body.end() && !thinking->is_null()) {
    if (!thinking->is_object()) return WrongType("thinking", "an object", *thinking);
    std::optional<std::string> type;
    if (auto e = ReadString(*thinking, "type", "thinking.type", &type)) return e;
    if (type && *type != "enabled" && *type != "disabled" && *type != "adaptive") {
      return BadRequest("Invalid thinking type '" + tok::Utf8Lossy(*type) + "'", "thinking.type");
    }
    if (type) chat.template_kwargs["enable_thinking"] = *type != "disabled";
  }

  if (auto stops = body.find("stop_sequences"); stops != body.end() && !stops->is_null()) {
    if (!stops->is_array()) return WrongType("stop_sequences", "an array of strings", *stops);
    for (size_t i = 0; i < stops->size(); ++i) {
      if (!(*stops)[i].is_string()) {
        return WrongType(Index("stop_sequences", i), "a string", (*stops)[i]);
      }
      o.stop.push_back((*stops)[i].get<std::string>());
    }
    if (Status s = StopMatcher::Validate(o.stop); !s.ok()) {
      return BadRequest(s.message(), "stop_sequences");
    }
  }
  if (auto e = ReadBool(body, "stream", "stream", &o.stream)) return e;
  if (auto md = body.find("metadata"); md != body.end() && !md->is_null() && !md->is_object()) {
    return WrongType("metadata", "an object", *md);
  }
  return ReadSampling(body, ctx, &o);
}

const char* AnthropicStopReason(const ChoiceOutput& choice) {
  if (choice.ended_with_tool_calls()) return "tool_use";
  if (choice.finish_reason() == FinishReason::kLength) return "max_tokens";
  return choice.stop_index() >= 0 ? "stop_sequence" : "end_turn";
}

Json AnthropicUsage(const RequestUsage& usage) {
  Json j = Json::object();
  j["input_tokens"] = usage.prompt_tokens - usage.cached_tokens;
  j["output_tokens"] = usage.completion_tokens;
  j["cache_creation_input_tokens"] = 0;
  j["cache_read_input_tokens"] = usage.cached_tokens;
  return j;
}

namespace {

Json StopSequence(const AnthropicMeta& meta, const ChoiceOutput& choice) {
  const int32_t i = choice.stop_index();
  if (i < 0 || static_cast<size_t>(i) >= meta.stop_sequences.size()) return nullptr;
  return meta.stop_sequences[static_cast<size_t>(i)];
}

// A tool call's input as an object; arguments that do not parse (a call cut by max_tokens)
// give {}.
Json ToolInput(const std::string& arguments) {
  Json input;
  if (JsonNestingDepth(arguments, kMaxJsonDepth + 1) <= kMaxJsonDepth) {
    input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  }
  return input.is_object() ? input : Json::object();
}

Json MessageHeader(const AnthropicMeta& meta) {
  Json j = Json::object();
  j["id"] = meta.id;
  j["type"] = "message";
  j["role"] = "assistant";
  j["model"] = meta.model;
  j["content"] = Json::array();
  j["stop_reason"] = nullptr;
  j["stop_sequence"] = nullptr;
  return j;
}

}  // namespace

Json AnthropicMessageJson(const AnthropicMeta& meta, const ChoiceOutput& choice) {
  const ParsedMessage& m = choice.message();
  Json j = MessageHeader(meta);
  Json& content = j["content"];
  if (!m.reasoning.empty()) {
    content.push_back(Json{{"type", "thinking"}, {"thinking", m.reasoning}, {"signature", ""}});
  }
  if (!m.content.empty()) content.push_back(Json{{"type", "text"}, {"text", m.content}});
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    content.push_back(Json{{"type", "tool_use"},
                           {"id", choice.tool_call_id(i)},
                           {"name", m.tool_calls[i].name},
                           {"input", ToolInput(m.tool_calls[i].arguments)}});
  }
  j["stop_reason"] = AnthropicStopReason(choice);
  j["stop_sequence"] = StopSequence(meta, choice);
  j["usage"] = AnthropicUsage(choice.usage());
  return j;
}

std::string AnthropicEventFrame(const Json& event) {
  std::string frame = "event: ";
  frame += event.value("type", "message");
  frame += '\n';
  frame += SseJsonFrame(event);
  return frame;
}

AnthropicStreamEncoder::AnthropicStreamEncoder(AnthropicMeta meta)
    : meta_(std::move(meta)), output_(meta_.parsing, "toolu_") {}

std::string AnthropicStreamEncoder::Start() {
  Json message = MessageHeader(meta_);
  RequestUsage usage;
  usage.prompt_tokens = meta_.n_prompt_tokens;
  message["usage"] = AnthropicUsage(usage);
  return AnthropicEventFrame(Json{{"type", "message_start"}, {"message", std::move(message)}}) +
         AnthropicEventFrame(Json{{"type", "ping"}});
}

std::string AnthropicStreamEncoder::OpenBlock(const OutputPiece& piece) {
  block_index_ = n_blocks_++;
  block_kind_ = piece.kind;
  block_tool_ = piece.tool_index;
  Json block;
  switch (piece.kind) {
    case OutputPiece::Kind::kReasoning:
      block = Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
      break;
    case OutputPiece::Kind::kContent:
      block = Json{{"type", "text"}, {"text", ""}};
      break;
    case OutputPiece::Kind::kToolCall:
      block = Json{{"type", "tool_use"},
                   {"id", output_.tool_call_id(static_cast<size_t>(piece.tool_index))},
                   {"name", piece.tool_name},
                   {"input", Json::object()}};
      break;
  }
  return AnthropicEventFrame(
      Json{{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
}

std::string AnthropicStreamEncoder::CloseBlock() {
  if (block_index_ < 0) return "";
  const int32_t index = block_index_;
  block_index_ = -1;
  return AnthropicEventFrame(Json{{"type", "content_block_stop"}, {"index", index}});
}

std::string AnthropicStreamEncoder::Add(const RequestOutput& event) {
  if (finished_) return "";
  std::string frames;
  for (const OutputPiece& piece : output_.Add(event)) {
    const bool same_block = block_index_ >= 0 && block_kind_ == piece.kind &&
                            !piece.starts_call() && block_tool_ == piece.tool_index;
    if (!same_block) {
      frames += CloseBlock();
      frames += OpenBlock(piece);
    }
    if (piece.text.empty()) continue;
    Json delta;
    switch (piece.kind) {
      case OutputPiece::Kind::kReasoning:
        delta = Json{{"type", "thinking_delta"}, {"thinking", piece.text}};
        break;
      case OutputPiece::Kind::kContent:
        delta = Json{{"type", "text_delta"}, {"text", piece.text}};
        break;
      case OutputPiece::Kind::kToolCall:
        delta = Json{{"type", "input_json_delta"}, {"partial_json", piece.text}};
        break;
    }
    frames += AnthropicEventFrame(
        Json{{"type", "content_block_delta"}, {"index", block_index_}, {"delta", delta}});
  }
  if (!event.finished) return frames;

  finished_ = true;
  if (std::optional<ApiError> error = EventError(event)) {
    return frames + AnthropicEventFrame(AnthropicErrorJson(*error));
  }
  frames += CloseBlock();
  Json delta = Json{{"stop_reason", AnthropicStopReason(output_)},
                    {"stop_sequence", StopSequence(meta_, output_)}};
  frames += AnthropicEventFrame(Json{{"type", "message_delta"},
                                     {"delta", std::move(delta)},
                                     {"usage", AnthropicUsage(output_.usage())}});
  frames += AnthropicEventFrame(Json{{"type", "message_stop"}});
  return frames;
}

AnthropicAccumulator::AnthropicAccumulator(AnthropicMeta meta)
    : meta_(std::move(meta)), output_(meta_.parsing, "toolu_") {}

void AnthropicAccumulator::Add(const RequestOutput& event) {
  if (finished_) return;
  output_.Add(event);
  if (event.finished) {
    finished_ = true;
    error_ = EventError(event);
  }
}

Json AnthropicAccumulator::Build() const {
  return AnthropicMessageJson(meta_, output_);
}

}  // namespace kestrel::server
