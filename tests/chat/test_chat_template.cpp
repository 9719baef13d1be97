// ChatTemplate around the interpreter: how templates and special tokens are found in a
// tokenizer directory, and what apply_chat_template does besides rendering (template choice
// by tools, continue_final_message, call parameters that never reach the template).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "tokenizer/chat_template.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// A scratch tokenizer directory, removed at the end of the test.
class TokenizerDir {
 public:
  TokenizerDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("kestrel_chat_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TokenizerDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  void Write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

const json kUser = json::parse(R"([{"role": "user", "content": "hi"}])");

std::string RenderOk(const ChatTemplate& t, const json& messages, const json& tools, bool agp,
                     const json& kwargs = json::object()) {
  Result<std::string> r = t.Render(messages, tools, agp, kwargs);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::string();
}

TEST(ChatTemplateDir, ChatTemplateJinjaWinsOverTheConfig) {
  TokenizerDir dir;
  dir.Write("tokenizer_config.json", R"({"chat_template": "config", "eos_token": "</s>"})");
  dir.Write("chat_template.jinja", "file {{ eos_token }}\n");
  Result<ChatTemplate> t = ChatTemplate::FromDirectory(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(RenderOk(*t, kUser, nullptr, false), "file </s>");
}

TEST(ChatTemplateDir, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  TokenizerDir dir;
  dir.Write("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "plain"},
      {"name": "tool_use", "template": "tools={{ tools | length }}"}]})");
  Result<ChatTemplate> t = ChatTemplate::FromDirectory(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(RenderOk(*t, kUser, nullptr, false), "plain");
  EXPECT_EQ(RenderOk(*t, kUser, json::array(), false), "tools=0");  // `tools is not None`
  EXPECT_EQ(RenderOk(*t, kUser, json::parse(R"([{"name": "f"}])"), false), "tools=1");
}

TEST(ChatTemplateDir, WithoutADefaultOnlyToolUseRenders) {
  TokenizerDir dir;
  dir.Write("tokenizer_config.json", "{}");
  dir.Write("additional_chat_templates/tool_use.jinja", "T");
  Result<ChatTemplate> t = ChatTemplate::FromDirectory(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(RenderOk(*t, kUser, json::array(), false), "T");
  Result<std::string> r = t->Render(kUser, nullptr, false, json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no default"), std::string::npos);
}

TEST(ChatTemplateDir, MissingOrBrokenTemplatesAreStatuses) {
  TokenizerDir dir;
  dir.Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_EQ(ChatTemplate::FromDirectory(dir.path()).status().code(), StatusCode::kNotFound);
  dir.Write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  EXPECT_EQ(ChatTemplate::FromDirectory(dir.path()).status().code(), StatusCode::kInvalidArgument);
  dir.Write("tokenizer_config.json", R"({"chat_template": 42})");
  EXPECT_FALSE(ChatTemplate::FromDirectory(dir.path()).ok());
  dir.Write("tokenizer_config.json", "{not json");
  EXPECT_FALSE(ChatTemplate::FromDirectory(dir.path()).ok());
}

TEST(ChatTemplateDir, SpecialTokensFollowTransformers5) {
  TokenizerDir dir;
  dir.Write("tokenizer_config.json", R"({
      "chat_template": "[{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ image_token }}|{{ additional_special_tokens is defined }}]",
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
      "eos_token": "</s>", "pad_token": "", "unk_token": null,
      "additional_special_tokens": ["<x>"],
      "extra_special_tokens": {"image_token": "<img>"}})");
  dir.Write("special_tokens_map.json", R"({"unk_token": "<unk>", "eos_token": "<ignored>"})");
  Result<ChatTemplate> t = ChatTemplate::FromDirectory(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().message();
  // unk_token is null in the config, which takes precedence over special_tokens_map.json.
  EXPECT_EQ(RenderOk(*t, kUser, nullptr, false), "[<s>|</s>||False|<img>|False]");
}

TEST(ChatTemplateRender, ContinueFinalMessageCutsAfterTheLastContent) {
  Result<ChatTemplate> t = ChatTemplate::FromSource(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</end>\n{% endfor %}",
      json::object());
  ASSERT_TRUE(t.ok());
  const json msgs = json::parse(
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, here"}])");
  const json cont = json{{"continue_final_message", true}};
  EXPECT_EQ(RenderOk(*t, msgs, nullptr, false, cont), "<user>hi</end>\n<assistant>Sure, here");
  // Trailing spaces the template trimmed away are not brought back.
  const json spaced = json::parse(
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  partial  "}])");
  EXPECT_EQ(RenderOk(*t, spaced, nullptr, false, cont), "<user>hi</end>\n<assistant>partial");
  EXPECT_FALSE(t->Render(msgs, nullptr, true, cont).ok());  // with add_generation_prompt
  Result<ChatTemplate> drops =
      ChatTemplate::FromSource("{{ messages[0].content }}", json::object());
  ASSERT_TRUE(drops.ok());
  EXPECT_FALSE(drops->Render(msgs, nullptr, false, cont).ok());  // final message not rendered
}

TEST(ChatTemplateRender, CallParametersNeverReachTheTemplate) {
  Result<ChatTemplate> t = ChatTemplate::FromSource(
      "{{ tokenize is defined }}{{ return_dict is defined }}{{ chat_template is defined }}"
      "{{ custom }}",
      json::object());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(
      RenderOk(
          *t, kUser, nullptr, false,
          json{{"tokenize", false}, {"return_dict", true}, {"chat_template", "x"}, {"custom", 7}}),
      "FalseFalseFalse7");
}

TEST(ChatTemplateRender, BadConversationsAreStatuses) {
  Result<ChatTemplate> t = ChatTemplate::FromSource("{{ messages | length }}", json::object());
  ASSERT_TRUE(t.ok());
  Result<std::string> empty = t->Render(json::array(), nullptr, false, json::object());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            "Cannot apply chat template to an empty conversation. Provide at least one message.");
  EXPECT_FALSE(t->Render(json::object(), nullptr, false, json::object()).ok());
  EXPECT_FALSE(t->Render(kUser, json::object(), false, json::object()).ok());
  EXPECT_EQ(RenderOk(*t, kUser, nullptr, false, json()), "1");  // null kwargs = none
}

TEST(ChatTemplateRender, OrderedInputKeepsClientKeyOrder) {
  Result<ChatTemplate> t = ChatTemplate::FromSource(
      "{{ tools[0] | tojson }}|{{ messages[0] | tojson }}", json::object());
  ASSERT_TRUE(t.ok());
  const ordered_json msgs = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  const ordered_json tools = ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  Result<std::string> r = t->Render(msgs, tools, false, ordered_json::object());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r,
            R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})"
            R"(|{"role": "user", "content": "x"})");
}

}  // namespace
}  // namespace kestrel
