// Request streams of `kestrel bench-serve`, deterministic from a seed: the `fixed` workload
// (independent prompts of random words, lengths fixed or drawn from a distribution) and the
// `agent-trace` workload (multi-turn coding-agent conversations behind one long shared system
// prompt, each turn resending the whole history, so successive requests share prefixes).
//
// The benchmark has no tokenizer of the server's model: lengths are asked for in tokens and
// turned into a number of words through a calibration measured on the server (two probe prompts,
// usage.prompt_tokens of each), so "about I tokens" holds for whatever tokenizer serves.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::bench {

// A length in tokens: a constant, uniform on [a, b], or normal(mean, sd) rounded and clamped
// to at least 1. Spelled "N", "fixed:N", "uniform:a,b" or "normal:mean,sd".
struct LengthDist {
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double a = 0;  // fixed: the value; uniform: low; normal: mean
  double b = 0;  // uniform: high; normal: sd

  int64_t Draw(std::mt19937_64& rng) const;
  std::string ToString() const;
};

Result<LengthDist> ParseLengthDist(const std::string& spec, const std::string& flag);

// prompt_tokens ~= overhead_tokens + tokens_per_word * words, fitted from two probe prompts.
struct TokenCalibration {
  double tokens_per_word = 1.0;
  double overhead_tokens = 0;
  bool measured = false;  // false: the defaults above (the server reported no usage)
};

// Fits the line through two probes (n_words, prompt_tokens); the defaults when the points do not
// give a positive slope.
TokenCalibration FitCalibration(int64_t words_a, int64_t tokens_a, int64_t words_b,
                                int64_t tokens_b);

// Words that make about n_tokens tokens of running text (overhead not included), at least 1.
int64_t WordsForTokens(const TokenCalibration& calibration, double n_tokens);

// n_words common English words drawn from rng, separated by spaces.
std::string RandomWords(int64_t n_words, std::mt19937_64& rng);

// Mixes values into one well-spread 64-bit seed (SplitMix64 steps).
uint64_t MixSeed(std::initializer_list<uint64_t> values);

struct Message {
  std::string role;  // system, user or assistant
  std::string content;
};

struct RequestSpec {
  std::vector<Message> messages;
  int64_t max_tokens = 0;
  int32_t turn = 0;  // agent-trace: 1-based turn within its conversation; 0 for `fixed`
};

// The text of a /v1/completions prompt: one user message as it is; a conversation as
// role-labelled paragraphs ending with "Assistant:".
std::string CompletionPrompt(const std::vector<Message>& messages);

enum class WorkloadKind { kFixed, kAgentTrace };

struct WorkloadOptions {
  WorkloadKind kind = WorkloadKind::kFixed;
  LengthDist input;   // fixed: prompt tokens (chat template overhead included)
  LengthDist output;  // max_tokens of every request (agent-trace: also its synthesized answer)
  int32_t turns = 6;  // agent-trace
  int64_t system_tokens = 2000;  // agent-trace: the shared system prompt
  int64_t turn_tokens = 150;     // agent-trace: each new user message
  uint64_t seed = 1;
  TokenCalibration calibration;
};

// The requests of one run (one server, one concurrency level, one repeat). Lengths depend on
// (seed, run) only, so every server gets the same lengths; the words also depend on the server,
// so two URLs naming one server do not hit each other's prefix cache. The agent-trace system
// prompt depends on (seed, server) only: one agent's prompt, shared by all its conversations.
class Workload {
 public:
  Workload(const WorkloadOptions& options, uint64_t run_key, uint64_t server_key);

  // fixed: the index-th request of the run.
  RequestSpec FixedRequest(uint64_t index) const;

  // agent-trace: a conversation's requests one turn after another; the previous turn's answer
  // is synthesized (the output length's words), not the server's, so all servers and repeats
  // see the same request stream.
  class Conversation {
   public:
    bool done() const { return next_turn_ > turns_; }
    RequestSpec Next();

   private:
    friend class Workload;
    const Workload* workload_ = nullptr;
    uint64_t index_ = 0;
    int32_t turns_ = 0;
    int32_t next_turn_ = 1;
    std::vector<Message> history_;
  };
  Conversation StartConversation(uint64_t index) const;

 private:
  WorkloadOptions options_;
  uint64_t length_key_;   // lengths: same for every server
  uint64_t content_key_;  // words: per server
  std::string system_prompt_;
};

}  // namespace kestrel::bench
