#include "cli/bench_serve/metrics.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kestrel::bench {

using nlohmann::json;

Percentiles Summarize(const std::vector<double>& values) {
  Percentiles p;
  p.n = static_cast<int64_t>(values.size());
  if (values.empty()) return p;
  p.p50 = Percentile(values, 50);
  p.p90 = Percentile(values, 90);
  p.p99 = Percentile(values, 99);
  p.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return p;
}

RunMetrics SummarizeRun(const RunRecord& run) {
  RunMetrics m;
  m.warmup_failed = run.warmup_failed;
  double first_start = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  std::vector<double> ttft, itl, e2e, tpot, text_gaps;
  std::map<int32_t, std::pair<std::vector<double>, std::vector<double>>> turns;  // prompt, ttft
  for (const RequestRecord& r : run.measured) {
    first_start = std::min(first_start, r.start_s);
    last_end = std::max(last_end, r.end_s);
    if (r.outcome != Outcome::kOk) {
      ++m.failed;
      switch (r.outcome) {
        case Outcome::kHttpError:
          ++m.http_errors;
          break;
        case Outcome::kRateLimited:
          ++m.rate_limited;
          break;
        case Outcome::kConnectionError:
          ++m.connection_errors;
          break;
        default:
          ++m.stream_errors;
      }
      if (r.http_status != 0 && r.http_status != 200) ++m.http_status_counts[r.http_status];
      if (m.error_samples.size() < 3 && std::find(m.error_samples.begin(), m.error_samples.end(),
                                                  r.error) == m.error_samples.end()) {
        m.error_samples.push_back(r.error);
      }
      continue;
    }
    ++m.completed;
    if (!r.usage_present) ++m.without_usage;
    const int64_t n_out = r.output_tokens();
    m.output_tokens += n_out;
    m.prompt_tokens += r.usage_prompt_tokens;
    e2e.push_back(1e3 * r.e2e_s());
    if (r.first_output_s() >= 0) {
      ttft.push_back(1e3 * r.ttft_s());
      if (n_out > 1) {
        tpot.push_back(1e3 * (r.end_s - r.first_output_s()) / static_cast<double>(n_out - 1));
      }
    }
    for (double v : r.InterTokenLatencies()) itl.push_back(1e3 * v);
    if (!r.token_times_s.empty()) ++m.with_token_counts;
    for (size_t i = 1; i < r.content_times_s.size(); ++i) {
      text_gaps.push_back(1e3 * (r.content_times_s[i] - r.content_times_s[i - 1]));
    }
    if (r.turn > 0) {
      auto& [prompts, ttfts] = turns[r.turn];
      prompts.push_back(static_cast<double>(r.usage_prompt_tokens));
      if (r.first_output_s() >= 0) ttfts.push_back(1e3 * r.ttft_s());
    }
  }
  if (!run.measured.empty()) m.window_s = last_end - first_start;
  if (m.window_s > 0) {
    m.output_tok_per_s = static_cast<double>(m.output_tokens) / m.window_s;
    m.requests_per_s = static_cast<double>(m.completed) / m.window_s;
  }
  double last_start = -std::numeric_limits<double>::infinity();
  for (const RequestRecord& r : run.measured) last_start = std::max(last_start, r.start_s);
  const double steady_from = std::max(first_start, run.all_workers_started_s);
  if (!run.measured.empty() && last_start > steady_from) {
    m.steady_window_s = last_start - steady_from;
    double tokens = 0;
    for (const auto* records : {&run.warmup, &run.measured}) {
      for (const RequestRecord& r : *records) {
        if (r.outcome != Outcome::kOk) continue;
        tokens += r.TokensArrivedBetween(steady_from, last_start);
      }
    }
    m.steady_output_tok_per_s = tokens / m.steady_window_s;
  }
  m.ttft_ms = Summarize(ttft);
  m.itl_ms = Summarize(itl);
  m.text_gap_ms = Summarize(text_gaps);
  m.e2e_ms = Summarize(e2e);
  m.tpot_ms = Summarize(tpot);
  for (const auto& [turn, values] : turns) {
    TurnMetrics t;
    t.turn = turn;
    t.requests = static_cast<int64_t>(values.first.size());
    t.prompt_tokens_mean = Summarize(values.first).mean;
    t.ttft_p50_ms = Percentile(values.second, 50);
    m.by_turn.push_back(t);
  }
  return m;
}

namespace {

json ToJson(const Percentiles& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}, {"n", p.n}};
}

}  // namespace

json ToJson(const RunMetrics& m) {
  json statuses = json::object();
  for (const auto& [code, n] : m.http_status_counts) statuses[std::to_string(code)] = n;
  json j = {{"completed", m.completed},
            {"failed", m.failed},
            {"http_errors", m.http_errors},
            {"rate_limited", m.rate_limited},
            {"connection_errors", m.connection_errors},
            {"stream_errors", m.stream_errors},
            {"http_status_counts", statuses},
            {"error_samples", m.error_samples},
            {"warmup_failed", m.warmup_failed},
            {"requests_without_usage", m.without_usage},
            {"output_tokens_source", m.without_usage == 0 ? "usage"
                                     : m.without_usage == m.completed
                                         ? "chunk_count (the server sent no usage)"
                                         : "usage, chunk_count where the server sent no usage"},
            {"output_tokens", m.output_tokens},
            {"prompt_tokens", m.prompt_tokens},
            {"window_s", m.window_s},
            {"output_tok_per_s", m.output_tok_per_s},
            {"steady_window_s", m.steady_window_s},
            {"steady_output_tok_per_s", m.steady_output_tok_per_s},
            {"requests_per_s", m.requests_per_s},
            {"ttft_ms", ToJson(m.ttft_ms)},
            {"itl_source", m.with_token_counts == m.completed
                               ? "per-chunk usage (continuous_usage_stats)"
                           : m.with_token_counts == 0
                               ? "content chunks, gaps spread over the usage count"
                               : "per-chunk usage where the server sent it, else content chunks"},
            {"itl_ms", ToJson(m.itl_ms)},
            {"text_gap_ms", ToJson(m.text_gap_ms)},
            {"e2e_ms", ToJson(m.e2e_ms)},
            {"tpot_ms", ToJson(m.tpot_ms)}};
  if (!m.by_turn.empty()) {
    json turns = json::array();
    for (const TurnMetrics& t : m.by_turn) {
      turns.push_back({{"turn", t.turn},
                       {"requests", t.requests},
                       {"prompt_tokens_mean", t.prompt_tokens_mean},
                       {"ttft_p50_ms", t.ttft_p50_ms}});
    }
    j["by_turn"] = std::move(turns);
  }
  return j;
}

std::vector<std::pair<std::string, double>> ScalarMetrics(const RunMetrics& m) {
  return {{"output_tok_per_s", m.output_tok_per_s},
          {"steady_output_tok_per_s", m.steady_output_tok_per_s},
          {"requests_per_s", m.requests_per_s},
          {"ttft_p50_ms", m.ttft_ms.p50},
          {"ttft_p90_ms", m.ttft_ms.p90},
          {"ttft_p99_ms", m.ttft_ms.p99},
          {"itl_p50_ms", m.itl_ms.p50},
          {"itl_p90_ms", m.itl_ms.p90},
          {"itl_p99_ms", m.itl_ms.p99},
          {"e2e_p50_ms", m.e2e_ms.p50},
          {"e2e_p99_ms", m.e2e_ms.p99},
          {"tpot_p50_ms", m.tpot_ms.p50}};
}

json ToJson(const Interval& interval) {
  return {{"median", interval.estimate},
          {"ci_low", interval.low},
          {"ci_high", interval.high},
          {"confidence", interval.confidence},
          {"n", interval.n}};
}

namespace {

// metric name -> its value in each run, in run order.
std::vector<std::pair<std::string, std::vector<double>>> Columns(
    const std::vector<RunMetrics>& runs) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (const RunMetrics& run : runs) {
    const auto scalars = ScalarMetrics(run);
    if (out.empty()) {
      for (const auto& [name, value] : scalars) out.push_back({name, {}});
    }
    for (size_t i = 0; i < scalars.size(); ++i) out[i].second.push_back(scalars[i].second);
  }
  return out;
}

}  // namespace

json RepeatSummary(const std::vector<RunMetrics>& runs, CiMethod method, uint64_t seed) {
  json out = json::object();
  for (const auto& [name, values] : Columns(runs)) {
    out[name] = ToJson(MedianCi(values, method, seed));
  }
  return out;
}

json PairedComparison(const std::vector<RunMetrics>& a, const std::vector<RunMetrics>& b,
                      CiMethod method, uint64_t seed) {
  json out = json::object();
  const auto columns_a = Columns(a);
  const auto columns_b = Columns(b);
  for (size_t i = 0; i < std::min(columns_a.size(), columns_b.size()); ++i) {
    out[columns_a[i].first] =
        ToJson(PairedRatioCi(columns_a[i].second, columns_b[i].second, method, seed));
  }
  return out;
}

}  // namespace kestrel::bench
