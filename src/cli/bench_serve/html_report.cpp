#include "cli/bench_serve/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/html_escape.h"

namespace kestrel::bench {

using nlohmann::json;

namespace {

constexpr const char* kColors[] = {"#1f6fb4", "#d1495b", "#2a9d55", "#8e5cc2"};

// Three significant digits (whole numbers as such), no exponent for the magnitudes a benchmark
// shows.
std::string Num(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 100 || a == std::round(a)) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f", v);
  } else if (a >= 1) {
    std::snprintf(buf, sizeof(buf), "%.2f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  }
  return buf;
}

// A tick step of 1, 2 or 5 times a power of ten giving about 5 ticks up to `top`.
double NiceStep(double top) {
  const double raw = top / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

double At(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

const json& Summary(const json& server_level, const std::string& metric) {
  static const json kEmpty = json::object();
  const json& s = server_level.contains("summary") ? server_level["summary"] : kEmpty;
  return s.contains(metric) ? s[metric] : kEmpty;
}

}  // namespace

std::string SvgLineChart(const std::string& title, const std::string& y_label,
                         const std::vector<std::string>& x_labels,
                         const std::vector<PlotSeries>& series) {
  constexpr double kWidth = 720, kHeight = 380;
  constexpr double kLeft = 70, kRight = 190, kTop = 36, kBottom = 52;
  const double plot_w = kWidth - kLeft - kRight;
  const double plot_h = kHeight - kTop - kBottom;
  const size_t n_x = std::max<size_t>(1, x_labels.size());

  double top = 0;
  for (const PlotSeries& s : series) {
    for (double v : s.y) top = std::max(top, v);
    for (double v : s.y_high) top = std::max(top, v);
  }
  if (!(top > 0) || !std::isfinite(top)) top = 1;
  const double step = NiceStep(top);
  top = std::ceil(top / step) * step;
  auto x_at = [&](size_t i) {
    return kLeft + (static_cast<double>(i) + 0.5) * plot_w / static_cast<double>(n_x);
  };
  auto y_at = [&](double v) { return kTop + plot_h * (1 - std::clamp(v / top, 0.0, 1.0)); };

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(kWidth) +
                    "\" height=\"" + Num(kHeight) + "\" viewBox=\"0 0 " + Num(kWidth) + " " +
                    Num(kHeight) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<title>" + HtmlEscape(title) + "</title>\n";
  svg += "<text x=\"" + Num(kLeft) + "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">" +
         HtmlEscape(title) + "</text>\n";
  // Grid and y ticks.
  for (double v = 0; v <= top + step / 2; v += step) {
    const std::string y = Num(y_at(v));
    svg += "<line x1=\"" + Num(kLeft) + "\" y1=\"" + y + "\" x2=\"" + Num(kLeft + plot_w) +
           "\" y2=\"" + y + "\" stroke=\"#ddd\"/>\n";
    svg += "<text x=\"" + Num(kLeft - 6) + "\" y=\"" + y +
           "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + Num(v) + "</text>\n";
  }
  svg += "<line x1=\"" + Num(kLeft) + "\" y1=\"" + Num(kTop + plot_h) + "\" x2=\"" +
         Num(kLeft + plot_w) + "\" y2=\"" + Num(kTop + plot_h) + "\" stroke=\"#333\"/>\n";
  for (size_t i = 0; i < x_labels.size(); ++i) {
    svg += "<text x=\"" + Num(x_at(i)) + "\" y=\"" + Num(kTop + plot_h + 18) +
           "\" text-anchor=\"middle\">" + HtmlEscape(x_labels[i]) + "</text>\n";
  }
  svg += "<text x=\"" + Num(kLeft + plot_w / 2) + "\" y=\"" + Num(kHeight - 8) +
         "\" text-anchor=\"middle\">concurrency</text>\n";
  svg += "<text transform=\"translate(16," + Num(kTop + plot_h / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + HtmlEscape(y_label) + "</text>\n";

  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const std::string dash = s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"";
    std::string points;
    for (size_t i = 0; i < s.y.size() && i < n_x; ++i) {
      points += (i ? " " : "") + Num(x_at(i)) + "," + Num(y_at(s.y[i]));
    }
    svg += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\"" + dash +
           " points=\"" + points + "\"/>\n";
    for (size_t i = 0; i < s.y.size() && i < n_x; ++i) {
      svg += "<circle cx=\"" + Num(x_at(i)) + "\" cy=\"" + Num(y_at(s.y[i])) +
             "\" r=\"3\" fill=\"" + s.color + "\"><title>" + HtmlEscape(s.label) + " @ " +
             HtmlEscape(i < x_labels.size() ? x_labels[i] : "") + ": " + Num(s.y[i]) +
             "</title></circle>\n";
      if (i < s.y_low.size() && i < s.y_high.size() && s.y_high[i] > s.y_low[i]) {
        const std::string x = Num(x_at(i));
        const std::string x0 = Num(x_at(i) - 4), x1 = Num(x_at(i) + 4);
        const std::string lo = Num(y_at(s.y_low[i])), hi = Num(y_at(s.y_high[i]));
        svg += "<path d=\"M" + x + "," + lo + "V" + hi + "M" + x0 + "," + lo + "H" + x1 + "M" + x0 +
               "," + hi + "H" + x1 + "\" stroke=\"" + s.color + "\" fill=\"none\"/>\n";
      }
    }
    // Legend.
    const double ly = kTop + 8 + 18 * static_cast<double>(k);
    const double lx = kLeft + plot_w + 14;
    svg += "<line x1=\"" + Num(lx) + "\" y1=\"" + Num(ly) + "\" x2=\"" + Num(lx + 26) + "\" y2=\"" +
           Num(ly) + "\" stroke=\"" + s.color + "\" stroke-width=\"2\"" + dash + "/>\n";
    svg += "<text x=\"" + Num(lx + 32) + "\" y=\"" + Num(ly) + "\" dominant-baseline=\"middle\">" +
           HtmlEscape(s.label) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::string HtmlReport(const json& results) {
  const json& servers = results["servers"];
  const json& levels = results["levels"];
  std::vector<std::string> x_labels;
  for (const json& level : levels)
    x_labels.push_back(std::to_string(level["concurrency"].get<int64_t>()));

  // One series per server (and per percentile) across the levels, from the repeat summaries.
  auto series_of = [&](size_t server, const std::string& metric, const std::string& label,
                       const std::string& dash, bool whiskers) {
    PlotSeries s;
    s.label = label;
    s.color = kColors[server % std::size(kColors)];
    s.dash = dash;
    for (const json& level : levels) {
      const json& m = Summary(level["servers"][server], metric);
      s.y.push_back(At(m, "median"));
      if (whiskers) {
        s.y_low.push_back(At(m, "ci_low"));
        s.y_high.push_back(At(m, "ci_high"));
      }
    }
    return s;
  };
  std::vector<PlotSeries> throughput, ttft, itl;
  const std::pair<const char*, const char*> kPercentiles[] = {
      {"p50", ""}, {"p90", "7 4"}, {"p99", "2 3"}};
  for (size_t s = 0; s < servers.size(); ++s) {
    const std::string name = servers[s]["name"].get<std::string>();
    throughput.push_back(series_of(s, "output_tok_per_s", name, "", true));
    for (const auto& [p, dash] : kPercentiles) {
      ttft.push_back(series_of(s, std::string("ttft_") + p + "_ms", name + " " + p, dash, false));
      itl.push_back(series_of(s, std::string("itl_") + p + "_ms", name + " " + p, dash, false));
    }
  }

  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  h += "<title>kestrel bench-serve</title>\n<style>\n"
       "body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}\n"
       "table{border-collapse:collapse;margin:8px 0 20px}\n"
       "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
       "th{background:#f3f3f3}td.l,th.l{text-align:left}\n"
       "figure{margin:12px 0}p.note{color:#555;font-size:13px}\n</style></head><body>\n";
  h += "<h1>kestrel bench-serve</h1>\n";
  h += "<p>Endpoint <code>" + HtmlEscape(results.value("endpoint", "")) +
       "</code>, workload <code>" + HtmlEscape(results["workload"].dump()) + "</code></p>\n";
  h += "<table><tr><th class=\"l\">server</th><th class=\"l\">url</th><th "
       "class=\"l\">model</th></tr>\n";
  for (const json& s : servers) {
    h += "<tr><td class=\"l\">" + HtmlEscape(s["name"].get<std::string>()) +
         "</td><td class=\"l\">" + HtmlEscape(s["url"].get<std::string>()) +
         "</td><td class=\"l\">" + HtmlEscape(s["model"].get<std::string>()) + "</td></tr>\n";
  }
  h += "</table>\n";
  const json& stats = results["statistics"];
  h += "<p class=\"note\">Each point is the median over " +
       std::to_string(stats.value("repeats", 1)) +
       " repeat(s); whiskers: " + HtmlEscape(stats.value("ci", "")) +
       ". Percentiles: " + HtmlEscape(stats.value("percentiles", "")) + ".</p>\n";

  h += "<figure>" + SvgLineChart("Output throughput", "output tokens / s", x_labels, throughput) +
       "</figure>\n";
  h += "<figure>" +
       SvgLineChart("Time to first token (p50 solid, p90 dashed, p99 dotted)", "ms", x_labels,
                    ttft) +
       "</figure>\n";
  h +=
      "<figure>" +
      SvgLineChart("Inter-token latency (p50 solid, p90 dashed, p99 dotted)", "ms", x_labels, itl) +
      "</figure>\n";

  h += "<h2>Medians per level</h2>\n<table><tr><th>concurrency</th><th class=\"l\">server</th>"
       "<th>tok/s</th><th>95% CI</th><th>req/s</th><th>TTFT p50</th><th>TTFT p99</th>"
       "<th>ITL p50</th><th>ITL p99</th><th>E2E p50</th><th>E2E p99</th><th>completed</th>"
       "<th>failed</th><th>429</th></tr>\n";
  for (const json& level : levels) {
    for (size_t s = 0; s < servers.size(); ++s) {
      const json& sl = level["servers"][s];
      auto med = [&](const char* metric) { return Num(At(Summary(sl, metric), "median")); };
      const json& tp = Summary(sl, "output_tok_per_s");
      const json& totals = sl["totals"];
      h += "<tr><td>" + std::to_string(level["concurrency"].get<int64_t>()) +
           "</td><td class=\"l\">" + HtmlEscape(servers[s]["name"].get<std::string>()) +
           "</td><td>" + med("output_tok_per_s") + "</td><td>" + Num(At(tp, "ci_low")) +
           " &ndash; " + Num(At(tp, "ci_high")) + "</td><td>" + med("requests_per_s") +
           "</td><td>" + med("ttft_p50_ms") + "</td><td>" + med("ttft_p99_ms") + "</td><td>" +
           med("itl_p50_ms") + "</td><td>" + med("itl_p99_ms") + "</td><td>" + med("e2e_p50_ms") +
           "</td><td>" + med("e2e_p99_ms") + "</td><td>" + Num(At(totals, "completed")) +
           "</td><td>" + Num(At(totals, "failed")) + "</td><td>" + Num(At(totals, "rate_limited")) +
           "</td></tr>\n";
    }
  }
  h += "</table>\n<p class=\"note\">Latencies in ms. Output tokens come from the servers' usage "
       "counts.</p>\n";

  if (servers.size() == 2) {
    h += "<h2>Paired comparison: " + HtmlEscape(servers[1]["name"].get<std::string>()) + " / " +
         HtmlEscape(servers[0]["name"].get<std::string>()) + "</h2>\n";
    h += "<table><tr><th>concurrency</th><th class=\"l\">metric</th><th>ratio (median)</th>"
         "<th>CI low</th><th>CI high</th><th>confidence</th><th>pairs</th></tr>\n";
    for (const json& level : levels) {
      if (!level.contains("comparison")) continue;
      for (const auto& [metric, v] : level["comparison"]["metrics"].items()) {
        h += "<tr><td>" + std::to_string(level["concurrency"].get<int64_t>()) +
             "</td><td class=\"l\">" + HtmlEscape(metric) + "</td><td>" + Num(At(v, "median")) +
             "</td><td>" + Num(At(v, "ci_low")) + "</td><td>" + Num(At(v, "ci_high")) +
             "</td><td>" + Num(At(v, "confidence")) + "</td><td>" + Num(At(v, "n")) +
             "</td></tr>\n";
      }
    }
    h += "</table>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace kestrel::bench
