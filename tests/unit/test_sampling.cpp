#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "sampling/logit_kernels.h"
#include "sampling/sampler.h"

namespace kestrel {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

SamplingParams Params(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// Draws n tokens from the same logits (copied each step, since Sample processes in place).
std::vector<int32_t> DrawMany(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> z = logits;
    out.push_back(s.Sample(z).token);
  }
  return out;
}

std::set<int32_t> Support(const std::vector<int32_t>& tokens) {
  return std::set<int32_t>(tokens.begin(), tokens.end());
}

std::vector<double> LogSoftmax(const std::vector<float>& z) {
  double m = -std::numeric_limits<double>::infinity();
  for (float v : z) m = std::max(m, static_cast<double>(v));
  double s = 0;
  for (float v : z) s += std::exp(static_cast<double>(v) - m);
  std::vector<double> out;
  for (float v : z) out.push_back(static_cast<double>(v) - m - std::log(s));
  return out;
}

// ---------------------------------------------------------------- validation

TEST(SamplingParamsTest, RejectsOutOfRangeFields) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    Status s = ValidateSamplingParams(p, 100);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    return !s.ok();
  };
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = -0.1f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = kNaN; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = kInf; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = 0.0f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = 1.01f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = kNaN; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.min_p = -0.01f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.min_p = 1.5f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.repetition_penalty = kInf; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.presence_penalty = 2.5f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.presence_penalty = kNaN; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.frequency_penalty = -2.01f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) {
    p.logprobs = true;
    p.n_top_logprobs = 21;
  }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.n_top_logprobs = -1; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.n_top_logprobs = 3; }));  // logprobs off
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{3, kNaN}}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{3, kInf}}; }));
}

TEST(SamplingParamsTest, AcceptsDefaultsAndBoundaries) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 1e-3f;
  p.logprobs = true;
  p.n_top_logprobs = 20;
  p.logit_bias = {{0, -kInf}, {99, 100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  // Without a vocabulary size only the sign of the ids is checked.
  p.logit_bias = {{1000000, 1.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  EXPECT_FALSE(ValidateSamplingParams(p, 100).ok());
}

// ---------------------------------------------------------------- greedy

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(Params(0.0f), 6);
  std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 2.0f};
  EXPECT_EQ(s.Sample(z).token, 1);
  z = {-kInf, -3.0f, -3.0f, -kInf, -4.0f, -3.5f};
  EXPECT_EQ(s.Sample(z).token, 1);
  z = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(s.Sample(z).token, 0);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  std::mt19937 gen(3);
  std::uniform_int_distribution<int> level(0, 5);  // coarse logits: many ties
  SamplingParams p = Params(1.3f, 42);
  p.top_k = 1;
  Sampler top1(p, 300), greedy(Params(0.0f), 300);
  for (int step = 0; step < 200; ++step) {
    std::vector<float> z(300);
    for (float& v : z) v = 0.5f * static_cast<float>(level(gen));
    std::vector<float> z2 = z;
    ASSERT_EQ(top1.Sample(z).token, greedy.Sample(z2).token) << "step " << step;
  }
}

// ---------------------------------------------------------------- the seeded draw

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  std::vector<float> z(1000);
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : z) v = normal(gen);
  SamplingParams p = Params(1.0f, 12345);
  p.top_p = 0.95f;
  p.top_k = 200;
  Sampler a(p, 1000), b(p, 1000);
  std::vector<int32_t> ta = DrawMany(a, z, 300), tb = DrawMany(b, z, 300);
  EXPECT_EQ(ta, tb);
  p.seed = 12346;
  Sampler c(p, 1000);
  std::vector<int32_t> tc = DrawMany(c, z, 300);
  int n_diff = 0;
  for (size_t i = 0; i < ta.size(); ++i) n_diff += ta[i] != tc[i];
  EXPECT_GT(n_diff, 200);  // a flat 200-token distribution: different seeds rarely agree
}

// The documented draw: one mt19937_64 output x per step (greedy included), r = x >> 11,
// target = floor(r * W / 2^53), first token in id order whose running fixed-point weight exceeds
// it.
TEST(SamplerTest, DrawFollowsTheDocumentedInverseCdf) {
  const std::vector<float> z = {0.0f, 1.0f, -0.5f, 0.25f};
  const float t = 0.8f;
  std::vector<uint64_t> w;
  uint64_t total = 0;
  for (float v : z) {
    w.push_back(sampling::FixedWeight(sampling::ExpNonPositive((v - 1.0f) * (1.0f / t))));
    total += w.back();
  }
  EXPECT_EQ(w[1], uint64_t{1} << 43);

  std::mt19937_64 rng(2024);
  Sampler s(Params(t, 2024), 4);
  std::vector<int> counts(4, 0);
  for (int step = 0; step < 500; ++step) {
    const uint64_t r = rng() >> 11;
    const uint64_t target =
        static_cast<uint64_t>((static_cast<unsigned __int128>(r) * total) >> 53);
    int32_t expected = -1;
    uint64_t cumulative = 0;
    for (int32_t i = 0; i < 4 && expected < 0; ++i) {
      cumulative += w[static_cast<size_t>(i)];
      if (cumulative > target) expected = i;
    }
    ++counts[static_cast<size_t>(expected)];
    std::vector<float> logits = z;
    ASSERT_EQ(s.Sample(logits).token, expected) << "step " << step;
  }
  for (int c : counts) EXPECT_GT(c, 20);
}

// Greedy steps consume a draw too, so draw n belongs to step n whatever came before.
TEST(SamplerTest, EveryStepConsumesExactlyOneDraw) {
  const std::vector<float> z = {0.3f, 0.1f, 0.2f, 0.0f, 0.25f};
  SamplingParams p = Params(1.0f, 77);
  Sampler reference(p, 5);
  std::vector<int32_t> expected = DrawMany(reference, z, 40);
  // Same seed, but the first 10 steps forced by a -inf ban on all tokens but one.
  Sampler s(p, 5);
  for (int i = 0; i < 10; ++i) {
    std::vector<float> forced = {-kInf, -kInf, 0.0f, -kInf, -kInf};
    EXPECT_EQ(s.Sample(forced).token, 2);
  }
  std::vector<int32_t> rest = DrawMany(s, z, 30);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 10, expected.end()));
}

// ---------------------------------------------------------------- temperature

// Chi-square goodness of fit with 3 degrees of freedom; the seed is fixed so the statistic is
// a fixed number, and the bound (p = 1e-4 critical value) is far from it for a correct sampler.
double ChiSquare(const std::vector<int32_t>& tokens, const std::vector<double>& probs) {
  std::map<int32_t, int> h;
  for (int32_t t : tokens) ++h[t];
  double chi2 = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    double expected = probs[i] * static_cast<double>(tokens.size());
    double d = h[static_cast<int32_t>(i)] - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

TEST(SamplerTest, TemperatureShapesTheDistribution) {
  const std::vector<float> z = {1.0f, 0.5f, 0.0f, -1.0f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    std::vector<float> scaled;
    for (float v : z) scaled.push_back(v / t);
    std::vector<double> probs;
    for (double lp : LogSoftmax(scaled)) probs.push_back(std::exp(lp));
    Sampler s(Params(t, 5), 4);
    std::vector<int32_t> tokens = DrawMany(s, z, 20000);
    EXPECT_LT(ChiSquare(tokens, probs), 21.1) << "temperature " << t;
    // A wrong temperature is detected: the same draws against T = 1 probabilities.
    if (t != 1.0f) {
      std::vector<double> wrong;
      for (double lp : LogSoftmax(z)) wrong.push_back(std::exp(lp));
      EXPECT_GT(ChiSquare(tokens, wrong), 100.0) << "temperature " << t;
    }
  }
}

// ---------------------------------------------------------------- top-k

TEST(SamplerTest, TopKKeepsExactlyTheKBest) {
  // Nearly flat logits over a big vocabulary, shuffled, so that any token leaking past the cut
  // would be drawn. Covers the heap path (small k) and the nth_element path (k > 512).
  const int32_t vocab = 6000;
  std::vector<int32_t> perm(vocab);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  std::vector<float> z(vocab);
  for (int32_t r = 0; r < vocab; ++r) z[static_cast<size_t>(perm[r])] = -1e-4f * r;  // rank r
  for (int32_t k : {1, 7, 100, 600, 3000, 5999}) {
    SamplingParams p = Params(1.0f, 9);
    p.top_k = k;
    Sampler s(p, vocab);
    std::set<int32_t> allowed(perm.begin(), perm.begin() + k);
    std::vector<int32_t> tokens = DrawMany(s, z, 800);
    for (int32_t t : tokens) ASSERT_TRUE(allowed.count(t)) << "k " << k << " token " << t;
    if (k >= 100) {
      EXPECT_GT(Support(tokens).size(), std::min<size_t>(k, 800) / 3) << "k " << k;
    }
  }
}

TEST(SamplerTest, TopKBreaksTiesAtTheCutTowardLowerIds) {
  // Token 5 is best; tokens 1, 2, 3, 4 tie for second place; k = 3 keeps 5, 1, 2.
  std::vector<float> z = {-1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 2.0f};
  SamplingParams p = Params(1.0f, 1);
  p.top_k = 3;
  Sampler s(p, 6);
  EXPECT_EQ(Support(DrawMany(s, z, 2000)), (std::set<int32_t>{1, 2, 5}));
  p.top_k = 6;  // k == vocab: disabled
  Sampler all(p, 6);
  EXPECT_EQ(Support(DrawMany(all, z, 4000)).size(), 6u);
}

// ---------------------------------------------------------------- top-p

std::vector<float> LogProbs(std::vector<double> probs) {
  std::vector<float> z;
  for (double q : probs) z.push_back(static_cast<float>(std::log(q)));
  return z;
}

TEST(SamplerTest, TopPOneKeepsAllAndTinyTopPOnlyTheMostProbable) {
  SamplingParams p = Params(1.0f, 3);
  Sampler all(p, 5);
  EXPECT_EQ(Support(DrawMany(all, LogProbs({0.6, 0.3, 0.06, 0.03, 0.01}), 5000)).size(), 5u);
  p.top_p = 1e-6f;
  Sampler s(p, 5);
  EXPECT_EQ(Support(DrawMany(s, LogProbs({0.1, 0.3, 0.2, 0.25, 0.15}), 500)),
            (std::set<int32_t>{1}));
  // Ties for the most probable: one token, the lowest id.
  Sampler t(p, 4);
  EXPECT_EQ(Support(DrawMany(t, {0.0f, 2.0f, 2.0f, 1.0f}, 200)), (std::set<int32_t>{1}));
}

TEST(SamplerTest, TopPExactCumulativeBoundary) {
  // Four equal logits: weights are exactly 1, so the cumulative sums are exact (0.25 steps).
  const std::vector<float> flat = {0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams p = Params(1.0f, 8);
  p.top_p = 0.5f;  // two tokens reach exactly 0.5 >= top_p: the third is not needed
  Sampler two(p, 4);
  EXPECT_EQ(Support(DrawMany(two, flat, 1000)), (std::set<int32_t>{0, 1}));
  p.top_p = 0.5000001f;
  Sampler three(p, 4);
  EXPECT_EQ(Support(DrawMany(three, flat, 1000)), (std::set<int32_t>{0, 1, 2}));
  p.top_p = 0.25f;
  Sampler one(p, 4);
  EXPECT_EQ(Support(DrawMany(one, flat, 200)), (std::set<int32_t>{0}));
}

TEST(SamplerTest, TopPUsesProbabilityOrder) {
  const std::vector<float> z = LogProbs({0.1, 0.4, 0.3, 0.2});
  SamplingParams p = Params(1.0f, 4);
  p.top_p = 0.65f;  // 0.4 + 0.3 = 0.7
  Sampler a(p, 4);
  EXPECT_EQ(Support(DrawMany(a, z, 2000)), (std::set<int32_t>{1, 2}));
  p.top_p = 0.75f;  // + 0.2
  Sampler b(p, 4);
  EXPECT_EQ(Support(DrawMany(b, z, 2000)), (std::set<int32_t>{1, 2, 3}));
}

TEST(SamplerTest, TopPRenormalisesOverTheTopKSet) {
  // top_k = 2 leaves {0: 4/7, 1: 3/7}; top_p = 0.55 is reached by token 0 alone (0.571), whereas
  // over the full distribution 0.4 < 0.55 would keep both.
  const std::vector<float> z = LogProbs({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = Params(1.0f, 4);
  p.top_k = 2;
  p.top_p = 0.55f;
  Sampler s(p, 4);
  EXPECT_EQ(Support(DrawMany(s, z, 500)), (std::set<int32_t>{0}));
}

TEST(SamplerTest, TopPNucleusReachingFarIntoTheTail) {
  // Ten tokens at weight 1, 12000 at e^-8.8: the nucleus for top_p = 0.95 needs about two
  // thirds of the tail, which lies below the first weight band of the implementation.
  const int32_t vocab = 12010;
  auto is_head = [](int32_t id) { return id % 1201 == 0 && id / 1201 < 10; };
  std::vector<float> z(vocab, 0.0f);
  for (int32_t i = 0; i < vocab; ++i) {
    if (is_head(i)) z[static_cast<size_t>(i)] = 8.8f;
  }
  // The exact cut, from the documented fixed-point arithmetic.
  const uint64_t w_head = sampling::FixedWeight(1.0f);
  const uint64_t w_tail = sampling::FixedWeight(sampling::ExpNonPositive(-8.8f));
  const uint64_t need = sampling::CeilScaled(0.95f, 10 * w_head + 12000 * w_tail);
  const uint64_t n_tail_kept = (need - 10 * w_head + w_tail - 1) / w_tail;
  ASSERT_GT(n_tail_kept, 6000u);
  ASSERT_LT(n_tail_kept, 11000u);
  int32_t last_kept = -1;  // the tail is ranked by id
  for (int32_t i = 0, n = 0; i < vocab; ++i) {
    if (!is_head(i) && static_cast<uint64_t>(++n) == n_tail_kept) last_kept = i;
  }
  SamplingParams p = Params(1.0f, 6);
  p.top_p = 0.95f;
  Sampler s(p, vocab);
  std::vector<int32_t> tokens = DrawMany(s, z, 1000);
  int n_tail = 0, n_tail_upper_half = 0, max_tail = -1;
  for (int32_t t : tokens) {
    if (!is_head(t)) {
      ++n_tail;
      n_tail_upper_half += t > last_kept / 2;
      max_tail = std::max(max_tail, t);
    }
  }
  EXPECT_LE(max_tail, last_kept);
  EXPECT_GT(max_tail, last_kept - 1000);
  EXPECT_GT(n_tail, 60);  // about 10% of draws
  EXPECT_GT(n_tail_upper_half, 20);
}

// ---------------------------------------------------------------- min-p

TEST(SamplerTest, MinPKeepsTokensAboveAFractionOfTheMax) {
  const std::vector<float> z = LogProbs({0.4, 0.2, 0.1, 0.05, 0.25});  // ratios 1 .5 .25 .125 .625
  auto support = [&](float min_p, float t) {
    SamplingParams p = Params(t, 10);
    p.min_p = min_p;
    Sampler s(p, 5);
    return Support(DrawMany(s, z, 3000));
  };
  EXPECT_EQ(support(0.0f, 1.0f), (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(support(0.3f, 1.0f), (std::set<int32_t>{0, 1, 4}));
  EXPECT_EQ(support(0.55f, 1.0f), (std::set<int32_t>{0, 4}));
  EXPECT_EQ(support(0.9f, 1.0f), (std::set<int32_t>{0}));
  EXPECT_EQ(support(1.0f, 1.0f), (std::set<int32_t>{0}));
  // After temperature: at T = 2 the ratios are square roots (1 .71 .5 .35 .79).
  EXPECT_EQ(support(0.6f, 2.0f), (std::set<int32_t>{0, 1, 4}));
  EXPECT_EQ(support(0.45f, 2.0f), (std::set<int32_t>{0, 1, 2, 4}));
}

TEST(SamplerTest, MinPOneKeepsAllTiedMaxima) {
  SamplingParams p = Params(1.0f, 2);
  p.min_p = 1.0f;
  Sampler s(p, 4);
  EXPECT_EQ(Support(DrawMany(s, {3.0f, 1.0f, 3.0f, 2.9f}, 500)), (std::set<int32_t>{0, 2}));
}

// ---------------------------------------------------------------- weight kernels

TEST(LogitKernelsTest, ExpNonPositiveMatchesStdExp) {
  EXPECT_EQ(sampling::ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(sampling::ExpNonPositive(-0.0f), 1.0f);
  EXPECT_EQ(sampling::ExpNonPositive(-kInf), 0.0f);
  EXPECT_EQ(sampling::ExpNonPositive(-87.5f), 0.0f);
  double max_rel = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0013f) {
    const double exact = std::exp(static_cast<double>(x));
    max_rel = std::max(max_rel, std::abs(sampling::ExpNonPositive(x) - exact) / exact);
  }
  EXPECT_LT(max_rel, 3e-7);
}

TEST(LogitKernelsTest, SanitizeMaxFirstIndexAndLaneSum) {
  std::vector<float> z = {-1.0f, kNaN, -0.0f, kInf, 3.0f, -kInf, kInf};
  EXPECT_EQ(sampling::SanitizeAndMax(z), std::numeric_limits<float>::max());
  EXPECT_EQ(z[1], -kInf);
  EXPECT_EQ(z[3], std::numeric_limits<float>::max());
  EXPECT_EQ(sampling::FirstIndexOf(z, std::numeric_limits<float>::max()), 3u);
  std::vector<float> neg = {-5.0f, -0.0f, -kInf, -7.0f};
  EXPECT_EQ(sampling::SanitizeAndMax(neg), 0.0f);
  EXPECT_EQ(sampling::FirstIndexOf(neg, 0.0f), 1u);
  std::vector<float> banned = {-kInf, -kInf};
  EXPECT_EQ(sampling::SanitizeAndMax(banned), -kInf);

  std::vector<float> w(1003);
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = 1.0f / static_cast<float>(i + 1);
    lanes[i % 8] += w[i];
  }
  const double expected = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                          ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  EXPECT_EQ(sampling::LaneSum(w), expected);          // bit-exact order
  EXPECT_NEAR(sampling::LaneSum(w), 7.488465, 1e-5);  // H(1003)
}

TEST(LogitKernelsTest, FixedPointHelpersAreExact) {
  EXPECT_EQ(sampling::FixedWeight(1.0f), uint64_t{1} << 43);
  EXPECT_EQ(sampling::FixedWeight(0x1p-43f), 1u);
  EXPECT_EQ(sampling::FixedWeight(0x1p-44f), 0u);    // 0.5 rounds to even
  EXPECT_EQ(sampling::FixedWeight(0x1.8p-43f), 2u);  // 1.5 rounds to even
  EXPECT_EQ(sampling::FixedWeight(0x1.4p-43f), 1u);  // 1.25
  EXPECT_EQ(sampling::FixedWeight(0x1.fffffep-1f), (uint64_t{1} << 43) - (uint64_t{1} << 19));
  EXPECT_EQ(sampling::FixedWeight(0.0f), 0u);
  const std::vector<float> w = {1.0f, 0.25f, 0x1p-50f, 0.125f};
  EXPECT_EQ(sampling::FixedWeightSum(w),
            (uint64_t{1} << 43) + (uint64_t{1} << 41) + (uint64_t{1} << 40));

  EXPECT_EQ(sampling::CeilScaled(1.0f, 12345), 12345u);
  EXPECT_EQ(sampling::CeilScaled(0.5f, 11), 6u);
  EXPECT_EQ(sampling::CeilScaled(1e-30f, 1000), 1u);
  EXPECT_EQ(sampling::CeilScaled(0.5f, 0), 0u);
  // 0.1f is slightly above 0.1: ceil(0.1f * 10) = 2.
  EXPECT_EQ(sampling::CeilScaled(0.1f, 10), 2u);
  const uint64_t big = uint64_t{3} << 60;
  EXPECT_EQ(sampling::CeilScaled(0.75f, big), (big / 4) * 3);

  EXPECT_EQ(sampling::DrawTarget(0, 1000), 0u);
  EXPECT_EQ(sampling::DrawTarget((uint64_t{1} << 53) - 1, 1000), 999u);
  EXPECT_EQ(sampling::DrawTarget(uint64_t{1} << 52, 1000), 500u);
  EXPECT_EQ(sampling::DrawTarget(uint64_t{1} << 52, uint64_t{1} << 62), uint64_t{1} << 61);
}

// ---------------------------------------------------------------- penalties and bias

TEST(SamplerTest, PenaltiesProduceTheExactExpectedLogits) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 6);
  s.AddPromptTokens(std::vector<int32_t>{0, 1, 0, 5});
  s.Accept(2);
  s.Accept(2);
  s.Accept(3);
  const std::vector<float> raw = {2.0f, -1.0f, 3.0f, -0.5f, 1.0f, 0.0f};

  std::vector<float> z = raw;
  EXPECT_EQ(s.Sample(z).token, 0);
  // Repetition over prompt + generated; presence/frequency over generated only.
  EXPECT_EQ(z[0], 2.0f / 1.5f);
  EXPECT_EQ(z[1], -1.0f * 1.5f);
  EXPECT_EQ(z[2], 3.0f / 1.5f - 0.25f * 2.0f - 0.5f);
  EXPECT_EQ(z[3], -0.5f * 1.5f - 0.25f * 1.0f - 0.5f);
  EXPECT_EQ(z[4], 1.0f);
  EXPECT_EQ(z[5], 0.0f);  // a zero logit is unchanged by the repetition penalty

  // Sample accepted token 0: it now carries presence and frequency too.
  z = raw;
  EXPECT_EQ(s.Sample(z).token, 2);  // z2 = 1.0 ties z4 = 1.0: lower id
  EXPECT_EQ(z[0], 2.0f / 1.5f - 0.25f - 0.5f);
  EXPECT_EQ(z[2], 1.0f);
  z = raw;
  EXPECT_EQ(s.Sample(z).token, 4);
  EXPECT_EQ(z[2], 3.0f / 1.5f - 0.25f * 3.0f - 0.5f);
}

TEST(SamplerTest, NegativePenaltiesEncourageAndRepetitionBelowOneBoosts) {
  SamplingParams p = Params(0.0f);
  p.presence_penalty = -1.0f;
  p.frequency_penalty = -0.5f;
  p.repetition_penalty = 0.5f;
  Sampler s(p, 3);
  s.Accept(1);
  std::vector<float> z = {1.0f, 0.5f, -2.0f};
  EXPECT_EQ(s.Sample(z).token, 1);
  EXPECT_EQ(z[1], 0.5f / 0.5f + 0.5f + 1.0f);
}

TEST(SamplerTest, LogitBiasComesFirstAndRepeatsAdd) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, 1.0f}, {1, 1.0f}, {1, 2.0f}};
  Sampler s(p, 3);
  s.AddPromptTokens(std::vector<int32_t>{0});
  std::vector<float> z = {2.0f, 0.0f, 0.5f};
  EXPECT_EQ(s.Sample(z).token, 1);
  EXPECT_EQ(z[0], (2.0f + 1.0f) / 2.0f);  // bias, then repetition penalty
  EXPECT_EQ(z[1], 3.0f);
  EXPECT_EQ(z[2], 0.5f);
}

TEST(SamplerTest, LogitBiasForcesAndBans) {
  const std::vector<float> z = {5.0f, 1.0f, 0.0f, 4.5f};
  SamplingParams force = Params(1.0f, 3);
  force.logit_bias = {{2, 100.0f}};
  Sampler forced(force, 4);
  EXPECT_EQ(Support(DrawMany(forced, z, 500)), (std::set<int32_t>{2}));

  SamplingParams ban = Params(0.0f);
  ban.logit_bias = {{0, -kInf}};
  Sampler greedy(ban, 4);
  EXPECT_EQ(DrawMany(greedy, z, 1)[0], 3);
  ban.temperature = 1.0f;
  Sampler sampled(ban, 4);
  EXPECT_EQ(Support(DrawMany(sampled, z, 3000)), (std::set<int32_t>{1, 2, 3}));

  // A banned token stays banned through penalties (no NaN from -inf arithmetic).
  ban.repetition_penalty = 1.3f;
  ban.frequency_penalty = -2.0f;
  ban.presence_penalty = -2.0f;
  Sampler penalised(ban, 4);
  penalised.AddPromptTokens(std::vector<int32_t>{0});
  penalised.Accept(0);
  std::vector<float> processed = z;
  EXPECT_NE(penalised.Sample(processed).token, 0);
  EXPECT_EQ(processed[0], -kInf);
}

TEST(SamplerTest, EverythingBannedReturnsTokenZero) {
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p = Params(t);
    p.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}};
    p.logprobs = true;
    p.logprob_mode = LogprobMode::kProcessed;
    Sampler s(p, 3);
    std::vector<float> z = {1.0f, 2.0f, 3.0f};
    SampleResult r = s.Sample(z);
    EXPECT_EQ(r.token, 0);
    EXPECT_EQ(r.logprob, -kInf);
  }
}

// ---------------------------------------------------------------- non-finite logits

TEST(SamplerTest, NanIsMinusInfinityAndPlusInfinityIsClamped) {
  std::vector<float> z = {kNaN, 1.0f, kNaN, 0.5f};
  Sampler greedy(Params(0.0f), 4);
  std::vector<float> g = z;
  EXPECT_EQ(greedy.Sample(g).token, 1);
  EXPECT_EQ(g[0], -kInf);
  Sampler sampled(Params(1.0f, 4), 4);
  EXPECT_EQ(Support(DrawMany(sampled, z, 2000)), (std::set<int32_t>{1, 3}));

  Sampler all_nan(Params(1.0f), 2);
  std::vector<float> n = {kNaN, kNaN};
  EXPECT_EQ(all_nan.Sample(n).token, 0);

  SamplingParams p = Params(1.0f, 5);
  p.logprobs = true;
  Sampler inf(p, 4);
  std::vector<float> i = {0.0f, kInf, 1.0f, kInf};
  SampleResult r = inf.Sample(i);
  EXPECT_TRUE(r.token == 1 || r.token == 3);
  EXPECT_EQ(i[1], std::numeric_limits<float>::max());
  EXPECT_FLOAT_EQ(r.logprob, -std::log(2.0f));
  EXPECT_EQ(Support(DrawMany(inf, {0.0f, kInf, 1.0f, kInf}, 500)), (std::set<int32_t>{1, 3}));

  // A penalty overflowing to +inf is clamped too.
  p.repetition_penalty = 0.25f;
  Sampler s(p, 2);
  s.AddPromptTokens(std::vector<int32_t>{0});
  std::vector<float> big = {std::numeric_limits<float>::max() * 0.5f, 0.0f};
  EXPECT_EQ(s.Sample(big).token, 0);
  EXPECT_EQ(big[0], std::numeric_limits<float>::max());
}

// ---------------------------------------------------------------- logprobs

TEST(SamplerTest, RawLogprobsAreTheModelsLogSoftmax) {
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> raw(300);
  for (float& v : raw) v = normal(gen);
  raw[17] = raw[42] = 9.0f;  // tied best: lower id first in the top list
  SamplingParams p = Params(0.7f, 8);
  p.top_k = 10;
  p.repetition_penalty = 1.3f;
  p.logit_bias = {{5, 3.0f}, {17, -kInf}};
  p.logprobs = true;
  p.n_top_logprobs = 5;
  Sampler s(p, 300);
  s.AddPromptTokens(std::vector<int32_t>{1, 2, 3, 42});
  std::vector<double> expected = LogSoftmax(raw);
  std::vector<int32_t> order(300);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return raw[a] > raw[b]; });
  for (int step = 0; step < 20; ++step) {
    std::vector<float> z = raw;
    SampleResult r = s.Sample(z);
    EXPECT_NEAR(r.logprob, expected[static_cast<size_t>(r.token)], 1e-5);
    ASSERT_EQ(r.top.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(r.top[j].token, order[j]);
      EXPECT_NEAR(r.top[j].logprob, expected[static_cast<size_t>(order[j])], 1e-5);
    }
  }
}

TEST(SamplerTest, ProcessedLogprobsFollowBiasAndPenaltiesAtTemperatureOne) {
  const std::vector<float> raw = {1.0f, 2.0f, 0.5f, -1.0f, 0.0f};
  SamplingParams p = Params(0.3f, 8);
  p.presence_penalty = 1.0f;
  p.logit_bias = {{3, 2.5f}, {4, -kInf}};
  p.logprobs = true;
  p.n_top_logprobs = 5;
  p.logprob_mode = LogprobMode::kProcessed;
  Sampler s(p, 5);
  for (int step = 0; step < 10; ++step) {
    std::vector<float> z = raw;
    SampleResult r = s.Sample(z);
    std::vector<double> expected = LogSoftmax(z);  // z now holds the processed logits
    EXPECT_NEAR(r.logprob, expected[static_cast<size_t>(r.token)], 1e-5);
    ASSERT_EQ(r.top.size(), 5u);
    EXPECT_EQ(r.top[4].token, 4);
    EXPECT_EQ(r.top[4].logprob, -kInf);
    for (size_t j = 0; j < 4; ++j) {  // descending, and the values of log_softmax
      EXPECT_GE(r.top[j].logprob, r.top[j + 1].logprob);
      EXPECT_NEAR(r.top[j].logprob, expected[static_cast<size_t>(r.top[j].token)], 1e-5);
    }
  }
}

TEST(SamplerTest, LogprobsOnlyWhenAsked) {
  Sampler s(Params(1.0f), 3);
  std::vector<float> z = {0.0f, 1.0f, 2.0f};
  SampleResult r = s.Sample(z);
  EXPECT_TRUE(r.top.empty());
  EXPECT_EQ(r.logprob, 0.0f);
  SamplingParams p = Params(1.0f);
  p.logprobs = true;
  Sampler t(p, 3);
  z = {0.0f, 0.0f, 0.0f};
  r = t.Sample(z);
  EXPECT_TRUE(r.top.empty());
  EXPECT_NEAR(r.logprob, -std::log(3.0), 1e-6);
}

// ---------------------------------------------------------------- against a plain reference

// The documented semantics written the slow, obvious way: full sort, maps for the penalties.
class ReferenceSampler {
 public:
  ReferenceSampler(const SamplingParams& p, int32_t vocab) : p_(p), vocab_(vocab), rng_(p.seed) {}

  void AddPromptToken(int32_t t) { seen_.insert(t); }

  int32_t Sample(std::vector<float>& z) {
    const float fmax = std::numeric_limits<float>::max();
    auto clamp = [&](float& v) {
      if (std::isnan(v)) v = -kInf;
      if (v > fmax) v = fmax;
    };
    for (float& v : z) clamp(v);
    for (auto [id, b] : p_.logit_bias) z[static_cast<size_t>(id)] += b;
    if (p_.repetition_penalty != 1.0f) {
      for (int32_t id : seen_) {
        float& v = z[static_cast<size_t>(id)];
        v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
      }
    }
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
      for (auto [id, c] : counts_) {
        z[static_cast<size_t>(id)] -= p_.frequency_penalty * static_cast<float>(c);
        z[static_cast<size_t>(id)] -= p_.presence_penalty;
      }
    }
    for (float& v : z) clamp(v);
    const int32_t token = Choose(z, rng_() >> 11);
    seen_.insert(token);
    ++counts_[token];
    return token;
  }

 private:
  int32_t Choose(const std::vector<float>& z, uint64_t r) const {
    const int32_t argmax = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    const float z_max = z[static_cast<size_t>(argmax)];
    if (p_.temperature == 0.0f || z_max == -kInf) return argmax;
    const float inv_t = 1.0f / p_.temperature;
    std::vector<float> w;
    std::vector<uint64_t> fixed;
    for (float v : z) {
      w.push_back(sampling::ExpNonPositive((v - z_max) * inv_t));
      fixed.push_back(sampling::FixedWeight(w.back()));
    }
    // Candidates in rank order: (z descending, id ascending).
    std::vector<int32_t> kept;
    for (int32_t i = 0; i < vocab_; ++i) {
      if (z[static_cast<size_t>(i)] != -kInf) kept.push_back(i);
    }
    std::stable_sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    if (p_.top_k > 0 && p_.top_k < vocab_ && kept.size() > static_cast<size_t>(p_.top_k)) {
      kept.resize(p_.top_k);
    }
    if (p_.top_p < 1.0f) {
      uint64_t total = 0;
      for (int32_t id : kept) total += fixed[static_cast<size_t>(id)];
      // Exact: ceil(top_p * total) through long double would round; use the kernel's helper.
      const uint64_t need = sampling::CeilScaled(p_.top_p, total);
      uint64_t cumulative = 0;
      for (size_t j = 0; j < kept.size(); ++j) {
        cumulative += fixed[static_cast<size_t>(kept[j])];
        if (cumulative >= need) {
          kept.resize(j + 1);
          break;
        }
      }
    }
    std::erase_if(kept, [&](int32_t id) { return w[static_cast<size_t>(id)] < p_.min_p; });
    std::sort(kept.begin(), kept.end());
    uint64_t total = 0;
    for (int32_t id : kept) total += fixed[static_cast<size_t>(id)];
    const auto target = static_cast<uint64_t>((static_cast<unsigned __int128>(r) * total) >> 53);
    uint64_t cumulative = 0;
    for (int32_t id : kept) {
      cumulative += fixed[static_cast<size_t>(id)];
      if (cumulative > target) return id;
    }
    ADD_FAILURE() << "no token drawn";
    return -1;
  }

  SamplingParams p_;
  int32_t vocab_;
  std::mt19937_64 rng_;
  std::set<int32_t> seen_;
  std::map<int32_t, int32_t> counts_;
};

TEST(SamplerTest, MatchesAPlainReferenceOnRandomRequests) {
  std::mt19937 gen(99);
  auto pick = [&](auto values) {
    return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(gen)];
  };
  int n_sampled_steps = 0;
  for (int c = 0; c < 200; ++c) {
    const int32_t vocab = pick(std::vector<int32_t>{1, 2, 5, 60, 1000, 5000});
    SamplingParams p;
    p.seed = gen();
    p.temperature = pick(std::vector<float>{0.0f, 0.3f, 0.7f, 1.0f, 1.6f});
    p.top_k = pick(std::vector<int32_t>{0, 0, 1, 3, 40, 600, 4000});
    p.top_p = pick(std::vector<float>{1.0f, 1.0f, 0.95f, 0.6f, 0.1f});
    p.min_p = pick(std::vector<float>{0.0f, 0.0f, 0.05f, 0.4f});
    p.repetition_penalty = pick(std::vector<float>{1.0f, 1.2f, 0.8f});
    p.presence_penalty = pick(std::vector<float>{0.0f, 0.7f, -0.5f});
    p.frequency_penalty = pick(std::vector<float>{0.0f, 0.3f});
    for (int b = pick(std::vector<int>{0, 0, 3}); b > 0; --b) {
      p.logit_bias.push_back({std::uniform_int_distribution<int32_t>(0, vocab - 1)(gen),
                              pick(std::vector<float>{-kInf, -5.0f, 2.0f, 30.0f})});
    }
    ASSERT_TRUE(ValidateSamplingParams(p, vocab).ok());
    Sampler sampler(p, vocab);
    ReferenceSampler reference(p, vocab);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i)
      prompt.push_back(std::uniform_int_distribution<int32_t>(0, vocab - 1)(gen));
    sampler.AddPromptTokens(prompt);
    for (int32_t t : prompt) reference.AddPromptToken(t);
    const bool coarse = gen() % 2 == 0;  // quantised logits: many ties
    // Flat logits make nuclei of thousands of tokens.
    std::normal_distribution<float> normal(0.0f,
                                           coarse ? 2.0f : pick(std::vector<float>{0.3f, 3.0f}));
    for (int step = 0; step < 12; ++step) {
      std::vector<float> z(static_cast<size_t>(vocab));
      for (float& v : z) v = coarse ? std::round(normal(gen)) : normal(gen);
      if (gen() % 4 == 0) z[gen() % z.size()] = -kInf;
      if (gen() % 8 == 0) z[gen() % z.size()] = kNaN;
      std::vector<float> zr = z;
      const int32_t got = sampler.Sample(z).token;
      ASSERT_EQ(got, reference.Sample(zr)) << "case " << c << " step " << step;
      ASSERT_EQ(z, zr) << "processed logits, case " << c;
      n_sampled_steps += p.temperature > 0.0f;
    }
  }
  EXPECT_GT(n_sampled_steps, 1200);
}

}  // namespace
}  // namespace kestrel
