#include "cli/bench_serve/runner.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

namespace kestrel::bench {

RunRecord RunClosedLoop(const ServerUrl& url, const Workload& workload, WorkloadKind kind,
                        const RunOptions& options) {
  RunRecord run;
  std::mutex mu;
  std::atomic<int64_t> n_issued{0};
  std::atomic<uint64_t> n_conversations{0};
  std::optional<Clock::time_point> measure_start;  // the first measured request's issue (mu)
  const Clock::time_point epoch = Clock::now();
  const std::string path = EndpointPath(options.body.endpoint);

  std::vector<double> first_start(static_cast<size_t>(options.concurrency),
                                  std::numeric_limits<double>::infinity());
  auto worker = [&](int32_t w) {
    if (options.ramp_up_s > 0) {
      std::this_thread::sleep_until(
          epoch + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                      options.ramp_up_s * w / options.concurrency)));
    }
    StreamClient client(url, options.api_key, options.timeout_s);
    std::optional<Workload::Conversation> conversation;
    while (true) {
      const int64_t index = n_issued.fetch_add(1);
      const bool warm = index < options.warmup;
      if (!warm) {
        std::lock_guard lock(mu);
        const Clock::time_point now = Clock::now();
        if (!measure_start) measure_start = now;
        if (options.requests > 0
                ? index >= options.warmup + options.requests
                : now - *measure_start >= std::chrono::duration<double>(options.duration_s)) {
          break;
        }
      }
      RequestSpec spec;
      if (kind == WorkloadKind::kFixed) {
        spec = workload.FixedRequest(static_cast<uint64_t>(index));
      } else {
        if (!conversation || conversation->done()) {
          conversation = workload.StartConversation(n_conversations.fetch_add(1));
        }
        spec = conversation->Next();
      }
      RequestRecord record = client.Stream(path, RequestBody(spec, options.body), epoch);
      record.turn = spec.turn;
      double& first = first_start[static_cast<size_t>(w)];
      first = std::min(first, record.start_s);
      const bool failed = record.outcome != Outcome::kOk;
      {
        std::lock_guard lock(mu);
        if (!warm) {
          run.measured.push_back(std::move(record));
        } else if (failed) {
          ++run.warmup_failed;
        } else {
          run.warmup.push_back(std::move(record));
        }
      }
      if (failed) {
        std::this_thread::sleep_for(std::chrono::duration<double>(options.failure_pause_s));
      }
    }
  };
  std::vector<std::thread> workers;
  for (int32_t i = 0; i < options.concurrency; ++i) workers.emplace_back(worker, i);
  for (std::thread& t : workers) t.join();
  run.all_workers_started_s = *std::max_element(first_start.begin(), first_start.end());
  return run;
}

}  // namespace kestrel::bench
