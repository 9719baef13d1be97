// The machine's own limits, measured in the same run as a benchmark, so that every figure
// can be quoted as a fraction of them (DESIGN.md "Performance discipline").
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace kestrel {

struct MachineLimits {
  double read_gb_per_s = 0;     // STREAM-like: sum over a buffer far larger than the caches
  double fma_gflop_per_s = 0;   // f32 FMA peak (register-resident), all threads
};

// Median of `repeats` passes over a buffer of `bytes`.
double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes, int repeats);
double MeasureFmaPeak(ThreadPool& pool, int repeats);

}  // namespace kestrel
