// Server-sent events cut at arbitrary byte boundaries parse to the same events, and a streamed
// completion turns into the right timings, usage and outcome.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_serve/client.h"
#include "cli/bench_serve/sse.h"

namespace kestrel::bench {
namespace {

using nlohmann::json;

// Every line ending, a comment, an event name, a multi-line data field, a field without a
// space after the colon, an event without data (not dispatched) and [DONE].
const std::string kStream =
    ": keep-alive comment\n"
    "data: {\"a\":1}\n\n"
    "data: first line\r\n"
    "data: second line\r\n\r\n"
    "event: ping\r"
    "data:no-space\r\r"
    "id: 7\n\n"
    "data: caf\xc3\xa9\n\n"
    "data: [DONE]\n\n";

std::vector<SseEvent> ParseInPieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser parser;
  std::vector<SseEvent> events;
  size_t begin = 0;
  for (size_t cut : cuts) {
    parser.Feed(std::string_view(stream).substr(begin, cut - begin), &events);
    begin = cut;
  }
  parser.Feed(std::string_view(stream).substr(begin), &events);
  parser.Finish(&events);
  return events;
}

void ExpectSameEvents(const std::vector<SseEvent>& got, const std::vector<SseEvent>& want,
                      const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].event, want[i].event) << where << " event " << i;
    EXPECT_EQ(got[i].data, want[i].data) << where << " event " << i;
  }
}

TEST(BenchSse, ParsesTheWholeStream) {
  const std::vector<SseEvent> events = ParseInPieces(kStream, {});
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].data, "{\"a\":1}");
  EXPECT_EQ(events[1].data, "first line\nsecond line");
  EXPECT_EQ(events[2].event, "ping");
  EXPECT_EQ(events[2].data, "no-space");
  EXPECT_EQ(events[3].data, "caf\xc3\xa9");
  EXPECT_EQ(events[4].data, "[DONE]");
}

TEST(BenchSse, EveryTwoPieceSplitGivesTheSameEvents) {
  const std::vector<SseEvent> whole = ParseInPieces(kStream, {});
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    ExpectSameEvents(ParseInPieces(kStream, {cut}), whole, "cut at " + std::to_string(cut));
  }
}

TEST(BenchSse, SingleBytesAndRandomCutsGiveTheSameEvents) {
  const std::vector<SseEvent> whole = ParseInPieces(kStream, {});
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < kStream.size(); ++i) every_byte.push_back(i);
  ExpectSameEvents(ParseInPieces(kStream, every_byte), whole, "single bytes");
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < kStream.size(); ++i) {
      if (rng() % 4 == 0) cuts.push_back(i);
    }
    ExpectSameEvents(ParseInPieces(kStream, cuts), whole, "trial " + std::to_string(trial));
  }
}

TEST(BenchSse, AnUnterminatedLastEventIsDispatchedAtTheEnd) {
  SseParser parser;
  std::vector<SseEvent> events;
  parser.Feed("data: x\n\ndata: tail", &events);
  ASSERT_EQ(events.size(), 1u);
  parser.Finish(&events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].data, "tail");
}

std::string Frame(const json& j) {
  return "data: " + j.dump() + "\n\n";
}

json ChatChunk(const std::string& content, const json& finish = nullptr) {
  return {
      {"object", "chat.completion.chunk"},
      {"choices", {{{"index", 0}, {"delta", {{"content", content}}}, {"finish_reason", finish}}}},
      {"usage", nullptr}};
}

// A chat stream as OpenAI sends it: role chunk (empty content), three content chunks, the
// finish chunk, the usage chunk, [DONE].
std::vector<std::string> ChatFrames(bool with_usage) {
  std::vector<std::string> frames;
  frames.push_back(
      Frame({{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}}}}}));
  frames.push_back(Frame(ChatChunk("Hel")));
  frames.push_back(Frame(ChatChunk("lo wor")));
  frames.push_back(Frame(ChatChunk("ld")));
  frames.push_back(Frame(
      {{"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "length"}}}}}));
  if (with_usage) {
    frames.push_back(Frame(
        {{"choices", json::array()},
         {"usage", {{"prompt_tokens", 12}, {"completion_tokens", 5}, {"total_tokens", 17}}}}));
  }
  frames.push_back("data: [DONE]\n\n");
  return frames;
}

TEST(BenchStream, ChunkTimesAndUsageOfAChatStream) {
  RequestRecord r;
  r.start_s = 0.5;
  StreamRecorder recorder(&r);
  const std::vector<std::string> frames = ChatFrames(true);
  for (size_t i = 0; i < frames.size(); ++i)
    recorder.OnBytes(frames[i], 1.0 + static_cast<double>(i));
  recorder.Finish(9.0);
  EXPECT_EQ(r.outcome, Outcome::kOk);
  EXPECT_EQ(r.content_times_s, (std::vector<double>{2, 3, 4}));  // not the empty role chunk
  EXPECT_TRUE(r.usage_present);
  EXPECT_EQ(r.output_tokens(), 5);  // usage, not the 3 chunks
  EXPECT_EQ(r.usage_prompt_tokens, 12);
  EXPECT_DOUBLE_EQ(r.ttft_s(), 1.5);
  EXPECT_DOUBLE_EQ(r.e2e_s(), 8.5);
}

// Per-chunk usage (continuous_usage_stats): a token whose text is held back arrives in a chunk
// with empty text, and a chunk may bring two tokens.
TEST(BenchStream, PerChunkUsageTimesEveryToken) {
  auto chunk = [](const std::string& text, int completion) {
    json c = ChatChunk(text);
    c["usage"] = {{"prompt_tokens", 4}, {"completion_tokens", completion},
                  {"total_tokens", 4 + completion}};
    return c;
  };
  RequestRecord r;
  r.start_s = 0.0;
  StreamRecorder recorder(&r);
  recorder.OnBytes(Frame(chunk("a", 1)), 1.0);
  recorder.OnBytes(Frame(chunk("", 2)), 1.1);  // held back: no text, one more token
  recorder.OnBytes(Frame(chunk("bc", 3)), 1.2);
  recorder.OnBytes(Frame(chunk("de", 5)), 1.6);  // two tokens in one chunk
  const json usage = {{"prompt_tokens", 4}, {"completion_tokens", 5}, {"total_tokens", 9}};
  const json finish = {
      {"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "length"}}}},
      {"usage", usage}};
  recorder.OnBytes(Frame(finish), 1.7);
  recorder.OnBytes(Frame({{"choices", json::array()}, {"usage", usage}}) + "data: [DONE]\n\n", 1.8);
  recorder.Finish(1.8);
  ASSERT_EQ(r.outcome, Outcome::kOk);
  EXPECT_EQ(r.content_times_s, (std::vector<double>{1.0, 1.2, 1.6}));
  EXPECT_EQ(r.token_times_s, (std::vector<double>{1.0, 1.1, 1.2, 1.6}));
  EXPECT_EQ(r.token_counts, (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_EQ(r.output_tokens(), 5);
  EXPECT_DOUBLE_EQ(r.ttft_s(), 1.0);
  const std::vector<double> itl = r.InterTokenLatencies();
  ASSERT_EQ(itl.size(), 4u);
  EXPECT_NEAR(itl[0], 0.1, 1e-12);
  EXPECT_NEAR(itl[1], 0.1, 1e-12);
  EXPECT_NEAR(itl[2], 0.2, 1e-12);  // the two-token chunk: 0.4 s over two tokens
  EXPECT_NEAR(itl[3], 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(r.TokensArrivedBetween(1.05, 1.5), 2.0);  // the tokens of 1.1 and 1.2
  // Without per-chunk usage the same content chunks spread the 4 gaps' tokens evenly instead.
  RequestRecord plain = r;
  plain.token_times_s.clear();
  plain.token_counts.clear();
  EXPECT_EQ(plain.InterTokenLatencies().size(), 4u);
  EXPECT_NEAR(plain.InterTokenLatencies()[0], 0.1, 1e-12);  // 0.2 s gap over two tokens
  EXPECT_DOUBLE_EQ(plain.TokensArrivedBetween(1.05, 1.5), 5.0 / 3.0);
}

TEST(BenchStream, ByteSplitsDoNotChangeTheRecord) {
  std::string all;
  for (const std::string& f : ChatFrames(true)) all += f;
  for (size_t cut = 0; cut <= all.size(); cut += 7) {
    RequestRecord r;
    StreamRecorder recorder(&r);
    recorder.OnBytes(std::string_view(all).substr(0, cut), 1.0);
    recorder.OnBytes(std::string_view(all).substr(cut), 2.0);
    recorder.Finish(3.0);
    EXPECT_EQ(r.outcome, Outcome::kOk) << cut;
    EXPECT_EQ(r.content_times_s.size(), 3u) << cut;
    EXPECT_EQ(r.output_tokens(), 5) << cut;
  }
}

TEST(BenchStream, WithoutUsageTheChunkCountIsUsedAndMarked) {
  RequestRecord r;
  StreamRecorder recorder(&r);
  for (const std::string& f : ChatFrames(false)) recorder.OnBytes(f, 1.0);
  recorder.Finish(2.0);
  EXPECT_EQ(r.outcome, Outcome::kOk);
  EXPECT_FALSE(r.usage_present);
  EXPECT_EQ(r.output_tokens(), 3);
}

TEST(BenchStream, CompletionsTextAndReasoningCountAsContent) {
  RequestRecord r;
  StreamRecorder recorder(&r);
  recorder.OnBytes(
      Frame({{"choices", {{{"index", 0}, {"text", "def"}, {"finish_reason", nullptr}}}}}), 1);
  recorder.OnBytes(
      Frame({{"choices", {{{"index", 0}, {"delta", {{"reasoning_content", "hmm"}}}}}}}), 2);
  recorder.OnBytes(Frame({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "stop"}}}}}),
                   3);
  recorder.Finish(4);
  EXPECT_EQ(r.outcome, Outcome::kOk);  // a finish_reason ends the stream even without [DONE]
  EXPECT_EQ(r.content_times_s, (std::vector<double>{1, 2}));
}

TEST(BenchStream, ErrorFramesAndTruncatedStreamsAreStreamErrors) {
  {
    RequestRecord r;
    StreamRecorder recorder(&r);
    recorder.OnBytes(Frame(ChatChunk("a")), 1);
    recorder.OnBytes(Frame({{"error", {{"message", "engine failed"}, {"type", "server_error"}}}}),
                     2);
    recorder.OnBytes("data: [DONE]\n\n", 3);
    recorder.Finish(3);
    EXPECT_EQ(r.outcome, Outcome::kStreamError);
    EXPECT_NE(r.error.find("engine failed"), std::string::npos) << r.error;
  }
  {
    RequestRecord r;
    StreamRecorder recorder(&r);
    recorder.OnBytes(Frame(ChatChunk("a")), 1);
    recorder.Finish(2);  // no finish_reason, no [DONE]
    EXPECT_EQ(r.outcome, Outcome::kStreamError);
  }
  {
    RequestRecord r;
    StreamRecorder recorder(&r);
    recorder.OnBytes("data: {not json\n\n", 1);
    recorder.Finish(2);
    EXPECT_EQ(r.outcome, Outcome::kStreamError);
  }
}

}  // namespace
}  // namespace kestrel::bench
