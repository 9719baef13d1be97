#include "tokenizer/chat_template.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/json_file.h"
#include "core/gguf.h"
#include "tokenizer/tokenizer_gguf.h"
#include "core/mapped_file.h"
#include "tokenizer/jinja/json.h"
#include "tokenizer/jinja/pystr.h"
#include "tokenizer/jinja/template.h"

namespace kestrel {

namespace {

using nlohmann::json;

// The named special tokens transformers puts in the template's scope
// (template_kwargs = {**tokenizer.special_tokens_map, **kwargs}).
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

// apply_chat_template's own parameters: passed as kwargs they configure the call and never
// reach the template.
constexpr const char* kCallParameters[] = {"tokenize",
                                           "padding",
                                           "truncation",
                                           "max_length",
                                           "return_tensors",
                                           "return_dict",
                                           "return_assistant_tokens_mask",
                                           "tokenizer_kwargs",
                                           "continue_final_message",
                                           "chat_template"};

// A special token is a string or a serialized AddedToken {"content": "...", ...}.
std::optional<std::string> TokenString(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return std::nullopt;
}

// transformers 5 puts the named special tokens that are set (not None) in the template's scope,
// plus the model-specific names of a dict-valued extra_special_tokens (image_token, ...);
// the list of additional special tokens is not part of it.
json SpecialTokens(const json& config, const json& map_file) {
  json out = json::object();
  for (const char* name : kSpecialTokenNames) {
    const json* source = config.contains(name) ? &config : &map_file;
    if (!source->contains(name)) continue;
    if (auto tok = TokenString((*source)[name])) out[name] = *tok;
  }
  if (auto it = config.find("extra_special_tokens"); it != config.end() && it->is_object()) {
    for (auto e = it->begin(); e != it->end(); ++e) {
      if (auto s = TokenString(e.value())) out[e.key()] = *s;
    }
  }
  return out;
}

// Named templates of a tokenizer directory: "default" and possibly "tool_use" (and others).
Result<std::map<std::string, std::string>> TemplateSources(const std::string& dir,
                                                           const json& config) {
  std::map<std::string, std::string> sources;
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (FileExists(jinja_path)) {
    KASSIGN(sources["default"], ReadFileToString(jinja_path));
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      sources["default"] = it->get<std::string>();
    } else if (it->is_array()) {
      for (const json& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return InvalidArgument(dir +
                                 "/tokenizer_config.json: chat_template entries must be "
                                 "{\"name\": ..., \"template\": ...}");
        }
        sources[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
      }
    } else {
      return InvalidArgument(dir +
                             "/tokenizer_config.json: chat_template must be a string or "
                             "a list of {name, template}");
    }
  }
  const std::string tool_use_path = dir + "/additional_chat_templates/tool_use.jinja";
  if (FileExists(tool_use_path)) {
    KASSIGN(sources["tool_use"], ReadFileToString(tool_use_path));
  }
  if (sources.empty()) {
    return NotFound(dir +
                    ": the tokenizer has no chat template (no chat_template in "
                    "tokenizer_config.json and no chat_template.jinja)");
  }
  return sources;
}

// continue_final_message: cut the rendering right after the final message's content, so the
// model continues it (transformers' render_jinja_template does the same).
Result<std::string> CutAtFinalMessage(std::string rendered, const jinja::Value& messages) {
  const jinja::Value& last = messages.items().back();
  const jinja::Value* content = last.is_dict() ? last.dict().FindString("content") : nullptr;
  std::optional<std::string> text;
  if (content != nullptr && content->is_string()) {
    text = content->str();
  } else if (content != nullptr && content->has_items()) {
    for (auto it = content->items().rbegin(); it != content->items().rend(); ++it) {
      if (!it->is_dict()) continue;
      const jinja::Value* t = it->dict().FindString("text");
      if (t != nullptr && t->is_string()) {
        text = t->str();
        break;
      }
    }
  }
  if (!text) {
    return InvalidArgument(
        "continue_final_message is set but we could not find any text to continue in the final "
        "message!");
  }
  const std::string stripped = jinja::py::Strip(*text, std::nullopt, true, true);
  const size_t loc = rendered.rfind(stripped);
  if (loc == std::string::npos) {
    return InvalidArgument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template! This can happen if the chat template deletes portions of "
        "the final message. Please verify the chat template and final message in your chat to "
        "ensure they are compatible.");
  }
  const std::string lstripped = jinja::py::Strip(*text, std::nullopt, true, false);
  if (rendered.compare(loc, lstripped.size(), *text) == 0 &&
      loc + lstripped.size() <= rendered.size()) {
    rendered.resize(loc + lstripped.size());
  } else {
    rendered.resize(loc + stripped.size());
  }
  return rendered;
}

}  // namespace

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

Result<ChatTemplate> ChatTemplate::FromDirectory(const std::string& dir) {
  if (IsGgufFile(dir)) {
    KASSIGN(GgufFile g, GgufFile::Open(dir));
    KASSIGN(json config, tok::TokenizerConfigFromGguf(g));
    auto it = config.find("chat_template");
    if (it == config.end()) return NotFound(dir + ": the GGUF file has no tokenizer.chat_template");
    Result<ChatTemplate> t = FromSource(it->get<std::string>(), SpecialTokens(config, json::object()));
    if (!t.ok()) return t.status().With(dir + ": chat template: ");
    return t;
  }
  const std::string config_path = dir + "/tokenizer_config.json";
  json config = json::object();
  if (FileExists(config_path)) {
    KASSIGN(config, ReadJsonFile(config_path));
    if (!config.is_object()) return InvalidArgument(config_path + ": expected a JSON object");
  }
  json map_file = json::object();
  const std::string map_path = dir + "/special_tokens_map.json";
  if (FileExists(map_path)) {
    KASSIGN(map_file, ReadJsonFile(map_path));
    if (!map_file.is_object()) map_file = json::object();
  }
  KASSIGN(auto sources, TemplateSources(dir, config));
  ChatTemplate t;
  t.special_tokens_ = SpecialTokens(config, map_file);
  for (const auto& [name, source] : sources) {
    if (name != "default" && name != "tool_use") continue;
    Result<std::unique_ptr<jinja::Template>> compiled = jinja::Template::Parse(source);
    if (!compiled.ok()) return compiled.status().With(dir + ": chat template \"" + name + "\": ");
    (name == "default" ? t.template_ : t.tool_use_template_) = std::move(*compiled);
  }
  return t;
}

Result<ChatTemplate> ChatTemplate::FromSource(const std::string& source,
                                              const nlohmann::json& special_tokens) {
  KASSIGN(std::unique_ptr<jinja::Template> compiled, jinja::Template::Parse(source));
  ChatTemplate t;
  t.template_ = std::move(compiled);
  t.special_tokens_ = special_tokens.is_object() ? special_tokens : json::object();
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                         const nlohmann::json& tools, bool add_generation_prompt,
                                         const nlohmann::json& kwargs) const {
  try {
    return RenderValues(jinja::FromJson(messages), jinja::FromJson(tools), add_generation_prompt,
                        jinja::FromJson(kwargs));
  } catch (const std::exception& e) {
    return InvalidArgument(e.what());
  }
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& kwargs) const {
  try {
    return RenderValues(jinja::FromJson(messages), jinja::FromJson(tools), add_generation_prompt,
                        jinja::FromJson(kwargs));
  } catch (const std::exception& e) {
    return InvalidArgument(e.what());
  }
}

Result<std::string> ChatTemplate::RenderValues(const jinja::Value& messages,
                                               const jinja::Value& tools,
                                               bool add_generation_prompt,
                                               const jinja::Value& kwargs) const {
  using jinja::Value;
  if (!messages.is_list()) return InvalidArgument("messages must be a list");
  if (messages.items().empty()) {
    return InvalidArgument(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  if (!tools.is_none() && !tools.is_undefined() && !tools.is_list()) {
    return InvalidArgument("tools must be a list or null");
  }
  bool continue_final = false;
  if (kwargs.is_dict()) {
    if (const Value* v = kwargs.dict().FindString("continue_final_message"))
      continue_final = v->Truthy();
  }
  if (continue_final && add_generation_prompt) {
    return InvalidArgument(
        "continue_final_message and add_generation_prompt are not compatible. Use "
        "continue_final_message when you want the model to continue the final message, and "
        "add_generation_prompt when you want to add a header that will prompt it to start a new "
        "assistant message instead.");
  }

  jinja::Dict context;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    context.Set(Value::MakeString(it.key()), jinja::FromJson(it.value()));
  }
  Value documents = Value::MakeNone();
  if (kwargs.is_dict()) {
    for (const auto& [k, v] : kwargs.dict().entries()) {
      const std::string name = jinja::ToStr(k);
      if (std::find(std::begin(kCallParameters), std::end(kCallParameters), name) !=
          std::end(kCallParameters)) {
        continue;
      }
      if (name == "documents") {
        documents = v;
        continue;
      }
      context.Set(k, v);
    }
  }
  context.Set(Value::MakeString("messages"), messages);
  context.Set(Value::MakeString("tools"), tools.is_undefined() ? Value::MakeNone() : tools);
  context.Set(Value::MakeString("documents"), documents);
  context.Set(Value::MakeString("add_generation_prompt"), Value::MakeBool(add_generation_prompt));

  const bool has_tools = !tools.is_none() && !tools.is_undefined();
  const jinja::Template* tmpl =
      has_tools && tool_use_template_ ? tool_use_template_.get() : template_.get();
  if (tmpl == nullptr) {
    return InvalidArgument(
        "This model has multiple chat templates with no default specified! Please either pass a "
        "chat template or the name of the template you wish to use to the `chat_template` "
        "argument.");
  }
  KASSIGN(std::string rendered, tmpl->Render(Value::MakeDict(std::move(context))));
  if (continue_final) return CutAtFinalMessage(std::move(rendered), messages);
  return rendered;
}

}  // namespace kestrel
