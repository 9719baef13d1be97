// `kestrel bench --device cuda` (cmd_bench_cuda.cpp): GPU prefill and batched decode.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/model_setup.h"

namespace kestrel::cli {

struct CudaBenchOptions {
  std::vector<int64_t> prefill_tokens;
  std::vector<int64_t> decode_contexts;
  std::vector<int64_t> batch_sizes;
  // The serving engine end to end (kestrel serve without HTTP) at these batch sizes, with
  // asynchronous scheduling off and on; empty: skipped.
  std::vector<int64_t> engine_batch_sizes;
  // Time to first token cold and after a prefix-cache hit, at these prompt lengths; empty: skipped.
  std::vector<int64_t> prefix_hit_tokens;
  int32_t decode_tokens = 32;
  int repeats = 3;
  bool no_graphs = false;
  bool profile = true;  // one extra event-timed run per figure for the stage breakdown
};

// Prints the JSON report; returns the process exit code.
int RunCudaBench(const CudaBenchOptions& options, LoadedModel& loaded);

}  // namespace kestrel::cli
