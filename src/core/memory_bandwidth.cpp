#include "core/memory_bandwidth.h"

#include "core/check.h"
#include "core/large_array.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kestrel {

// Defined in memory_bandwidth_avx2.cpp (compiled with AVX2/FMA).
double SumFloatsAvx2(const float* p, int64_t n);
double FmaLoopAvx2(int64_t iterations);

namespace {
double SumFloatsScalar(const float* p, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}
bool HasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes, int repeats) {
  const int64_t n = bytes / 4;
  // In huge pages where the kernel gives them, as the weights and the KV cache the benchmarks
  // read (AllocateLargeArray).
  LargeArray<float> buf = AllocateLargeArray<float>(static_cast<size_t>(n));
  KCHECK_MSG(buf != nullptr, "MeasureReadBandwidth: out of memory");
  // First touch from the threads that will read it, with non-zero data.
  pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<float>(i & 1023) * 1e-3f;
  });
  const bool avx2 = HasAvx2();
  std::vector<double> rates;
  std::atomic<double> sink{0};
  for (int r = 0; r < repeats + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e, int) {
      double s = avx2 ? SumFloatsAvx2(buf.get() + b, e - b) : SumFloatsScalar(buf.get() + b, e - b);
      sink.store(sink.load() + s);
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(static_cast<double>(n) * 4 / s / 1e9);  // first pass warms up
  }
  return Median(rates);
}

double MeasureFmaPeak(ThreadPool& pool, int repeats) {
  if (!HasAvx2()) return 0;
  const int64_t iters = 20'000'000;
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::atomic<double> sink{0};
    pool.ParallelFor(pool.n_threads(), 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sink.store(sink.load() + FmaLoopAvx2(iters));
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // 10 independent 8-wide FMA chains per iteration = 160 flops.
    rates.push_back(static_cast<double>(iters) * 160 * pool.n_threads() / s / 1e9);
  }
  return Median(rates);
}

}  // namespace kestrel
