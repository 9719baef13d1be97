// Workloads, request bodies and URLs of `kestrel bench-serve`, without a server.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/bench_serve/client.h"
#include "cli/bench_serve/workload.h"

namespace kestrel::bench {
namespace {

using nlohmann::json;

TEST(BenchWorkload, LengthDistributionsParseAndDrawInRange) {
  Result<LengthDist> fixed = ParseLengthDist("128", "--input-dist");
  ASSERT_TRUE(fixed.ok());
  std::mt19937_64 rng(1);
  EXPECT_EQ(fixed->Draw(rng), 128);
  EXPECT_EQ(fixed->ToString(), "fixed:128");

  Result<LengthDist> uniform = ParseLengthDist("uniform:10,20", "--input-dist");
  ASSERT_TRUE(uniform.ok());
  int64_t lo = 1000, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = uniform->Draw(rng);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 10);  // both ends are reached
  EXPECT_EQ(hi, 20);

  Result<LengthDist> normal = ParseLengthDist("normal:5,50", "--input-dist");
  ASSERT_TRUE(normal.ok());
  double sum = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = normal->Draw(rng);
    EXPECT_GE(v, 1);  // clamped
    sum += static_cast<double>(v);
  }
  EXPECT_GT(sum / 2000, 5);  // the clamp pulls the mean up

  for (const char* bad : {"", "x", "0", "uniform:5", "uniform:9,3", "normal:1", "gauss:1,2",
                          "fixed:1,2", "uniform:1,2,3", "normal:10,-1"}) {
    Result<LengthDist> d = ParseLengthDist(bad, "--input-dist");
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("--input-dist"), std::string::npos);
    }
  }
}

TEST(BenchWorkload, DrawsAreDeterministicForASeed) {
  const LengthDist d = *ParseLengthDist("normal:100,30", "x");
  std::mt19937_64 a(9), b(9);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(d.Draw(a), d.Draw(b));
}

TEST(BenchWorkload, CalibrationFitsTheProbeLine) {
  const TokenCalibration c = FitCalibration(16, 26, 80, 107);
  EXPECT_TRUE(c.measured);
  EXPECT_DOUBLE_EQ(c.tokens_per_word, 81.0 / 64);
  EXPECT_DOUBLE_EQ(c.overhead_tokens, 26 - 16 * 81.0 / 64);
  EXPECT_EQ(WordsForTokens(c, 81), 64);
  // No usage (zeros) or a non-increasing line: one token per word, no overhead.
  EXPECT_FALSE(FitCalibration(16, 0, 80, 0).measured);
  EXPECT_FALSE(FitCalibration(16, 50, 80, 40).measured);
  EXPECT_DOUBLE_EQ(FitCalibration(16, 0, 80, 0).tokens_per_word, 1);
}

WorkloadOptions FixedOptions() {
  WorkloadOptions o;
  o.kind = WorkloadKind::kFixed;
  o.input = *ParseLengthDist("uniform:20,60", "x");
  o.output = *ParseLengthDist("uniform:4,9", "x");
  o.seed = 11;
  return o;
}

TEST(BenchWorkload, FixedRequestsRepeatForTheSameRunAndServer) {
  const Workload w(FixedOptions(), 3, 0);
  const Workload same(FixedOptions(), 3, 0);
  for (uint64_t i = 0; i < 10; ++i) {
    const RequestSpec a = w.FixedRequest(i);
    const RequestSpec b = same.FixedRequest(i);
    EXPECT_EQ(a.messages[0].content, b.messages[0].content);
    EXPECT_EQ(a.max_tokens, b.max_tokens);
    EXPECT_GE(a.max_tokens, 4);
    EXPECT_LE(a.max_tokens, 9);
  }
  EXPECT_NE(w.FixedRequest(0).messages[0].content, w.FixedRequest(1).messages[0].content);
}

TEST(BenchWorkload, ServersGetTheSameLengthsButOtherWords) {
  // One server named twice must not find the other's prompts in its prefix cache.
  const Workload a(FixedOptions(), 3, 0);
  const Workload b(FixedOptions(), 3, 1);
  for (uint64_t i = 0; i < 10; ++i) {
    const RequestSpec ra = a.FixedRequest(i);
    const RequestSpec rb = b.FixedRequest(i);
    EXPECT_EQ(ra.max_tokens, rb.max_tokens);
    auto words = [](const std::string& s) { return std::count(s.begin(), s.end(), ' ') + 1; };
    EXPECT_EQ(words(ra.messages[0].content), words(rb.messages[0].content));
    EXPECT_NE(ra.messages[0].content, rb.messages[0].content);
  }
}

TEST(BenchWorkload, AgentConversationsGrowAndSharePrefixes) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kAgentTrace;
  o.output = *ParseLengthDist("8", "x");
  o.turns = 4;
  o.system_tokens = 200;
  o.turn_tokens = 20;
  const Workload w(o, 1, 0);
  Workload::Conversation c = w.StartConversation(0);
  std::vector<RequestSpec> turns;
  while (!c.done()) turns.push_back(c.Next());
  ASSERT_EQ(turns.size(), 4u);
  for (size_t t = 0; t < turns.size(); ++t) {
    EXPECT_EQ(turns[t].turn, static_cast<int32_t>(t + 1));
    EXPECT_EQ(turns[t].messages.size(), 2 + 2 * t);  // system, (user, assistant) * t, user
    EXPECT_EQ(turns[t].messages.front().role, "system");
    EXPECT_EQ(turns[t].messages.back().role, "user");
    if (t == 0) continue;
    // The previous request is a prefix of this one: its messages, then an answer, then a user.
    for (size_t m = 0; m < turns[t - 1].messages.size(); ++m) {
      EXPECT_EQ(turns[t].messages[m].content, turns[t - 1].messages[m].content);
    }
    EXPECT_EQ(turns[t].messages[turns[t - 1].messages.size()].role, "assistant");
  }
  // Conversations differ but share the system prompt.
  Workload::Conversation other = w.StartConversation(1);
  const RequestSpec first = other.Next();
  EXPECT_EQ(first.messages[0].content, turns[0].messages[0].content);
  EXPECT_NE(first.messages[1].content, turns[0].messages[1].content);
  EXPECT_EQ(CompletionPrompt(turns[1].messages).rfind("Assistant:"),
            CompletionPrompt(turns[1].messages).size() - 10);
}

TEST(BenchWorkload, ServerUrlsKeepOriginAndPrefix) {
  Result<ServerUrl> plain = ParseServerUrl("http://127.0.0.1:8080");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->origin, "http://127.0.0.1:8080");
  EXPECT_EQ(plain->prefix, "");
  Result<ServerUrl> v1 = ParseServerUrl("http://host:1/v1/");
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(v1->origin, "http://host:1");
  EXPECT_EQ(v1->prefix, "");
  Result<ServerUrl> nested = ParseServerUrl("https://example.com/api/v1");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->origin, "https://example.com");
  EXPECT_EQ(nested->prefix, "/api");
  EXPECT_FALSE(ParseServerUrl("127.0.0.1:8080").ok());
  EXPECT_FALSE(ParseServerUrl("ftp://x").ok());
  EXPECT_FALSE(ParseServerUrl("http:///v1").ok());
}

TEST(BenchWorkload, RequestBodiesAskForUsageAndExactLengths) {
  RequestSpec spec;
  spec.max_tokens = 8;
  spec.messages = {{"user", "hello there"}};
  BodyOptions o;
  o.model = "m";
  json chat = json::parse(RequestBody(spec, o));
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["messages"][0]["content"], "hello there");
  EXPECT_EQ(chat["max_tokens"], 8);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
  EXPECT_EQ(chat["stream_options"]["continuous_usage_stats"], true);
  EXPECT_EQ(chat["ignore_eos"], true);
  EXPECT_EQ(chat["min_tokens"], 8);

  o.endpoint = Endpoint::kCompletions;
  o.ignore_eos = false;
  o.continuous_usage = false;
  o.extra = {{"temperature", 0}, {"max_tokens", 3}};
  json completion = json::parse(RequestBody(spec, o));
  EXPECT_EQ(completion["stream_options"], (json{{"include_usage", true}}));
  EXPECT_EQ(completion["prompt"], "hello there");
  EXPECT_FALSE(completion.contains("messages"));
  EXPECT_FALSE(completion.contains("ignore_eos"));
  EXPECT_FALSE(completion.contains("min_tokens"));
  EXPECT_EQ(completion["temperature"], 0);
  EXPECT_EQ(completion["max_tokens"], 3);  // --extra-body wins
}

}  // namespace
}  // namespace kestrel::bench
