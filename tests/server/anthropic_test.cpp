// The Anthropic Messages API: request conversion (system, content blocks, tool_use /
// tool_result round trips, tools, tool_choice, errors), the message object, and the SSE event
// sequence, which must add up (as the SDK's MessageStream accumulates it) to the message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/anthropic_api.h"

namespace kestrel::server {
namespace {

ParseContext Context() {
  ParseContext ctx;
  ctx.vocab_size = 1000;
  ctx.accepted_models = {"tiny"};
  return ctx;
}

std::optional<ApiError> Parse(const std::string& text, AnthropicRequest* out,
                              bool count_tokens = false) {
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  return ParseAnthropicRequest(body, Context(), out, count_tokens);
}

// {"model": "tiny", "max_tokens": 16, "messages": [user "hi"], <extra>}
std::string Body(const std::string& extra) {
  return R"({"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}])" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

void ExpectError(const std::string& text, const std::string& param, int status = 400) {
  AnthropicRequest req;
  std::optional<ApiError> e = Parse(text, &req);
  ASSERT_TRUE(e.has_value()) << text;
  EXPECT_EQ(e->status, status) << text;
  EXPECT_EQ(e->param, param) << e->message;
}

TEST(AnthropicRequest, ConvertsAToolRoundTrip) {
  AnthropicRequest req;
  ASSERT_FALSE(Parse(R"({"model": "tiny", "max_tokens": 32,
      "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
      "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "need a tool", "signature": "sig"},
          {"type": "text", "text": "Checking."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1",
           "content": [{"type": "text", "text": "18C"}]},
          {"type": "text", "text": "Thanks"}]}],
      "tools": [{"name": "get_weather", "description": "Weather",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
      "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u"},
      "thinking": {"type": "disabled"}})",
                     &req)
                   .has_value());
  const Json& m = req.chat.messages;
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[0], Json::parse(R"({"role": "system", "content": "Be brief.\nUse tools."})"));
  EXPECT_EQ(m[1], Json::parse(R"({"role": "user", "content": "Weather in Paris?"})"));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "need a tool");
  EXPECT_EQ(m[2]["tool_calls"].dump(),
            R"([{"id":"toolu_1","type":"function","function":{"name":"get_weather",)"
            R"("arguments":{"city":"Paris"}}}])");
  EXPECT_EQ(m[3].dump(),
            R"({"role":"tool","tool_call_id":"toolu_1","content":"18C","name":"get_weather"})");
  EXPECT_EQ(m[4], Json::parse(R"({"role": "user", "content": "Thanks"})"));
  ASSERT_EQ(req.chat.tools.size(), 1u);
  EXPECT_EQ(req.chat.tools[0].dump(),
            R"({"type":"function","function":{"name":"get_weather","description":"Weather",)"
            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})");
  EXPECT_EQ(req.chat.tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_FALSE(req.chat.parallel_tool_calls);
  EXPECT_EQ(req.chat.options.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*req.chat.options.max_tokens, 32);
  EXPECT_FLOAT_EQ(req.chat.options.sampling.temperature, 0.5f);
  EXPECT_EQ(req.chat.options.sampling.top_k, 5);
  EXPECT_EQ(req.chat.template_kwargs["enable_thinking"], false);
}

TEST(AnthropicRequest, FinalAssistantMessageIsAPrefill) {
  AnthropicRequest req;
  ASSERT_FALSE(Parse(R"({"model": "tiny", "max_tokens": 5, "messages": [
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello,"}]})",
                     &req)
                   .has_value());
  EXPECT_FALSE(req.chat.add_generation_prompt);
  EXPECT_EQ(req.chat.template_kwargs["continue_final_message"], true);
  AnthropicRequest plain;
  ASSERT_FALSE(Parse(Body(""), &plain).has_value());
  EXPECT_TRUE(plain.chat.add_generation_prompt);
}

TEST(AnthropicRequest, ToolChoices) {
  const std::string tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}])";
  AnthropicRequest req;
  ASSERT_FALSE(Parse(Body(tools + R"(, "tool_choice": {"type": "any"})"), &req).has_value());
  EXPECT_EQ(req.chat.tool_choice.mode, ToolChoice::Mode::kRequired);
  ASSERT_FALSE(
      Parse(Body(tools + R"(, "tool_choice": {"type": "tool", "name": "f"})"), &req).has_value());
  EXPECT_EQ(req.chat.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(req.chat.tool_choice.function, "f");
  ASSERT_FALSE(Parse(Body(tools + R"(, "tool_choice": {"type": "none"})"), &req).has_value());
  EXPECT_EQ(req.chat.tool_choice.mode, ToolChoice::Mode::kNone);
  ExpectError(Body(tools + R"(, "tool_choice": {"type": "tool", "name": "g"})"), "tool_choice");
  ExpectError(Body(tools + R"(, "tool_choice": {"type": "maybe"})"), "tool_choice.type");
  ExpectError(Body(R"("tool_choice": {"type": "any"})"), "tool_choice");
}

TEST(AnthropicRequest, Errors) {
  ExpectError(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})",
              "max_tokens");
  ExpectError(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})", "model");
  ExpectError(R"({"model": "claude", "max_tokens": 5, "messages": []})", "model", 404);
  ExpectError(R"({"model": "tiny", "max_tokens": 5, "messages": []})", "messages");
  ExpectError(R"({"model": "tiny", "max_tokens": 0, "messages": []})", "max_tokens");
  ExpectError(Body(R"("temperature": 1.5)"), "temperature");
  ExpectError(Body(R"("stop_sequences": [""])"), "stop_sequences");
  ExpectError(Body(R"("stop_sequences": "x")"), "stop_sequences");
  ExpectError(Body(R"("tools": [{"type": "web_search_20250305", "name": "web_search"}])"),
              "tools[0].type");
  ExpectError(Body(R"("tools": [{"name": "f"}])"), "tools[0].input_schema");
  ExpectError(Body(R"("tools": [{"name": "f", "input_schema": {}}, {"name": "f",
      "input_schema": {}}])"),
              "tools[1].name");
  ExpectError(R"({"model": "tiny", "max_tokens": 5, "messages": [{"role": "system",
      "content": "x"}]})",
              "messages[0].role");
  ExpectError(R"({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user",
      "content": [{"type": "image", "source": {}}]}]})",
              "messages[0].content[0].type");
  ExpectError(R"({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user",
      "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]})",
              "messages[0].content[0].type");
  // count_tokens does not need max_tokens.
  AnthropicRequest req;
  EXPECT_FALSE(Parse(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})", &req,
                     /*count_tokens=*/true)
                   .has_value());
}

TEST(AnthropicError, Shape) {
  EXPECT_EQ(AnthropicErrorJson(BadRequest("bad", "x")).dump(),
            R"({"type":"error","error":{"type":"invalid_request_error","message":"bad"}})");
  EXPECT_EQ(AnthropicErrorJson(ModelNotFound("m"))["error"]["type"], "not_found_error");
  EXPECT_EQ(AnthropicErrorJson(Unauthorized(false))["error"]["type"], "authentication_error");
  EXPECT_EQ(AnthropicErrorJson(PayloadTooLarge(8))["error"]["type"], "request_too_large");
  EXPECT_EQ(AnthropicErrorJson(InternalError("x"))["error"]["type"], "api_error");
  EXPECT_EQ(AnthropicErrorJson(ServiceUnavailable("x"))["error"]["type"], "overloaded_error");
}

AnthropicMeta Meta() {
  AnthropicMeta meta;
  meta.id = "msg_x";
  meta.model = "tiny";
  meta.stop_sequences = {"END", "STOP"};
  meta.parsing.tool_calls = ToolCallFormat::kHermes;
  meta.parsing.reasoning = true;
  meta.n_prompt_tokens = 10;
  return meta;
}

RequestOutput Text(std::string text, bool finished = false,
                   FinishReason reason = FinishReason::kStop, int32_t stop_index = -1) {
  RequestOutput e;
  e.text = std::move(text);
  e.finished = finished;
  e.finish_reason = reason;
  e.stop_index = stop_index;
  e.usage = {10, 7, 4};
  return e;
}

// The SDK's MessageStream accumulation: events -> the final message.
Json AccumulateEvents(const std::string& sse) {
  Json message;
  std::vector<std::string> json_bufs;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string frame = sse.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_TRUE(frame.starts_with("event: ")) << frame;
    const size_t nl = frame.find('\n');
    const std::string type = frame.substr(7, nl - 7);
    EXPECT_EQ(frame.compare(nl + 1, 6, "data: "), 0);
    const Json data = Json::parse(frame.substr(nl + 7));
    EXPECT_EQ(data["type"], type);
    if (type == "message_start") {
      message = data["message"];
    } else if (type == "content_block_start") {
      EXPECT_EQ(data["index"].get<size_t>(), message["content"].size());
      message["content"].push_back(data["content_block"]);
      json_bufs.emplace_back();
    } else if (type == "content_block_delta") {
      const size_t i = data["index"].get<size_t>();
      Json& block = message["content"][i];
      const Json& d = data["delta"];
      if (d["type"] == "text_delta")
        block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") {
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      }
      if (d["type"] == "input_json_delta") {
        json_bufs[i] += d["partial_json"].get<std::string>();
        block["input"] = Json::parse(json_bufs[i], nullptr, false);
      }
    } else if (type == "message_delta") {
      message["stop_reason"] = data["delta"]["stop_reason"];
      message["stop_sequence"] = data["delta"]["stop_sequence"];
      for (const auto& [k, v] : data["usage"].items()) message["usage"][k] = v;
    }
  }
  return message;
}

// Model output -> (non-streamed message, streamed then accumulated message).
std::pair<Json, Json> Both(const std::vector<RequestOutput>& events) {
  AnthropicAccumulator acc(Meta());
  AnthropicStreamEncoder enc(Meta());
  std::string sse = enc.Start();
  for (const RequestOutput& e : events) {
    acc.Add(e);
    sse += enc.Add(e);
  }
  EXPECT_TRUE(acc.finished());
  EXPECT_TRUE(enc.finished());
  return {acc.Build(), AccumulateEvents(sse)};
}

// Tool-use ids are random: compare without them, after checking their shape.
Json WithoutIds(Json message) {
  for (Json& block : message["content"]) {
    if (block["type"] != "tool_use") continue;
    EXPECT_TRUE(block["id"].get<std::string>().starts_with("toolu_")) << block.dump();
    block.erase("id");
  }
  return message;
}

TEST(AnthropicMessage, ToolUseStreamEqualsBody) {
  const std::string out =
      "<think>plan</think>Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>";
  for (size_t split = 0; split <= out.size(); split += 7) {
    auto [body, streamed] = Both({Text(out.substr(0, split)), Text(out.substr(split), true)});
    EXPECT_EQ(WithoutIds(streamed).dump(), WithoutIds(body).dump()) << "split " << split;
  }
  auto [body, streamed] = Both({Text(out, true)});
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_TRUE(body["stop_sequence"].is_null());
  ASSERT_EQ(body["content"].size(), 3u);
  EXPECT_EQ(body["content"][0].dump(), R"({"type":"thinking","thinking":"plan","signature":""})");
  EXPECT_EQ(body["content"][1].dump(), R"({"type":"text","text":"Sure."})");
  EXPECT_EQ(WithoutIds(body)["content"][2].dump(),
            R"({"type":"tool_use","name":"get_weather","input":{"city":"Paris"}})");
  EXPECT_EQ(body["usage"].dump(),
            R"({"input_tokens":6,"output_tokens":7,"cache_creation_input_tokens":0,)"
            R"("cache_read_input_tokens":4})");
}

TEST(AnthropicMessage, StopReasons) {
  EXPECT_EQ(Both({Text("hi", true)}).first["stop_reason"], "end_turn");
  EXPECT_EQ(Both({Text("hi", true, FinishReason::kLength)}).first["stop_reason"], "max_tokens");
  auto [body, streamed] = Both({Text("hi", true, FinishReason::kStop, 1)});
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], "STOP");
  EXPECT_EQ(streamed["stop_sequence"], "STOP");
  // Empty output: no content blocks at all, in both forms.
  auto [empty, empty_streamed] = Both({Text("", true)});
  EXPECT_EQ(empty["content"], Json::array());
  EXPECT_EQ(empty_streamed["content"], Json::array());
}

TEST(AnthropicMessage, StreamStartsWithMessageStartAndPing) {
  AnthropicStreamEncoder enc(Meta());
  const std::string start = enc.Start();
  EXPECT_TRUE(start.starts_with("event: message_start\ndata: {\"type\":\"message_start\""));
  EXPECT_NE(start.find("event: ping\ndata: {\"type\":\"ping\"}\n\n"), std::string::npos);
  EXPECT_NE(start.find("\"input_tokens\":10"), std::string::npos);
  RequestOutput failed = Text("", true);
  failed.error = Internal("boom");
  const std::string end = enc.Add(failed);
  EXPECT_TRUE(
      end.starts_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                      "\"api_error\""))
      << end;
}

}  // namespace
}  // namespace kestrel::server
