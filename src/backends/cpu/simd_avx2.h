// Small AVX2/FMA helpers shared by the *_avx2.cpp files. Include only from those files: every
// function has internal linkage (anonymous namespace), so no AVX-encoded copy can be picked by
// the linker for baseline code.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// Marks a function of an AVX2 translation unit that uses 512-bit registers: built for the
// extensions CpuHasAvx512() checks, and called only where it holds.
#define KESTREL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace kestrel::cpu::avx2 {
namespace {

// The f16 at p (possibly unaligned) as f32.
inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i Load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0, 8 lanes: x = n ln2 + r (Cody-Waite, |r| <= ln2/2), exp(r) by its Taylor
// polynomial of degree 7 (truncation < 0.05 ulp), times 2^n. Within 2 ulp of expf; results
// below the smallest normal float (x < -87.33) flush to 0.
inline __m256 ExpNonPositive(__m256 x) {
  const __m256 min_x = _mm256_set1_ps(-87.33f);
  const __m256 underflow = _mm256_cmp_ps(x, min_x, _CMP_LT_OQ);
  x = _mm256_max_ps(x, min_x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

}  // namespace
}  // namespace kestrel::cpu::avx2
