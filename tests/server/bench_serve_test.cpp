// `kestrel bench-serve` end to end: the built binary benchmarks a real `kestrel serve` on
// models/kestrel-tiny over HTTP. Counts are checked exactly (the tiny model honors max_tokens
// with ignore_eos, and tokens come from usage); times only for being present and positive.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve_process.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

using TinyServer = kestrel::testing::ServeProcess;

struct ProcessRun {
  int exit_code = -1;
  std::string out, err;
};

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `kestrel <args>` with stdout and stderr in files of `dir`; killed after 120 s.
ProcessRun RunKestrel(const std::vector<std::string>& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    std::vector<std::string> all = {KESTREL_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ProcessRun r;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

int CountLines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

class BenchServeE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);
    server_ = new TinyServer();
    started_ = server_->Start({});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(started_) << "kestrel serve did not start:\n" << server_->stderr_text();
    dir_ = fs::temp_directory_path() /
           ("kestrel_bench_serve_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs bench-serve with --json and --html into the test's directory; the parsed JSON.
  json Bench(std::vector<std::string> args, ProcessRun* run = nullptr) {
    args.insert(args.begin(), "bench-serve");
    args.insert(args.end(),
                {"--json", (dir_ / "out.json").string(), "--html", (dir_ / "out.html").string()});
    ProcessRun r = RunKestrel(args, dir_);
    if (run != nullptr) *run = r;
    EXPECT_TRUE(fs::exists(dir_ / "out.json")) << r.err;
    json j = json::parse(ReadFile(dir_ / "out.json"), nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.err;
    return j;
  }
  std::string Html() const { return ReadFile(dir_ / "out.html"); }

  static TinyServer* server_;
  static bool started_;
  fs::path dir_;
};

TinyServer* BenchServeE2E::server_ = nullptr;
bool BenchServeE2E::started_ = false;

TEST_F(BenchServeE2E, FixedWorkloadCountsTokensFromUsage) {
  ProcessRun run;
  const json j = Bench({"--url", server_->url(), "--concurrency", "1,2", "--requests-per-level",
                        "4", "--workload", "fixed", "--input-tokens", "32", "--output-tokens", "8"},
                       &run);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(run.out.empty()) << "the report went to --json";
  EXPECT_EQ(j["servers"][0]["model"], "kestrel-tiny");  // from GET /v1/models
  EXPECT_EQ(j["endpoint"], "/v1/chat/completions");
  EXPECT_TRUE(j["calibration"]["measured"].get<bool>());
  ASSERT_EQ(j["levels"].size(), 2u);
  int i = 0;
  for (const json& level : j["levels"]) {
    EXPECT_EQ(level["concurrency"], i == 0 ? 1 : 2);
    ++i;
    ASSERT_EQ(level["servers"].size(), 1u);
    EXPECT_FALSE(level.contains("comparison"));
    const json& runs = level["servers"][0]["runs"];
    ASSERT_EQ(runs.size(), 1u);  // one repeat with one server
    const json& r = runs[0];
    EXPECT_EQ(r["completed"], 4) << r.dump();
    EXPECT_EQ(r["failed"], 0) << r["error_samples"].dump();
    EXPECT_EQ(r["requests_without_usage"], 0);
    EXPECT_EQ(r["output_tokens_source"], "usage");
    EXPECT_EQ(r["output_tokens"], 4 * 8);  // from usage: ignore_eos holds every answer at 8
    // Prompts of about 32 tokens each, counted by the server.
    EXPECT_GE(r["prompt_tokens"].get<int64_t>(), 4 * 24);
    EXPECT_LE(r["prompt_tokens"].get<int64_t>(), 4 * 40);
    EXPECT_GT(r["ttft_ms"]["p50"].get<double>(), 0);
    EXPECT_EQ(r["ttft_ms"]["n"], 4);
    // Chunks read together have gaps of 0, so only the mean is sure to be positive.
    EXPECT_GT(r["itl_ms"]["mean"].get<double>(), 0);
    // Kestrel puts the usage in every chunk (continuous_usage_stats): one ITL per token after
    // the first, whatever the text's chunking.
    EXPECT_EQ(r["itl_source"], "per-chunk usage (continuous_usage_stats)");
    EXPECT_EQ(r["itl_ms"]["n"], 4 * 7);
    EXPECT_LE(r["text_gap_ms"]["n"].get<int64_t>(), 4 * 7);
    EXPECT_GE(r["e2e_ms"]["p50"].get<double>(), r["ttft_ms"]["p50"].get<double>());
    EXPECT_GT(r["output_tok_per_s"].get<double>(), 0);
    EXPECT_GE(r["steady_output_tok_per_s"].get<double>(), 0);
    EXPECT_GT(r["requests_per_s"].get<double>(), 0);
    const json& summary = level["servers"][0]["summary"];
    EXPECT_DOUBLE_EQ(summary["output_tok_per_s"]["median"].get<double>(),
                     r["output_tok_per_s"].get<double>());
    EXPECT_EQ(level["servers"][0]["totals"]["output_tokens"], 32);
  }
  const std::string html = Html();
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST_F(BenchServeE2E, TwoUrlsRunPairedInAlternatingOrder) {
  // The same server twice (once spelled with /v1): an A/A comparison.
  ProcessRun run;
  const json j = Bench({"--url", server_->url(), "--url", server_->url() + "/v1", "--concurrency",
                        "1,2", "--requests-per-level", "3", "--repeats", "2", "--input-tokens",
                        "32", "--output-tokens", "8"},
                       &run);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(j["servers"].size(), 2u);
  EXPECT_EQ(j["servers"][1]["name"], "B");
  for (const json& level : j["levels"]) {
    ASSERT_EQ(level["servers"].size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      const json& runs = level["servers"][s]["runs"];
      ASSERT_EQ(runs.size(), 2u);
      for (const json& r : runs) {
        EXPECT_EQ(r["completed"], 3);
        EXPECT_EQ(r["output_tokens"], 3 * 8);
        // A,B in repeat 0, B,A in repeat 1.
        EXPECT_EQ(r["order"].get<int>(), (r["repeat"].get<int>() + static_cast<int>(s)) % 2);
      }
    }
    ASSERT_TRUE(level.contains("comparison"));
    EXPECT_EQ(level["comparison"]["ratio"], "B/A");
    const json& tp = level["comparison"]["metrics"]["output_tok_per_s"];
    EXPECT_EQ(tp["n"], 2);
    EXPECT_GT(tp["median"].get<double>(), 0);
    EXPECT_LE(tp["ci_low"].get<double>(), tp["median"].get<double>());
    EXPECT_GE(tp["ci_high"].get<double>(), tp["median"].get<double>());
    EXPECT_DOUBLE_EQ(tp["confidence"].get<double>(), 0.5);  // [min, max] of 2 pairs
    EXPECT_TRUE(level["comparison"]["metrics"].contains("ttft_p50_ms"));
    EXPECT_TRUE(level["comparison"]["metrics"].contains("itl_p50_ms"));
  }
  const std::string html = Html();
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Paired comparison"), std::string::npos);
}

TEST_F(BenchServeE2E, AgentTracePromptsGrowTurnByTurn) {
  ProcessRun run;
  const json j = Bench({"--url", server_->url(), "--workload", "agent-trace", "--concurrency", "1",
                        "--requests-per-level", "6", "--warmup", "0", "--turns", "3",
                        "--system-tokens", "64", "--turn-tokens", "16", "--output-tokens", "4"},
                       &run);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json& r = j["levels"][0]["servers"][0]["runs"][0];
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["output_tokens"], 6 * 4);
  ASSERT_TRUE(r.contains("by_turn")) << r.dump();
  const json& turns = r["by_turn"];
  ASSERT_EQ(turns.size(), 3u);
  double last = 0;
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(turns[t]["turn"], t + 1);
    EXPECT_EQ(turns[t]["requests"], 2);  // two conversations of three turns
    const double prompt = turns[t]["prompt_tokens_mean"].get<double>();
    // Each turn resends the last one plus an answer (4 tokens) and a message (16 tokens).
    EXPECT_GT(prompt, last + 16) << t;
    last = prompt;
  }
  EXPECT_GE(turns[0]["prompt_tokens_mean"].get<double>(), 64);  // the system prompt
}

TEST_F(BenchServeE2E, FailedRequestsAreCountedNotFatal) {
  // Prompts longer than the tiny model's 2048-token context: every request gets HTTP 400. The
  // probe (short) succeeds, so the sweep runs and reports the failures, then exits 1.
  ProcessRun run;
  const json j = Bench({"--url", server_->url(), "--concurrency", "2", "--requests-per-level", "3",
                        "--warmup", "0", "--input-tokens", "3000", "--output-tokens", "4"},
                       &run);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("no request completed"), std::string::npos) << run.err;
  const json& r = j["levels"][0]["servers"][0]["runs"][0];
  EXPECT_EQ(r["completed"], 0);
  EXPECT_EQ(r["failed"], 3);
  EXPECT_EQ(r["http_errors"], 3);
  EXPECT_EQ(r["rate_limited"], 0);
  EXPECT_EQ(r["http_status_counts"]["400"], 3);
  ASSERT_FALSE(r["error_samples"].empty());
  EXPECT_NE(r["error_samples"][0].get<std::string>().find("context"), std::string::npos)
      << r["error_samples"].dump();
}

TEST_F(BenchServeE2E, RateLimitedRequestsAreCountedApart) {
  // One running sequence and no queue: concurrent requests beyond the first may get 429. How
  // many do depends on timing, so only the bookkeeping is exact: every 429 is counted as
  // rate_limited and none as an HTTP error.
  TinyServer limited;
  ASSERT_TRUE(limited.Start({"--max-num-seqs", "1", "--max-waiting", "0"})) << limited.stderr_text();
  ProcessRun run;
  const json j = Bench({"--url", limited.url(), "--concurrency", "4", "--requests-per-level", "8",
                        "--warmup", "0", "--input-tokens", "32", "--output-tokens", "32"},
                       &run);
  const json& r = j["levels"][0]["servers"][0]["runs"][0];
  EXPECT_EQ(r["completed"].get<int64_t>() + r["rate_limited"].get<int64_t>(), 8) << r.dump();
  EXPECT_EQ(r["http_errors"], 0);
  EXPECT_EQ(r["connection_errors"], 0);
  const int64_t n_429 = r["http_status_counts"].value("429", int64_t{0});
  EXPECT_EQ(n_429, r["rate_limited"].get<int64_t>());
  EXPECT_EQ(r["output_tokens"].get<int64_t>(), 32 * r["completed"].get<int64_t>());
}

TEST_F(BenchServeE2E, UnreachableUrlIsOneLine) {
  // Port 1 on the loopback: nothing listens there.
  const ProcessRun r = RunKestrel({"bench-serve", "--url", "http://127.0.0.1:1"}, dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("kestrel: error: http://127.0.0.1:1"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

// --ramp-up 2 with 4 workers: worker i sends its first request 0.5 * i seconds in, so the run
// cannot end before 1.5 s (these requests take milliseconds), and the JSON says so.
TEST_F(BenchServeE2E, RampUpSpreadsTheWorkersFirstRequests) {
  ProcessRun run;
  const auto t0 = std::chrono::steady_clock::now();
  const json j = Bench({"--url", server_->url(), "--concurrency", "4", "--requests-per-level",
                        "8", "--warmup", "0", "--ramp-up", "2", "--input-tokens", "16",
                        "--output-tokens", "2"},
                       &run);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_GE(elapsed, 1.5);
  EXPECT_DOUBLE_EQ(j["load"]["ramp_up_s"].get<double>(), 2.0);
  EXPECT_EQ(j["levels"][0]["servers"][0]["runs"][0]["completed"], 8);
}

TEST_F(BenchServeE2E, BadFlagsAreOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {"bench-serve"},
      {"bench-serve", "--url", "localhost:8080"},
      {"bench-serve", "--url", server_->url(), "--concurrency", "0"},
      {"bench-serve", "--url", server_->url(), "--workload", "chatty"},
      {"bench-serve", "--url", server_->url(), "--input-dist", "gauss:3"},
      {"bench-serve", "--url", server_->url(), "--duration", "5", "--requests-per-level", "3"},
      {"bench-serve", "--url", server_->url(), "--concurrency", "x"},
      {"bench-serve", "--url", server_->url(), "--ramp-up", "-1"},
      {"bench-serve", "--url", server_->url(), "--model", "no-such-model"},
  };
  for (const auto& args : cases) {
    const ProcessRun r = RunKestrel(args, dir_);
    EXPECT_NE(r.exit_code, 0) << args.back();
    EXPECT_EQ(CountLines(r.err), 1) << args.back() << ": " << r.err;
    EXPECT_NE(r.err.find("kestrel: error:"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << args.back();
  }
}

}  // namespace
