// Timing shared by the CUDA kernel benchmarks (cuda_linear.cpp, cuda_kernels.cpp): the median of
// per-call CUDA event intervals, with the host kept ahead of the GPU.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"

namespace kestrel::cuda::bench {

// `--reps N` from the command line (default 30, at least 1).
inline int ParseReps(int argc, char** argv) {
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
  }
  return reps;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Median seconds of one call of fn(rep), rep = 0..reps-1, after 3 warm-up calls (module load,
// opt-in shared memory, GEMM heuristics). n_delay_copies device copies of delay_bytes from
// delay_src to delay_dst are queued first, so the host has queued every timed call before the
// GPU reaches them: the events then time the kernels back to back, without the host's launch
// latency between them (the copies also flush the L2 after the warm-up).
template <class Fn>
double MedianSeconds(int reps, cudaStream_t stream, const DeviceBuffer& delay_src,
                     const DeviceBuffer& delay_dst, size_t delay_bytes, int n_delay_copies,
                     Fn&& fn) {
  for (int r = 0; r < 3; ++r) fn(r);
  KCUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(static_cast<size_t>(reps) + 1);
  for (cudaEvent_t& e : events) KCUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < n_delay_copies; ++i) {
    KCUDA_CHECK(cudaMemcpyAsync(delay_dst.get(), delay_src.get(), delay_bytes,
                                cudaMemcpyDeviceToDevice, stream));
  }
  for (int r = 0; r < reps; ++r) {
    KCUDA_CHECK(cudaEventRecord(events[r], stream));
    fn(r);
  }
  KCUDA_CHECK(cudaEventRecord(events[reps], stream));
  KCUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> seconds(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    KCUDA_CHECK(cudaEventElapsedTime(&ms, events[r], events[r + 1]));
    seconds[r] = ms * 1e-3;
  }
  for (cudaEvent_t& e : events) KCUDA_CHECK(cudaEventDestroy(e));
  return Median(seconds);
}

}  // namespace kestrel::cuda::bench
