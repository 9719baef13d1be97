// What a request gets must not depend on what else runs: a greedy request gives the same tokens
// (and, with the reference kernels, bitwise the same logprobs) alone, in a batch of 32 with
// chunked prefills, after a prefix-cache hit, when a small KV pool forces preemptions, and with
// or without asynchronous scheduling (the host one step ahead of the device).
//
// Batch invariance of the CPU forward (measured by CpuForwardBatchInvariance below): the
// reference kernels compute every row the same way whatever the batch, so they are bitwise
// invariant. The AVX2 Linear streams W with 8-lane partial sums for up to kDirectMaxRows (16)
// token rows and switches to a packed kernel with one sequential FMA chain per output above
// that, so a row's logits change in the last bits (about 1e-5) when the step holds more than 16
// tokens. Tests with the fast kernels therefore compare tokens exactly and logprobs to 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {
namespace {

using testing::Collect;
using testing::Collected;
using testing::LoadModel;
using testing::RunConcurrently;
using testing::RunOneByOne;
using testing::WaitIdle;

EngineConfig Config(int32_t max_num_seqs, int32_t max_batched_tokens, bool prefix_caching) {
  EngineConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_batched_tokens = max_batched_tokens;
  c.prefix_caching = prefix_caching;
  return c;
}

EngineRequest Greedy(std::vector<int32_t> prompt, int32_t max_new) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.logprobs = true;
  r.max_new_tokens = max_new;
  r.ignore_eos = true;
  return r;
}

// n prompts of lengths 1..120 over vocab 512; groups of them share stems so that prefix-cache
// hits happen inside the batch too.
std::vector<EngineRequest> FixtureRequests(int n, int32_t max_new) {
  std::mt19937 gen(7);
  std::vector<std::vector<int32_t>> stems(4);
  for (auto& stem : stems)
    for (int i = 0; i < 64; ++i) stem.push_back(static_cast<int32_t>(gen() % 512));
  std::vector<EngineRequest> out;
  for (int i = 0; i < n; ++i) {
    const int32_t len = 1 + (i * 37) % 120;
    std::vector<int32_t> prompt;
    for (int32_t t = 0; t < len; ++t) {
      prompt.push_back(t < 64 ? stems[static_cast<size_t>(i % 4)][static_cast<size_t>(t)]
                              : static_cast<int32_t>(gen() % 512));
    }
    out.push_back(Greedy(std::move(prompt), max_new));
  }
  return out;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Tokens equal; logprobs bitwise (max_logprob_diff == 0) or within the tolerance.
void ExpectSame(const std::vector<Collected>& got, const std::vector<Collected>& want,
                float max_logprob_diff, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int n_differing = 0, n_total = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].finished) << what << " request " << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << " request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << " request " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      n_differing += Bits(got[i].logprobs[t]) != Bits(want[i].logprobs[t]);
      ++n_total;
      if (max_logprob_diff == 0.0f) {
        EXPECT_EQ(Bits(got[i].logprobs[t]), Bits(want[i].logprobs[t]))
            << what << " request " << i << " token " << t;
      } else {
        EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], max_logprob_diff)
            << what << " request " << i << " token " << t;
      }
    }
  }
  std::printf("[ info     ] %s: %d of %d sampled-token logprobs differ bitwise from solo\n",
              what.c_str(), n_differing, n_total);
}

// Solo, batched (chunked prefills mixed with decodes), again from the prefix cache, and under
// constant preemption: the same tokens and bitwise the same logprobs. Returns the solo results.
std::vector<Collected> CheckInvariance(ModelLoadOptions::KvCacheDType kv) {
  const std::vector<EngineRequest> reqs = FixtureRequests(32, 16);
  const std::string dir = testing::FixtureModelDir();
  const CpuKernels ref = CpuKernels::kReference;

  Engine solo(LoadModel(dir, 512, ref, kv), nullptr, {}, Config(1, 2048, false));
  solo.Start();
  const std::vector<Collected> want = RunOneByOne(solo, reqs);

  // 32 at once; a budget of 64 tokens chunks the long prompts and mixes them with decodes.
  Engine batched(LoadModel(dir, 4096, ref, kv), nullptr, {}, Config(32, 64, true));
  ExpectSame(RunConcurrently(batched, reqs, /*start_after_submit=*/true), want, 0.0f, "batched");
  // Everything again, one by one: now served from the prefix cache.
  const std::vector<Collected> again = RunOneByOne(batched, reqs);
  ExpectSame(again, want, 0.0f, "prefix hit");
  for (size_t i = 0; i < reqs.size(); ++i) {
    const int32_t n_prompt = static_cast<int32_t>(reqs[i].prompt_ids.size());
    EXPECT_EQ(again[i].usage.cached_tokens, (n_prompt - 1) / 16 * 16) << i;
    EXPECT_EQ(again[i].usage.prompt_tokens, n_prompt);
  }
  EngineMetrics m = WaitIdle(batched);
  EXPECT_GT(m.prompt_tokens_cached, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);

  // 10 blocks of 16 tokens for 32 requests of up to 136 tokens: constant preemption.
  Engine tight(LoadModel(dir, 160, ref, kv), nullptr, {}, Config(32, 64, true));
  ExpectSame(RunConcurrently(tight, reqs, true), want, 0.0f, "preempted");
  m = WaitIdle(tight);
  EXPECT_GT(m.preemptions, 10u);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_total, 10);
  return want;
}

TEST(EngineExactnessTest, ReferenceKernelsAreBitwiseInvariantToBatchingCachingAndPreemption) {
  CheckInvariance(ModelLoadOptions::KvCacheDType::kAuto);
}

// CheckInvariance with the KV cache in `kv`, then its first tokens against the f32 cache's:
// how many are equal, and the largest |logprob difference| (printed as `name`).
struct FirstTokens {
  int same = 0;
  double worst = 0;
};
FirstTokens CheckInvarianceAgainstF32(ModelLoadOptions::KvCacheDType kv, const char* name) {
  const std::vector<Collected> f32 = CheckInvariance(ModelLoadOptions::KvCacheDType::kAuto);
  const std::vector<Collected> other = CheckInvariance(kv);
  FirstTokens r;
  for (size_t i = 0; i < f32.size(); ++i) {
    r.same += other[i].tokens[0] == f32[i].tokens[0];
    r.worst = std::max(r.worst,
                       std::fabs(static_cast<double>(other[i].logprobs[0]) - f32[i].logprobs[0]));
  }
  std::printf(
      "[ info     ] %s KV: first token equal to f32 in %d of %zu requests, max |logprob "
      "diff| %.4f\n",
      name, r.same, f32.size(), r.worst);
  return r;
}

// The int8 KV cache (--kv-cache-dtype int8) keeps every one of those invariances (a block holds
// the same codes whoever wrote it), and its greedy tokens stay those of the f32 cache as long as
// the f32 logprob margin is clear (this fixture's flat logits make near-ties common).
TEST(EngineExactnessTest, Int8KvCacheIsInvariantTooAndStaysNearF32) {
  EXPECT_GE(CheckInvarianceAgainstF32(ModelLoadOptions::KvCacheDType::kInt8, "int8").same, 30);
}

// The bf16 KV cache on the CPU (--kv-cache-dtype bf16: half the f32 cache's bytes) keeps them too;
// its rounding (2^-9 relative per value) moves the logprobs far less than int8's.
TEST(EngineExactnessTest, Bf16KvCacheIsInvariantTooAndStaysNearF32) {
  const FirstTokens r = CheckInvarianceAgainstF32(ModelLoadOptions::KvCacheDType::kBf16, "bf16");
  EXPECT_GE(r.same, 31);
  EXPECT_GT(r.worst, 0.0) << "the bf16 cache was not used";
}

// The forward itself: one decode row alone, then inside a batch whose other sequence prefills
// kDirectMaxRows - 1 tokens (the streaming Linear either way) or kDirectMaxRows + 4 tokens
// (the packed Linear for the batch).
TEST(EngineExactnessTest, CpuForwardBatchInvariance) {
  for (CpuKernels kernels : {CpuKernels::kReference, CpuKernels::kAuto}) {
    std::unique_ptr<Model> model = LoadModel(testing::TinyModelDir(), 512, kernels);
    ASSERT_NE(model, nullptr);
    const std::string name = model->kernels_name();
    const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
    // Sequence A: blocks 0-3, 20 prompt tokens then a decode at position 20. B: blocks 8-11.
    auto forward = [&](int32_t a_begin, int32_t a_end, int32_t n_b, std::vector<float>* logits) {
      std::vector<int32_t> ids, pos, slots, starts{0}, ctx, tables, rows;
      auto add = [&](int32_t first_block, int32_t begin, int32_t end) {
        for (int32_t t = begin; t < end; ++t) {
          ids.push_back((t * 37 + first_block * 11) % 8000);
          pos.push_back(t);
          slots.push_back((first_block + t / 16) * 16 + t % 16);
        }
        starts.push_back(static_cast<int32_t>(ids.size()));
        ctx.push_back(end);
        rows.push_back(static_cast<int32_t>(ids.size()) - 1);
        for (int32_t b = 0; b < 4; ++b) tables.push_back(first_block + b);
      };
      add(0, a_begin, a_end);
      if (n_b > 0) add(8, 0, n_b);
      Batch batch;
      batch.token_ids = ids;
      batch.positions = pos;
      batch.slot_mapping = slots;
      batch.seq_starts = starts;
      batch.context_lens = ctx;
      batch.block_tables = tables;
      batch.max_blocks_per_seq = 4;
      batch.logits_indices = rows;
      logits->assign(rows.size() * static_cast<size_t>(vocab), 0.0f);
      model->Forward(batch, logits->data());
    };
    std::vector<float> alone, batched;
    forward(0, 20, 0, &alone);  // A's prompt
    forward(20, 21, 0, &alone);
    constexpr int32_t kDirect = static_cast<int32_t>(cpu::kDirectMaxRows);
    static_assert(kDirect + 4 <= 64, "B's 4 blocks hold 64 tokens");
    for (int32_t n_b : {kDirect - 1, kDirect + 4}) {
      forward(20, 21, n_b, &batched);
      int n_diff = 0;
      float max_diff = 0;
      for (size_t v = 0; v < static_cast<size_t>(vocab); ++v) {
        n_diff += Bits(alone[v]) != Bits(batched[v]);
        max_diff = std::max(max_diff, std::abs(alone[v] - batched[v]));
      }
      const int32_t n_rows = 1 + n_b;
      RecordProperty(name + "_rows" + std::to_string(n_rows) + "_differing_logits", n_diff);
      std::printf(
          "[ info     ] %s kernels, decode row in a %d-row batch: %d of %d logits differ, "
          "max |diff| %g\n",
          name.c_str(), n_rows, n_diff, vocab, static_cast<double>(max_diff));
      if (name == "reference" || n_rows <= kDirect) {
        EXPECT_EQ(n_diff, 0) << name << " " << n_rows;  // same kernel path: bitwise
      } else {
        EXPECT_LT(max_diff, 1e-4f);  // packed vs streaming Linear: rounding only
      }
    }
  }
}

// kestrel-tiny with the fast kernels, prompts from real Python text.
class TinyModelEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<Tokenizer> tok = Tokenizer::FromDirectory(testing::TinyModelDir());
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tokenizer_ = new Tokenizer(std::move(*tok));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  static std::vector<EngineRequest> Requests(int n, int32_t max_new) {
    const std::string text =
        "import os\nimport sys\n\n\ndef read_config(path):\n    \"\"\"Read a config file and "
        "return a dict.\"\"\"\n    result = {}\n    with open(path) as f:\n        for line in "
        "f:\n            line = line.strip()\n            if not line or line.startswith('#'):\n"
        "                continue\n            key, _, value = line.partition('=')\n"
        "            result[key.strip()] = value.strip()\n    return result\n\n\nclass "
        "Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = "
        "{}\n\n    def get(self, key, default=None):\n        return self.items.get(key, "
        "default)\n";
    const std::vector<int32_t> ids = tokenizer_->Encode(text);
    std::vector<EngineRequest> out;
    for (int i = 0; i < n; ++i) {
      const size_t start = static_cast<size_t>((i % 4) * 9);
      const size_t len = std::min<size_t>(3 + static_cast<size_t>(i * 29) % 90, ids.size() - start);
      out.push_back(
          Greedy(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(start),
                                      ids.begin() + static_cast<std::ptrdiff_t>(start + len)),
                 max_new));
    }
    return out;
  }

  static std::vector<int32_t> EosIds() { return {8002, 8000}; }
  static Tokenizer* tokenizer_;
};

Tokenizer* TinyModelEngineTest::tokenizer_ = nullptr;

TEST_F(TinyModelEngineTest, GreedyTokensAreTheSameAloneBatchedCachedAndPreempted) {
  const std::vector<EngineRequest> reqs = Requests(32, 20);
  const std::string dir = testing::TinyModelDir();
  Engine solo(LoadModel(dir, 2048), tokenizer_, EosIds(), Config(1, 2048, false));
  solo.Start();
  const std::vector<Collected> want = RunOneByOne(solo, reqs);

  Engine batched(LoadModel(dir, 2048), tokenizer_, EosIds(), Config(32, 256, true));
  ExpectSame(RunConcurrently(batched, reqs, /*start_after_submit=*/true), want, 1e-4f, "batched");
  const std::vector<Collected> again = RunOneByOne(batched, {reqs[5], reqs[31]});
  ExpectSame(again, {want[5], want[31]}, 1e-4f, "prefix hit");
  EXPECT_GT(again[0].usage.cached_tokens, 0);
  EXPECT_GT(again[1].usage.cached_tokens, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_FALSE(want[i].text.empty()) << i;

  // 16 blocks of 16 tokens for 32 requests of up to 112 tokens.
  Engine tight(LoadModel(dir, 256), tokenizer_, EosIds(), Config(32, 256, true));
  const std::vector<Collected> preempted = RunConcurrently(tight, reqs, true);
  ExpectSame(preempted, want, 1e-4f, "preempted");
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(preempted[i].text, want[i].text) << i;
  const EngineMetrics m = WaitIdle(tight);
  EXPECT_GT(m.preemptions, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// Asynchronous scheduling (the host plans and enqueues step N+1 before step N's tokens are
// known) changes which rows a step holds (a sequence that finishes at step N still has a row in
// step N+1, thrown away) but nothing a request sees: with the reference kernels (bitwise
// batch-invariant) every request's tokens, text, finish reason, usage and logprobs equal those
// of synchronous scheduling. The requests mix greedy and seeded sampling with every penalty
// (their state must take token N before step N+1 is sampled), stop strings, EOS and lengths
// from 1; a small pool adds preemptions of sequences whose token is still pending.
TEST_F(TinyModelEngineTest, AsyncSchedulingChangesNothingARequestSees) {
  std::vector<EngineRequest> reqs = Requests(24, 1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EngineRequest& r = reqs[i];
    r.max_new_tokens = 1 + static_cast<int32_t>((i * 7) % 24);
    r.ignore_eos = i % 3 != 0;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 1000 + i;
      r.sampling.top_p = 0.9f;
      r.sampling.presence_penalty = 0.5f;
      r.sampling.frequency_penalty = 0.3f;
      r.sampling.repetition_penalty = 1.2f;
    }
    if (i % 4 == 2) r.stop = {"\n", "return"};
  }
  const std::string dir = testing::TinyModelDir();
  auto make = [&](bool async, int64_t kv_tokens) {
    EngineConfig c = Config(16, 64, true);
    c.async_scheduling = async;
    return std::make_unique<Engine>(LoadModel(dir, kv_tokens, CpuKernels::kReference), tokenizer_,
                                    EosIds(), c);
  };
  auto sync = make(false, 4096);
  const std::vector<Collected> want = RunConcurrently(*sync, reqs, /*start_after_submit=*/true);
  for (bool tight : {false, true}) {
    auto async = make(true, tight ? 256 : 4096);
    const std::vector<Collected> got = RunConcurrently(*async, reqs, true);
    const std::string what = tight ? "async, preempted" : "async";
    ExpectSame(got, want, 0.0f, what);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].text, want[i].text) << what << " request " << i;
      EXPECT_EQ(got[i].usage.completion_tokens, want[i].usage.completion_tokens) << i;
      EXPECT_EQ(got[i].usage.completion_tokens, static_cast<int32_t>(got[i].tokens.size())) << i;
      EXPECT_EQ(got[i].n_events, want[i].n_events) << what << " request " << i;
    }
    const EngineMetrics m = WaitIdle(*async);
    EXPECT_EQ(m.kv_blocks_used, 0);
    if (tight) {
      EXPECT_GT(m.preemptions, 0u);
    }
  }
}

// A request cancelled while its next token is being sampled reports only the tokens it sent.
TEST_F(TinyModelEngineTest, CancelledWhileATokenIsPendingCountsOnlyDeliveredTokens) {
  EngineConfig c = Config(4, 256, true);
  c.async_scheduling = true;
  Engine engine(LoadModel(testing::TinyModelDir(), 4096), tokenizer_, EosIds(), c);
  engine.Start();
  for (int round = 0; round < 5; ++round) {
    EngineRequest r = Requests(1, 1000)[0];
    std::shared_ptr<RequestHandle> h = testing::MustSubmit(engine, r);
    ASSERT_NE(h, nullptr);
    RequestOutput ev;
    int n_tokens = 0;
    while (n_tokens < 2 + round) {
      if (h->Next(&ev, std::chrono::milliseconds(100))) {
        n_tokens += static_cast<int>(ev.token_ids.size());
      }
    }
    h->Cancel();
    const Collected rest = Collect(*h);
    EXPECT_EQ(rest.reason, FinishReason::kCancelled);
    EXPECT_EQ(rest.usage.completion_tokens, n_tokens + static_cast<int>(rest.tokens.size()));
  }
  const EngineMetrics m = WaitIdle(engine);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_cancelled, 5u);
}

}  // namespace
}  // namespace kestrel
