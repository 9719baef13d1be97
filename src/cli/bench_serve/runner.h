// One closed-loop run of `kestrel bench-serve`: N workers, each with its own connection, issue
// requests back to back against one server until the run's budget (a request count or a
// duration) is spent. The first `warmup` requests issued are discarded. With a ramp-up, worker
// i sends its first request i * ramp_up_s / N seconds after the start: closed-loop clients whose
// requests all take about as long otherwise stay in step, arriving in waves of N.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/bench_serve/client.h"
#include "cli/bench_serve/workload.h"

namespace kestrel::bench {

struct RunOptions {
  int32_t concurrency = 1;
  int64_t requests = 0;    // measured requests; 0: run for duration_s instead
  double duration_s = 0;   // measured window when requests == 0
  int64_t warmup = 0;      // requests issued first and discarded
  double timeout_s = 600;  // per request
  double ramp_up_s = 0;    // the workers' first requests spread over this many seconds
  std::string api_key;
  BodyOptions body;
  // Pause of a worker after a failed request, so a dead server is not hammered in a tight loop
  // under --duration.
  double failure_pause_s = 0.05;
};

struct RunRecord {
  std::vector<RequestRecord> measured;  // in completion order
  // The warm-up requests that completed: their tokens count in the steady-state window
  // (RunMetrics::steady_output_tok_per_s), nothing else.
  std::vector<RequestRecord> warmup;
  int64_t warmup_failed = 0;
  // When the last worker started its first request (seconds since the run's epoch, like the
  // records' times); infinite when a worker never started one.
  double all_workers_started_s = 0;
};

RunRecord RunClosedLoop(const ServerUrl& url, const Workload& workload, WorkloadKind kind,
                        const RunOptions& options);

}  // namespace kestrel::bench
