// The two ceilings every CUDA figure is quoted against, measured on the device in the same run
// (METHOD.md: datasheet rates are leads, measured ones are the roofline).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace kestrel::cuda {

struct Roofline {
  double copy_gb_per_s = 0;     // device-to-device cudaMemcpy, bytes read + written per second
  double gemm_tflop_per_s = 0;  // cuBLASLt bf16 GEMM (f32 accumulate), m = n = k = gemm_size
  int64_t copy_bytes = 0;
  int64_t gemm_size = 0;
};

// Median of `repeats` timed runs each (CUDA events, after a warm-up), on random data.
Result<Roofline> MeasureRoofline(int64_t copy_bytes = int64_t{2} << 30, int64_t gemm_size = 8192,
                                 int repeats = 10);

}  // namespace kestrel::cuda
