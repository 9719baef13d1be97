#include "cli/bench_serve/workload.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

namespace kestrel::bench {
namespace {

// Short common words: one token each in most BPE vocabularies, so the calibrated slope is near 1
// and prompts read as (meaningless) text rather than noise.
constexpr std::string_view kWords[] = {
    "the",     "of",     "and",     "to",    "in",     "is",     "that",    "for",     "it",
    "as",      "with",   "was",     "on",    "be",     "at",     "by",      "this",    "had",
    "not",     "are",    "but",     "from",  "or",     "have",   "an",      "they",    "which",
    "one",     "you",    "were",    "all",   "we",     "when",   "your",    "can",     "said",
    "there",   "use",    "each",    "she",   "do",     "how",    "their",   "if",      "will",
    "up",      "other",  "about",   "out",   "many",   "then",   "them",    "these",   "so",
    "some",    "her",    "would",   "make",  "like",   "him",    "into",    "time",    "has",
    "look",    "two",    "more",    "write", "go",     "see",    "number",  "no",      "way",
    "could",   "people", "my",      "than",  "first",  "water",  "been",    "call",    "who",
    "now",     "find",   "long",    "down",  "day",    "did",    "get",     "come",    "made",
    "may",     "part",   "over",    "new",   "sound",  "take",   "only",    "little",  "work",
    "know",    "place",  "year",    "live",  "back",   "give",   "most",    "very",    "after",
    "thing",   "our",    "just",    "name",  "good",   "man",    "think",   "say",     "great",
    "where",   "help",   "through", "much",  "before", "line",   "right",   "too",     "mean",
    "old",     "any",    "same",    "tell",  "boy",    "follow", "came",    "want",    "show",
    "also",    "around", "form",    "three", "small",  "set",    "put",     "end",     "does",
    "another", "well",   "large",   "must",  "big",    "even",   "such",    "because", "turn",
    "here",    "why",    "ask",     "went",  "men",    "read",   "need",    "land",    "different",
    "home",    "us",     "move",    "try",   "kind",   "hand",   "picture", "again",   "change",
    "off",     "play",   "spell",   "air",   "away",   "animal", "house",   "point",   "page",
    "letter",  "mother", "answer",  "found", "study",  "still",  "learn",   "should",  "world",
    "file",    "value",  "list",
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// "uniform:a,b" -> {a, b}; false unless exactly n numbers.
bool ParseNumbers(std::string_view text, size_t n, std::vector<double>* out) {
  out->clear();
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      try {
        size_t used = 0;
        const double v = std::stod(item, &used);
        if (used != item.size() || !std::isfinite(v)) return false;
        out->push_back(v);
      } catch (const std::exception&) {
        return false;
      }
      item.clear();
    } else {
      item.push_back(text[i]);
    }
  }
  return out->size() == n;
}

}  // namespace

int64_t LengthDist::Draw(std::mt19937_64& rng) const {
  // Uniform doubles from the raw 53 high bits: the same numbers with every standard library.
  auto unit = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  double v = a;
  switch (kind) {
    case Kind::kFixed:
      break;
    case Kind::kUniform:
      v = std::floor(a + unit() * (b - a + 1));
      v = std::min(v, b);
      break;
    case Kind::kNormal: {
      // Box-Muller; 1 - unit() is in (0, 1], so the log is finite.
      const double r = std::sqrt(-2 * std::log(1 - unit()));
      v = std::round(a + b * r * std::cos(2 * M_PI * unit()));
      break;
    }
  }
  return std::max<int64_t>(1, static_cast<int64_t>(v));
}

std::string LengthDist::ToString() const {
  auto num = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  switch (kind) {
    case Kind::kFixed:
      return "fixed:" + num(a);
    case Kind::kUniform:
      return "uniform:" + num(a) + "," + num(b);
    case Kind::kNormal:
      return "normal:" + num(a) + "," + num(b);
  }
  return "";
}

Result<LengthDist> ParseLengthDist(const std::string& spec, const std::string& flag) {
  const std::string usage =
      flag + " must be N, fixed:N, uniform:MIN,MAX or normal:MEAN,SD (tokens), got '" + spec + "'";
  const size_t colon = spec.find(':');
  const std::string kind = colon == std::string::npos ? "fixed" : spec.substr(0, colon);
  const std::string args = colon == std::string::npos ? spec : spec.substr(colon + 1);
  std::vector<double> v;
  LengthDist d;
  if (kind == "fixed" && ParseNumbers(args, 1, &v) && v[0] >= 1) {
    d.kind = LengthDist::Kind::kFixed;
    d.a = std::floor(v[0]);
    return d;
  }
  if (kind == "uniform" && ParseNumbers(args, 2, &v) && v[0] >= 1 && v[1] >= v[0]) {
    d.kind = LengthDist::Kind::kUniform;
    d.a = std::floor(v[0]);
    d.b = std::floor(v[1]);
    return d;
  }
  if (kind == "normal" && ParseNumbers(args, 2, &v) && v[0] >= 1 && v[1] >= 0) {
    d.kind = LengthDist::Kind::kNormal;
    d.a = v[0];
    d.b = v[1];
    return d;
  }
  return InvalidArgument(usage);
}

TokenCalibration FitCalibration(int64_t words_a, int64_t tokens_a, int64_t words_b,
                                int64_t tokens_b) {
  TokenCalibration c;
  if (words_b == words_a || tokens_a <= 0 || tokens_b <= 0) return c;
  const double slope =
      static_cast<double>(tokens_b - tokens_a) / static_cast<double>(words_b - words_a);
  if (!(slope > 0)) return c;
  c.tokens_per_word = slope;
  c.overhead_tokens =
      std::max(0.0, static_cast<double>(tokens_a) - slope * static_cast<double>(words_a));
  c.measured = true;
  return c;
}

int64_t WordsForTokens(const TokenCalibration& calibration, double n_tokens) {
  return std::max<int64_t>(1, std::llround(n_tokens / calibration.tokens_per_word));
}

std::string RandomWords(int64_t n_words, std::mt19937_64& rng) {
  std::string out;
  for (int64_t i = 0; i < n_words; ++i) {
    if (i > 0) out.push_back(' ');
    out.append(kWords[static_cast<size_t>(rng() % std::size(kWords))]);
  }
  return out;
}

uint64_t MixSeed(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x6B657374726C;  // "kestrl"
  for (uint64_t v : values) h = SplitMix64(h ^ SplitMix64(v));
  return h;
}

std::string CompletionPrompt(const std::vector<Message>& messages) {
  if (messages.size() == 1 && messages[0].role == "user") return messages[0].content;
  std::string out;
  for (const Message& m : messages) {
    std::string role = m.role;
    if (!role.empty()) role[0] = static_cast<char>(role[0] - 'a' + 'A');
    out += role + ": " + m.content + "\n\n";
  }
  return out + "Assistant:";
}

Workload::Workload(const WorkloadOptions& options, uint64_t run_key, uint64_t server_key)
    : options_(options),
      length_key_(MixSeed({options.seed, run_key})),
      content_key_(MixSeed({options.seed, run_key, server_key})) {
  if (options_.kind == WorkloadKind::kAgentTrace) {
    std::mt19937_64 rng(MixSeed({options.seed, server_key, 0x5359u}));
    system_prompt_ =
        "You are a coding agent. " +
        RandomWords(
            WordsForTokens(options_.calibration, static_cast<double>(options_.system_tokens)), rng);
  }
}

RequestSpec Workload::FixedRequest(uint64_t index) const {
  std::mt19937_64 length_rng(MixSeed({length_key_, index}));
  std::mt19937_64 word_rng(MixSeed({content_key_, index}));
  const int64_t input_tokens = options_.input.Draw(length_rng);
  RequestSpec spec;
  spec.max_tokens = options_.output.Draw(length_rng);
  // The chat template's (or BOS's) share of the prompt is part of the requested length.
  const double text_tokens =
      std::max(1.0, static_cast<double>(input_tokens) - options_.calibration.overhead_tokens);
  spec.messages.push_back(
      {"user", RandomWords(WordsForTokens(options_.calibration, text_tokens), word_rng)});
  return spec;
}

Workload::Conversation Workload::StartConversation(uint64_t index) const {
  Conversation c;
  c.workload_ = this;
  c.index_ = index;
  c.turns_ = options_.turns;
  c.history_.push_back({"system", system_prompt_});
  return c;
}

RequestSpec Workload::Conversation::Next() {
  const WorkloadOptions& o = workload_->options_;
  const int32_t turn = next_turn_++;
  std::mt19937_64 length_rng(
      MixSeed({workload_->length_key_, index_, static_cast<uint64_t>(turn)}));
  std::mt19937_64 word_rng(MixSeed({workload_->content_key_, index_, static_cast<uint64_t>(turn)}));
  RequestSpec spec;
  spec.turn = turn;
  spec.max_tokens = o.output.Draw(length_rng);
  history_.push_back(
      {"user",
       RandomWords(WordsForTokens(o.calibration, static_cast<double>(o.turn_tokens)), word_rng)});
  spec.messages = history_;
  // The answer this turn is assumed to get, resent with the next turn.
  history_.push_back(
      {"assistant",
       RandomWords(WordsForTokens(o.calibration, static_cast<double>(spec.max_tokens)), word_rng)});
  return spec;
}

}  // namespace kestrel::bench
