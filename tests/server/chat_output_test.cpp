// Chat answers with parsed output: tool calls and reasoning in chat.completion bodies and in
// their chunks (accumulated the way the OpenAI SDK does, a stream must give the body's message
// for any split of the model's text), n choices, and completions with echo.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "server/response_json.h"
#include "server/sse.h"

namespace kestrel::server {
namespace {

std::string TokenBytes(int32_t id) {
  std::string bytes = "t";
  bytes += std::to_string(id);
  return bytes;
}

RequestOutput Text(std::string text, bool finished = false,
                   FinishReason reason = FinishReason::kStop) {
  RequestOutput e;
  e.token_ids = {1};
  e.samples.resize(1);
  e.text = std::move(text);
  e.finished = finished;
  e.finish_reason = reason;
  e.usage = {10, 4, 6};
  return e;
}

ResponseMeta ChatMeta(int32_t n = 1) {
  ResponseMeta m;
  m.kind = ApiKind::kChat;
  m.id = "chatcmpl-x";
  m.created = 1;
  m.model = "tiny";
  m.n_choices = n;
  m.parsing.tool_calls = ToolCallFormat::kHermes;
  m.parsing.reasoning = true;
  return m;
}

std::vector<Json> Chunks(const std::string& sse, bool* done) {
  std::vector<Json> out;
  *done = false;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_EQ(sse.compare(pos, 6, "data: "), 0);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    if (payload == "[DONE]") {
      *done = true;
    } else {
      out.push_back(Json::parse(payload));
    }
    pos = end + 2;
  }
  return out;
}

// The OpenAI SDK's accumulation of chat chunks (ChatCompletionStream), per choice.
std::map<int64_t, Json> Accumulate(const std::vector<Json>& chunks) {
  std::map<int64_t, Json> choices;
  for (const Json& chunk : chunks) {
    for (const Json& c : chunk["choices"]) {
      Json& m = choices[c["index"].get<int64_t>()];
      if (m.is_null()) m = Json{{"message", Json::object()}, {"finish_reason", nullptr}};
      if (!c["finish_reason"].is_null()) m["finish_reason"] = c["finish_reason"];
      const Json& d = c["delta"];
      Json& msg = m["message"];
      if (d.contains("role")) msg["role"] = d["role"];
      for (const char* key : {"content", "reasoning_content"}) {
        if (d.contains(key) && !d[key].get<std::string>().empty()) {
          std::string text = msg.value(key, std::string());
          text += d[key].get<std::string>();
          msg[key] = text;
        }
      }
      if (d.contains("tool_calls")) {
        if (!msg.contains("tool_calls")) msg["tool_calls"] = Json::array();
        for (const Json& tc : d["tool_calls"]) {
          const size_t i = tc["index"].get<size_t>();
          Json& calls = msg["tool_calls"];
          if (i == calls.size()) {
            // The first delta of a call carries its id, type and name.
            EXPECT_TRUE(tc.contains("id") && tc.contains("type")) << tc.dump();
            EXPECT_TRUE(tc["function"].contains("name")) << tc.dump();
            calls.push_back(
                Json{{"id", tc["id"]},
                     {"type", tc["type"]},
                     {"function", Json{{"name", tc["function"]["name"]}, {"arguments", ""}}}});
          } else {
            EXPECT_LT(i, calls.size());
            if (i >= calls.size()) continue;
            EXPECT_FALSE(tc.contains("id"));
          }
          calls[i]["function"]["arguments"] = calls[i]["function"]["arguments"].get<std::string>() +
                                              tc["function"]["arguments"].get<std::string>();
        }
      }
    }
  }
  return choices;
}

// A message with the random tool-call ids replaced by their order (ids differ between runs).
Json WithoutIds(Json message) {
  if (message.contains("tool_calls")) {
    for (Json& call : message["tool_calls"]) {
      EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_")) << call.dump();
      EXPECT_EQ(call["id"].get<std::string>().size(), 29u);
      call.erase("id");
    }
  }
  return message;
}

const std::string kToolOutput =
    "<think>\nCheck the weather.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
    "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

TEST(ChatOutput, ToolCallsAndReasoningInTheBody) {
  ResponseAccumulator acc(ChatMeta(), TokenBytes);
  acc.Add(Text(kToolOutput, true));
  ASSERT_TRUE(acc.finished());
  const Json body = acc.Build();
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const Json& m = choice["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], "Let me look.");
  EXPECT_EQ(m["reasoning_content"], "\nCheck the weather.\n");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(
      WithoutIds(m)["tool_calls"][0].dump(),
      R"({"type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}})");
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
}

TEST(ChatOutput, OnlyToolCallsMeansNullContent) {
  ResponseAccumulator acc(ChatMeta(), TokenBytes);
  acc.Add(Text("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", true));
  const Json m = acc.Build()["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_FALSE(m.contains("reasoning_content"));
  // Cut by max_tokens in the middle of a call: finish_reason stays "length".
  ResponseAccumulator cut(ChatMeta(), TokenBytes);
  cut.Add(
      Text("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"", true, FinishReason::kLength));
  EXPECT_EQ(cut.Build()["choices"][0]["finish_reason"], "length");
}

TEST(ChatOutput, PlainTextWithoutToolParsing) {
  ResponseMeta meta = ChatMeta();
  meta.parsing = OutputParserOptions();  // tool_choice none, no reasoning
  ResponseAccumulator acc(meta, TokenBytes);
  acc.Add(Text(kToolOutput, true));
  const Json m = acc.Build()["choices"][0]["message"];
  const Json expected = Json{{"role", "assistant"}, {"content", kToolOutput}};
  EXPECT_EQ(m.dump(), expected.dump());
}

TEST(ChatOutput, StreamReassemblesToTheBodyAtEverySplit) {
  ResponseAccumulator acc(ChatMeta(), TokenBytes);
  acc.Add(Text(kToolOutput, true));
  const Json body = acc.Build();
  const Json expected = WithoutIds(body["choices"][0]["message"]);
  for (size_t split = 0; split <= kToolOutput.size(); ++split) {
    StreamEncoder enc(ChatMeta(), TokenBytes);
    std::string sse = enc.Start();
    sse += enc.Add(Text(kToolOutput.substr(0, split)));
    sse += enc.Add(Text(kToolOutput.substr(split), true));
    bool done = false;
    const std::vector<Json> chunks = Chunks(sse, &done);
    EXPECT_TRUE(done);
    std::map<int64_t, Json> choices = Accumulate(chunks);
    ASSERT_EQ(choices.size(), 1u);
    Json msg = choices[0]["message"];
    if (!msg.contains("content")) msg["content"] = nullptr;  // the SDK's default
    EXPECT_EQ(msg["content"], expected["content"]) << "split " << split;
    EXPECT_EQ(msg["reasoning_content"], expected["reasoning_content"]) << "split " << split;
    EXPECT_EQ(WithoutIds(msg)["tool_calls"], expected["tool_calls"]) << "split " << split;
    EXPECT_EQ(choices[0]["finish_reason"], "tool_calls");
  }
}

TEST(ChatOutput, SeveralChoices) {
  ResponseMeta meta = ChatMeta(2);
  meta.parsing = OutputParserOptions();
  meta.include_usage = true;
  ResponseAccumulator acc(meta, TokenBytes);
  acc.Add(1, Text("b1"));
  acc.Add(0, Text("a", true));
  EXPECT_FALSE(acc.finished());
  acc.Add(1, Text("b2", true, FinishReason::kLength));
  ASSERT_TRUE(acc.finished());
  const Json body = acc.Build();
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "a");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["message"]["content"], "b1b2");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  // The prompt counts once, completions add up.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);

  StreamEncoder enc(meta, TokenBytes);
  std::string sse = enc.Start();
  sse += enc.Add(1, Text("b1"));
  sse += enc.Add(0, Text("a", true));
  EXPECT_FALSE(enc.finished());
  sse += enc.Add(1, Text("b2", true, FinishReason::kLength));
  EXPECT_TRUE(enc.finished());
  bool done = false;
  const std::vector<Json> chunks = Chunks(sse, &done);
  EXPECT_TRUE(done);
  std::map<int64_t, Json> choices = Accumulate(chunks);
  EXPECT_EQ(choices[0]["message"]["role"], "assistant");
  EXPECT_EQ(choices[1]["message"]["role"], "assistant");
  EXPECT_EQ(choices[0]["message"]["content"], "a");
  EXPECT_EQ(choices[1]["message"]["content"], "b1b2");
  EXPECT_EQ(choices[1]["finish_reason"], "length");
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 8);  // after both finished
}

TEST(ChatOutput, CompletionEcho) {
  ResponseMeta meta;
  meta.kind = ApiKind::kCompletion;
  meta.id = "cmpl-x";
  meta.n_choices = 2;
  meta.echo = "def f():";
  ResponseAccumulator acc(meta, TokenBytes);
  acc.Add(0, Text(" pass", true));
  acc.Add(1, Text(" return", true));
  const Json body = acc.Build();
  EXPECT_EQ(body["choices"][0]["text"], "def f(): pass");
  EXPECT_EQ(body["choices"][1]["text"], "def f(): return");

  StreamEncoder enc(meta, TokenBytes);
  std::string sse = enc.Start();
  sse += enc.Add(0, Text(" pass", true));
  sse += enc.Add(1, Text(" return", true));
  bool done = false;
  std::map<int64_t, std::string> text;
  for (const Json& chunk : Chunks(sse, &done)) {
    for (const Json& c : chunk["choices"]) text[c["index"].get<int64_t>()] += c["text"];
  }
  EXPECT_EQ(text[0], "def f(): pass");
  EXPECT_EQ(text[1], "def f(): return");
}

TEST(ChatOutput, FailureOfOneChoiceEndsTheAnswer) {
  ResponseMeta meta = ChatMeta(2);
  ResponseAccumulator acc(meta, TokenBytes);
  RequestOutput failed = Text("", true);
  failed.error = Internal("boom");
  acc.Add(1, failed);
  EXPECT_TRUE(acc.finished());
  ASSERT_TRUE(acc.error().has_value());
  EXPECT_EQ(acc.error()->status, 500);
}

}  // namespace
}  // namespace kestrel::server
