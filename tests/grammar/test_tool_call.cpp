// Forced tool calls (grammar/tool_call.h): the Hermes and Llama 3 JSON syntaxes, the tool's name
// as a const, arguments checked against its schema, one call or several, and errors naming the
// tool.
#include <gtest/gtest.h>

#include <vector>

#include "grammar/tool_call.h"
#include "grammar_test_util.h"

namespace kestrel::grammar {
namespace {

using testing::CompileOrDie;
using testing::FullMatch;

std::vector<ToolSpec> Tools() {
  return {
      {"read_file", nlohmann::ordered_json::parse(
                        R"({"type":"object","properties":{"path":{"type":"string"},
                            "line":{"type":"integer","minimum":1}},"required":["path"]})")},
      {"list", nlohmann::ordered_json()},  // no parameters schema: any object
  };
}

TEST(ToolCallGrammar, HermesSyntaxWithSchemaValidArguments) {
  auto g = CompileOrDie(*ToolCallGrammar(ToolCallSyntax::kHermes, Tools(), /*parallel=*/false));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(FullMatch(g,
                        "<tool_call>\n{\"name\": \"read_file\", \"arguments\": "
                        "{\"path\": \"a.txt\", \"line\": 3}}\n</tool_call>"));
  EXPECT_TRUE(FullMatch(g,
                        "<tool_call>\n{\"name\":\"read_file\",\"arguments\":{\"path\":\"a\"}}"
                        "\n</tool_call>"));
  EXPECT_TRUE(FullMatch(g,
                        "<tool_call>\n{\"name\": \"list\", \"arguments\": {\"any\": [1, 2]}}"
                        "\n</tool_call>"));
  // Unknown tool, missing required argument, wrong type, out of bounds, no wrapper, two calls.
  EXPECT_FALSE(FullMatch(g, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {}}\n"
                         "</tool_call>"));
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n{\"name\": \"read_file\", \"arguments\": "
                         "{\"path\": 1}}\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n{\"name\": \"read_file\", \"arguments\": "
                         "{\"path\": \"a\", \"line\": 0}}\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g, "{\"name\": \"list\", \"arguments\": {}}"));
  const std::string one = "<tool_call>\n{\"name\": \"list\", \"arguments\": {}}\n</tool_call>";
  EXPECT_FALSE(FullMatch(g, one + "\n" + one));
  auto parallel = CompileOrDie(*ToolCallGrammar(ToolCallSyntax::kHermes, Tools(), true));
  EXPECT_TRUE(FullMatch(parallel, one + "\n" + one));
  EXPECT_TRUE(FullMatch(parallel, one));
  std::string eight = one, nine;
  for (uint32_t i = 1; i < kMaxParallelToolCalls; ++i) eight += "\n" + one;
  nine = eight + "\n" + one;
  EXPECT_TRUE(FullMatch(parallel, eight));
  EXPECT_FALSE(FullMatch(parallel, nine));
}

TEST(ToolCallGrammar, NamedToolAndLlama3Syntax) {
  const std::vector<ToolSpec> named = {Tools()[0]};
  auto g = CompileOrDie(*ToolCallGrammar(ToolCallSyntax::kLlama3Json, named, false));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(FullMatch(g, R"({"name": "read_file", "parameters": {"path": "x"}})"));
  EXPECT_FALSE(FullMatch(g, R"({"name": "list", "parameters": {}})"));
  EXPECT_FALSE(FullMatch(g, R"({"name": "read_file", "arguments": {"path": "x"}})"));
}

TEST(ToolCallGrammar, Qwen3CoderXmlSyntax) {
  auto g = CompileOrDie(*ToolCallGrammar(ToolCallSyntax::kXml, Tools(), /*parallel=*/false));
  ASSERT_NE(g, nullptr);
  const std::string call =
      "<tool_call>\n<function=read_file>\n<parameter=path>\na dir/b.txt\nline two\n"
      "</parameter>\n<parameter=line>\n12\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(FullMatch(g, call));
  // The optional parameter may be left out; the required one may not.
  EXPECT_TRUE(FullMatch(g,
                        "<tool_call>\n<function=read_file>\n<parameter=path>\nx\n</parameter>\n"
                        "</function>\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n<function=read_file>\n<parameter=line>\n3\n"
                         "</parameter>\n</function>\n</tool_call>"));
  // Typed values validate; string values cannot hold a closing tag.
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n<function=read_file>\n<parameter=path>\nx\n</parameter>\n"
                         "<parameter=line>\n0\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g,
                         "<tool_call>\n<function=read_file>\n<parameter=path>\na</b\n"
                         "</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(FullMatch(g, "<tool_call>\n<function=list>\n</function>\n</tool_call>"));
  EXPECT_FALSE(FullMatch(g, "<tool_call>\n<function=rm>\n</function>\n</tool_call>"));
}

TEST(ToolCallGrammar, ErrorsNameTheTool) {
  EXPECT_FALSE(ToolCallGrammar(ToolCallSyntax::kHermes, {}, false).ok());
  const std::vector<ToolSpec> bad = {
      {"odd", nlohmann::ordered_json::parse(R"({"type":"object","not":{}})")}};
  Result<Grammar> g = ToolCallGrammar(ToolCallSyntax::kHermes, bad, false);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tool 'odd'"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("not"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace kestrel::grammar
