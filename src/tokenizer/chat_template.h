// Chat templates: the Jinja2 subset that Hugging Face chat templates use, rendered exactly
// like transformers' apply_chat_template(..., tokenize=False).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel {

namespace jinja {
class Template;
class Value;
}  // namespace jinja

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // From tokenizer_config.json "chat_template" (a string, or a list of {name, template}:
  // "default" is used) or chat_template.jinja in dir. Special-token strings (bos_token,
  // eos_token, ...) come from tokenizer_config.json. As in transformers, a template named
  // "tool_use" (in the list, or additional_chat_templates/tool_use.jinja) replaces the default
  // when tools are given.
  static Result<ChatTemplate> FromDirectory(const std::string& dir);
  static Result<ChatTemplate> FromSource(const std::string& source,
                                         const nlohmann::json& special_tokens);

  // messages: [{role, content, tool_calls?, reasoning_content?, ...}]; tools: array or null;
  // kwargs: extra template variables (e.g. enable_thinking). A raise_exception in the
  // template, or an error while rendering, is returned as a Status with its message.
  //
  // nlohmann::json sorts object keys, and templates print objects (tools | tojson) in their
  // key order: callers holding request JSON should parse it as ordered_json and use the
  // ordered overload, which keeps keys in the order the client sent them, as Python does.
  Result<std::string> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                             bool add_generation_prompt, const nlohmann::json& kwargs) const;
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools, bool add_generation_prompt,
                             const nlohmann::ordered_json& kwargs) const;

  // The special-token variables the template sees (bos_token, eos_token, ...).
  const nlohmann::json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate();
  Result<std::string> RenderValues(const jinja::Value& messages, const jinja::Value& tools,
                                   bool add_generation_prompt, const jinja::Value& kwargs) const;
  std::unique_ptr<jinja::Template> template_;           // null: no default template
  std::unique_ptr<jinja::Template> tool_use_template_;  // null: none named "tool_use"
  nlohmann::json special_tokens_;
};

}  // namespace kestrel
