#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"
#include "sampling/logit_kernels.h"

namespace kestrel {
namespace {

using sampling::ExpNonPositive;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kMaxTopLogprobs = 20;

// A token still in the running: its processed logit, its weight exp((z - z_max) / T), its id.
struct Candidate {
  float z;
  float w;
  int32_t id;
};

// The ranking of top-k and top-p: higher logit first, lower id first among equal logits.
inline bool Better(const Candidate& a, const Candidate& b) {
  return a.z > b.z || (a.z == b.z && a.id < b.id);
}

// Per-call working memory, shared by every sampler running on this thread.
struct Scratch {
  std::vector<float> weights;         // [vocab]
  std::vector<Candidate> candidates;  // [vocab]
};

Scratch& ThreadScratch(size_t vocab) {
  thread_local Scratch scratch;
  if (scratch.weights.size() < vocab) {
    scratch.weights.resize(vocab);
    scratch.candidates.resize(vocab);
  }
  return scratch;
}

// Below this size top-k keeps a heap of the k best while scanning (most tokens cost one compare);
// above it, nth_element over all finite tokens.
constexpr int32_t kHeapTopKLimit = 512;

// Writes the k best finite tokens (by Better) to out, in no particular order; returns their count.
size_t SelectTopK(std::span<const float> z, int32_t k, Candidate* out) {
  const size_t vocab = z.size();
  if (k <= kHeapTopKLimit) {
    // Heap ordered by Better, so the front is the worst of the k kept so far.
    Candidate* heap = out;
    size_t n = 0;
    // Once the heap is full, ids only grow, so a token must beat the worst logit strictly.
    float worst = kNegInf;
    for (size_t i = 0; i < vocab; ++i) {
      if (z[i] <= worst) continue;  // also skips -inf
      const Candidate c{z[i], 0.0f, static_cast<int32_t>(i)};
      if (n < static_cast<size_t>(k)) {
        heap[n++] = c;
        std::push_heap(heap, heap + n, Better);
        if (n == static_cast<size_t>(k)) worst = heap[0].z;
      } else {
        std::pop_heap(heap, heap + n, Better);
        heap[n - 1] = c;
        std::push_heap(heap, heap + n, Better);
        worst = heap[0].z;
      }
    }
    return n;
  }
  size_t n = 0;
  for (size_t i = 0; i < vocab; ++i) {
    if (z[i] != kNegInf) out[n++] = {z[i], 0.0f, static_cast<int32_t>(i)};
  }
  if (n > static_cast<size_t>(k)) {
    std::nth_element(out, out + (k - 1), out + n, Better);
    n = static_cast<size_t>(k);
  }
  return n;
}

// Reorders cands[0, n) so that cands[0, r) is the smallest prefix of the ranking whose fixed-point
// weight reaches need, and returns r (n if even all of them fall short). Selects by mass like
// quickselect: no full sort, and exact because the sums are integers.
size_t NucleusByMass(Candidate* cands, size_t n, uint64_t need) {
  size_t lo = 0, hi = n;  // the answer lies in (lo, hi]; cands[0, lo) are in, with need left
  while (hi - lo > 64) {
    // Median of three (by rank) as the pivot, moved to the end of the range.
    Candidate* a = cands + lo;
    Candidate* b = cands + lo + (hi - lo) / 2;
    Candidate* c = cands + hi - 1;
    if (Better(*b, *a)) std::swap(*a, *b);
    if (Better(*c, *b)) std::swap(*b, *c);
    if (Better(*b, *a)) std::swap(*a, *b);
    std::swap(*b, cands[hi - 1]);
    const Candidate pivot = cands[hi - 1];
    Candidate* mid = std::partition(cands + lo, cands + hi - 1,
                                    [&pivot](const Candidate& x) { return Better(x, pivot); });
    std::swap(*mid, cands[hi - 1]);  // pivot in its ranked place
    const size_t p = static_cast<size_t>(mid - cands);
    uint64_t above = 0;
    for (size_t j = lo; j < p; ++j) above += sampling::FixedWeight(cands[j].w);
    if (above >= need) {
      hi = p;
    } else if (above + sampling::FixedWeight(pivot.w) >= need) {
      return p + 1;
    } else {
      need -= above + sampling::FixedWeight(pivot.w);
      lo = p + 1;
    }
  }
  std::sort(cands + lo, cands + hi, Better);
  uint64_t cumulative = 0;
  for (size_t j = lo; j < hi; ++j) {
    cumulative += sampling::FixedWeight(cands[j].w);
    if (cumulative >= need) return j + 1;
  }
  return hi;
}

// Top-p over the whole vocabulary (w: every token's weight). Tokens are gathered in bands of
// decreasing weight until the gathered ones carry enough; the nucleus, a prefix of the ranking,
// lies inside them.
size_t TopPOfVocab(std::span<const float> z, std::span<const float> w, uint64_t need,
                   Candidate* out) {
  const float cuts[] = {std::exp(-4.0f), std::exp(-12.0f), std::exp(-24.0f),
                        std::numeric_limits<float>::denorm_min()};
  float upper = std::numeric_limits<float>::infinity();
  size_t m = 0;
  uint64_t mass = 0;
  for (float cut : cuts) {
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] >= cut && w[i] < upper) {
        out[m++] = {z[i], w[i], static_cast<int32_t>(i)};
        mass += sampling::FixedWeight(w[i]);
      }
    }
    upper = cut;
    if (mass >= need) break;
  }
  return NucleusByMass(out, m, need);
}

// The draw over a vocabulary-wide weight array (0 = not kept), in id order.
int32_t WalkVocab(std::span<const float> w, uint64_t r53) {
  const uint64_t target = sampling::DrawTarget(r53, sampling::FixedWeightSum(w));
  uint64_t cumulative = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    cumulative += sampling::FixedWeight(w[i]);
    if (cumulative > target) return static_cast<int32_t>(i);
  }
  KCHECK_MSG(false, "no token with positive weight");
  return 0;
}

// The same draw over a kept list. A large list not in id order is scattered into the
// vocabulary-wide array w instead of sorted.
int32_t WalkList(Candidate* cands, size_t n, bool in_id_order, uint64_t r53, std::span<float> w) {
  if (!in_id_order) {
    if (n > w.size() / 16) {
      std::fill(w.begin(), w.end(), 0.0f);
      for (size_t j = 0; j < n; ++j) w[static_cast<size_t>(cands[j].id)] = cands[j].w;
      return WalkVocab(w, r53);
    }
    std::sort(cands, cands + n, [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }
  uint64_t total = 0;
  for (size_t j = 0; j < n; ++j) total += sampling::FixedWeight(cands[j].w);
  const uint64_t target = sampling::DrawTarget(r53, total);
  uint64_t cumulative = 0;
  for (size_t j = 0; j < n; ++j) {
    cumulative += sampling::FixedWeight(cands[j].w);
    if (cumulative > target) return cands[j].id;
  }
  KCHECK_MSG(false, "no token with positive weight");
  return 0;
}

std::string FloatText(float v) {
  return std::to_string(v);
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p, int32_t vocab_size) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return InvalidArgument("temperature must be a finite number >= 0, got " +
                           FloatText(p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + FloatText(p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + FloatText(p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be a finite number > 0, got " +
                           FloatText(p.repetition_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " +
                           FloatText(p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " +
                           FloatText(p.frequency_penalty));
  }
  if (p.n_top_logprobs < 0 || p.n_top_logprobs > kMaxTopLogprobs) {
    return InvalidArgument("top_logprobs must be in [0, 20], got " +
                           std::to_string(p.n_top_logprobs));
  }
  if (p.n_top_logprobs > 0 && !p.logprobs) {
    return InvalidArgument("top_logprobs requires logprobs to be enabled");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || (vocab_size >= 0 && id >= vocab_size)) {
      std::string range = vocab_size >= 0 ? "[0, " + std::to_string(vocab_size) + ")" : ">= 0";
      return InvalidArgument("logit_bias token id " + std::to_string(id) +
                             " is outside the vocabulary " + range);
    }
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return InvalidArgument("logit_bias for token " + std::to_string(id) +
                             " must be a number (or -inf), got " + FloatText(bias));
    }
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size), rng_(params.seed) {
  KCHECK(vocab_size > 0 && vocab_size <= sampling::kMaxFixedWeightTokens);
  KCHECK_MSG(ValidateSamplingParams(params, vocab_size).ok(),
             "SamplingParams must be validated before building a Sampler");
  const size_t vocab = static_cast<size_t>(vocab_size);
  if (uses_repetition()) seen_.assign(vocab, 0);
  if (uses_counts()) generated_count_.assign(vocab, 0);
  if (params_.logprobs && params_.logprob_mode == LogprobMode::kRaw) raw_logits_.resize(vocab);
}

void Sampler::AddPromptTokens(std::span<const int32_t> tokens) {
  if (!uses_repetition()) return;
  for (int32_t t : tokens) {
    KCHECK(t >= 0 && t < vocab_size_);
    if (!seen_[t]) {
      seen_[t] = 1;
      seen_ids_.push_back(t);
    }
  }
}

void Sampler::Accept(int32_t token) {
  KCHECK(token >= 0 && token < vocab_size_);
  if (uses_repetition() && !seen_[token]) {
    seen_[token] = 1;
    seen_ids_.push_back(token);
  }
  if (uses_counts() && generated_count_[token]++ == 0) generated_ids_.push_back(token);
}

void Sampler::ApplyBiasAndPenalties(std::span<float> logits) const {
  for (const auto& [id, bias] : params_.logit_bias) {
    KCHECK(id >= 0 && id < vocab_size_);
    logits[id] += bias;
  }
  if (uses_repetition()) {
    const float r = params_.repetition_penalty;
    for (int32_t id : seen_ids_) {
      float& z = logits[id];
      z = z > 0.0f ? z / r : z * r;
    }
  }
  if (uses_counts()) {
    for (int32_t id : generated_ids_) {
      float& z = logits[id];
      z -= params_.frequency_penalty * static_cast<float>(generated_count_[id]);
      z -= params_.presence_penalty;
    }
  }
}

int32_t Sampler::Draw(std::span<const float> z, float z_max, uint64_t r53) const {
  // Greedy (also for a denormal temperature), or nothing left to sample (all -inf: the tie rule
  // gives token 0).
  const float inv_t = params_.temperature == 0.0f ? 0.0f : 1.0f / params_.temperature;
  if (inv_t == 0.0f || !std::isfinite(inv_t) || z_max == kNegInf) {
    return static_cast<int32_t>(sampling::FirstIndexOf(z, z_max));
  }

  const size_t vocab = z.size();
  Scratch& scratch = ThreadScratch(vocab);
  const std::span<float> w(scratch.weights.data(), vocab);
  Candidate* cands = scratch.candidates.data();
  size_t n = 0;
  bool in_id_order = true;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab) {
    n = SelectTopK(z, params_.top_k, cands);
    uint64_t total = 0;
    for (size_t j = 0; j < n; ++j) {
      cands[j].w = ExpNonPositive((cands[j].z - z_max) * inv_t);
      total += sampling::FixedWeight(cands[j].w);
    }
    if (params_.top_p < 1.0f) {
      n = NucleusByMass(cands, n, sampling::CeilScaled(params_.top_p, total));
    }
    in_id_order = false;
  } else if (params_.min_p > 0.0f && params_.top_p == 1.0f) {
    // Only tokens with w >= min_p count: exponentiate just those above a safe bound, in id order.
    // (The bound is 1% below ln(min_p): far wider than the error of ExpNonPositive.)
    const float x_cut = std::log(params_.min_p) - 0.01f;
    for (size_t i = 0; i < vocab; ++i) {
      const float x = (z[i] - z_max) * inv_t;
      if (x >= x_cut) cands[n++] = {z[i], ExpNonPositive(x), static_cast<int32_t>(i)};
    }
  } else {
    sampling::ComputeWeights(z, z_max, inv_t, w);
    if (params_.top_p < 1.0f) {
      const uint64_t need = sampling::CeilScaled(params_.top_p, sampling::FixedWeightSum(w));
      n = TopPOfVocab(z, w, need, cands);
      in_id_order = false;
    } else {
      return WalkVocab(w, r53);
    }
  }
  if (params_.min_p > 0.0f) {
    const float min_p = params_.min_p;
    Candidate* end =
        std::remove_if(cands, cands + n, [min_p](const Candidate& c) { return c.w < min_p; });
    n = static_cast<size_t>(end - cands);
  }
  KCHECK(n > 0);  // the most probable token (weight exactly 1) survives every truncation
  return WalkList(cands, n, in_id_order, r53, w);
}

void Sampler::FillLogprobs(std::span<float> z, SampleResult* result) const {
  const size_t vocab = z.size();
  const float z_max = sampling::SanitizeAndMax(z);
  // logprob = (z - z_max) - log(sum of exp(z - z_max)), in double (z_max + log(sum) would lose
  // the log term for huge logits). When every logit is -inf every logprob is -inf.
  double log_sum = 0.0;
  if (z_max != kNegInf) {
    const std::span<float> w(ThreadScratch(vocab).weights.data(), vocab);
    sampling::ComputeWeights(z, z_max, 1.0f, w);
    log_sum = std::log(sampling::LaneSum(w));
  }
  auto logprob = [&](int32_t id) {
    if (z_max == kNegInf) return kNegInf;
    return static_cast<float>(static_cast<double>(z[id]) - static_cast<double>(z_max) - log_sum);
  };
  result->logprob = logprob(result->token);

  // The n best by (logit descending, id ascending), kept sorted by insertion.
  const size_t n_top = static_cast<size_t>(params_.n_top_logprobs);
  if (n_top == 0) return;
  std::vector<TokenLogprob>& top = result->top;  // .logprob holds the logit until the end
  top.clear();
  top.reserve(n_top + 1);
  for (size_t i = 0; i < vocab; ++i) {
    const float v = z[i];
    if (top.size() == n_top && !(v > top.back().logprob)) continue;
    auto pos = std::upper_bound(top.begin(), top.end(), v, [](float value, const TokenLogprob& t) {
      return value > t.logprob;
    });
    top.insert(pos, TokenLogprob{static_cast<int32_t>(i), v});
    if (top.size() > n_top) top.pop_back();
  }
  for (TokenLogprob& t : top) t.logprob = logprob(t.token);
}

void Sampler::SetAllowedTokens(std::span<const uint32_t> bitmask) {
  const size_t words = (static_cast<size_t>(vocab_size_) + 31) / 32;
  KCHECK(bitmask.size() >= words);
  allowed_.assign(bitmask.begin(), bitmask.begin() + static_cast<std::ptrdiff_t>(words));
  has_mask_ = true;
}

SampleResult Sampler::Sample(std::span<float> logits) {
  KCHECK(logits.size() == static_cast<size_t>(vocab_size_));
  float z_max = sampling::SanitizeAndMax(logits);
  if (params_.logprobs && params_.logprob_mode == LogprobMode::kRaw) {
    std::copy(logits.begin(), logits.end(), raw_logits_.begin());
  }
  if (!params_.logit_bias.empty() || uses_repetition() || uses_counts()) {
    ApplyBiasAndPenalties(logits);
    // Large biases or a repetition penalty < 1 may overflow to +inf: sanitize again.
    z_max = sampling::SanitizeAndMax(logits);
  }

  if (has_mask_) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (((allowed_[i / 32] >> (i % 32)) & 1u) == 0) logits[i] = -std::numeric_limits<float>::infinity();
    }
    z_max = sampling::SanitizeAndMax(logits);
    has_mask_ = false;
  }

  const uint64_t r53 = rng_() >> 11;  // exactly one draw per step, greedy included

  SampleResult result;
  result.token = Draw(logits, z_max, r53);
  if (params_.logprobs) {
    FillLogprobs(params_.logprob_mode == LogprobMode::kRaw ? std::span<float>(raw_logits_) : logits,
                 &result);
  }
  Accept(result.token);
  return result;
}

}  // namespace kestrel
