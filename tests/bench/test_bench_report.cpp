// The HTML report of `kestrel bench-serve`: SVG charts and a page that fetches nothing.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli/bench_serve/html_report.h"

namespace kestrel::bench {
namespace {

using nlohmann::json;

TEST(BenchReport, SvgChartHasOneLinePerSeriesAndEscapesText) {
  PlotSeries a{"A <x>", "#111", "", {1, 2, 3}, {0.5, 1.5, 2.5}, {1.5, 2.5, 3.5}};
  PlotSeries b{"B", "#222", "4 2", {2, 3, 1}, {}, {}};
  const std::string svg = SvgLineChart("T & U", "tok/s", {"1", "4", "16"}, {a, b});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t n_lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++n_lines;
  EXPECT_EQ(n_lines, 2u);
  EXPECT_NE(svg.find("A &lt;x&gt;"), std::string::npos);
  EXPECT_NE(svg.find("T &amp; U"), std::string::npos);
  EXPECT_EQ(svg.find("<x>"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray=\"4 2\""), std::string::npos);
}

TEST(BenchReport, HtmlIsSelfContained) {
  json interval = {{"median", 10}, {"ci_low", 9}, {"ci_high", 11}, {"confidence", 0.95}, {"n", 6}};
  json summary = json::object();
  for (const char* m :
       {"output_tok_per_s", "requests_per_s", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
        "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p99_ms"}) {
    summary[m] = interval;
  }
  json level_server = {{"name", "A"}, {"summary", summary}, {"totals", {{"completed", 4}}}};
  json results = {{"endpoint", "/v1/chat/completions"},
                  {"workload", {{"kind", "fixed"}}},
                  {"statistics", {{"repeats", 6}, {"ci", "order"}, {"percentiles", "linear"}}},
                  {"servers", {{{"name", "A"}, {"url", "http://h:1"}, {"model", "<m>"}}}},
                  {"levels",
                   {{{"concurrency", 1}, {"servers", {level_server}}},
                    {{"concurrency", 4}, {"servers", {level_server}}}}}};
  const std::string html = HtmlReport(results);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  size_t n_svg = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++n_svg;
  EXPECT_EQ(n_svg, 3u);  // throughput, TTFT, ITL
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("&lt;m&gt;"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::bench
