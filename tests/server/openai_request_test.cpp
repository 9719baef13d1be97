// The endpoint-specific schemas: chat messages, tools and logprobs; the completion prompt and
// its legacy options.
#include <gtest/gtest.h>

#include <string>

#include "server/openai_request.h"

namespace kestrel::server {
namespace {

ParseContext Context() {
  ParseContext ctx;
  ctx.vocab_size = 1000;
  ctx.accepted_models = {"tiny"};
  return ctx;
}

std::optional<ApiError> ParseChat(const std::string& text, ChatRequest* out) {
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  return ParseChatRequest(body, Context(), out);
}

std::optional<ApiError> ParseCompletion(const std::string& text, CompletionRequest* out) {
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  return ParseCompletionRequest(body, Context(), out);
}

// {"messages": [{"role": "user", "content": "hi"}], <extra>}
std::string ChatBody(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "hi"}])" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

void ExpectChatError(const std::string& text, const std::string& param) {
  ChatRequest req;
  std::optional<ApiError> e = ParseChat(text, &req);
  ASSERT_TRUE(e.has_value()) << text;
  EXPECT_EQ(e->status, 400) << text;
  EXPECT_EQ(e->type, "invalid_request_error");
  EXPECT_EQ(e->param, param) << text << ": " << e->message;
}

void ExpectCompletionError(const std::string& text, const std::string& param) {
  CompletionRequest req;
  std::optional<ApiError> e = ParseCompletion(text, &req);
  ASSERT_TRUE(e.has_value()) << text;
  EXPECT_EQ(e->status, 400) << text;
  EXPECT_EQ(e->param, param) << text << ": " << e->message;
}

TEST(ChatRequest, NormalizesRolesAndContent) {
  ChatRequest req;
  ASSERT_FALSE(ParseChat(R"({"messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "user", "content": "hi", "name": "bob", "extra": 1},
      {"role": "assistant", "content": null, "reasoning_content": "hmm"},
      {"role": "assistant", "reasoning": "r2"},
      {"role": "tool", "content": "42", "tool_call_id": "call_1"}]})",
                         &req)
                   .has_value());
  const Json& m = req.messages;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], Json::parse(R"({"role": "system", "content": "be brief"})"));
  EXPECT_EQ(m[1]["content"], "a\nb");
  EXPECT_EQ(m[2], Json::parse(R"({"role": "user", "content": "hi", "name": "bob"})"));
  EXPECT_EQ(m[3],
            Json::parse(R"({"role": "assistant", "content": "", "reasoning_content": "hmm"})"));
  EXPECT_EQ(m[4]["reasoning_content"], "r2");
  EXPECT_EQ(m[5], Json::parse(R"({"role": "tool", "content": "42", "tool_call_id": "call_1"})"));
  EXPECT_TRUE(req.add_generation_prompt);
  EXPECT_TRUE(req.tools.is_null());
  EXPECT_EQ(req.template_kwargs, Json::object());
}

TEST(ChatRequest, ParsesToolCallArgumentsKeepingKeyOrder) {
  ChatRequest req;
  ASSERT_FALSE(ParseChat(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"zeta\": 1, \"alpha\": \"x\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "raw", "arguments": "not json"}},
        {"function": {"name": "obj", "arguments": {"b": 1, "a": 2}}}]}]})",
                         &req)
                   .has_value());
  const Json& calls = req.messages[1]["tool_calls"];
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0]["id"], "call_1");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"zeta":1,"alpha":"x"})");
  EXPECT_EQ(calls[1]["function"]["arguments"], "not json");
  EXPECT_EQ(calls[2]["function"]["arguments"].dump(), R"({"b":1,"a":2})");
  EXPECT_EQ(calls[2]["type"], "function");
}

TEST(ChatRequest, DeeplyNestedArgumentsStayAString) {
  // Inside a string, the nesting escapes the body's depth limit: the arguments are not parsed.
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  ChatRequest req;
  ASSERT_FALSE(ParseChat(R"({"messages": [{"role": "assistant", "tool_calls": [
      {"function": {"name": "f", "arguments": "{\"a\": )" +
                             deep + R"(}"}}]}]})",
                         &req)
                   .has_value());
  EXPECT_TRUE(req.messages[0]["tool_calls"][0]["function"]["arguments"].is_string());
}

TEST(ChatRequest, KeepsToolsAsSent) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["z"]}}}])";
  ChatRequest req;
  ASSERT_FALSE(ParseChat(ChatBody("\"tools\": " + tools + R"(, "tool_choice": "auto")"), &req));
  EXPECT_EQ(req.tools.dump(), tools);  // key order preserved
  EXPECT_FALSE(ParseChat(ChatBody(R"("tools": [], "tool_choice": "none")"), &req).has_value());
}

TEST(ChatRequest, ReadsTemplateOptionsAndLogprobs) {
  ChatRequest req;
  ASSERT_FALSE(ParseChat(ChatBody(R"("chat_template_kwargs": {"enable_thinking": false},
      "add_generation_prompt": false, "logprobs": true, "top_logprobs": 3)"),
                         &req)
                   .has_value());
  EXPECT_EQ(req.template_kwargs, Json::parse(R"({"enable_thinking": false})"));
  EXPECT_FALSE(req.add_generation_prompt);
  EXPECT_TRUE(req.logprobs);
  EXPECT_EQ(req.top_logprobs, 3);
  EXPECT_TRUE(req.options.sampling.logprobs);
  EXPECT_EQ(req.options.sampling.n_top_logprobs, 3);
}

TEST(ChatRequest, ContinueFinalMessage) {
  ChatRequest req;
  ASSERT_FALSE(ParseChat(ChatBody(R"("continue_final_message": true)"), &req).has_value());
  EXPECT_FALSE(req.add_generation_prompt);
  EXPECT_EQ(req.template_kwargs["continue_final_message"], true);
  ExpectChatError(ChatBody(R"("continue_final_message": "yes")"), "continue_final_message");
}

TEST(ChatRequest, SharesTheCommonFields) {
  ChatRequest req;
  ASSERT_FALSE(
      ParseChat(ChatBody(R"("max_completion_tokens": 9, "stop": "x", "stream": true)"), &req));
  EXPECT_EQ(req.options.max_tokens, 9);
  EXPECT_EQ(req.options.stop, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(req.options.stream);
  ExpectChatError(ChatBody(R"("temperature": "x")"), "temperature");
  ExpectChatError(ChatBody(R"("n": 17)"), "n");  // at most kMaxChoices
}

TEST(ChatRequest, RejectsBadMessages) {
  ExpectChatError(R"({})", "messages");
  ExpectChatError(R"({"messages": null})", "messages");
  ExpectChatError(R"({"messages": "hi"})", "messages");
  ExpectChatError(R"({"messages": []})", "messages");
  ExpectChatError(R"({"messages": ["hi"]})", "messages[0]");
  ExpectChatError(R"({"messages": [{"content": "hi"}]})", "messages[0].role");
  ExpectChatError(R"({"messages": [{"role": 1, "content": "hi"}]})", "messages[0].role");
  ExpectChatError(R"({"messages": [{"role": "user", "content": "a"},
                                   {"role": "wizard", "content": "hi"}]})",
                  "messages[1].role");
  ExpectChatError(R"({"messages": [{"role": "user"}]})", "messages[0].content");
  ExpectChatError(R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content");
  ExpectChatError(R"({"messages": [{"role": "system", "content": 5}]})", "messages[0].content");
  ExpectChatError(R"({"messages": [{"role": "user", "content": ["hi"]}]})",
                  "messages[0].content[0]");
  ExpectChatError(R"({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})",
                  "messages[0].content[0].type");
  ExpectChatError(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})",
                  "messages[0].content[1].type");
  ExpectChatError(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
                  "messages[0].content[0].text");
  ExpectChatError(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
                  "messages[0].content[0].text");
  ExpectChatError(R"({"messages": [{"role": "user", "content": "a", "name": 5}]})",
                  "messages[0].name");
  ExpectChatError(R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 5}]})",
                  "messages[0].tool_call_id");
}

TEST(ChatRequest, RejectsBadToolCalls) {
  auto with_calls = [](const std::string& calls) {
    return R"({"messages": [{"role": "assistant", "content": "", "tool_calls": )" + calls + "}]}";
  };
  ExpectChatError(with_calls(R"({"id": "x"})"), "messages[0].tool_calls");
  ExpectChatError(with_calls(R"(["x"])"), "messages[0].tool_calls[0]");
  ExpectChatError(with_calls(R"([{"type": "function"}])"), "messages[0].tool_calls[0].function");
  ExpectChatError(with_calls(R"([{"function": {"arguments": "{}"}}])"),
                  "messages[0].tool_calls[0].function.name");
  ExpectChatError(with_calls(R"([{"type": "code", "function": {"name": "f"}}])"),
                  "messages[0].tool_calls[0].type");
  ExpectChatError(with_calls(R"([{"function": {"name": "f", "arguments": 5}}])"),
                  "messages[0].tool_calls[0].function.arguments");
}

TEST(ChatRequest, RejectsBadToolsAndOptions) {
  ExpectChatError(ChatBody(R"("tools": {"type": "function"})"), "tools");
  ExpectChatError(ChatBody(R"("tools": [5])"), "tools[0]");
  ExpectChatError(ChatBody(R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])"),
                  "tools[0].type");
  ExpectChatError(ChatBody(R"("tools": [{"type": "function"}])"), "tools[0].function");
  ExpectChatError(ChatBody(R"("tools": [{"type": "function", "function": {"name": 1}}])"),
                  "tools[0].function.name");
  ExpectChatError(ChatBody(R"("tool_choice": "required")"), "tool_choice");
  ExpectChatError(ChatBody(R"("tool_choice": "sometimes")"), "tool_choice");
  ExpectChatError(ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"),
                  "tool_choice");
  ExpectChatError(ChatBody(R"("tool_choice": 1)"), "tool_choice");
  ExpectChatError(ChatBody(R"("chat_template_kwargs": [1])"), "chat_template_kwargs");
  ExpectChatError(ChatBody(R"("add_generation_prompt": "yes")"), "add_generation_prompt");
}

TEST(ChatRequest, RejectsBadLogprobs) {
  ExpectChatError(ChatBody(R"("logprobs": 1)"), "logprobs");
  ExpectChatError(ChatBody(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs");
  ExpectChatError(ChatBody(R"("logprobs": true, "top_logprobs": -1)"), "top_logprobs");
  ExpectChatError(ChatBody(R"("logprobs": true, "top_logprobs": "2")"), "top_logprobs");
  ExpectChatError(ChatBody(R"("top_logprobs": 2)"), "top_logprobs");  // needs logprobs
}

TEST(CompletionRequest, PromptForms) {
  CompletionRequest req;
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "Once upon"})", &req));
  EXPECT_EQ(std::get<std::string>(req.prompt), "Once upon");
  ASSERT_FALSE(ParseCompletion(R"({"prompt": [1, 2, 999]})", &req));
  EXPECT_EQ(std::get<std::vector<int32_t>>(req.prompt), (std::vector<int32_t>{1, 2, 999}));
  ASSERT_FALSE(ParseCompletion(R"({"prompt": ["only one"]})", &req));
  EXPECT_EQ(std::get<std::string>(req.prompt), "only one");
  ASSERT_FALSE(ParseCompletion(R"({"prompt": [[4, 5]]})", &req));
  EXPECT_EQ(std::get<std::vector<int32_t>>(req.prompt), (std::vector<int32_t>{4, 5}));
  ASSERT_FALSE(ParseCompletion(R"({"prompt": [7]})", &req));
  EXPECT_EQ(std::get<std::vector<int32_t>>(req.prompt), (std::vector<int32_t>{7}));
  ASSERT_FALSE(ParseCompletion(R"({"prompt": [3.0]})", &req));
  EXPECT_EQ(std::get<std::vector<int32_t>>(req.prompt), (std::vector<int32_t>{3}));
}

TEST(CompletionRequest, RejectsBadPrompts) {
  ExpectCompletionError(R"({})", "prompt");
  ExpectCompletionError(R"({"prompt": null})", "prompt");
  ExpectCompletionError(R"({"prompt": 5})", "prompt");
  ExpectCompletionError(R"({"prompt": {"text": "a"}})", "prompt");
  ExpectCompletionError(R"({"prompt": []})", "prompt");
  ExpectCompletionError(R"({"prompt": ["a", "b"]})", "prompt");
  ExpectCompletionError(R"({"prompt": [[1], [2]]})", "prompt");
  ExpectCompletionError(R"({"prompt": [1, "a"]})", "prompt");
  ExpectCompletionError(R"({"prompt": [1, 1000]})", "prompt[1]");  // vocabulary is 1000
  ExpectCompletionError(R"({"prompt": [-1]})", "prompt[0]");
  ExpectCompletionError(R"({"prompt": [1.5]})", "prompt[0]");
  ExpectCompletionError(R"({"prompt": [true]})", "prompt[0]");
}

TEST(CompletionRequest, RefusesUnsupportedLegacyOptions) {
  CompletionRequest req;
  EXPECT_FALSE(
      ParseCompletion(R"({"prompt": "a", "echo": false, "suffix": "", "best_of": 1})", &req));
  ExpectCompletionError(R"({"prompt": "a", "echo": true, "logprobs": 1})", "echo");
  ExpectCompletionError(R"({"prompt": "a", "echo": "no"})", "echo");
  ExpectCompletionError(R"({"prompt": "a", "suffix": "end"})", "suffix");
  ExpectCompletionError(R"({"prompt": "a", "suffix": 1})", "suffix");
  ExpectCompletionError(R"({"prompt": "a", "best_of": 2})", "best_of");
  ExpectCompletionError(R"({"prompt": "a", "n": 17})", "n");
}

TEST(CompletionRequest, LogprobsIsACount) {
  CompletionRequest req;
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "a", "logprobs": 5})", &req));
  EXPECT_EQ(req.logprobs, 5);
  EXPECT_TRUE(req.options.sampling.logprobs);
  EXPECT_EQ(req.options.sampling.n_top_logprobs, 5);
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "a", "logprobs": 0})", &req));
  EXPECT_TRUE(req.options.sampling.logprobs);
  EXPECT_EQ(req.options.sampling.n_top_logprobs, 0);
  CompletionRequest none;
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "a"})", &none));
  EXPECT_FALSE(none.logprobs.has_value());
  EXPECT_FALSE(none.options.sampling.logprobs);
  ExpectCompletionError(R"({"prompt": "a", "logprobs": true})", "logprobs");
  ExpectCompletionError(R"({"prompt": "a", "logprobs": 21})", "logprobs");
  ExpectCompletionError(R"({"prompt": "a", "logprobs": "3"})", "logprobs");
}

TEST(ChatRequest, ValidatesTools) {
  const std::string f = R"({"type": "function", "function": {"name": "f"}})";
  ExpectChatError(ChatBody(R"("tools": {"name": "f"})"), "tools");
  ExpectChatError(ChatBody(R"("tools": [{"type": "retrieval"}])"), "tools[0].type");
  ExpectChatError(ChatBody(R"("tools": [{"type": "function"}])"), "tools[0].function");
  ExpectChatError(ChatBody(R"("tools": [{"type": "function", "function": {"name": ""}}])"),
                  "tools[0].function.name");
  ExpectChatError(
      ChatBody(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])"),
      "tools[0].function.parameters");
  ExpectChatError(ChatBody("\"tools\": [" + f + ", " + f + "]"), "tools[1].function.name");
  ExpectChatError(
      ChatBody(R"("tools": [{"type": "function", "function": {"name": "f", "description": 1}}])"),
      "tools[0].function.description");
}

TEST(ChatRequest, ToolChoiceAndParallelCalls) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  ChatRequest req;
  ASSERT_FALSE(ParseChat(ChatBody(tools), &req).has_value());
  EXPECT_EQ(req.tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_TRUE(req.parallel_tool_calls);
  ASSERT_FALSE(ParseChat(ChatBody(tools + R"(, "tool_choice": "required",
      "parallel_tool_calls": false)"),
                         &req)
                   .has_value());
  EXPECT_EQ(req.tool_choice.mode, ToolChoice::Mode::kRequired);
  EXPECT_FALSE(req.parallel_tool_calls);
  ChatRequest named;
  ASSERT_FALSE(ParseChat(ChatBody(tools + R"(, "tool_choice": {"type": "function",
      "function": {"name": "f"}})"),
                         &named)
                   .has_value());
  EXPECT_EQ(named.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(named.tool_choice.function, "f");
  ChatRequest none;
  ASSERT_FALSE(ParseChat(ChatBody(tools + R"(, "tool_choice": "none")"), &none).has_value());
  EXPECT_EQ(none.tool_choice.mode, ToolChoice::Mode::kNone);
  // A named function must be a tool; required needs tools.
  ExpectChatError(ChatBody(tools + R"(, "tool_choice": {"type": "function",
      "function": {"name": "g"}})"),
                  "tool_choice");
  ExpectChatError(ChatBody(tools + R"(, "tool_choice": {"type": "function", "function": {}})"),
                  "tool_choice.function.name");
  ExpectChatError(ChatBody(R"("tool_choice": "required")"), "tool_choice");
  ExpectChatError(ChatBody(tools + R"(, "parallel_tool_calls": "no")"), "parallel_tool_calls");
}

TEST(ChatRequest, SeveralChoices) {
  ChatRequest req;
  ASSERT_FALSE(ParseChat(ChatBody(R"("n": 16)"), &req).has_value());
  EXPECT_EQ(req.options.n, 16);
  ASSERT_FALSE(ParseChat(ChatBody(""), &req).has_value());
  ExpectChatError(ChatBody(R"("n": 0)"), "n");
}

TEST(CompletionRequest, Echo) {
  CompletionRequest req;
  ASSERT_FALSE(ParseCompletion(R"({"prompt": "a", "echo": true, "n": 2})", &req).has_value());
  EXPECT_TRUE(req.echo);
  EXPECT_EQ(req.options.n, 2);
}

}  // namespace
}  // namespace kestrel::server
