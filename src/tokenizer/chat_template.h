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
}

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // From tokenizer_config.json "chat_template" (a string, or a list of {name, template}:
  // "default" is used) or chat_template.jinja in dir. Special-token strings (bos_token,
  // eos_token, ...) come from tokenizer_config.json.
  static Result<ChatTemplate> FromDirectory(const std::string& dir);
  static Result<ChatTemplate> FromSource(const std::string& source, const nlohmann::json& special_tokens);

  // messages: [{role, content, tool_calls?, reasoning_content?, ...}]; tools: array or null;
  // kwargs: extra template variables (e.g. enable_thinking). A raise_exception in the
  // template, or an error while rendering, is returned as a Status with its message.
  Result<std::string> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                             bool add_generation_prompt, const nlohmann::json& kwargs) const;

 private:
  ChatTemplate();
  std::unique_ptr<jinja::Template> template_;
  nlohmann::json special_tokens_;
};

}  // namespace kestrel
