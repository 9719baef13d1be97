// /metrics in the Prometheus text exposition format (version 0.0.4): the engine's counters,
// gauges and latency histograms (_bucket{le=...} cumulative, _sum, _count) and the HTTP
// requests answered, by route and status.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/metrics.h"

namespace kestrel::server {

// Responses by (route, status code). Routes are the server's own patterns (never the raw path,
// which a client controls), so the label set stays small.
class HttpCounters {
 public:
  using Key = std::pair<std::string, int>;
  void Record(const std::string& route, int status);
  std::map<Key, uint64_t> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<Key, uint64_t> counts_;
};

// "1", "0.25", "2.5e-05", "+Inf": shortest text that reads back to the same double.
std::string PrometheusNumber(double v);
// Escapes \, " and newlines for a label value.
std::string PrometheusLabel(const std::string& v);

std::string FormatPrometheus(const EngineMetrics& engine,
                             const std::map<HttpCounters::Key, uint64_t>& http);

}  // namespace kestrel::server
