// Response shapes: error objects, usage, logprobs, full bodies, SSE framing and the chunk
// sequence of a stream.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/response_json.h"
#include "server/sse.h"

namespace kestrel::server {
namespace {

// Token i is the byte string "t<i>", except 9, the first half of "é" (0xC3 0xA9).
std::string FakeTokenBytes(int32_t id) {
  if (id == 9) return "\xc3";
  std::string bytes = "t";
  bytes += std::to_string(id);
  return bytes;
}

ResponseMeta Meta(ApiKind kind) {
  ResponseMeta m;
  m.kind = kind;
  m.id = kind == ApiKind::kChat ? "chatcmpl-test" : "cmpl-test";
  m.created = 1700000000;
  m.model = "tiny";
  return m;
}

RequestOutput Event(std::vector<int32_t> tokens, std::string text, bool finished = false,
                    FinishReason reason = FinishReason::kStop) {
  RequestOutput e;
  for (int32_t t : tokens) {
    SampleResult s;
    s.token = t;
    s.logprob = -0.5f * static_cast<float>(t);
    s.top = {{t, s.logprob}, {t + 1, s.logprob - 1.0f}};
    e.samples.push_back(s);
  }
  e.token_ids = std::move(tokens);
  e.text = std::move(text);
  e.finished = finished;
  e.finish_reason = reason;
  if (finished) e.usage = {5, 3, 2};
  return e;
}

// Splits SSE text into the payloads of its frames; fails on anything that is not a frame.
std::vector<std::string> Payloads(const std::string& sse) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    EXPECT_EQ(sse.compare(pos, 6, "data: "), 0) << sse.substr(pos);
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    EXPECT_EQ(payload.find('\n'), std::string::npos);
    out.push_back(payload);
    pos = end + 2;
  }
  return out;
}

TEST(ApiError, ObjectShape) {
  Json j = ErrorJson(BadRequest("bad top_p", "top_p"));
  EXPECT_EQ(
      j.dump(),
      R"({"error":{"message":"bad top_p","type":"invalid_request_error","param":"top_p","code":null}})");
  Json k = ErrorJson(ModelNotFound("gpt"));
  EXPECT_EQ(k["error"]["code"], "model_not_found");
  EXPECT_EQ(k["error"]["param"], "model");
  EXPECT_TRUE(ErrorJson(InternalError("x"))["error"]["param"].is_null());
}

TEST(ApiError, StatusMapping) {
  EXPECT_EQ(FromStatus(InvalidArgument("x"), "prompt").status, 400);
  EXPECT_EQ(FromStatus(InvalidArgument("x"), "prompt").param, "prompt");
  EXPECT_EQ(FromStatus(OutOfRange("x")).status, 400);
  ApiError busy = FromStatus(ResourceExhausted("queue full"));
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.type, "rate_limit_error");
  EXPECT_EQ(FromStatus(Unavailable("bye")).status, 503);
  EXPECT_EQ(FromStatus(Cancelled("gone")).status, 503);
  EXPECT_EQ(FromStatus(Internal("oops")).status, 500);
  EXPECT_EQ(FromStatus(Internal("oops")).type, "server_error");
  EXPECT_EQ(Unauthorized(false).status, 401);
  EXPECT_EQ(Unauthorized(true).code, "invalid_api_key");
  EXPECT_EQ(PayloadTooLarge(10).status, 413);
  EXPECT_EQ(MethodNotAllowed("GET", "/v1/completions").status, 405);
  EXPECT_EQ(UnknownRoute("GET", "/nope").status, 404);
  EXPECT_EQ(FromHttpStatus(413).status, 413);
  EXPECT_EQ(FromHttpStatus(414).status, 414);
  EXPECT_EQ(FromHttpStatus(500).type, "server_error");
}

TEST(ApiError, DumpNeverThrowsOnInvalidUtf8) {
  Json j = {{"text", std::string("a\xff"
                                 "b")}};
  EXPECT_EQ(Dump(j),
            "{\"text\":\"a\xef\xbf\xbd"
            "b\"}");
}

TEST(Response, Ids) {
  const std::string a = NewResponseId(ApiKind::kChat);
  const std::string b = NewResponseId(ApiKind::kChat);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
  EXPECT_EQ(NewResponseId(ApiKind::kCompletion).rfind("cmpl-", 0), 0u);
}

TEST(Response, Usage) {
  EXPECT_EQ(UsageJson({10, 4, 8}).dump(),
            R"({"prompt_tokens":10,"completion_tokens":4,"total_tokens":14,)"
            R"("prompt_tokens_details":{"cached_tokens":8}})");
}

TEST(Response, ChatBody) {
  ResponseAccumulator acc(Meta(ApiKind::kChat), FakeTokenBytes);
  acc.Add(Event({1}, "Hel"));
  EXPECT_FALSE(acc.finished());
  acc.Add(Event({2, 3}, "lo"));
  acc.Add(Event({}, "", true, FinishReason::kStop));
  ASSERT_TRUE(acc.finished());
  EXPECT_FALSE(acc.error().has_value());
  EXPECT_EQ(acc.Build().dump(),
            R"({"id":"chatcmpl-test","object":"chat.completion","created":1700000000,)"
            R"("model":"tiny","choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"Hello"},"logprobs":null,"finish_reason":"stop"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
            R"("prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(Response, CompletionBody) {
  ResponseAccumulator acc(Meta(ApiKind::kCompletion), FakeTokenBytes);
  acc.Add(Event({1, 2}, "ab", true, FinishReason::kLength));
  Json j = acc.Build();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-test");
  EXPECT_EQ(j["choices"][0].dump(),
            R"({"index":0,"text":"ab","logprobs":null,"finish_reason":"length"})");
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
}

TEST(Response, ChatLogprobs) {
  ResponseMeta meta = Meta(ApiKind::kChat);
  meta.logprobs = true;
  meta.top_logprobs = 1;
  ResponseAccumulator acc(meta, FakeTokenBytes);
  RequestOutput e = Event({2, 9}, "t2", true);
  e.samples[1].logprob = -std::numeric_limits<float>::infinity();
  acc.Add(e);
  const Json lp = acc.Build()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 2u);
  EXPECT_TRUE(lp["refusal"].is_null());
  EXPECT_EQ(lp["content"][0].dump(),
            R"({"token":"t2","logprob":-1.0,"bytes":[116,50],)"
            R"("top_logprobs":[{"token":"t2","logprob":-1.0,"bytes":[116,50]}]})");
  // A partial UTF-8 token shows as U+FFFD with its raw bytes; -inf becomes -9999.
  EXPECT_EQ(lp["content"][1]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(lp["content"][1]["bytes"], Json::parse("[195]"));
  EXPECT_EQ(lp["content"][1]["logprob"], -9999.0);
}

TEST(Response, CompletionLogprobs) {
  ResponseMeta meta = Meta(ApiKind::kCompletion);
  meta.logprobs = true;
  meta.top_logprobs = 2;
  ResponseAccumulator acc(meta, FakeTokenBytes);
  acc.Add(Event({1, 12}, "t1t12"));
  acc.Add(Event({3}, "t3", true));
  const Json lp = acc.Build()["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::parse(R"(["t1", "t12", "t3"])"));
  EXPECT_EQ(lp["token_logprobs"], Json::parse("[-0.5, -6.0, -1.5]"));
  EXPECT_EQ(lp["text_offset"], Json::parse("[0, 2, 5]"));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0].dump(), R"({"t1":-0.5,"t2":-1.5})");

  meta.top_logprobs = 0;  // logprobs=0: the chosen token only
  ResponseAccumulator only_chosen(meta, FakeTokenBytes);
  only_chosen.Add(Event({1}, "t1", true));
  EXPECT_TRUE(only_chosen.Build()["choices"][0]["logprobs"]["top_logprobs"][0].is_null());
}

TEST(Response, FailuresAfterAdmission) {
  ResponseAccumulator failed(Meta(ApiKind::kChat), FakeTokenBytes);
  RequestOutput e = Event({}, "", true);
  e.error = Internal("kv pool corrupted");
  failed.Add(e);
  ASSERT_TRUE(failed.error().has_value());
  EXPECT_EQ(failed.error()->status, 500);

  ResponseAccumulator cancelled(Meta(ApiKind::kChat), FakeTokenBytes);
  cancelled.Add(Event({}, "", true, FinishReason::kCancelled));
  ASSERT_TRUE(cancelled.error().has_value());
  EXPECT_EQ(cancelled.error()->status, 503);
}

TEST(Sse, Framing) {
  EXPECT_EQ(SseFrame(std::string_view("{}")), "data: {}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
  // Newlines inside the payload are JSON-escaped, so a frame never ends early.
  EXPECT_EQ(SseJsonFrame(Json{{"t", "a\n\nb"}}), "data: {\"t\":\"a\\n\\nb\"}\n\n");
  const std::string err = SseErrorFrames(ServiceUnavailable("bye"));
  std::vector<std::string> p = Payloads(err);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(Json::parse(p[0])["error"]["message"], "bye");
  EXPECT_EQ(p[1], "[DONE]");
}

TEST(Sse, ChatStream) {
  ResponseMeta meta = Meta(ApiKind::kChat);
  meta.include_usage = true;
  StreamEncoder enc(meta, FakeTokenBytes);
  std::string sse = enc.Start();
  sse += enc.Add(Event({1}, "Hi"));
  EXPECT_EQ(enc.Add(Event({2}, "")), "");  // held-back text, no logprobs asked: nothing to send
  sse += enc.Add(Event({3}, " there\n", true, FinishReason::kLength));
  EXPECT_TRUE(enc.finished());
  EXPECT_EQ(enc.Add(Event({4}, "late")), "");

  std::vector<std::string> p = Payloads(sse);
  ASSERT_EQ(p.size(), 6u);
  std::vector<Json> chunks;
  for (size_t i = 0; i + 1 < p.size(); ++i) chunks.push_back(Json::parse(p[i]));
  for (const Json& c : chunks) {
    EXPECT_EQ(c["id"], "chatcmpl-test");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["created"], 1700000000);
    EXPECT_EQ(c["model"], "tiny");
  }
  EXPECT_EQ(chunks[0]["choices"].dump(),
            R"([{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,)"
            R"("finish_reason":null}])");
  EXPECT_TRUE(chunks[0]["usage"].is_null());
  EXPECT_EQ(chunks[1]["choices"][0]["delta"].dump(), R"({"content":"Hi"})");
  EXPECT_EQ(chunks[2]["choices"][0]["delta"].dump(), R"({"content":" there\n"})");
  EXPECT_TRUE(chunks[2]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunks[3]["choices"][0]["delta"], Json::object());
  EXPECT_EQ(chunks[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunks[4]["choices"], Json::array());
  EXPECT_EQ(chunks[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(p[5], "[DONE]");
}

TEST(Sse, ContinuousUsageGivesEveryTokenAChunkWithTheUsageSoFar) {
  ResponseMeta meta = Meta(ApiKind::kCompletion);
  meta.include_usage = true;
  meta.continuous_usage = true;
  StreamEncoder enc(meta, FakeTokenBytes);
  auto event = [](std::vector<int32_t> tokens, std::string text, int32_t completion,
                  bool finished = false) {
    RequestOutput e = Event(std::move(tokens), std::move(text), finished, FinishReason::kLength);
    e.usage = {5, completion, 2};
    return e;
  };
  std::string sse = enc.Add(event({1}, "a", 1));
  sse += enc.Add(event({2}, "", 2));  // held back (partial UTF-8): an empty chunk all the same
  sse += enc.Add(event({3, 4}, "bc", 4));
  sse += enc.Add(event({5}, "", 5, true));
  std::vector<std::string> p = Payloads(sse);
  ASSERT_EQ(p.size(), 6u);  // a, "", bc, finish, usage, [DONE]
  const std::vector<std::string> texts = {"a", "", "bc", ""};
  const std::vector<int> completion = {1, 2, 4, 5};
  for (size_t i = 0; i < 4; ++i) {
    const Json c = Json::parse(p[i]);
    EXPECT_EQ(c["choices"][0]["text"], texts[i]) << p[i];
    EXPECT_EQ(c["usage"]["completion_tokens"], completion[i]) << p[i];
    EXPECT_EQ(c["usage"]["prompt_tokens"], 5) << p[i];
    EXPECT_EQ(c["usage"]["total_tokens"], 5 + completion[i]) << p[i];
  }
  EXPECT_EQ(Json::parse(p[3])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(Json::parse(p[4])["choices"], Json::array());
  EXPECT_EQ(Json::parse(p[4])["usage"]["completion_tokens"], 5);
  EXPECT_EQ(p[5], "[DONE]");
}

TEST(Sse, NoUsageKeysWithoutIncludeUsage) {
  StreamEncoder enc(Meta(ApiKind::kChat), FakeTokenBytes);
  std::string sse = enc.Start();
  sse += enc.Add(Event({1}, "x", true));
  std::vector<std::string> p = Payloads(sse);
  ASSERT_EQ(p.size(), 4u);  // role, content, finish, [DONE]
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(Json::parse(p[i]).contains("usage")) << p[i];
  EXPECT_EQ(p[3], "[DONE]");
}

TEST(Sse, CompletionStream) {
  StreamEncoder enc(Meta(ApiKind::kCompletion), FakeTokenBytes);
  EXPECT_EQ(enc.Start(), "");  // no role chunk for completions
  std::string sse = enc.Add(Event({1}, "ab"));
  sse += enc.Add(Event({2}, "c", true));
  std::vector<std::string> p = Payloads(sse);
  ASSERT_EQ(p.size(), 4u);
  Json first = Json::parse(p[0]);
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"].dump(),
            R"([{"index":0,"text":"ab","logprobs":null,"finish_reason":null}])");
  EXPECT_EQ(Json::parse(p[1])["choices"][0]["text"], "c");
  EXPECT_EQ(Json::parse(p[2])["choices"].dump(),
            R"([{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}])");
  EXPECT_EQ(p[3], "[DONE]");
}

TEST(Sse, LogprobsTravelWithTheirChunk) {
  ResponseMeta meta = Meta(ApiKind::kChat);
  meta.logprobs = true;
  StreamEncoder enc(meta, FakeTokenBytes);
  enc.Start();
  // Text held back (a possible stop string): the logprobs still go out, with empty content.
  std::vector<std::string> p = Payloads(enc.Add(Event({5}, "")));
  ASSERT_EQ(p.size(), 1u);
  Json c = Json::parse(p[0]);
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "");
  ASSERT_EQ(c["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(c["choices"][0]["logprobs"]["content"][0]["token"], "t5");
  p = Payloads(enc.Add(Event({6, 7}, "t5t6t7")));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(Json::parse(p[0])["choices"][0]["logprobs"]["content"].size(), 2u);
}

TEST(Sse, ErrorEndsTheStream) {
  StreamEncoder enc(Meta(ApiKind::kChat), FakeTokenBytes);
  enc.Start();
  RequestOutput e = Event({1}, "partial", true);
  e.error = Internal("engine failure");
  std::vector<std::string> p = Payloads(enc.Add(e));
  ASSERT_EQ(p.size(), 3u);  // the text that was produced, the error, [DONE]
  EXPECT_EQ(Json::parse(p[0])["choices"][0]["delta"]["content"], "partial");
  EXPECT_EQ(Json::parse(p[1])["error"]["type"], "server_error");
  EXPECT_EQ(p[2], "[DONE]");
  EXPECT_TRUE(enc.finished());

  StreamEncoder shut(Meta(ApiKind::kCompletion), FakeTokenBytes);
  p = Payloads(shut.Add(Event({}, "", true, FinishReason::kCancelled)));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(Json::parse(p[0])["error"]["code"], "service_unavailable");
}

}  // namespace
}  // namespace kestrel::server
