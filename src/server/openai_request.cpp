// The endpoint-specific parts of the OpenAI schemas: chat messages and tools for
// /v1/chat/completions, the prompt and legacy options for /v1/completions.
#include "server/openai_request.h"
#include "core/json_file.h"

#include <algorithm>
#include <limits>

#include "tokenizer/unicode.h"

namespace kestrel::server {
namespace {

using detail::Index;
using detail::ReadBool;
using detail::ReadInt;
using detail::ReadString;
using detail::TypeName;
using detail::WrongType;

// A message's content: a string, or an array of {"type": "text", "text": ...} parts joined with
// newlines (what vLLM gives templates that expect a string). Null only where allowed.
std::optional<ApiError> NormalizeContent(const Json& msg, const std::string& param,
                                         bool null_allowed, Json* out) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    if (!null_allowed) return BadRequest("'" + param + "' is required", param);
    *out = "";
    return std::nullopt;
  }
  if (it->is_string()) {
    *out = *it;
    return std::nullopt;
  }
  if (!it->is_array()) return WrongType(param, "a string or an array of content parts", *it);
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    const std::string part_param = Index(param, j);
    if (!part.is_object()) return WrongType(part_param, "an object", part);
    std::optional<std::string> type;
    if (auto e = ReadString(part, "type", part_param + ".type", &type)) return e;
    if (!type) return BadRequest("'" + part_param + ".type' is required", part_param + ".type");
    if (*type != "text") {
      return BadRequest(
          "Content part type '" + tok::Utf8Lossy(*type) + "' is not supported; only text parts are",
          part_param + ".type");
    }
    std::optional<std::string> part_text;
    if (auto e = ReadString(part, "text", part_param + ".text", &part_text)) return e;
    if (!part_text)
      return BadRequest("'" + part_param + ".text' is required", part_param + ".text");
    if (j > 0) text += '\n';
    text += *part_text;
  }
  *out = std::move(text);
  return std::nullopt;
}

// Assistant tool_calls in OpenAI form. `arguments` (a JSON string on the wire) is parsed into an
// object, as vLLM does, because templates print it with `| tojson`; text that is not a JSON
// object is passed on as the string.
std::optional<ApiError> NormalizeToolCalls(const Json& calls, const std::string& param, Json* out) {
  if (!calls.is_array()) return WrongType(param, "an array", calls);
  *out = Json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const Json& call = calls[j];
    const std::string call_param = Index(param, j);
    if (!call.is_object()) return WrongType(call_param, "an object", call);
    std::optional<std::string> id, type;
    if (auto e = ReadString(call, "id", call_param + ".id", &id)) return e;
    if (auto e = ReadString(call, "type", call_param + ".type", &type)) return e;
    if (type && *type != "function") {
      return BadRequest("Tool call type '" + tok::Utf8Lossy(*type) + "' is not supported",
                        call_param + ".type");
    }
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) {
      return BadRequest("'" + call_param + ".function' must be an object",
                        call_param + ".function");
    }
    std::optional<std::string> name;
    if (auto e = ReadString(*fn, "name", call_param + ".function.name", &name)) return e;
    if (!name) {
      return BadRequest("'" + call_param + ".function.name' is required",
                        call_param + ".function.name");
    }
    Json arguments = Json::object();
    if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
      if (a->is_string()) {
        // The body's nesting limit does not see inside strings: check the arguments too.
        const std::string& text = a->get_ref<const std::string&>();
        Json parsed;
        if (JsonNestingDepth(text, kMaxJsonDepth) <= kMaxJsonDepth) {
          parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        }
        arguments = parsed.is_object() ? std::move(parsed) : *a;
      } else if (a->is_object()) {
        arguments = *a;
      } else {
        return WrongType(call_param + ".function.arguments", "a string", *a);
      }
    }
    Json normalized = Json::object();
    if (id) normalized["id"] = *id;
    normalized["type"] = "function";
    normalized["function"] = Json{{"name", *name}, {"arguments", std::move(arguments)}};
    out->push_back(std::move(normalized));
  }
  return std::nullopt;
}

std::optional<ApiError> NormalizeMessage(const Json& msg, size_t i, Json* out) {
  const std::string param = Index("messages", i);
  if (!msg.is_object()) return WrongType(param, "an object", msg);
  std::optional<std::string> role;
  if (auto e = ReadString(msg, "role", param + ".role", &role)) return e;
  if (!role) return BadRequest("'" + param + ".role' is required", param + ".role");
  if (*role == "developer") role = "system";  // OpenAI's newer name for the system role
  const bool assistant = *role == "assistant";
  if (*role != "system" && *role != "user" && !assistant && *role != "tool") {
    return BadRequest("Invalid role '" + tok::Utf8Lossy(*role) +
                          "'; expected system, developer, user, assistant or tool",
                      param + ".role");
  }
  Json m = Json::object();
  m["role"] = *role;
  Json content;
  if (auto e = NormalizeContent(msg, param + ".content", assistant, &content)) return e;
  m["content"] = std::move(content);

  std::optional<std::string> name, tool_call_id, reasoning;
  if (auto e = ReadString(msg, "name", param + ".name", &name)) return e;
  if (name) m["name"] = *name;
  if (*role == "tool") {
    if (auto e = ReadString(msg, "tool_call_id", param + ".tool_call_id", &tool_call_id)) {
      return e;
    }
    if (tool_call_id) m["tool_call_id"] = *tool_call_id;
  }
  if (assistant) {
    if (auto calls = msg.find("tool_calls"); calls != msg.end() && !calls->is_null()) {
      Json normalized;
      if (auto e = NormalizeToolCalls(*calls, param + ".tool_calls", &normalized)) return e;
      m["tool_calls"] = std::move(normalized);
    }
    // Reasoning of earlier turns (Qwen3-style templates read reasoning_content).
    if (auto e = ReadString(msg, "reasoning_content", param + ".reasoning_content", &reasoning)) {
      return e;
    }
    if (!reasoning) {
      if (auto e = ReadString(msg, "reasoning", param + ".reasoning", &reasoning)) return e;
    }
    if (reasoning) m["reasoning_content"] = *reasoning;
  }
  *out = std::move(m);
  return std::nullopt;
}

std::optional<ApiError> ReadToolChoice(const Json& body, ChatRequest* out) {
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return std::nullopt;
  ToolChoice& tc = out->tool_choice;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (!detail::ToolChoiceModeOf(c, &tc.mode)) {
      return BadRequest("Invalid tool_choice '" + tok::Utf8Lossy(c) +
                            "'; expected 'auto', 'none', 'required' or a named function",
                        "tool_choice");
    }
  } else if (choice->is_object()) {
    std::optional<std::string> type, name;
    if (auto e = ReadString(*choice, "type", "tool_choice.type", &type)) return e;
    if (type.value_or("function") != "function") {
      return BadRequest("tool_choice type '" + tok::Utf8Lossy(*type) + "' is not supported",
                        "tool_choice.type");
    }
    auto fn = choice->find("function");
    if (fn == choice->end() || !fn->is_object()) {
      return BadRequest("'tool_choice.function' must be an object", "tool_choice.function");
    }
    if (auto e = ReadString(*fn, "name", "tool_choice.function.name", &name)) return e;
    if (!name || name->empty()) {
      return BadRequest("'tool_choice.function.name' is required", "tool_choice.function.name");
    }
    tc.mode = ToolChoice::Mode::kFunction;
    tc.function = *name;
  } else {
    return WrongType("tool_choice", "a string or an object", *choice);
  }
  return ValidateToolChoice(tc, out->tools, "tool_choice");
}

std::optional<ApiError> ReadTools(const Json& body, ChatRequest* out) {
  auto it = body.find("tools");
  if (it != body.end() && !it->is_null()) {
    if (auto e = ValidateTools(*it, "tools")) return e;
    out->tools = *it;
  }
  if (auto e = ReadToolChoice(body, out)) return e;
  return ReadBool(body, "parallel_tool_calls", "parallel_tool_calls", &out->parallel_tool_calls);
}

}  // namespace

std::optional<ApiError> ValidateTools(const Json& tools, const std::string& base) {
  if (!tools.is_array()) return WrongType(base, "an array", tools);
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = Index(base, i);
    if (!tool.is_object()) return WrongType(param, "an object", tool);
    std::optional<std::string> type;
    if (auto e = ReadString(tool, "type", param + ".type", &type)) return e;
    if (type.value_or("function") != "function") {
      return BadRequest(
          "Tool type '" + tok::Utf8Lossy(*type) + "' is not supported; only 'function' tools are",
          param + ".type");
    }
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) {
      return BadRequest("'" + param + ".function' must be an object", param + ".function");
    }
    std::optional<std::string> name, description;
    if (auto e = ReadString(*fn, "name", param + ".function.name", &name)) return e;
    if (!name || name->empty()) {
      return BadRequest("'" + param + ".function.name' is required", param + ".function.name");
    }
    if (std::find(names.begin(), names.end(), *name) != names.end()) {
      return BadRequest(
          "Tool names must be unique; '" + tok::Utf8Lossy(*name) + "' appears more than once",
          param + ".function.name");
    }
    names.push_back(*name);
    if (auto e = ReadString(*fn, "description", param + ".function.description", &description)) {
      return e;
    }
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object()) {
      return WrongType(param + ".function.parameters", "an object (a JSON schema)", *p);
    }
    bool strict = false;
    if (auto e = ReadBool(*fn, "strict", param + ".function.strict", &strict)) return e;
  }
  return std::nullopt;
}

std::vector<std::string> ToolNames(const Json& tools) {
  std::vector<std::string> names;
  if (!tools.is_array()) return names;
  for (const Json& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    auto name = fn->find("name");
    if (name != fn->end() && name->is_string()) names.push_back(name->get<std::string>());
  }
  return names;
}

std::optional<ApiError> ValidateToolChoice(const ToolChoice& choice, const Json& tools,
                                           const std::string& param) {
  const std::vector<std::string> names = ToolNames(tools);
  if (choice.mode == ToolChoice::Mode::kRequired && names.empty()) {
    return BadRequest("tool_choice 'required' needs at least one tool in 'tools'", param);
  }
  if (choice.mode == ToolChoice::Mode::kFunction &&
      std::find(names.begin(), names.end(), choice.function) == names.end()) {
    return BadRequest("tool_choice names the function '" + tok::Utf8Lossy(choice.function) +
                          "', which is not one of the tools",
                      param);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChatRequest(const Json& body, const ParseContext& ctx,
                                         ChatRequest* out) {
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) {
    return BadRequest("'messages' is required", "messages");
  }
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  if (messages->empty()) return BadRequest("'messages' must not be empty", "messages");
  out->messages = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    Json m;
    if (auto e = NormalizeMessage((*messages)[i], i, &m)) return e;
    out->messages.push_back(std::move(m));
  }
  if (auto e = ReadTools(body, out)) return e;
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) return WrongType("chat_template_kwargs", "an object", *kw);
    out->template_kwargs = *kw;
  }
  // vLLM extensions: continue_final_message (the template continues the last assistant message
  // instead of opening a new one) turns add_generation_prompt off unless that is set explicitly.
  bool continue_final = false;
  if (auto e =
          ReadBool(body, "continue_final_message", "continue_final_message", &continue_final)) {
    return e;
  }
  if (continue_final) {
    out->template_kwargs["continue_final_message"] = true;
    out->add_generation_prompt = false;
  }
  if (auto e = ReadBool(body, "add_generation_prompt", "add_generation_prompt",
                        &out->add_generation_prompt)) {
    return e;
  }

  if (auto e = detail::ParseCommonFields(body, ctx, &out->options)) return e;
  if (auto e = ReadBool(body, "logprobs", "logprobs", &out->logprobs)) return e;
  std::optional<int64_t> top;
  if (auto e = ReadInt(body, "top_logprobs", "top_logprobs", 0, 20, &top)) return e;
  out->top_logprobs = static_cast<int32_t>(top.value_or(0));
  SamplingParams& p = out->options.sampling;
  p.logprobs = out->logprobs;
  p.n_top_logprobs = out->top_logprobs;
  return detail::ValidateSampling(p, ctx.vocab_size);
}

std::optional<ApiError> ParseCompletionRequest(const Json& body, const ParseContext& ctx,
                                               CompletionRequest* out) {
  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) {
    return BadRequest("'prompt' is required", "prompt");
  }
  const Json* p = &*prompt;
  // A one-element batch is the same as its element.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  }
  if (p->is_string()) {
    out->prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return BadRequest("'prompt' must not be empty", "prompt");
    std::vector<int32_t> ids;
    ids.reserve(p->size());
    for (size_t i = 0; i < p->size(); ++i) {
      const Json& t = (*p)[i];
      if (t.is_string() || t.is_array()) {
        return BadRequest("Batched prompts are not supported; send one prompt per request",
                          "prompt");
      }
      int64_t id = 0;
      if (auto e = detail::IntValue(t, Index("prompt", i), 0, ctx.vocab_size - 1, &id)) return e;
      ids.push_back(static_cast<int32_t>(id));
    }
    out->prompt = std::move(ids);
  } else {
    return WrongType("prompt", "a string or an array of token ids", *p);
  }

  // Legacy options that the engine does not implement are refused rather than ignored.
  if (auto e = ReadBool(body, "echo", "echo", &out->echo)) return e;
  std::optional<std::string> suffix;
  if (auto e = ReadString(body, "suffix", "suffix", &suffix)) return e;
  if (suffix && !suffix->empty()) return BadRequest("'suffix' is not supported", "suffix");
  std::optional<int64_t> best_of;
  if (auto e = ReadInt(body, "best_of", "best_of", std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(), &best_of)) {
    return e;
  }
  if (best_of && *best_of != 1) return BadRequest("Only best_of=1 is supported", "best_of");

  if (auto e = detail::ParseCommonFields(body, ctx, &out->options)) return e;
  if (auto it = body.find("logprobs"); it != body.end() && it->is_boolean()) {
    return WrongType("logprobs", "an integer", *it);
  }
  std::optional<int64_t> logprobs;
  if (auto e = ReadInt(body, "logprobs", "logprobs", 0, 20, &logprobs)) return e;
  if (out->echo && logprobs) {
    return BadRequest(
        "'echo' together with 'logprobs' is not supported: prompt log-probabilities are not "
        "computed",
        "echo");
  }
  SamplingParams& s = out->options.sampling;
  if (logprobs) {
    out->logprobs = static_cast<int32_t>(*logprobs);
    s.logprobs = true;
    s.n_top_logprobs = *out->logprobs;
  } else {
    s.logprobs = false;
    s.n_top_logprobs = 0;
  }
  return detail::ValidateSampling(s, ctx.vocab_size);
}

}  // namespace kestrel::server
