#include <immintrin.h>

#include <cstdint>

namespace kestrel {

double SumFloatsAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  double total = 0;
  for (float v : lanes) total += v;
  for (; i < n; ++i) total += p[i];
  return total;
}

// Ten independent FMA chains keep both FMA ports busy despite the 4-5 cycle latency.
double FmaLoopAvx2(int64_t iterations) {
  __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-7f);
  __m256 c[10];
  for (int k = 0; k < 10; ++k) c[k] = _mm256_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 10
    for (int k = 0; k < 10; ++k) c[k] = _mm256_fmadd_ps(c[k], x, y);
  }
  __m256 s = c[0];
  for (int k = 1; k < 10; ++k) s = _mm256_add_ps(s, c[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  return lanes[0];
}

}  // namespace kestrel
