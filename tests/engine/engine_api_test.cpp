// The engine's request lifecycle with kestrel-tiny: stop strings, EOS, cancellation (running and
// queued), seeded sampling across batch compositions, queue limits, shutdown, validation and
// metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

namespace kestrel {
namespace {

using testing::Collect;
using testing::Collected;
using testing::LoadModel;
using testing::MustSubmit;
using testing::RunConcurrently;
using testing::RunOneByOne;
using testing::WaitIdle;

class EngineApiTest : public ::testing::Test {
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

  static std::unique_ptr<Engine> MakeEngine(EngineConfig config = EngineConfig{},
                                            int64_t kv_tokens = 2048, bool start = true) {
    auto engine = std::make_unique<Engine>(LoadModel(testing::TinyModelDir(), kv_tokens),
                                           tokenizer_, std::vector<int32_t>{8002, 8000}, config);
    if (start) engine->Start();
    return engine;
  }

  static EngineRequest Request(const std::string& prompt, int32_t max_new, float temperature = 0.0f,
                               uint64_t seed = 0) {
    EngineRequest r;
    r.prompt_ids = tokenizer_->Encode(prompt);
    r.max_new_tokens = max_new;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    if (temperature > 0) {
      r.sampling.top_p = 0.95f;
      r.sampling.top_k = 20;
    }
    r.ignore_eos = true;
    return r;
  }

  static Tokenizer* tokenizer_;
};

Tokenizer* EngineApiTest::tokenizer_ = nullptr;

TEST_F(EngineApiTest, StopStringEndsTheRequestAndIsNeverEmitted) {
  auto engine = MakeEngine();
  const EngineRequest base = Request("def parse_args(argv):\n    parser = ", 48);
  const Collected full = Collect(*MustSubmit(*engine, base));
  ASSERT_EQ(full.reason, FinishReason::kLength);
  ASSERT_EQ(full.tokens.size(), 48u);
  EXPECT_EQ(full.text, tokenizer_->Decode(full.tokens));  // held tails are released at the end
  ASSERT_GE(full.text.size(), 24u);
  // A stop string taken from the middle of the greedy text; output ends right before its first
  // occurrence.
  const std::string stop = full.text.substr(12, 4);
  const size_t first = full.text.find(stop);
  EngineRequest with_stop = base;
  with_stop.stop = {"never appears \x01", stop};
  const Collected cut = Collect(*MustSubmit(*engine, with_stop));
  EXPECT_EQ(cut.reason, FinishReason::kStop);
  EXPECT_EQ(cut.stop_index, 1);  // which stop string ended it
  EXPECT_EQ(full.stop_index, -1);
  EXPECT_EQ(cut.text, full.text.substr(0, first));
  EXPECT_EQ(cut.text.find(stop), std::string::npos);
  ASSERT_LE(cut.tokens.size(), full.tokens.size());
  EXPECT_TRUE(std::equal(cut.tokens.begin(), cut.tokens.end(), full.tokens.begin()));
  // The token that completed the stop string is the last one: the text up to it holds the stop.
  EXPECT_NE(tokenizer_->Decode(cut.tokens).find(stop), std::string::npos);
  const std::vector<int32_t> before_last(cut.tokens.begin(), cut.tokens.end() - 1);
  EXPECT_EQ(tokenizer_->Decode(before_last).find(stop), std::string::npos);
  EXPECT_EQ(cut.usage.completion_tokens, static_cast<int32_t>(cut.tokens.size()));
}

TEST_F(EngineApiTest, EosStopsUnlessIgnored) {
  auto engine = MakeEngine();
  EngineRequest r = Request("x = 1\n", 5);
  r.sampling.logit_bias = {{8002, 100.0f}};  // <|im_end|> wins every step
  r.ignore_eos = false;
  const Collected stopped = Collect(*MustSubmit(*engine, r));
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens, (std::vector<int32_t>{8002}));
  EXPECT_EQ(stopped.text, "");  // EOS is not text
  EXPECT_EQ(stopped.stop_index, -1);
  r.ignore_eos = true;
  const Collected ignored = Collect(*MustSubmit(*engine, r));
  EXPECT_EQ(ignored.reason, FinishReason::kLength);
  EXPECT_EQ(ignored.tokens, std::vector<int32_t>(5, 8002));
}

TEST_F(EngineApiTest, CancellationFreesEveryBlockOfRunningAndQueuedRequests) {
  EngineConfig config;
  config.max_num_seqs = 2;  // the others wait in the queue
  auto engine = MakeEngine(config);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 5; ++i) {
    handles.push_back(MustSubmit(*engine, Request("import os\n" + std::string(i, '#'), 1500)));
  }
  // Running: cancel after a few tokens.
  RequestOutput ev;
  int n_seen = 0;
  while (n_seen < 3) n_seen += handles[0]->Next(&ev, std::chrono::milliseconds(100)) ? 1 : 0;
  handles[0]->Cancel();
  handles[4]->Cancel();  // still queued
  const Collected first = Collect(*handles[0]);
  EXPECT_EQ(first.reason, FinishReason::kCancelled);
  EXPECT_TRUE(first.error.ok());
  EXPECT_LT(first.usage.completion_tokens, 1500);
  const Collected queued = Collect(*handles[4]);
  EXPECT_EQ(queued.reason, FinishReason::kCancelled);
  EXPECT_TRUE(queued.tokens.empty());
  EXPECT_EQ(queued.n_events, 1);
  for (int i = 1; i < 4; ++i) handles[static_cast<size_t>(i)]->Cancel();
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(Collect(*handles[static_cast<size_t>(i)]).reason, FinishReason::kCancelled);
  }
  const EngineMetrics m = WaitIdle(*engine);
  EXPECT_EQ(m.requests_cancelled, 5u);
  EXPECT_EQ(m.kv_blocks_used, 0);  // every block free (some still cached)
  EXPECT_LE(m.kv_blocks_cached_free, m.kv_blocks_total);
  EXPECT_EQ(Collect(*MustSubmit(*engine, Request("a", 1))).reason, FinishReason::kLength);
}

TEST_F(EngineApiTest, SeededSamplingIsReproducibleAcrossRunsAndBatchCompositions) {
  const EngineRequest seeded = Request(
      "class Node:\n    \"\"\"A node of a singly linked list.\"\"\"\n\n    def __init__(self", 24,
      0.8f, 1234);
  ASSERT_GT(seeded.prompt_ids.size(), 16u);  // at least one full block to find again
  auto solo = MakeEngine();
  const Collected alone = Collect(*MustSubmit(*solo, seeded));
  const Collected alone_again = Collect(*MustSubmit(*solo, seeded));  // a prefix hit too
  EXPECT_EQ(alone.tokens, alone_again.tokens);
  EXPECT_GT(alone_again.usage.cached_tokens, 0);

  // The same request inside a batch of others with other seeds and lengths.
  EngineConfig config;
  config.max_batched_tokens = 64;
  auto batched = MakeEngine(config);
  std::vector<EngineRequest> mix;
  for (int i = 0; i < 8; ++i) {
    mix.push_back(
        Request("def f" + std::to_string(i) + "(x):\n    return " + std::string(i * 5, 'x'),
                10 + i * 3, 0.8f, 99 + static_cast<uint64_t>(i)));
    if (i == 3) mix.push_back(seeded);
  }
  const std::vector<Collected> got = RunConcurrently(*batched, mix);
  EXPECT_EQ(got[4].tokens, alone.tokens);
  // Another seed gives another sample (24 tokens at temperature 0.8).
  EngineRequest other = seeded;
  other.sampling.seed = 4321;
  EXPECT_NE(Collect(*MustSubmit(*solo, other)).tokens, alone.tokens);
}

TEST_F(EngineApiTest, QueueLimitAndShutdownBeforeStart) {
  // max_waiting counts beyond the running capacity: 1 running + 1 waiting admitted.
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_waiting = 1;
  auto engine = MakeEngine(config, 2048, /*start=*/false);
  auto a = MustSubmit(*engine, Request("a = 1", 4));
  auto b = MustSubmit(*engine, Request("b = 2", 4));
  Result<std::shared_ptr<RequestHandle>> c = engine->Submit(Request("c = 3", 4));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EngineMetrics m = engine->Metrics();
  EXPECT_EQ(m.waiting, 2);
  EXPECT_EQ(m.requests_rejected, 1u);
  engine->Shutdown(/*cancel_running=*/false);  // never started: queued requests are cancelled
  for (auto& h : {a, b}) {
    const Collected got = Collect(*h);
    EXPECT_EQ(got.reason, FinishReason::kCancelled);
    EXPECT_EQ(got.error.code(), StatusCode::kUnavailable);
  }
  Result<std::shared_ptr<RequestHandle>> late = engine->Submit(Request("d = 4", 4));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine->Metrics().requests_rejected, 2u);
  engine->Start();         // after Shutdown: does nothing
  engine->Shutdown(true);  // idempotent
}

TEST_F(EngineApiTest, AFinishedRequestFreesItsPlaceBeforeItsLastEvent) {
  // One place in all: each request, sent as soon as the previous one's last event arrived, is
  // admitted (the freed place is published before that event, not at the end of the step).
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_waiting = 0;
  auto engine = MakeEngine(config);
  for (int i = 0; i < 50; ++i) {
    Result<std::shared_ptr<RequestHandle>> h = engine->Submit(Request("x = 1", 2));
    ASSERT_TRUE(h.ok()) << "request " << i << ": " << h.status().message();
    EXPECT_EQ(Collect(**h).reason, FinishReason::kLength);
  }
  EXPECT_EQ(engine->Metrics().requests_rejected, 0u);
}

TEST_F(EngineApiTest, ShutdownDrainsOrCancels) {
  auto draining = MakeEngine();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 4; ++i)
    handles.push_back(MustSubmit(*draining, Request(std::string(1, 'x') + std::to_string(i), 8)));
  draining->Shutdown(/*cancel_running=*/false);
  for (auto& h : handles) {
    const Collected got = Collect(*h);
    EXPECT_EQ(got.reason, FinishReason::kLength);
    EXPECT_EQ(got.tokens.size(), 8u);
  }
  EXPECT_EQ(draining->Submit(Request("y", 1)).status().code(), StatusCode::kUnavailable);

  auto cancelling = MakeEngine();
  handles.clear();
  for (int i = 0; i < 4; ++i)
    handles.push_back(
        MustSubmit(*cancelling, Request(std::string(1, 'z') + std::to_string(i), 1500)));
  RequestOutput ev;
  while (!handles[0]->Next(&ev, std::chrono::milliseconds(100))) {
  }
  cancelling->Shutdown(/*cancel_running=*/true);
  for (auto& h : handles) {
    const Collected got = Collect(*h);
    EXPECT_EQ(got.reason, FinishReason::kCancelled);
    EXPECT_EQ(got.error.code(), StatusCode::kUnavailable);
  }
  const EngineMetrics m = cancelling->Metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.requests_cancelled, 4u);
}

TEST_F(EngineApiTest, SubmitRejectsBadRequests) {
  auto engine = MakeEngine(EngineConfig{}, /*kv_tokens=*/512);
  auto code = [&](const EngineRequest& r) { return engine->Submit(r).status().code(); };
  EngineRequest r = Request("ok", 4);
  EXPECT_EQ(code(r), StatusCode::kOk);
  EngineRequest empty = r;
  empty.prompt_ids.clear();
  EXPECT_EQ(code(empty), StatusCode::kInvalidArgument);
  EngineRequest bad_id = r;
  bad_id.prompt_ids.push_back(8064);
  EXPECT_EQ(code(bad_id), StatusCode::kInvalidArgument);
  bad_id.prompt_ids.back() = -1;
  EXPECT_EQ(code(bad_id), StatusCode::kInvalidArgument);
  EngineRequest no_tokens = r;
  no_tokens.max_new_tokens = 0;
  EXPECT_EQ(code(no_tokens), StatusCode::kInvalidArgument);
  const int32_t n_prompt = static_cast<int32_t>(r.prompt_ids.size());
  EngineRequest too_long = r;  // beyond the 512-token KV pool, within the 2048 context
  too_long.max_new_tokens = 512 - n_prompt + 1;
  EXPECT_EQ(code(too_long), StatusCode::kInvalidArgument);
  EXPECT_NE(engine->Submit(too_long).status().message().find("KV cache capacity"),
            std::string::npos);
  too_long.max_new_tokens = 512 - n_prompt;  // exactly the pool
  EXPECT_EQ(code(too_long), StatusCode::kOk);
  EngineRequest beyond_context = r;
  beyond_context.max_new_tokens = 5000;
  EXPECT_NE(engine->Submit(beyond_context).status().message().find("context length"),
            std::string::npos);
  EngineRequest bad_sampling = r;
  bad_sampling.sampling.top_p = 0.0f;
  EXPECT_EQ(code(bad_sampling), StatusCode::kInvalidArgument);
  EngineRequest bad_stop = r;
  bad_stop.stop = {""};
  EXPECT_EQ(code(bad_stop), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->kv_capacity_tokens(), 512);
  EXPECT_EQ(engine->model_config().vocab_size, 8064);
}

TEST_F(EngineApiTest, MetricsAddUp) {
  EngineConfig config;
  config.max_batched_tokens = 32;
  auto engine = MakeEngine(config);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(Request("for i in range(" + std::to_string(i * 7) + "):\n", 5 + i));
  reqs.push_back(reqs[0]);  // a prefix hit once the first has run (6 + 1 tokens: none)
  std::vector<Collected> got = RunConcurrently(*engine, reqs);
  got.push_back(Collect(
      *MustSubmit(*engine, Request("for i in range(0):\n    print(i, i + 1, i * 2)\n", 3))));
  got.push_back(Collect(
      *MustSubmit(*engine, Request("for i in range(0):\n    print(i, i + 1, i * 2)\n", 3))));
  const EngineMetrics m = WaitIdle(*engine);
  uint64_t n_tokens = 0, n_prompt = 0, n_cached = 0;
  for (const Collected& c : got) {
    n_tokens += c.tokens.size();
    n_prompt += static_cast<uint64_t>(c.usage.prompt_tokens);
    n_cached += static_cast<uint64_t>(c.usage.cached_tokens);
    EXPECT_EQ(c.usage.completion_tokens, static_cast<int32_t>(c.tokens.size()));
  }
  EXPECT_GT(got.back().usage.cached_tokens, 0);
  EXPECT_EQ(m.requests_finished_length, got.size());
  EXPECT_EQ(m.requests_finished_stop, 0u);
  EXPECT_EQ(m.generation_tokens, n_tokens);
  EXPECT_EQ(m.prompt_tokens, n_prompt);
  EXPECT_EQ(m.prompt_tokens_cached, n_cached);
  EXPECT_EQ(m.time_to_first_token.count, got.size());
  EXPECT_EQ(m.e2e_latency.count, got.size());
  EXPECT_EQ(m.inter_token_latency.count, n_tokens - got.size());
  EXPECT_GT(m.steps, 0u);
  // Every step is timed once, as a decode step or as one that carried prompt chunks (all of
  // these prompts are several tokens long, so some did); the mixed steps computed at least the
  // prompt tokens the cache did not hold, less one per request whose last prompt token ran in a
  // decode step.
  EXPECT_EQ(m.decode_step.count + m.mixed_step.count, m.steps);
  EXPECT_GT(m.mixed_step.count, 0u);
  EXPECT_GT(m.decode_step.count, 0u);
  EXPECT_GE(m.mixed_step_tokens + got.size(), n_prompt - n_cached);
  EXPECT_GT(m.mixed_step.sum, 0.0);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_GT(m.kv_blocks_cached_free, 0);
  uint64_t bucket_total = 0;
  for (uint64_t c : m.time_to_first_token.counts) bucket_total += c;
  EXPECT_EQ(bucket_total, m.time_to_first_token.count);
}

}  // namespace
}  // namespace kestrel
