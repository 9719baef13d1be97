#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/stop_matcher.h"

namespace kestrel {
namespace {

StopMatcher Make(std::vector<std::string> stops) {
  Result<StopMatcher> m = StopMatcher::Create(std::move(stops));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

// What the client sees for a stream of deltas: the concatenated safe text, the stop that
// matched (-1 when none) and, after every delta, the text emitted so far.
struct Streamed {
  std::string text;
  int32_t stop_index = -1;
  std::vector<std::string> emitted_after_each;
  std::vector<std::string> input_after_each;  // the deltas pushed so far, concatenated
};

// Length of the longest suffix of s that is a proper prefix of some stop.
size_t LongestPendingSuffix(const std::vector<std::string>& stops, const std::string& s) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    for (size_t len = std::min(s.size(), stop.size() - 1); len > best; --len) {
      if (s.compare(s.size() - len, len, stop, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

Streamed Stream(const std::vector<std::string>& stops, const std::vector<std::string>& deltas) {
  StopMatcher m = Make(stops);
  Streamed out;
  std::string input;
  for (const std::string& d : deltas) {
    StopMatcher::Output o = m.Push(d);
    input += d;
    out.text += o.text;
    out.emitted_after_each.push_back(out.text);
    out.input_after_each.push_back(input);
    EXPECT_EQ(o.stopped, o.stop_index >= 0);
    if (o.stopped) {
      out.stop_index = o.stop_index;
      EXPECT_TRUE(m.stopped());
      EXPECT_EQ(m.Finish(), "");  // the text after a stop is dropped
      return out;
    }
  }
  out.text += m.Finish();
  return out;
}

// The semantics spelled out on the whole text: the occurrence with the earliest end wins, the
// longest among those ending together, then the lowest index.
Streamed Expected(const std::vector<std::string>& stops, const std::string& text) {
  size_t best_end = std::string::npos;
  int32_t best = -1;
  for (size_t k = 0; k < stops.size(); ++k) {
    size_t pos = text.find(stops[k]);
    if (pos == std::string::npos) continue;
    size_t end = pos + stops[k].size();
    if (best < 0 || end < best_end ||
        (end == best_end && stops[k].size() > stops[static_cast<size_t>(best)].size())) {
      best_end = end;
      best = static_cast<int32_t>(k);
    }
  }
  Streamed e;
  e.stop_index = best;
  e.text = best < 0 ? text : text.substr(0, best_end - stops[static_cast<size_t>(best)].size());
  return e;
}

TEST(StopMatcherTest, NoStopsPassesEverythingThrough) {
  StopMatcher m = Make({});
  EXPECT_EQ(m.Push("hello ").text, "hello ");
  EXPECT_EQ(m.Push("").text, "");
  StopMatcher::Output o = m.Push("world");
  EXPECT_EQ(o.text, "world");
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopMatcherTest, StopInsideOneDelta) {
  StopMatcher m = Make({"STOP"});
  StopMatcher::Output o = m.Push("hello STOP world");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.stop_index, 0);
  EXPECT_EQ(o.text, "hello ");
}

TEST(StopMatcherTest, StopAcrossTokenBoundariesIsHeldBack) {
  StopMatcher m = Make({"STOP"});
  StopMatcher::Output o = m.Push("hel");
  EXPECT_EQ(o.text, "hel");
  o = m.Push("lo S");
  EXPECT_EQ(o.text, "lo ");
  EXPECT_EQ(m.held(), "S");
  o = m.Push("TO");
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(m.held(), "STO");
  o = m.Push("P and more");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
}

TEST(StopMatcherTest, HeldTextIsReleasedWhenTheMatchBreaks) {
  StopMatcher m = Make({"STOP"});
  EXPECT_EQ(m.Push("S").text, "");
  EXPECT_EQ(m.Push("T").text, "");
  StopMatcher::Output o = m.Push("x");
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(o.text, "STx");
  EXPECT_EQ(m.held(), "");
  // A broken match that starts a new one: "STS" keeps the last "S".
  EXPECT_EQ(m.Push("STS").text, "ST");
  EXPECT_EQ(m.held(), "S");
}

TEST(StopMatcherTest, FinishReleasesHeldText) {
  StopMatcher m = Make({"</answer>"});
  EXPECT_EQ(m.Push("done </ans").text, "done ");
  EXPECT_EQ(m.Finish(), "</ans");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, StopLongerThanEveryDelta) {
  const std::string stop = "<|im_end|>";
  StopMatcher m = Make({stop});
  std::string shown;
  for (char c : std::string("answer: 42<|im_end|>ignored")) {
    StopMatcher::Output o = m.Push(std::string(1, c));
    shown += o.text;
    if (o.stopped) break;
  }
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(shown, "answer: 42");
}

TEST(StopMatcherTest, OverlappingStopsEarliestEndWins) {
  EXPECT_EQ(Stream({"ab", "b c"}, {"xab c"}).stop_index, 0);
  EXPECT_EQ(Stream({"ab", "b c"}, {"xab c"}).text, "x");
  EXPECT_EQ(Stream({"ab", "b c"}, {"xb c"}).stop_index, 1);
  EXPECT_EQ(Stream({"ab", "b c"}, {"xb c"}).text, "x");
  // Across deltas: the held "b" (a prefix of "b c") grows into "b c".
  Streamed s = Stream({"ab", "b c"}, {"x", "b", " ", "c!"});
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.text, "x");
  // "abcd" is a longer stop that would start earlier, but "bc" completes first.
  s = Stream({"abcd", "bc"}, {"za", "bcd"});
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.text, "za");
}

TEST(StopMatcherTest, StopsEndingTogetherPreferTheLongest) {
  Streamed s = Stream({"bc", "abc"}, {"zab", "c"});
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.text, "z");
  s = Stream({"x", "x"}, {"aax"});  // equal stops: lowest index
  EXPECT_EQ(s.stop_index, 0);
}

TEST(StopMatcherTest, SelfOverlappingStopNeedsBacktracking) {
  // A naive matcher that restarts after a mismatch misses these.
  EXPECT_EQ(Stream({"aab"}, {"a", "a", "a", "b"}).text, "a");
  Streamed s = Stream({"abab"}, {"xab", "a", "abab"});
  EXPECT_EQ(s.stop_index, 0);
  EXPECT_EQ(s.text, "xaba");
}

TEST(StopMatcherTest, ManyStops) {
  std::vector<std::string> stops;
  for (int i = 0; i < 10; ++i) stops.push_back("<stop" + std::to_string(i) + ">");
  Streamed s = Stream(stops, {"text <st", "op7", "> tail"});
  EXPECT_EQ(s.stop_index, 7);
  EXPECT_EQ(s.text, "text ");
  EXPECT_EQ(s.emitted_after_each[0], "text ");
}

TEST(StopMatcherTest, Utf8StopsHoldWholeCodePoints) {
  // Deltas are whole code points (the streaming detokenizer guarantees it).
  Streamed s = Stream({"终止"}, {"你好", "终", "止了"});
  EXPECT_EQ(s.stop_index, 0);
  EXPECT_EQ(s.text, "你好");
  EXPECT_EQ(s.emitted_after_each[1], "你好");  // "终" held

  // A stop whose first code point appears without the rest: released whole.
  StopMatcher m = Make({"éa"});
  EXPECT_EQ(m.Push("caf").text, "caf");
  EXPECT_EQ(m.Push("é").text, "");
  EXPECT_EQ(m.held(), "é");
  EXPECT_EQ(m.Push("b").text, "éb");

  // Shared lead bytes: "é" (C3 A9) and "ã" (C3 A3).
  s = Stream({"ã!"}, {"é", "ã", "!"});
  EXPECT_EQ(s.text, "é");
  s = Stream({"🛑"}, {"go ", "🛑", " no"});
  EXPECT_EQ(s.text, "go ");
}

TEST(StopMatcherTest, ValidationRejectsBadStops) {
  EXPECT_EQ(StopMatcher::Validate({""}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(StopMatcher::Create({"ok", ""}).ok());
  EXPECT_FALSE(StopMatcher::Validate({std::string("\xC3")}).ok());              // truncated
  EXPECT_FALSE(StopMatcher::Validate({std::string("\xC0\x80")}).ok());          // overlong
  EXPECT_FALSE(StopMatcher::Validate({std::string("\xED\xA0\x80")}).ok());      // surrogate
  EXPECT_FALSE(StopMatcher::Validate({std::string("\xF4\x90\x80\x80")}).ok());  // > U+10FFFF
  EXPECT_FALSE(StopMatcher::Validate({std::string("a\x80")}).ok());  // stray continuation
  EXPECT_TRUE(StopMatcher::Validate({"é", "终", "🛑", "\n\n"}).ok());
  EXPECT_FALSE(StopMatcher::Validate({std::string(StopMatcher::kMaxStopBytes + 1, 'a')}).ok());
  EXPECT_TRUE(StopMatcher::Validate({std::string(StopMatcher::kMaxStopBytes, 'a')}).ok());
  std::vector<std::string> many(StopMatcher::kMaxStops, "x");
  EXPECT_TRUE(StopMatcher::Validate(many).ok());
  many.push_back("y");
  EXPECT_FALSE(StopMatcher::Validate(many).ok());
  EXPECT_TRUE(StopMatcher::Validate({}).ok());
}

TEST(StopMatcherDeathTest, PushAfterStopIsABug) {
  StopMatcher m = Make({"x"});
  EXPECT_TRUE(m.Push("x").stopped);
  EXPECT_DEATH(m.Push("more"), "after a stop");
}

// Random texts, stops and splits: the outcome never depends on how the text is split, matches
// the whole-text semantics, and the text emitted so far is always a prefix of the final text.
TEST(StopMatcherTest, SplittingNeverChangesTheOutcome) {
  std::mt19937 gen(1234);
  const std::string alphabet = "ab c";
  auto random_string = [&](size_t min_len, size_t max_len) {
    std::string s(std::uniform_int_distribution<size_t>(min_len, max_len)(gen), ' ');
    for (char& c : s) c = alphabet[gen() % alphabet.size()];
    return s;
  };
  int n_stopped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (int k = 1 + static_cast<int>(gen() % 5); k > 0; --k) stops.push_back(random_string(1, 5));
    const std::string text = random_string(0, 40);
    const Streamed expected = Expected(stops, text);
    n_stopped += expected.stop_index >= 0;
    for (int split = 0; split < 4; ++split) {
      std::vector<std::string> deltas;
      for (size_t pos = 0; pos < text.size();) {
        size_t len = split == 0 ? text.size() : split == 1 ? 1 : 1 + gen() % 7;
        deltas.push_back(text.substr(pos, len));
        pos += len;
        if (gen() % 5 == 0) deltas.push_back("");  // empty deltas are harmless
      }
      const Streamed got = Stream(stops, deltas);
      ASSERT_EQ(got.stop_index, expected.stop_index) << "text '" << text << "' trial " << trial;
      ASSERT_EQ(got.text, expected.text) << "text '" << text << "' trial " << trial;
      for (size_t i = 0; i < got.emitted_after_each.size(); ++i) {
        const std::string& so_far = got.emitted_after_each[i];
        ASSERT_EQ(expected.text.compare(0, so_far.size(), so_far), 0);
        // Before a stop, exactly the longest tail that could still become a stop is held.
        const std::string& input = got.input_after_each[i];
        if (i + 1 < got.emitted_after_each.size() || got.stop_index < 0) {
          ASSERT_EQ(so_far.size(), input.size() - LongestPendingSuffix(stops, input))
              << "input '" << input << "'";
        }
      }
    }
  }
  EXPECT_GT(n_stopped, 1000);
  EXPECT_LT(n_stopped, 2900);
}

}  // namespace
}  // namespace kestrel
