// Statistics of `kestrel bench-serve`: percentiles of one run, confidence intervals across
// repeats, the paired ratio of two servers, and the split of a multi-token chunk's gap into
// inter-token latencies. Pure functions of their arguments (the bootstrap takes its seed), so
// each is unit-tested on known vectors.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel::bench {

// The p-th percentile (p in [0, 100]) by linear interpolation between closest ranks: with the
// values sorted x[0..n-1] and h = (n - 1) * p / 100, the result is
// x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]) (NumPy's default "linear",
// Hyndman & Fan type 7). 0 for an empty vector.
double Percentile(std::vector<double> values, double p);

// The sample median: the mean of the two middle values for an even count. 0 when empty.
double MedianOf(std::vector<double> values);

// A point estimate with a two-sided confidence interval; `confidence` is the level actually
// achieved, which is below the requested one when there are too few samples for it.
struct Interval {
  double estimate = 0;
  double low = 0;
  double high = 0;
  double confidence = 0;
  int64_t n = 0;
};

// The distribution-free confidence interval of the median from order statistics: the widest
// symmetric pair (x[k], x[n-1-k]) whose coverage, 1 - 2 * P(Binomial(n, 1/2) <= k), is at least
// `level`. With fewer than 6 samples no pair reaches 95 %; then [min, max] is returned with its
// coverage 1 - 2^(1-n) in `confidence`. Valid for any continuous distribution.
Interval MedianOrderCi(std::vector<double> values, double level = 0.95);

// The percentile-bootstrap confidence interval of the median: n_resamples resamples with
// replacement drawn from a generator seeded with `seed` (same inputs and seed, same interval).
// `confidence` is the requested level (the bootstrap does not know its real coverage).
Interval MedianBootstrapCi(const std::vector<double>& values, uint64_t seed,
                           int n_resamples = 10000, double level = 0.95);

enum class CiMethod { kOrderStatistic, kBootstrap };

Interval MedianCi(const std::vector<double>& values, CiMethod method, uint64_t seed,
                  double level = 0.95);

// Paired runs of two servers (a[i] and b[i] measured in the same repeat, one after the other):
// the median of the per-pair ratios b[i] / a[i] and its confidence interval by `method`. Pairs
// with a[i] == 0 are skipped. Working on per-pair ratios lets drift that moves both runs of a
// pair cancel.
Interval PairedRatioCi(const std::vector<double>& a, const std::vector<double>& b, CiMethod method,
                       uint64_t seed, double level = 0.95);

// Inter-token latencies of one streamed response from the arrival times (seconds, ascending) of
// its content chunks and the response's output token count (from usage). The first chunk carries
// the first token; the other n_tokens - 1 tokens are spread as evenly as integers allow over the
// gaps between chunks (the earlier gaps take the remainder), and a gap of k tokens yields k equal
// latencies gap / k. When there are more gaps than tokens left (a server that splits one token's
// text over chunks), each gap is one latency. The latencies always sum to last - first.
std::vector<double> SplitInterTokenLatencies(const std::vector<double>& chunk_times_s,
                                             int64_t n_tokens);

}  // namespace kestrel::bench
