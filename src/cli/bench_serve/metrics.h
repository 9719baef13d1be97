// What `kestrel bench-serve` reports: the figures of one run (one server, one concurrency level,
// one repeat), their medians and confidence intervals across repeats, and the paired ratio of two
// servers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_serve/runner.h"
#include "cli/bench_serve/stats.h"

namespace kestrel::bench {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  int64_t n = 0;
};

Percentiles Summarize(const std::vector<double>& values);

// Per turn of the agent-trace workload: prompts grow turn by turn; TTFT shows the prefix cache.
struct TurnMetrics {
  int32_t turn = 0;
  int64_t requests = 0;
  double prompt_tokens_mean = 0;
  double ttft_p50_ms = 0;
};

struct RunMetrics {
  int64_t completed = 0;          // measured requests that streamed to the end
  int64_t failed = 0;             // the four kinds below
  int64_t http_errors = 0;        // non-200 other than 429
  int64_t rate_limited = 0;       // 429
  int64_t connection_errors = 0;  // no answer, or the stream broke off
  int64_t stream_errors = 0;      // an error frame, malformed JSON, no finish_reason nor [DONE]
  int64_t warmup_failed = 0;
  std::map<int, int64_t> http_status_counts;
  std::vector<std::string> error_samples;  // up to 3 distinct messages
  int64_t without_usage = 0;               // completed requests whose stream had no usage
  int64_t with_token_counts = 0;           // completed requests with usage in every chunk
  int64_t output_tokens = 0;               // from usage (chunk counts where without_usage)
  int64_t prompt_tokens = 0;               // from usage
  double window_s = 0;                     // first measured request's start to the last one's end
  double output_tok_per_s = 0;
  // Closed-loop throughput while every worker had a request in flight: from the later of the
  // first measured request's start and the last worker's first start (--ramp-up) to the last
  // measured request's start (after it the workers run out of requests and the concurrency
  // drains), the output tokens of all requests, warm-up ones included, that arrived in it (a
  // request's tokens in the window, RequestRecord::TokensArrivedBetween). 0 when there is
  // no such window (the measured requests all started at once, or before every worker had).
  double steady_window_s = 0;
  double steady_output_tok_per_s = 0;
  double requests_per_s = 0;
  // ITL per token (RequestRecord::InterTokenLatencies); text_gap_ms the gaps between chunks
  // that carried text, as a reader of the stream sees them (a token whose text is held back, a
  // partial UTF-8 sequence, makes one gap of two tokens).
  Percentiles ttft_ms, itl_ms, e2e_ms, tpot_ms, text_gap_ms;
  std::vector<TurnMetrics> by_turn;  // agent-trace only
};

RunMetrics SummarizeRun(const RunRecord& run);

nlohmann::json ToJson(const RunMetrics& m);

// The scalar figures compared across repeats and servers, in report order.
std::vector<std::pair<std::string, double>> ScalarMetrics(const RunMetrics& m);

// {"metric": {"median", "ci_low", "ci_high", "confidence", "n"}} over the repeats of one server.
nlohmann::json RepeatSummary(const std::vector<RunMetrics>& runs, CiMethod method, uint64_t seed);

// {"metric": {"median", "ci_low", "ci_high", "confidence", "n"}} of the per-repeat ratios b / a.
nlohmann::json PairedComparison(const std::vector<RunMetrics>& a, const std::vector<RunMetrics>& b,
                                CiMethod method, uint64_t seed);

nlohmann::json ToJson(const Interval& interval);

}  // namespace kestrel::bench
