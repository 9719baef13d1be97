// Prefix caching of hybrid models (Gated DeltaNet layers beside attention): a hit restores the
// recurrent state snapshotted at the hit's last block boundary, so a cached request must give
// what the same request gives from cold caches, token for token and in log-probabilities.
// Gates, on the transformers-checked fixtures (tests/data/models/qwen3_5, qwen3_next):
//   * hits at every block boundary of the 254-token fixture prompt (and the cold engine agrees
//     with the transformers greedy continuation);
//   * a multi-turn conversation hits up to the last full block of the previous turn;
//   * under preemption (a KV pool too small for the batch);
//   * 32 concurrent requests sharing prefixes, and with a snapshot pool small enough to evict.
// The delta rule runs over different segments in a cached and a cold run (the hit starts a new
// segment), so log-probabilities agree to rounding (1e-4), tokens exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine_test_util.h"

namespace kestrel {
namespace {

using testing::Collected;
using testing::RunConcurrently;
using testing::RunOneByOne;

constexpr float kLogprobTolerance = 1e-4f;

struct Fixture {
  std::string dir;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;
};

Fixture LoadFixture(const std::string& name) {
  Fixture f;
  f.dir = std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/" + name;
  std::ifstream in(f.dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  f.prompts = ref.at("prompts").get<std::vector<std::vector<int32_t>>>();
  f.greedy = ref.at("greedy").get<std::vector<std::vector<int32_t>>>();
  return f;
}

std::shared_ptr<Model> LoadHybrid(const std::string& dir, int64_t kv_tokens,
                                  int64_t snapshot_bytes = -1) {
  ModelLoadOptions options;
  options.kv_cache_tokens = kv_tokens;
  options.max_num_seqs = 32;
  options.state_snapshot_bytes = snapshot_bytes;
  Result<std::unique_ptr<Model>> model = Model::Load(dir, options);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::shared_ptr<Model>(std::move(*model)) : nullptr;
}

EngineConfig Config(int32_t max_num_seqs, int32_t budget, bool prefix_caching) {
  EngineConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_batched_tokens = budget;
  c.max_waiting = 1024;
  c.prefix_caching = prefix_caching;
  return c;
}

EngineRequest Greedy(std::vector<int32_t> prompt, int32_t max_new_tokens) {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.logprobs = true;
  r.max_new_tokens = max_new_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

void ExpectSame(const Collected& got, const Collected& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.finished);
  EXPECT_TRUE(got.error.ok()) << got.error.message();
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], kLogprobTolerance) << "token " << i;
  }
}

// The cold result of each request: a fresh engine without prefix caching, one at a time.
std::vector<Collected> Cold(const std::string& dir, const std::vector<EngineRequest>& reqs) {
  Engine cold(LoadHybrid(dir, 2048), nullptr, {}, Config(1, 2048, /*prefix_caching=*/false));
  cold.Start();
  return RunOneByOne(cold, reqs);
}

class HybridPrefixCache : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridPrefixCache, HitsAtEveryBlockBoundaryEqualColdAndTransformers) {
  const Fixture f = LoadFixture(GetParam());
  const std::vector<int32_t>& prompt = f.prompts.back();
  ASSERT_EQ(prompt.size(), 254u);
  const int32_t gen = static_cast<int32_t>(f.greedy.back().size());
  const Collected want = Cold(f.dir, {Greedy(prompt, gen)})[0];
  EXPECT_EQ(want.tokens, f.greedy.back()) << "the engine's cold greedy continuation differs "
                                             "from transformers";
  EXPECT_EQ(want.usage.cached_tokens, 0);

  const int32_t block = 16;
  for (int32_t k = 1; k * block < static_cast<int32_t>(prompt.size()); ++k) {
    SCOPED_TRACE("hit at block " + std::to_string(k));
    // A small step budget splits the primer's prefill into chunks that end off block
    // boundaries, so the snapshot is taken inside a chunk.
    std::shared_ptr<Model> model = LoadHybrid(f.dir, 1024);
    ASSERT_NE(model, nullptr);
    Engine engine(model, nullptr, {}, Config(4, 40, true));
    engine.Start();
    // The primer shares k whole blocks and a few more tokens; then the full prompt.
    const size_t primer_len = static_cast<size_t>(k * block + k % 7);
    const Collected primer = RunOneByOne(engine, {Greedy(Prefix(prompt, primer_len), 1)})[0];
    ASSERT_TRUE(primer.finished);
    const Collected hit = RunOneByOne(engine, {Greedy(prompt, gen)})[0];
    EXPECT_EQ(hit.usage.cached_tokens, k * block);
    ExpectSame(hit, want, "cached vs cold");
    const EngineMetrics m = testing::WaitIdle(engine);
    EXPECT_GT(m.state_snapshots, 0);
    EXPECT_EQ(m.state_snapshot_bytes,
              m.state_snapshots * model->cache_spec().state_bytes_per_slot());
  }
}

TEST_P(HybridPrefixCache, MultiTurnHitsUpToTheLastFullBlockOfThePreviousTurn) {
  const Fixture f = LoadFixture(GetParam());
  const std::vector<int32_t>& base = f.prompts.back();
  // A step budget of 40 tokens: prefills in several chunks, snapshots inside them.
  Engine engine(LoadHybrid(f.dir, 2048), nullptr, {}, Config(4, 40, true));
  engine.Start();
  std::vector<int32_t> conversation = Prefix(base, 70);
  size_t next_user_token = 70;
  int32_t previous_computed = 0;  // tokens whose K/V and state the previous turn computed
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    const Collected got = RunOneByOne(engine, {Greedy(conversation, 20)})[0];
    const Collected want = Cold(f.dir, {Greedy(conversation, 20)})[0];
    ExpectSame(got, want, "turn vs cold");
    EXPECT_EQ(got.usage.cached_tokens, previous_computed / 16 * 16);
    // It computed its prompt and every generated token but the last.
    previous_computed = static_cast<int32_t>(conversation.size() + got.tokens.size()) - 1;
    // The next turn: this turn's prompt, its answer, and a new user message.
    conversation.insert(conversation.end(), got.tokens.begin(), got.tokens.end());
    const size_t extra = 9 + 5 * static_cast<size_t>(turn);
    for (size_t i = 0; i < extra; ++i) {
      conversation.push_back(base[next_user_token++ % base.size()]);
    }
  }
}

// Requests sharing prefixes of the fixture prompt, each with its own tail.
std::vector<EngineRequest> SharedPrefixRequests(const std::vector<int32_t>& base, int n, int salt,
                                                int32_t max_new_tokens) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = Prefix(base, static_cast<size_t>(40 + 16 * (i % 4) + i % 5));
    for (int j = 0; j < 3 + i % 4; ++j) p.push_back((i * 37 + j * 11 + salt * 101) % 256);
    reqs.push_back(Greedy(std::move(p), max_new_tokens));
  }
  return reqs;
}

TEST_P(HybridPrefixCache, ThirtyTwoConcurrentRequestsSharingPrefixesEqualCold) {
  const Fixture f = LoadFixture(GetParam());
  const std::vector<int32_t>& base = f.prompts.back();
  const std::vector<EngineRequest> first = SharedPrefixRequests(base, 32, 1, 12);
  const std::vector<EngineRequest> second = SharedPrefixRequests(base, 32, 2, 12);
  std::vector<EngineRequest> all = first;
  all.insert(all.end(), second.begin(), second.end());
  const std::vector<Collected> want = Cold(f.dir, all);

  // Default snapshot pool, and one of 6 snapshots: hits still restore the right state, or miss.
  for (int64_t snapshot_slots : {int64_t{-1}, int64_t{6}}) {
    SCOPED_TRACE("snapshot slots " + std::to_string(snapshot_slots));
    std::shared_ptr<Model> model = LoadHybrid(f.dir, 4096);
    ASSERT_NE(model, nullptr);
    const int64_t bytes =
        snapshot_slots < 0 ? -1 : snapshot_slots * model->cache_spec().state_bytes_per_slot();
    model = LoadHybrid(f.dir, 4096, bytes);
    Engine engine(model, nullptr, {}, Config(32, 256, true));
    std::vector<Collected> got = RunConcurrently(engine, first, /*start_after_submit=*/true);
    const std::vector<Collected> got2 = RunConcurrently(engine, second);
    got.insert(got.end(), got2.begin(), got2.end());
    int64_t cached = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      ExpectSame(got[i], want[i], "request " + std::to_string(i));
      cached += got[i].usage.cached_tokens;
    }
    EXPECT_GT(cached, 0);
    const EngineMetrics m = testing::WaitIdle(engine);
    EXPECT_EQ(m.state_snapshot_slots, model->n_state_slots() - 32);
    if (snapshot_slots > 0) {
      EXPECT_LE(m.state_snapshots, snapshot_slots);
      EXPECT_GT(m.state_snapshot_evictions, 0u);
    }
  }
}

TEST_P(HybridPrefixCache, PreemptedRequestsEqualCold) {
  const Fixture f = LoadFixture(GetParam());
  const std::vector<EngineRequest> reqs = SharedPrefixRequests(f.prompts.back(), 12, 3, 24);
  const std::vector<Collected> want = Cold(f.dir, reqs);
  // 16 blocks of 16 tokens for 12 requests of up to 119 tokens.
  std::shared_ptr<Model> model = LoadHybrid(f.dir, 256);
  ASSERT_NE(model, nullptr);
  Engine engine(model, nullptr, {}, Config(12, 128, true));
  const std::vector<Collected> got = RunConcurrently(engine, reqs, /*start_after_submit=*/true);
  for (size_t i = 0; i < reqs.size(); ++i) ExpectSame(got[i], want[i], std::to_string(i));
  const EngineMetrics m = testing::WaitIdle(engine);
  EXPECT_GT(m.preemptions, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridPrefixCache, ::testing::Values("qwen3_5", "qwen3_next"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kestrel
