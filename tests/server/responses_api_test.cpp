// The OpenAI Responses API: input items to chat messages, previous_response_id through the
// store, the response object, the SSE events (accumulated the way the SDK does, they must give
// the non-streamed response), and the bounded LRU store.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/responses_api.h"

namespace kestrel::server {
namespace {

ParseContext Context() {
  ParseContext ctx;
  ctx.vocab_size = 1000;
  ctx.accepted_models = {"tiny"};
  return ctx;
}

std::optional<ApiError> Parse(const std::string& text, ResponseStore& store,
                              ResponsesRequest* out) {
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  return ParseResponsesRequest(body, Context(), store, out);
}

void ExpectError(const std::string& text, const std::string& param) {
  ResponseStore store(4, 1 << 20);
  ResponsesRequest req;
  std::optional<ApiError> e = Parse(text, store, &req);
  ASSERT_TRUE(e.has_value()) << text;
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, param) << e->message;
}

TEST(ResponsesRequest, StringInputAndInstructions) {
  ResponseStore store(4, 1 << 20);
  ResponsesRequest req;
  ASSERT_FALSE(Parse(R"({"model": "tiny", "input": "hi", "instructions": "be brief",
      "max_output_tokens": 9, "store": false, "metadata": {"k": "v"}})",
                     store, &req)
                   .has_value());
  EXPECT_EQ(req.chat.messages.dump(),
            R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])");
  EXPECT_EQ(req.conversation.dump(), R"([{"role":"user","content":"hi"}])");
  EXPECT_EQ(*req.chat.options.max_tokens, 9);
  EXPECT_FALSE(req.store);
  EXPECT_EQ(req.echo["instructions"], "be brief");
  EXPECT_EQ(req.echo["metadata"]["k"], "v");
  EXPECT_EQ(req.echo["tool_choice"], "auto");
}

TEST(ResponsesRequest, ItemsWithAToolRoundTrip) {
  ResponseStore store(4, 1 << 20);
  ResponsesRequest req;
  ASSERT_FALSE(Parse(R"({"input": [
      {"role": "developer", "content": "sys"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "use the tool"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "oops"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18C"}],
      "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                {"type": "function", "name": "get_time"}],
      "tool_choice": {"type": "function", "name": "get_time"}, "parallel_tool_calls": false})",
                     store, &req)
                   .has_value());
  const Json& m = req.chat.messages;
  ASSERT_EQ(m.size(), 4u) << m.dump();
  EXPECT_EQ(m[0].dump(), R"({"role":"system","content":"sys"})");
  EXPECT_EQ(m[1].dump(), R"({"role":"user","content":"weather?"})");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "use the tool");
  EXPECT_EQ(m[2]["tool_calls"].dump(),
            R"([{"id":"call_1","type":"function","function":{"name":"get_weather",)"
            R"("arguments":{"city":"Paris"}}},{"id":"call_2","type":"function","function":)"
            R"({"name":"get_time","arguments":"oops"}}])");
  EXPECT_EQ(m[3].dump(),
            R"({"role":"tool","tool_call_id":"call_1","content":"18C","name":"get_weather"})");
  EXPECT_EQ(
      req.chat.tools[0].dump(),
      R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}})");
  EXPECT_EQ(req.chat.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_FALSE(req.chat.parallel_tool_calls);
}

TEST(ResponsesRequest, Errors) {
  ExpectError(R"({"model": "tiny"})", "input");
  ExpectError(R"({"input": []})", "input");
  ExpectError(R"({"input": 3})", "input");
  ExpectError(R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type");
  ExpectError(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})",
              "input[0].content[0].type");
  ExpectError(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
              "input[0].call_id");
  ExpectError(R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type");
  ExpectError(R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name");
  ExpectError(R"({"input": "x", "tool_choice": "required"})", "tool_choice");
  ExpectError(R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens");
  ExpectError(R"({"input": "x", "background": true})", "background");
  ExpectError(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format.type");
  ExpectError(R"({"input": "x", "temperature": -1})", "temperature");
  ResponseStore store(4, 1 << 20);
  ResponsesRequest req;
  std::optional<ApiError> e =
      Parse(R"({"input": "x", "previous_response_id": "resp_gone"})", store, &req);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "previous_response_id");
  EXPECT_EQ(e->code, "previous_response_not_found");
}

ResponsesMeta Meta(ResponseStore* store, const Json& conversation) {
  ResponsesMeta meta;
  meta.id = "resp_x";
  meta.created_at = 5;
  meta.model = "tiny";
  meta.echo = Json{{"store", store != nullptr}};
  meta.parsing.tool_calls = ToolCallFormat::kHermes;
  meta.parsing.reasoning = true;
  meta.conversation = conversation;
  meta.store = store;
  return meta;
}

RequestOutput Text(std::string text, bool finished = false,
                   FinishReason reason = FinishReason::kStop) {
  RequestOutput e;
  e.text = std::move(text);
  e.finished = finished;
  e.finish_reason = reason;
  e.usage = {12, 5, 8};
  return e;
}

// The SDK's accumulateResponse over the events; the final snapshot is response.completed's.
Json AccumulateEvents(const std::string& sse, std::vector<std::string>* types) {
  Json snapshot;
  int64_t expected_sequence = 0;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string frame = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = frame.find('\n');
    const Json data = Json::parse(frame.substr(nl + 7));
    const std::string type = frame.substr(7, nl - 7);
    EXPECT_EQ(data["type"], type);
    EXPECT_EQ(data["sequence_number"], expected_sequence++);
    types->push_back(type);
    if (type == "response.created" || type == "response.in_progress" ||
        type == "response.completed" || type == "response.incomplete") {
      snapshot = data["response"];
    } else if (type == "response.output_item.added") {
      EXPECT_EQ(data["output_index"].get<size_t>(), snapshot["output"].size());
      snapshot["output"].push_back(data["item"]);
    } else if (type == "response.output_item.done") {
      snapshot["output"][data["output_index"].get<size_t>()] = data["item"];
    } else if (type == "response.content_part.added") {
      snapshot["output"][data["output_index"].get<size_t>()]["content"].push_back(data["part"]);
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      Json& part = snapshot["output"][data["output_index"].get<size_t>()]["content"]
                           [data["content_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + data["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.delta") {
      Json& item = snapshot["output"][data["output_index"].get<size_t>()];
      item["arguments"] = item["arguments"].get<std::string>() + data["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.done") {
      // The accumulated arguments must equal the final ones.
      EXPECT_EQ(snapshot["output"][data["output_index"].get<size_t>()]["arguments"],
                data["arguments"]);
    }
  }
  return snapshot;
}

TEST(ResponsesEncoder, StreamEqualsBodyAndIsStored) {
  const std::string out =
      "<think>hmm</think>Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const Json conversation = Json::parse(R"([{"role": "user", "content": "weather?"}])");
  ResponseStore store(4, 1 << 20);
  ResponsesEncoder body_encoder(Meta(&store, conversation), /*stream=*/false);
  EXPECT_EQ(body_encoder.Start(), "");
  EXPECT_EQ(body_encoder.Add(Text(out.substr(0, 20))), "");
  const Json body = Json::parse(body_encoder.Add(Text(out.substr(20), true)));
  EXPECT_EQ(body["id"], "resp_x");
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  ASSERT_EQ(body["output"].size(), 3u) << body.dump();
  EXPECT_EQ(body["output"][0]["type"], "reasoning");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "hmm");
  EXPECT_EQ(body["output"][1]["type"], "message");
  EXPECT_EQ(body["output"][1]["content"][0]["text"], "Let me check.");
  const Json& call = body["output"][2];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], R"({"city": "Paris"})");
  EXPECT_TRUE(call["call_id"].get<std::string>().starts_with("call_"));
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("fc_"));
  EXPECT_EQ(body["usage"]["input_tokens"], 12);
  EXPECT_EQ(body["usage"]["input_tokens_details"]["cached_tokens"], 8);
  EXPECT_EQ(body["usage"]["total_tokens"], 17);

  // Stored: the response, and the conversation a follow-up continues.
  std::shared_ptr<const ResponseStore::Entry> entry = store.Get("resp_x");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->response, body);
  ASSERT_EQ(entry->messages.size(), 2u);
  EXPECT_EQ(entry->messages[1]["content"], "Let me check.");
  EXPECT_EQ(entry->messages[1]["reasoning_content"], "hmm");
  EXPECT_EQ(entry->messages[1]["tool_calls"][0]["id"], call["call_id"]);
  EXPECT_EQ(entry->messages[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");

  for (size_t split = 0; split <= out.size(); split += 5) {
    ResponsesEncoder stream(Meta(nullptr, conversation), /*stream=*/true);
    std::string sse = stream.Start();
    sse += stream.Add(Text(out.substr(0, split)));
    sse += stream.Add(Text(out.substr(split), true));
    std::vector<std::string> types;
    Json streamed = AccumulateEvents(sse, &types);
    EXPECT_EQ(types.front(), "response.created");
    EXPECT_EQ(types.back(), "response.completed");
    // Ids are random per encoder: compare the items without them.
    ASSERT_EQ(streamed["output"].size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      Json a = streamed["output"][i], b = body["output"][i];
      for (Json* item : {&a, &b}) {
        item->erase("id");
        item->erase("call_id");
      }
      EXPECT_EQ(a, b) << "split " << split << " item " << i;
    }
  }
}

TEST(ResponsesEncoder, IncompleteAndNotStored) {
  ResponsesEncoder enc(Meta(nullptr, Json::array()), /*stream=*/true);
  std::string sse = enc.Start();
  sse += enc.Add(Text("abc", true, FinishReason::kLength));
  std::vector<std::string> types;
  const Json r = AccumulateEvents(sse, &types);
  EXPECT_EQ(types.back(), "response.incomplete");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "abc");
}

TEST(ResponsesRequest, PreviousResponseContinuesTheConversation) {
  ResponseStore store(4, 1 << 20);
  ResponseStore::Entry entry;
  entry.response = Json{{"id", "resp_1"}};
  entry.messages = Json::parse(
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])");
  store.Put("resp_1", entry);
  ResponsesRequest req;
  ASSERT_FALSE(Parse(R"({"input": "again", "previous_response_id": "resp_1",
      "instructions": "new rules"})",
                     store, &req)
                   .has_value());
  EXPECT_EQ(req.chat.messages.dump(),
            R"([{"role":"system","content":"new rules"},{"role":"user","content":"hi"},)"
            R"({"role":"assistant","content":"hello"},{"role":"user","content":"again"}])");
  EXPECT_EQ(req.conversation.size(), 3u);  // without the instructions
  EXPECT_EQ(req.echo["previous_response_id"], "resp_1");
}

TEST(ResponseStore, BoundedLeastRecentlyUsed) {
  ResponseStore store(2, 1 << 20);
  for (const char* id : {"a", "b"}) store.Put(id, ResponseStore::Entry{Json{{"id", id}}, Json()});
  ASSERT_NE(store.Get("a"), nullptr);  // a is now the most recent
  store.Put("c", ResponseStore::Entry{Json{{"id", "c"}}, Json()});
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.Get("b"), nullptr);  // evicted
  EXPECT_NE(store.Get("a"), nullptr);
  EXPECT_TRUE(store.Erase("a"));
  EXPECT_FALSE(store.Erase("a"));
  EXPECT_EQ(store.size(), 1u);

  // The byte budget evicts too, and an entry larger than it is not kept.
  ResponseStore small(100, 200);
  small.Put("x", ResponseStore::Entry{Json{{"t", std::string(120, 'x')}}, Json()});
  small.Put("y", ResponseStore::Entry{Json{{"t", std::string(120, 'y')}}, Json()});
  EXPECT_EQ(small.size(), 1u);
  EXPECT_EQ(small.Get("x"), nullptr);
  small.Put("z", ResponseStore::Entry{Json{{"t", std::string(500, 'z')}}, Json()});
  EXPECT_EQ(small.Get("z"), nullptr);
  EXPECT_LE(small.bytes(), 200u);
}

}  // namespace
}  // namespace kestrel::server
