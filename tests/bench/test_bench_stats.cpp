// The statistics of `kestrel bench-serve` on known vectors: percentiles, confidence intervals of
// the median, the paired ratio, and the split of multi-token chunks into inter-token latencies.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cli/bench_serve/metrics.h"
#include "cli/bench_serve/runner.h"
#include "cli/bench_serve/stats.h"

namespace kestrel::bench {
namespace {

// Uniform doubles in [0, 1) from the raw engine: the same on every standard library.
std::vector<double> UniformSamples(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return v;
}

TEST(BenchStats, PercentileInterpolatesLinearlyBetweenClosestRanks) {
  // h = (n - 1) * p / 100; x[floor h] + frac(h) * (x[floor h + 1] - x[floor h]), as NumPy.
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  const std::vector<double> w = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(Percentile(w, 30), 23);  // numpy.percentile(w, 30)
  EXPECT_DOUBLE_EQ(Percentile(w, 40), 29);
  EXPECT_DOUBLE_EQ(Percentile(w, 99), 49.6);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(BenchStats, MedianAveragesTheMiddlePairOfAnEvenCount) {
  EXPECT_DOUBLE_EQ(MedianOf({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(MedianOf({4, 1, 3, 2}), 2.5);
}

TEST(BenchStats, OrderStatisticCiUsesBinomialRanks) {
  std::vector<double> v(10);
  std::iota(v.begin(), v.end(), 1.0);  // 1..10
  // n = 10: P(B <= 1) = 11/1024 gives coverage 0.9785; P(B <= 2) = 56/1024 would give 0.891.
  const Interval ci = MedianOrderCi(v, 0.95);
  EXPECT_DOUBLE_EQ(ci.estimate, 5.5);
  EXPECT_DOUBLE_EQ(ci.low, 2);
  EXPECT_DOUBLE_EQ(ci.high, 9);
  EXPECT_NEAR(ci.confidence, 1 - 22.0 / 1024, 1e-12);
  EXPECT_EQ(ci.n, 10);
}

TEST(BenchStats, OrderStatisticCiOfFewSamplesIsTheRangeWithItsCoverage) {
  // Five samples cannot reach 95 %: [min, max] covers the median with 1 - 2^-4.
  const Interval five = MedianOrderCi({5, 3, 9, 1, 7}, 0.95);
  EXPECT_DOUBLE_EQ(five.low, 1);
  EXPECT_DOUBLE_EQ(five.high, 9);
  EXPECT_DOUBLE_EQ(five.estimate, 5);
  EXPECT_DOUBLE_EQ(five.confidence, 1 - 1.0 / 16);
  const Interval three = MedianOrderCi({2, 1, 3});
  EXPECT_DOUBLE_EQ(three.confidence, 0.75);
  const Interval six = MedianOrderCi({1, 2, 3, 4, 5, 6});
  EXPECT_GE(six.confidence, 0.95);
  const Interval one = MedianOrderCi({4});
  EXPECT_DOUBLE_EQ(one.low, 4);
  EXPECT_DOUBLE_EQ(one.high, 4);
  EXPECT_EQ(MedianOrderCi({}).n, 0);
}

TEST(BenchStats, MedianCiContainsTheMedianAndNarrowsWithMoreSamples) {
  for (CiMethod method : {CiMethod::kOrderStatistic, CiMethod::kBootstrap}) {
    double last_width = INFINITY;
    for (size_t n : {10u, 100u, 1000u}) {
      const std::vector<double> v = UniformSamples(n, 42);
      const Interval ci = MedianCi(v, method, 7);
      EXPECT_LE(ci.low, ci.estimate) << n;
      EXPECT_GE(ci.high, ci.estimate) << n;
      EXPECT_DOUBLE_EQ(ci.estimate, MedianOf(v));
      // The true median of U(0, 1), 0.5, is inside for these samples.
      EXPECT_LE(ci.low, 0.5) << n;
      EXPECT_GE(ci.high, 0.5) << n;
      EXPECT_LT(ci.high - ci.low, last_width) << n;
      last_width = ci.high - ci.low;
    }
    EXPECT_LT(last_width, 0.1);
  }
}

TEST(BenchStats, BootstrapIsDeterministicForASeed) {
  const std::vector<double> v = UniformSamples(25, 3);
  const Interval a = MedianBootstrapCi(v, 123, 2000);
  const Interval b = MedianBootstrapCi(v, 123, 2000);
  EXPECT_EQ(a.low, b.low);
  EXPECT_EQ(a.high, b.high);
  EXPECT_EQ(a.estimate, b.estimate);
  EXPECT_DOUBLE_EQ(a.confidence, 0.95);
  // Another seed draws other resamples: some end of the interval moves.
  bool differs = false;
  for (uint64_t seed = 124; seed < 134 && !differs; ++seed) {
    const Interval c = MedianBootstrapCi(v, seed, 2000);
    differs = c.low != a.low || c.high != a.high;
  }
  EXPECT_TRUE(differs);
}

TEST(BenchStats, PairedRatioOfAnExactMultipleIsThatMultiple) {
  const std::vector<double> a = {100, 120, 90, 110, 105, 95};
  std::vector<double> b;
  for (double x : a) b.push_back(2 * x);
  for (CiMethod method : {CiMethod::kOrderStatistic, CiMethod::kBootstrap}) {
    const Interval r = PairedRatioCi(a, b, method, 1);
    EXPECT_DOUBLE_EQ(r.estimate, 2);
    EXPECT_DOUBLE_EQ(r.low, 2);
    EXPECT_DOUBLE_EQ(r.high, 2);
    EXPECT_EQ(r.n, 6);
  }
}

TEST(BenchStats, PairedRatioCancelsDriftSharedByAPair) {
  // Both servers drift upwards by the same factor in each pair; B is 1.5x A up to +-2 % noise.
  // The per-pair ratios stay near 1.5 although the raw values spread over 4x.
  const std::vector<double> drift = {1.0, 1.4, 1.9, 2.5, 3.0, 3.4, 3.8, 4.1};
  const std::vector<double> noise = {0.01, -0.02, 0.015, 0.0, -0.01, 0.02, -0.005, 0.005};
  std::vector<double> a, b;
  for (size_t i = 0; i < drift.size(); ++i) {
    a.push_back(100 * drift[i]);
    b.push_back(150 * drift[i] * (1 + noise[i]));
  }
  const Interval r = PairedRatioCi(a, b, CiMethod::kOrderStatistic, 1);
  EXPECT_LE(r.low, 1.5);
  EXPECT_GE(r.high, 1.5);
  EXPECT_GT(r.low, 1.45);
  EXPECT_LT(r.high, 1.55);
  EXPECT_GE(r.confidence, 0.95);
  // An unpaired view of the same data (median B / median A) would still be 1.5 here, but its
  // spread is that of the drift: the CI of either median covers more than a factor 2.
  const Interval ma = MedianOrderCi(a);
  EXPECT_GT(ma.high / ma.low, 2);
}

TEST(BenchStats, PairedRatioSkipsPairsWithAZeroBaseline) {
  const Interval r = PairedRatioCi({0, 10, 20}, {5, 30, 60}, CiMethod::kOrderStatistic, 1);
  EXPECT_EQ(r.n, 2);
  EXPECT_DOUBLE_EQ(r.estimate, 3);
}

TEST(BenchStats, OneTokenPerChunkGivesTheGaps) {
  const std::vector<double> itl = SplitInterTokenLatencies({0.0, 1.0, 3.0, 6.0}, 4);
  EXPECT_EQ(itl, (std::vector<double>{1, 2, 3}));
}

TEST(BenchStats, MultiTokenChunksSplitTheirGapEvenly) {
  // 5 tokens in 3 chunks: the first carries one token, the other 4 spread 2 + 2.
  EXPECT_EQ(SplitInterTokenLatencies({0.0, 2.0, 3.0}, 5), (std::vector<double>{1, 1, 0.5, 0.5}));
  // 4 tokens in 3 chunks: 3 after the first, the earlier gap takes the remainder (2 + 1).
  EXPECT_EQ(SplitInterTokenLatencies({0.0, 3.0, 4.0}, 4), (std::vector<double>{1.5, 1.5, 1}));
  // 8 tokens in 2 chunks: 7 latencies of a seventh of the gap.
  const std::vector<double> seven = SplitInterTokenLatencies({1.0, 8.0}, 8);
  ASSERT_EQ(seven.size(), 7u);
  for (double v : seven) EXPECT_DOUBLE_EQ(v, 1);
}

TEST(BenchStats, SplitLatenciesSumToTheDecodeTime) {
  const std::vector<double> times = {0.10, 0.13, 0.19, 0.20, 0.32, 0.41};
  for (int64_t n_tokens : {1, 2, 6, 7, 13, 40}) {
    const std::vector<double> itl = SplitInterTokenLatencies(times, n_tokens);
    EXPECT_NEAR(std::accumulate(itl.begin(), itl.end(), 0.0), 0.41 - 0.10, 1e-12) << n_tokens;
    EXPECT_EQ(static_cast<int64_t>(itl.size()), std::max<int64_t>(n_tokens - 1, 5)) << n_tokens;
  }
}

TEST(BenchStats, FewerTokensThanChunksKeepsOneLatencyPerGap) {
  // A server that splits one token's text over chunks: the gaps are all that can be measured.
  EXPECT_EQ(SplitInterTokenLatencies({0.0, 1.0, 2.0, 4.0}, 2), (std::vector<double>{1, 1, 2}));
  EXPECT_TRUE(SplitInterTokenLatencies({0.5}, 9).empty());
  EXPECT_TRUE(SplitInterTokenLatencies({}, 0).empty());
}

// The steady-state window runs from the first measured start to the last; every completed
// request's tokens that arrived in it count, warm-up ones included, in proportion to its chunks.
TEST(BenchStats, SteadyThroughputCountsTheTokensInsideTheFullConcurrencyWindow) {
  auto record = [](double start, double first_chunk, int n_chunks, int64_t tokens) {
    RequestRecord r;
    r.start_s = start;
    for (int i = 0; i < n_chunks; ++i) r.content_times_s.push_back(first_chunk + i);
    r.end_s = r.content_times_s.back();
    r.usage_present = true;
    r.usage_output_tokens = tokens;
    return r;
  };
  RunRecord run;
  run.warmup.push_back(record(0, 1, 10, 10));     // chunks at 5..9 inside: 5 tokens
  run.measured.push_back(record(5, 6, 10, 20));   // 6..9 inside, 2 tokens a chunk: 8
  run.measured.push_back(record(9, 10, 10, 10));  // none inside
  RequestRecord failed = record(1, 2, 10, 10);
  failed.outcome = Outcome::kConnectionError;
  run.warmup.push_back(failed);  // not counted
  const RunMetrics m = SummarizeRun(run);
  EXPECT_DOUBLE_EQ(m.steady_window_s, 4.0);
  EXPECT_DOUBLE_EQ(m.steady_output_tok_per_s, 13.0 / 4.0);
  EXPECT_DOUBLE_EQ(m.output_tok_per_s, 30.0 / 14.0);  // measured tokens over 5 .. 19
  // The window starts once every worker has started (a ramp-up still under way before that).
  run.all_workers_started_s = 7;  // 5 .. 7 dropped: warm-up 7..9 inside (3), measured 7..9 (6)
  const RunMetrics ramped = SummarizeRun(run);
  EXPECT_DOUBLE_EQ(ramped.steady_window_s, 2.0);
  EXPECT_DOUBLE_EQ(ramped.steady_output_tok_per_s, 9.0 / 2.0);
  run.all_workers_started_s = std::numeric_limits<double>::infinity();  // a worker never started
  EXPECT_EQ(SummarizeRun(run).steady_output_tok_per_s, 0.0);
  // Measured requests that all started together leave no window.
  RunRecord burst;
  burst.measured.push_back(record(1, 2, 4, 4));
  burst.measured.push_back(record(1, 3, 4, 4));
  EXPECT_EQ(SummarizeRun(burst).steady_output_tok_per_s, 0.0);
}

}  // namespace
}  // namespace kestrel::bench
