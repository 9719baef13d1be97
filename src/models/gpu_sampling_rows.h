// The bridge between the CPU Sampler's state and GPU sampling (backends/cuda/sampling.h): one
// GpuSamplingRow per sequence per step, and the penalty / bias arrays its ranges index. Used by
// the CUDA model, the sampling tests and the kernel benchmark, so all three map a Sampler the same
// way.
#pragma once

#ifdef KESTREL_HAS_CUDA

#include <cstdint>
#include <vector>

#include "backends/cuda/sampling.h"
#include "sampling/sampler.h"

namespace kestrel {

// Host side of one GpuSample call.
struct GpuSamplingHostBatch {
  std::vector<cuda::GpuSamplingRow> rows;  // [n_rows]
  std::vector<int32_t> repetition_ids;     // distinct ids of prompt + generated, per row range
  std::vector<int32_t> count_ids;          // distinct generated ids, per row range
  std::vector<int32_t> count_values;       // their counts in the generated tokens
  std::vector<int32_t> bias_ids;           // SamplingParams::logit_bias, in order
  std::vector<float> bias_values;

  void Clear();
};

// Appends the row of `sampler` for this step: its parameters, its penalty state, and this step's
// random bits (Sampler::NextR53, the one draw Sampler::Sample would take). The sampler must then
// Accept the token the GPU chose.
void AppendGpuSamplingRow(Sampler& sampler, GpuSamplingHostBatch* batch);

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
