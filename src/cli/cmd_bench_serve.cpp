// kestrel bench-serve: a serving benchmark against any OpenAI-compatible server (Kestrel or
// another). Streams completions at a sweep of closed-loop concurrency levels, times every
// chunk, counts tokens from usage, and reports throughput, TTFT, ITL and E2E percentiles with
// confidence intervals across repeats; with two --url, paired A/B runs in alternating order and
// the ratio B/A. JSON on stdout (or --json FILE), a self-contained HTML page with --html FILE.
// See docs/bench-serve.md.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_serve/client.h"
#include "cli/bench_serve/html_report.h"
#include "cli/bench_serve/metrics.h"
#include "cli/bench_serve/runner.h"
#include "cli/bench_serve/workload.h"
#include "cli/common.h"
#include "cli/verbs.h"

namespace kestrel::cli {
namespace {

using nlohmann::json;
namespace bench = kestrel::bench;

struct BenchServeFlags {
  std::vector<std::string> urls;
  std::string model;
  std::string api_key;
  std::string endpoint = "chat";
  std::vector<int64_t> concurrency = {1, 4, 16, 64};
  int64_t requests_per_level = 0;  // 0: the default (100) unless --duration
  double duration_s = 0;
  int64_t warmup = -1;  // -1: one request per worker
  double ramp_up_s = 0;
  int repeats = 0;      // 0: 1 with one server, 3 with two
  std::string workload = "fixed";
  int64_t input_tokens = 512;
  int64_t output_tokens = 128;
  std::string input_dist;
  std::string output_dist;
  int32_t turns = 6;
  int64_t system_tokens = 2000;
  int64_t turn_tokens = 150;
  uint64_t seed = 1;
  bool no_ignore_eos = false;
  bool no_continuous_usage = false;
  std::string extra_body;
  double timeout_s = 600;
  std::string ci = "order";
  std::string json_path;
  std::string html_path;
};

// Probe prompts for the words -> tokens calibration: two lengths, one output token each.
constexpr int64_t kProbeWords[2] = {16, 80};

struct Server {
  std::string name;
  bench::ServerUrl url;
  std::string model;
  int64_t probe_prompt_tokens[2] = {0, 0};  // 0 when the server reports no usage
};

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return IoError(path + ": cannot open for writing");
  f << text;
  f.close();
  if (!f) return IoError(path + ": write failed");
  return Status::Ok();
}

// Two streamed requests of known word counts: checks the server answers (a readable error
// otherwise) and measures its prompt tokens per word. A 429 is retried a few times: a server at
// capacity, or one that frees a slot a moment after the previous stream ended, is not down.
Status ProbeServer(Server* server, const bench::RunOptions& options, uint64_t seed) {
  bench::StreamClient client(server->url, options.api_key, options.timeout_s);
  for (int i = 0; i < 2; ++i) {
    // Words of their own ("PROBE" in the seed), so no measured prompt starts like a probe.
    std::mt19937_64 rng(bench::MixSeed({seed, 0x50524F4245u, static_cast<uint64_t>(i)}));
    bench::RequestSpec spec;
    spec.max_tokens = 1;
    spec.messages.push_back({"user", bench::RandomWords(kProbeWords[i], rng)});
    bench::BodyOptions body = options.body;
    body.model = server->model;
    const std::string path = bench::EndpointPath(body.endpoint);
    bench::RequestRecord r;
    for (int attempt = 0; attempt < 6; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
      r = client.Stream(path, bench::RequestBody(spec, body), bench::Clock::now());
      if (r.outcome != bench::Outcome::kRateLimited) break;
    }
    if (r.outcome != bench::Outcome::kOk) {
      return Unavailable(server->url.text + ": the probe request to " + path +
                         " failed: " + r.error);
    }
    server->probe_prompt_tokens[i] = r.usage_prompt_tokens;
  }
  return Status::Ok();
}

// The counts of a level's runs summed over its repeats.
json RunTotals(const std::vector<bench::RunMetrics>& runs) {
  json t = json::object();
  auto add = [&t](const char* key, int64_t v) { t[key] = t.value(key, int64_t{0}) + v; };
  for (const bench::RunMetrics& m : runs) {
    add("completed", m.completed);
    add("failed", m.failed);
    add("http_errors", m.http_errors);
    add("rate_limited", m.rate_limited);
    add("connection_errors", m.connection_errors);
    add("stream_errors", m.stream_errors);
    add("requests_without_usage", m.without_usage);
    add("output_tokens", m.output_tokens);
    add("prompt_tokens", m.prompt_tokens);
  }
  return t;
}

// Checks the flags and fills in the defaults that depend on others.
Status CheckFlags(BenchServeFlags* f) {
  if (f->urls.empty())
    return InvalidArgument("bench-serve needs --url URL (twice for an A/B comparison)");
  if (f->urls.size() > 2) {
    return InvalidArgument("bench-serve compares at most two servers (--url given " +
                           std::to_string(f->urls.size()) + " times)");
  }
  if (f->endpoint != "chat" && f->endpoint != "completions") {
    return InvalidArgument("--endpoint must be chat or completions, got '" + f->endpoint + "'");
  }
  if (f->workload != "fixed" && f->workload != "agent-trace") {
    return InvalidArgument("--workload must be fixed or agent-trace, got '" + f->workload + "'");
  }
  if (f->ci != "order" && f->ci != "bootstrap") {
    return InvalidArgument("--ci must be order or bootstrap, got '" + f->ci + "'");
  }
  if (f->concurrency.empty()) return InvalidArgument("--concurrency needs at least one level");
  for (int64_t c : f->concurrency) {
    if (c < 1 || c > 4096) {
      return InvalidArgument("--concurrency values must be in [1, 4096], got " + std::to_string(c));
    }
  }
  if (f->duration_s < 0) return InvalidArgument("--duration must be positive");
  if (f->duration_s > 0 && f->requests_per_level > 0) {
    return InvalidArgument("--requests-per-level and --duration are alternatives; pass one");
  }
  if (f->requests_per_level < 0) return InvalidArgument("--requests-per-level must be >= 1");
  if (f->duration_s == 0 && f->requests_per_level == 0) f->requests_per_level = 100;
  if (f->warmup < -1) return InvalidArgument("--warmup must be >= 0");
  if (!(f->ramp_up_s >= 0 && f->ramp_up_s <= 3600)) {
    return InvalidArgument("--ramp-up must be in [0, 3600] seconds");
  }
  if (f->repeats < 0 || f->repeats > 1000) return InvalidArgument("--repeats must be in [1, 1000]");
  if (f->repeats == 0) f->repeats = f->urls.size() == 2 ? 3 : 1;
  if (f->input_tokens < 1 || f->output_tokens < 1) {
    return InvalidArgument("--input-tokens and --output-tokens must be >= 1");
  }
  if (f->turns < 1 || f->system_tokens < 1 || f->turn_tokens < 1) {
    return InvalidArgument("--turns, --system-tokens and --turn-tokens must be >= 1");
  }
  if (f->timeout_s <= 0) return InvalidArgument("--timeout must be positive");
  return Status::Ok();
}

Result<bench::WorkloadOptions> WorkloadFromFlags(const BenchServeFlags& f) {
  bench::WorkloadOptions wo;
  wo.kind = f.workload == "fixed" ? bench::WorkloadKind::kFixed : bench::WorkloadKind::kAgentTrace;
  KASSIGN(wo.input, bench::ParseLengthDist(
                        f.input_dist.empty() ? std::to_string(f.input_tokens) : f.input_dist,
                        "--input-dist"));
  KASSIGN(wo.output, bench::ParseLengthDist(
                         f.output_dist.empty() ? std::to_string(f.output_tokens) : f.output_dist,
                         "--output-dist"));
  wo.turns = f.turns;
  wo.system_tokens = f.system_tokens;
  wo.turn_tokens = f.turn_tokens;
  wo.seed = f.seed;
  return wo;
}

Result<bench::RunOptions> RunOptionsFromFlags(const BenchServeFlags& f) {
  bench::RunOptions ro;
  ro.requests = f.requests_per_level;
  ro.duration_s = f.duration_s;
  ro.timeout_s = f.timeout_s;
  ro.ramp_up_s = f.ramp_up_s;
  ro.api_key = f.api_key;
  ro.body.endpoint = f.endpoint == "chat" ? bench::Endpoint::kChat : bench::Endpoint::kCompletions;
  ro.body.ignore_eos = !f.no_ignore_eos;
  ro.body.continuous_usage = !f.no_continuous_usage;
  if (!f.extra_body.empty()) {
    ro.body.extra = json::parse(f.extra_body, nullptr, false);
    if (!ro.body.extra.is_object()) return InvalidArgument("--extra-body must be a JSON object");
  }
  return ro;
}

// The servers of the comparison: URL parsed, model named or discovered, probed.
Result<std::vector<Server>> ConnectServers(const BenchServeFlags& f, const bench::RunOptions& ro) {
  std::vector<Server> servers;
  for (size_t i = 0; i < f.urls.size(); ++i) {
    Server s;
    s.name = i == 0 ? "A" : "B";
    KASSIGN(s.url, bench::ParseServerUrl(f.urls[i]));
    s.model = f.model;
    if (s.model.empty()) {
      KASSIGN(s.model, bench::DiscoverModel(s.url, f.api_key));
    }
    KTRY(ProbeServer(&s, ro, f.seed));
    servers.push_back(std::move(s));
  }
  return servers;
}

// One concurrency level: `repeats` runs per server, A,B then B,A, so drift during the benchmark
// weighs on both servers alike; the runs, their summaries and (two servers) the paired ratios.
json RunLevel(size_t level_index, const BenchServeFlags& f, const std::vector<Server>& servers,
              const bench::WorkloadOptions& wo, bench::RunOptions ro, bench::CiMethod ci,
              int64_t* n_completed) {
  const int32_t c = static_cast<int32_t>(f.concurrency[level_index]);
  ro.concurrency = c;
  ro.warmup = f.warmup < 0 ? c : f.warmup;
  std::vector<std::vector<bench::RunMetrics>> metrics(servers.size());
  std::vector<json> runs(servers.size(), json::array());
  for (int r = 0; r < f.repeats; ++r) {
    for (size_t k = 0; k < servers.size(); ++k) {
      const size_t s = r % 2 == 0 ? k : servers.size() - 1 - k;
      const bench::Workload workload(wo, bench::MixSeed({level_index, static_cast<uint64_t>(r)}),
                                     s);
      ro.body.model = servers[s].model;
      bench::RunMetrics m =
          bench::SummarizeRun(bench::RunClosedLoop(servers[s].url, workload, wo.kind, ro));
      *n_completed += m.completed;
      std::fprintf(stderr,
                   "kestrel: bench-serve %s c=%d repeat %d/%d: %.1f tok/s, %.2f req/s, TTFT p50 "
                   "%.1f ms, ITL p50 %.2f ms, %lld completed, %lld failed\n",
                   servers[s].name.c_str(), c, r + 1, f.repeats, m.output_tok_per_s,
                   m.requests_per_s, m.ttft_ms.p50, m.itl_ms.p50,
                   static_cast<long long>(m.completed), static_cast<long long>(m.failed));
      if (m.without_usage > 0) {
        std::fprintf(stderr,
                     "kestrel: bench-serve %s: %lld responses had no usage; their output tokens "
                     "are chunk counts (marked in the JSON)\n",
                     servers[s].name.c_str(), static_cast<long long>(m.without_usage));
      }
      json run = bench::ToJson(m);
      run["repeat"] = r;
      run["order"] = k;  // 0: ran first in its pair
      runs[s].push_back(std::move(run));
      metrics[s].push_back(std::move(m));
    }
  }
  json level = {{"concurrency", c}, {"warmup", ro.warmup}, {"servers", json::array()}};
  for (size_t s = 0; s < servers.size(); ++s) {
    level["servers"].push_back({{"name", servers[s].name},
                                {"totals", RunTotals(metrics[s])},
                                {"summary", bench::RepeatSummary(metrics[s], ci, f.seed)},
                                {"runs", std::move(runs[s])}});
  }
  if (servers.size() == 2) {
    level["comparison"] = {
        {"ratio", "B/A"}, {"metrics", bench::PairedComparison(metrics[0], metrics[1], ci, f.seed)}};
  }
  return level;
}

// Everything but the levels: what was run, against what, and how the statistics are made.
json ReportHeader(const BenchServeFlags& f, const std::vector<Server>& servers,
                  const bench::WorkloadOptions& wo, const bench::RunOptions& ro,
                  bench::CiMethod ci) {
  json out;
  out["benchmark"] = "kestrel bench-serve";
  out["endpoint"] = bench::EndpointPath(ro.body.endpoint);
  out["servers"] = json::array();
  for (const Server& s : servers) {
    out["servers"].push_back({{"name", s.name}, {"url", s.url.text}, {"model", s.model}});
  }
  json workload = {{"kind", f.workload}, {"output_tokens", wo.output.ToString()}};
  if (wo.kind == bench::WorkloadKind::kFixed) {
    workload["input_tokens"] = wo.input.ToString();
  } else {
    workload["turns"] = wo.turns;
    workload["system_tokens"] = wo.system_tokens;
    workload["turn_tokens"] = wo.turn_tokens;
  }
  workload["seed"] = f.seed;
  workload["ignore_eos"] = ro.body.ignore_eos;
  workload["continuous_usage_stats"] = ro.body.continuous_usage;
  out["workload"] = std::move(workload);
  const Server& first = servers[0];
  out["calibration"] = {
      {"tokens_per_word", wo.calibration.tokens_per_word},
      {"overhead_tokens", wo.calibration.overhead_tokens},
      {"measured", wo.calibration.measured},
      {"server", first.name},
      {"probe_words", {kProbeWords[0], kProbeWords[1]}},
      {"probe_prompt_tokens", {first.probe_prompt_tokens[0], first.probe_prompt_tokens[1]}}};
  out["load"] = {{"mode", "closed loop"},
                 {"requests_per_level", f.requests_per_level},
                 {"duration_s", f.duration_s},
                 {"warmup", f.warmup < 0 ? json("one per worker") : json(f.warmup)},
                 {"ramp_up_s", f.ramp_up_s},
                 {"timeout_s", f.timeout_s}};
  out["statistics"] = {
      {"repeats", f.repeats},
      {"percentiles",
       "linear interpolation between closest ranks (NumPy 'linear', Hyndman-Fan type 7)"},
      {"ci", ci == bench::CiMethod::kBootstrap
                 ? "95% percentile bootstrap of the median (10000 resamples, seed " +
                       std::to_string(f.seed) + ")"
                 : "95% order-statistic confidence interval of the median (distribution-free; "
                   "'confidence' is the coverage reached with the repeats available)"},
      {"ci_level", 0.95},
      {"seed", f.seed}};
  return out;
}

int RunBenchServe(BenchServeFlags f) {
  if (Status st = CheckFlags(&f); !st.ok()) return Fail(st);
  Result<bench::WorkloadOptions> wo = WorkloadFromFlags(f);
  if (!wo.ok()) return Fail(wo.status());
  Result<bench::RunOptions> ro = RunOptionsFromFlags(f);
  if (!ro.ok()) return Fail(ro.status());
  const bench::CiMethod ci =
      f.ci == "bootstrap" ? bench::CiMethod::kBootstrap : bench::CiMethod::kOrderStatistic;

  std::signal(SIGPIPE, SIG_IGN);
  Result<std::vector<Server>> servers = ConnectServers(f, *ro);
  if (!servers.ok()) return Fail(servers.status());
  // Words -> tokens from the first server's probes; both servers get the same word counts.
  const Server& first = (*servers)[0];
  wo->calibration = bench::FitCalibration(kProbeWords[0], first.probe_prompt_tokens[0],
                                          kProbeWords[1], first.probe_prompt_tokens[1]);
  if (!wo->calibration.measured) {
    std::fprintf(stderr,
                 "kestrel: bench-serve: %s reported no usage.prompt_tokens; prompt lengths assume "
                 "one token per word\n",
                 first.url.text.c_str());
  }

  json out = ReportHeader(f, *servers, *wo, *ro, ci);
  out["levels"] = json::array();
  int64_t n_completed = 0;
  for (size_t li = 0; li < f.concurrency.size(); ++li) {
    out["levels"].push_back(RunLevel(li, f, *servers, *wo, *ro, ci, &n_completed));
  }

  const std::string text = out.dump(2);
  if (f.json_path.empty() || f.json_path == "-") {
    WriteLine(text);
  } else if (Status st = WriteFile(f.json_path, text + "\n"); !st.ok()) {
    return Fail(st);
  }
  if (!f.html_path.empty()) {
    if (Status st = WriteFile(f.html_path, bench::HtmlReport(out)); !st.ok()) return Fail(st);
  }
  if (n_completed == 0) return Fail("no request completed; see error_samples in the report");
  return 0;
}

}  // namespace

void RegisterBenchServe(CLI::App& app, int& exit_code) {
  static BenchServeFlags f;
  auto* cmd = app.add_subcommand(
      "bench-serve", "Serving benchmark of OpenAI-compatible servers (throughput, TTFT, ITL)");
  cmd->add_option("--url", f.urls, "Server base URL (http://host:port); twice for paired A/B runs");
  cmd->add_option("--model", f.model, "Model name to request (default: first id of /v1/models)");
  cmd->add_option("--api-key", f.api_key, "Bearer token sent to the servers");
  cmd->add_option("--endpoint", f.endpoint, "chat (/v1/chat/completions) or completions")
      ->capture_default_str();
  cmd->add_option("--concurrency", f.concurrency, "Closed-loop concurrency levels")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--requests-per-level", f.requests_per_level,
                  "Measured requests per level and repeat (default 100)");
  cmd->add_option("--duration", f.duration_s, "Seconds per level and repeat instead of a count");
  cmd->add_option("--warmup", f.warmup,
                  "Requests per level discarded first (default: concurrency)");
  cmd->add_option("--ramp-up", f.ramp_up_s,
                  "Seconds over which the workers' first requests are spread (default 0: all "
                  "at once)");
  cmd->add_option("--repeats", f.repeats, "Repeats per level (default 1; 3 with two servers)");
  cmd->add_option("--workload", f.workload, "fixed or agent-trace")->capture_default_str();
  cmd->add_option("--input-tokens", f.input_tokens, "fixed: prompt tokens")->capture_default_str();
  cmd->add_option("--output-tokens", f.output_tokens, "max_tokens of each request")
      ->capture_default_str();
  cmd->add_option("--input-dist", f.input_dist,
                  "fixed: prompt length distribution: N, uniform:MIN,MAX or normal:MEAN,SD");
  cmd->add_option("--output-dist", f.output_dist,
                  "Output length distribution: N, uniform:MIN,MAX or normal:MEAN,SD");
  cmd->add_option("--turns", f.turns, "agent-trace: turns per conversation")->capture_default_str();
  cmd->add_option("--system-tokens", f.system_tokens, "agent-trace: shared system prompt tokens")
      ->capture_default_str();
  cmd->add_option("--turn-tokens", f.turn_tokens, "agent-trace: tokens of each new user message")
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "Seed of prompts, lengths and the bootstrap")
      ->capture_default_str();
  cmd->add_flag("--no-ignore-eos", f.no_ignore_eos,
                "Do not send ignore_eos/min_tokens (for servers that reject unknown fields)");
  cmd->add_flag("--no-continuous-usage", f.no_continuous_usage,
                "Do not ask for stream_options.continuous_usage_stats (usage in every chunk)");
  cmd->add_option("--extra-body", f.extra_body, "JSON object merged into every request body");
  cmd->add_option("--timeout", f.timeout_s, "Seconds per request")->capture_default_str();
  cmd->add_option("--ci", f.ci, "Confidence intervals: order (order statistics) or bootstrap")
      ->capture_default_str();
  cmd->add_option("--json", f.json_path, "Write the JSON report here instead of stdout");
  cmd->add_option("--html", f.html_path, "Write a self-contained HTML report here");
  cmd->callback([&exit_code] { exit_code = RunBenchServe(f); });
}

}  // namespace kestrel::cli
