// Real chat templates (tests/data/npm/<name>) rendered for every case of
// tests/data/chat/cases.jsonl must match:
//   golden_<name>.jsonl    transformers' apply_chat_template (tools/golden_chat.py), and
//   reference_<name>.jsonl jinja2 set up like transformers (tools/jinja_reference.py).
// A case transformers fails on must fail here too.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "chat_test_util.h"
#include "tokenizer/chat_template.h"

namespace kestrel {
namespace {

using nlohmann::ordered_json;

void CompareWithExpectations(const std::string& tokenizer, const std::string& expectations,
                             const std::string& how_to_make) {
  const std::string cases_path = test::SourcePath("tests/data/chat/cases.jsonl");
  const std::string expect_path = test::SourcePath("tests/data/chat/" + expectations);
  ASSERT_TRUE(test::FileReadable(cases_path))
      << cases_path << " is missing: run tools/gen_chat_cases.py";
  if (!test::FileReadable(expect_path)) {
    FAIL() << expect_path << " is missing. Make it with:\n  " << how_to_make;
  }
  Result<ChatTemplate> tmpl =
      ChatTemplate::FromDirectory(test::SourcePath("tests/data/npm/" + tokenizer));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();

  std::map<std::string, ordered_json> cases;
  for (ordered_json& c : test::ReadJsonLines(cases_path)) {
    std::string name = c.at("name").get<std::string>();
    cases.emplace(std::move(name), std::move(c));
  }
  const std::vector<ordered_json> rows = test::ReadJsonLines(expect_path);
  EXPECT_EQ(rows.size(), cases.size())
      << expect_path << " does not cover cases.jsonl: regenerate it";

  size_t passed = 0;
  for (const ordered_json& row : rows) {
    const std::string name = row.at("name").get<std::string>();
    auto it = cases.find(name);
    if (it == cases.end()) {
      ADD_FAILURE() << name << ": in " << expectations << " but not in cases.jsonl";
      continue;
    }
    const ordered_json& c = it->second;
    const ordered_json kwargs = c.value("kwargs", ordered_json::object());
    Result<std::string> r = tmpl->Render(c.at("messages"), c.value("tools", ordered_json()),
                                         c.value("add_generation_prompt", false),
                                         kwargs.is_null() ? ordered_json::object() : kwargs);
    if (row.contains("rendered")) {
      const std::string want = row.at("rendered").get<std::string>();
      if (!r.ok()) {
        ADD_FAILURE() << name << ": error \"" << r.status().message() << "\", want a rendering";
      } else if (*r != want) {
        ADD_FAILURE() << name << ": " << test::FirstDifference(*r, want);
      } else {
        ++passed;
      }
    } else if (r.ok()) {
      ADD_FAILURE() << name << ": rendered, but the reference failed with \""
                    << row.value("error", std::string()) << "\"";
    } else {
      ++passed;
    }
  }
  std::printf("%s vs %s: %zu/%zu cases match\n", tokenizer.c_str(), expectations.c_str(), passed,
              rows.size());
}

class ChatTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplates, MatchTransformersGolden) {
  const std::string name = GetParam();
  CompareWithExpectations(name, "golden_" + name + ".jsonl",
                          "python3 tools/golden_chat.py --tokenizer-dir tests/data/npm/" + name +
                              " --name " + name +
                              " --cases tests/data/chat/cases.jsonl --out "
                              "tests/data/chat/golden_" +
                              name + ".jsonl   (needs transformers 5.x)");
}

TEST_P(ChatTemplates, MatchJinja2Reference) {
  const std::string name = GetParam();
  CompareWithExpectations(name, "reference_" + name + ".jsonl",
                          "python3 tools/jinja_reference.py --tokenizer-dir tests/data/npm/" +
                              name + " --name " + name +
                              " --cases tests/data/chat/cases.jsonl --out "
                              "tests/data/chat/reference_" +
                              name + ".jsonl");
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ChatTemplates, ::testing::Values("qwen3", "llama3"));

TEST(ChatTemplate, SpecialTokensComeFromTheTokenizerConfig) {
  Result<ChatTemplate> qwen = ChatTemplate::FromDirectory(test::SourcePath("tests/data/npm/qwen3"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_EQ(qwen->special_tokens().value("eos_token", ""), "<|im_end|>");
  EXPECT_FALSE(qwen->special_tokens().contains("bos_token"));  // null in the config
  Result<ChatTemplate> llama =
      ChatTemplate::FromDirectory(test::SourcePath("tests/data/npm/llama3"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  EXPECT_EQ(llama->special_tokens().value("bos_token", ""), "<|begin_of_text|>");
}

TEST(ChatTemplate, OrderedAndSortedJsonOverloadsAgreeOnSortedInput) {
  Result<ChatTemplate> t = ChatTemplate::FromSource("{{ tools | tojson }}{{ messages[0].content }}",
                                                    nlohmann::json::object());
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string msgs = R"([{"content": "hi", "role": "user"}])";
  const std::string tools = R"([{"a": 1, "b": {"c": [1.0, "é"]}}])";
  Result<std::string> a = t->Render(nlohmann::json::parse(msgs), nlohmann::json::parse(tools),
                                    false, nlohmann::json::object());
  Result<std::string> b = t->Render(ordered_json::parse(msgs), ordered_json::parse(tools), false,
                                    ordered_json::object());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, "[{\"a\": 1, \"b\": {\"c\": [1.0, \"é\"]}}]hi");
}

TEST(ChatTemplate, BadTemplateSourceIsAStatus) {
  EXPECT_FALSE(ChatTemplate::FromSource("{% for %}", nlohmann::json::object()).ok());
  EXPECT_FALSE(ChatTemplate::FromDirectory("/nonexistent/dir").ok());
}

TEST(ChatTemplate, KwargsOverrideSpecialTokensAndReachTheTemplate) {
  Result<ChatTemplate> t = ChatTemplate::FromSource(
      "{{ bos_token }}|{{ enable_thinking }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt "
      "}}",
      nlohmann::json{{"bos_token", "<s>"}});
  ASSERT_TRUE(t.ok());
  const nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
  Result<std::string> r =
      t->Render(msgs, nullptr, true, nlohmann::json{{"enable_thinking", false}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "<s>|False|None|None|True");
  r = t->Render(msgs, nullptr, false, nlohmann::json{{"bos_token", "<B>"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "<B>||None|None|False");
}

}  // namespace
}  // namespace kestrel
