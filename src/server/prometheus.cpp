#include "server/prometheus.h"

#include <charconv>
#include <cmath>

namespace kestrel::server {
namespace {

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void Sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += ' ';
  *out += PrometheusNumber(v);
  *out += '\n';
}

void Scalar(std::string* out, const char* name, const char* type, const char* help, double v) {
  Family(out, name, type, help);
  Sample(out, name, "", v);
}

void HistogramText(std::string* out, const char* name, const char* help, const Histogram& h) {
  Family(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
    cumulative += h.counts[i];
    Sample(out, std::string(name) + "_bucket",
           "le=\"" + PrometheusNumber(Histogram::kBounds[i]) + "\"",
           static_cast<double>(cumulative));
  }
  cumulative += h.counts.back();
  Sample(out, std::string(name) + "_bucket", "le=\"+Inf\"", static_cast<double>(cumulative));
  Sample(out, std::string(name) + "_sum", "", h.sum);
  Sample(out, std::string(name) + "_count", "", static_cast<double>(h.count));
}

}  // namespace

void HttpCounters::Record(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[{route, status}];
}

std::map<HttpCounters::Key, uint64_t> HttpCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

std::string PrometheusNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string PrometheusLabel(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatPrometheus(const EngineMetrics& m,
                             const std::map<HttpCounters::Key, uint64_t>& http) {
  std::string out;
  Family(&out, "kestrel_http_requests_total", "counter", "HTTP responses by route and status.");
  for (const auto& [key, count] : http) {
    Sample(&out, "kestrel_http_requests_total",
           "route=\"" + PrometheusLabel(key.first) + "\",status=\"" + std::to_string(key.second) +
               "\"",
           static_cast<double>(count));
  }

  Family(&out, "kestrel_requests_finished_total", "counter",
         "Engine requests finished, by reason.");
  Sample(&out, "kestrel_requests_finished_total", "finish_reason=\"stop\"",
         static_cast<double>(m.requests_finished_stop));
  Sample(&out, "kestrel_requests_finished_total", "finish_reason=\"length\"",
         static_cast<double>(m.requests_finished_length));
  Sample(&out, "kestrel_requests_finished_total", "finish_reason=\"cancelled\"",
         static_cast<double>(m.requests_cancelled));
  Scalar(&out, "kestrel_requests_rejected_total", "counter",
         "Requests refused by the engine (queue full or shutting down).",
         static_cast<double>(m.requests_rejected));
  Scalar(&out, "kestrel_prompt_tokens_total", "counter", "Prompt tokens admitted.",
         static_cast<double>(m.prompt_tokens));
  Scalar(&out, "kestrel_prompt_tokens_cached_total", "counter",
         "Prompt tokens served from the prefix cache.",
         static_cast<double>(m.prompt_tokens_cached));
  Scalar(&out, "kestrel_generation_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(m.generation_tokens));
  Scalar(&out, "kestrel_jump_forward_tokens_total", "counter",
         "Generated tokens a grammar forced, appended without a decode step each.",
         static_cast<double>(m.jump_forward_tokens));
  Scalar(&out, "kestrel_preemptions_total", "counter", "Sequences preempted for KV space.",
         static_cast<double>(m.preemptions));
  Scalar(&out, "kestrel_engine_steps_total", "counter", "Engine steps run.",
         static_cast<double>(m.steps));

  Scalar(&out, "kestrel_requests_waiting", "gauge", "Requests queued, not yet running.",
         static_cast<double>(m.waiting));
  Scalar(&out, "kestrel_requests_running", "gauge", "Sequences running.",
         static_cast<double>(m.running));
  Scalar(&out, "kestrel_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
         static_cast<double>(m.kv_blocks_total));
  Scalar(&out, "kestrel_kv_blocks_used", "gauge", "KV cache blocks held by running sequences.",
         static_cast<double>(m.kv_blocks_used));
  Scalar(&out, "kestrel_kv_blocks_free", "gauge",
         "KV cache blocks not held by a running sequence (cached prefixes included).",
         static_cast<double>(m.kv_blocks_total - m.kv_blocks_used));
  Scalar(&out, "kestrel_kv_blocks_cached_free", "gauge",
         "Free KV cache blocks that still hold a reusable prefix.",
         static_cast<double>(m.kv_blocks_cached_free));
  Scalar(&out, "kestrel_state_snapshots", "gauge",
         "Recurrent-state snapshots held by the prefix cache (hybrid models).",
         static_cast<double>(m.state_snapshots));
  Scalar(&out, "kestrel_state_snapshot_bytes", "gauge",
         "Bytes of the recurrent-state snapshots held by the prefix cache.",
         static_cast<double>(m.state_snapshot_bytes));
  Scalar(&out, "kestrel_state_snapshot_slots", "gauge",
         "Recurrent-state snapshot slots (the snapshot pool's capacity).",
         static_cast<double>(m.state_snapshot_slots));
  Scalar(&out, "kestrel_state_snapshot_evictions_total", "counter",
         "Recurrent-state snapshots evicted to make room for newer ones.",
         static_cast<double>(m.state_snapshot_evictions));
  Scalar(&out, "kestrel_kv_cache_usage_ratio", "gauge",
         "Fraction of the KV cache blocks held by running sequences.",
         m.kv_blocks_total > 0
             ? static_cast<double>(m.kv_blocks_used) / static_cast<double>(m.kv_blocks_total)
             : 0.0);
  Scalar(&out, "kestrel_prefix_cache_hit_rate", "gauge",
         "Fraction of admitted prompt tokens served from the prefix cache.",
         m.prompt_tokens > 0
             ? static_cast<double>(m.prompt_tokens_cached) / static_cast<double>(m.prompt_tokens)
             : 0.0);

  HistogramText(&out, "kestrel_time_to_first_token_seconds",
                "Time from arrival to the first generated token of a request.",
                m.time_to_first_token);
  HistogramText(&out, "kestrel_inter_token_latency_seconds",
                "Time between consecutive generated tokens of a sequence.", m.inter_token_latency);
  HistogramText(&out, "kestrel_e2e_request_latency_seconds",
                "Time from arrival to the end of a request.", m.e2e_latency);
  HistogramText(&out, "kestrel_decode_step_seconds",
                "Engine steps where every sequence computed one token: time per step.",
                m.decode_step);
  HistogramText(&out, "kestrel_mixed_step_seconds",
                "Engine steps that carried prompt chunks: time per step.", m.mixed_step);
  Scalar(&out, "kestrel_mixed_step_tokens_total", "counter",
         "Tokens computed by the steps that carried prompt chunks.",
         static_cast<double>(m.mixed_step_tokens));
  return out;
}

}  // namespace kestrel::server
