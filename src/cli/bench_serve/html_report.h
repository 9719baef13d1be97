// The `--html` report of `kestrel bench-serve`: one self-contained page (inline CSS and SVG, no
// scripts, nothing fetched) drawn from the result JSON: throughput, TTFT and ITL percentiles
// against concurrency, one line per server, and the tables behind the plots.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel::bench {

struct PlotSeries {
  std::string label;
  std::string color;
  std::string dash;           // SVG stroke-dasharray; empty for a solid line
  std::vector<double> y;      // one value per x position
  std::vector<double> y_low;  // confidence interval, drawn as whiskers; empty for none
  std::vector<double> y_high;
};

// An SVG line chart with categorical x positions (the concurrency levels, equally spaced) and a
// linear y axis from 0.
std::string SvgLineChart(const std::string& title, const std::string& y_label,
                         const std::vector<std::string>& x_labels,
                         const std::vector<PlotSeries>& series);

// The whole page from the JSON that bench-serve prints.
std::string HtmlReport(const nlohmann::json& results);

}  // namespace kestrel::bench
