// /metrics text: exposition-format syntax, histogram semantics, and the values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "server/prometheus.h"

namespace kestrel::server {
namespace {

EngineMetrics SampleMetrics() {
  EngineMetrics m;
  m.requests_finished_stop = 7;
  m.requests_finished_length = 2;
  m.requests_cancelled = 1;
  m.requests_rejected = 3;
  m.prompt_tokens = 400;
  m.prompt_tokens_cached = 100;
  m.generation_tokens = 250;
  m.waiting = 4;
  m.running = 5;
  m.kv_blocks_total = 100;
  m.kv_blocks_used = 30;
  m.kv_blocks_cached_free = 12;
  m.time_to_first_token.Observe(0.0005);  // first bucket
  m.time_to_first_token.Observe(0.02);    // le=0.025
  m.time_to_first_token.Observe(0.02);
  m.time_to_first_token.Observe(100.0);  // +Inf only
  m.inter_token_latency.Observe(0.004);
  m.decode_step.Observe(0.02);
  m.mixed_step.Observe(0.07);
  m.mixed_step.Observe(0.06);
  m.mixed_step_tokens = 3000;
  return m;
}

// name{labels} -> value, for every sample line.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    const std::string value = line.substr(space + 1);
    out[line.substr(0, space)] =
        value == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(value);
  }
  return out;
}

TEST(Prometheus, EveryLineIsWellFormed) {
  HttpCounters counters;
  counters.Record("/v1/chat/completions", 200);
  counters.Record("/v1/chat/completions", 200);
  counters.Record("other", 404);
  const std::string text = FormatPrometheus(SampleMetrics(), counters.Snapshot());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::regex sample_re(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*\})? (\S+)$)");
  const std::regex help_re(R"(^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  const std::regex type_re(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)");
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.rfind("# HELP", 0) == 0) {
      EXPECT_TRUE(std::regex_match(line, help_re)) << line;
    } else if (std::regex_match(line, m, type_re)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "family typed twice: " << line;
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample_re)) << line;
      // Every sample belongs to a family declared before it.
      std::string family = m[1];
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (!typed.count(family) && family.size() > s.size() &&
            family.compare(family.size() - s.size(), s.size(), s) == 0) {
          family = family.substr(0, family.size() - s.size());
        }
      }
      EXPECT_TRUE(typed.count(family)) << line;
    }
  }
  for (const char* family :
       {"kestrel_http_requests_total", "kestrel_prompt_tokens_total",
        "kestrel_generation_tokens_total", "kestrel_requests_waiting", "kestrel_requests_running",
        "kestrel_kv_blocks_used", "kestrel_kv_blocks_free", "kestrel_prefix_cache_hit_rate",
        "kestrel_time_to_first_token_seconds", "kestrel_inter_token_latency_seconds",
        "kestrel_decode_step_seconds", "kestrel_mixed_step_seconds",
        "kestrel_mixed_step_tokens_total"}) {
    EXPECT_TRUE(typed.count(family)) << family;
  }
}

TEST(Prometheus, Values) {
  HttpCounters counters;
  counters.Record("/v1/chat/completions", 200);
  counters.Record("/v1/chat/completions", 200);
  counters.Record("/v1/chat/completions", 400);
  auto s = Samples(FormatPrometheus(SampleMetrics(), counters.Snapshot()));
  EXPECT_EQ(s[R"(kestrel_http_requests_total{route="/v1/chat/completions",status="200"})"], 2);
  EXPECT_EQ(s[R"(kestrel_http_requests_total{route="/v1/chat/completions",status="400"})"], 1);
  EXPECT_EQ(s[R"(kestrel_requests_finished_total{finish_reason="stop"})"], 7);
  EXPECT_EQ(s[R"(kestrel_requests_finished_total{finish_reason="cancelled"})"], 1);
  EXPECT_EQ(s["kestrel_requests_rejected_total"], 3);
  EXPECT_EQ(s["kestrel_prompt_tokens_total"], 400);
  EXPECT_EQ(s["kestrel_generation_tokens_total"], 250);
  EXPECT_EQ(s["kestrel_decode_step_seconds_count"], 1);
  EXPECT_EQ(s["kestrel_mixed_step_seconds_count"], 2);
  EXPECT_DOUBLE_EQ(s["kestrel_mixed_step_seconds_sum"], 0.13);
  EXPECT_EQ(s[R"(kestrel_mixed_step_seconds_bucket{le="0.05"})"], 0);
  EXPECT_EQ(s[R"(kestrel_mixed_step_seconds_bucket{le="0.1"})"], 2);
  EXPECT_EQ(s["kestrel_mixed_step_tokens_total"], 3000);
  EXPECT_EQ(s["kestrel_requests_waiting"], 4);
  EXPECT_EQ(s["kestrel_requests_running"], 5);
  EXPECT_EQ(s["kestrel_kv_blocks_used"], 30);
  EXPECT_EQ(s["kestrel_kv_blocks_free"], 70);
  EXPECT_EQ(s["kestrel_kv_blocks_cached_free"], 12);
  EXPECT_DOUBLE_EQ(s["kestrel_kv_cache_usage_ratio"], 0.3);
  EXPECT_DOUBLE_EQ(s["kestrel_prefix_cache_hit_rate"], 0.25);
}

TEST(Prometheus, HistogramBucketsAreCumulative) {
  auto s = Samples(FormatPrometheus(SampleMetrics(), {}));
  const std::string h = "kestrel_time_to_first_token_seconds";
  EXPECT_EQ(s[h + R"(_bucket{le="0.001"})"], 1);
  EXPECT_EQ(s[h + R"(_bucket{le="0.01"})"], 1);
  EXPECT_EQ(s[h + R"(_bucket{le="0.025"})"], 3);
  EXPECT_EQ(s[h + R"(_bucket{le="30"})"], 3);
  EXPECT_EQ(s[h + R"(_bucket{le="+Inf"})"], 4);
  EXPECT_EQ(s[h + "_count"], 4);
  EXPECT_DOUBLE_EQ(s[h + "_sum"], 0.0005 + 0.02 + 0.02 + 100.0);
  // Non-decreasing across the buckets, in the order written.
  double previous = -1;
  for (double bound : Histogram::kBounds) {
    const double v = s[h + "_bucket{le=\"" + PrometheusNumber(bound) + "\"}"];
    EXPECT_GE(v, previous);
    previous = v;
  }
}

TEST(Prometheus, EmptyEngine) {
  auto s = Samples(FormatPrometheus(EngineMetrics{}, {}));
  EXPECT_EQ(s["kestrel_prefix_cache_hit_rate"], 0);  // no division by zero
  EXPECT_EQ(s["kestrel_kv_cache_usage_ratio"], 0);
  EXPECT_EQ(s[R"(kestrel_e2e_request_latency_seconds_bucket{le="+Inf"})"], 0);
}

TEST(Prometheus, NumbersAndLabels) {
  EXPECT_EQ(PrometheusNumber(1.0), "1");
  EXPECT_EQ(PrometheusNumber(0.0025), "0.0025");
  EXPECT_EQ(PrometheusNumber(12345678.0), "12345678");
  EXPECT_EQ(PrometheusNumber(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PrometheusNumber(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PrometheusNumber(std::nan("")), "NaN");
  EXPECT_EQ(PrometheusLabel("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace kestrel::server
