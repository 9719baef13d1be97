#include "cli/bench_serve/stats.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kestrel::bench {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double h = static_cast<double>(values.size() - 1) * std::clamp(p, 0.0, 100.0) / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

double MedianOf(std::vector<double> values) {
  return Percentile(std::move(values), 50);
}

namespace {

// P(Binomial(n, 1/2) <= k), summed in logs so large n does not overflow.
double BinomialHalfCdf(int64_t n, int64_t k) {
  double sum = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_term =
        std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
        std::lgamma(static_cast<double>(n - i) + 1) - static_cast<double>(n) * std::log(2.0);
    sum += std::exp(log_term);
  }
  return sum;
}

}  // namespace

Interval MedianOrderCi(std::vector<double> values, double level) {
  Interval out;
  out.n = static_cast<int64_t>(values.size());
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  out.estimate = MedianOf(values);
  const int64_t n = out.n;
  // k = 0 is [min, max]; widen inwards while the coverage stays at or above the level.
  int64_t k = 0;
  double coverage = 1 - 2 * BinomialHalfCdf(n, 0);
  while (2 * (k + 1) <= n - 1) {  // x[k+1] must not pass x[n-2-k]
    const double next = 1 - 2 * BinomialHalfCdf(n, k + 1);
    if (next < level) break;
    ++k;
    coverage = next;
  }
  out.low = values[static_cast<size_t>(k)];
  out.high = values[static_cast<size_t>(n - 1 - k)];
  out.confidence = coverage;
  return out;
}

Interval MedianBootstrapCi(const std::vector<double>& values, uint64_t seed, int n_resamples,
                           double level) {
  Interval out;
  out.n = static_cast<int64_t>(values.size());
  if (values.empty()) return out;
  out.estimate = MedianOf(values);
  out.confidence = level;
  // The engine's output sequence is fixed by the standard, and the index is taken modulo n
  // (not through a distribution object, whose algorithm varies between standard libraries), so
  // a seed gives the same interval everywhere.
  std::mt19937_64 rng(seed);
  std::vector<double> medians(static_cast<size_t>(std::max(1, n_resamples)));
  std::vector<double> resample(values.size());
  for (double& m : medians) {
    for (double& v : resample) v = values[static_cast<size_t>(rng() % values.size())];
    m = MedianOf(resample);
  }
  const double tail = 100.0 * (1 - level) / 2;
  out.low = Percentile(medians, tail);
  out.high = Percentile(medians, 100.0 - tail);
  return out;
}

Interval MedianCi(const std::vector<double>& values, CiMethod method, uint64_t seed, double level) {
  return method == CiMethod::kBootstrap ? MedianBootstrapCi(values, seed, 10000, level)
                                        : MedianOrderCi(values, level);
}

Interval PairedRatioCi(const std::vector<double>& a, const std::vector<double>& b, CiMethod method,
                       uint64_t seed, double level) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != 0) ratios.push_back(b[i] / a[i]);
  }
  return MedianCi(ratios, method, seed, level);
}

std::vector<double> SplitInterTokenLatencies(const std::vector<double>& chunk_times_s,
                                             int64_t n_tokens) {
  std::vector<double> out;
  if (chunk_times_s.size() < 2) return out;
  const int64_t n_gaps = static_cast<int64_t>(chunk_times_s.size()) - 1;
  const int64_t tokens_after_first = n_tokens - 1;
  for (int64_t i = 0; i < n_gaps; ++i) {
    const double gap =
        chunk_times_s[static_cast<size_t>(i + 1)] - chunk_times_s[static_cast<size_t>(i)];
    int64_t k = 1;
    if (tokens_after_first >= n_gaps) {
      k = tokens_after_first / n_gaps + (i < tokens_after_first % n_gaps ? 1 : 0);
    }
    out.insert(out.end(), static_cast<size_t>(k), gap / static_cast<double>(k));
  }
  return out;
}

}  // namespace kestrel::bench
