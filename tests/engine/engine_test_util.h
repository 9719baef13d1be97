// Helpers shared by the engine tests: loading the test models, collecting a request's events.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "models/model.h"

namespace kestrel::testing {

inline std::string TinyModelDir() {
  return std::string(KESTREL_SOURCE_DIR) + "/models/kestrel-tiny";
}
// A 2-layer random-init Qwen3 (vocab 512, hidden 64, no tokenizer): fast even with the
// reference kernels, and its nearly flat logits make greedy near-ties common.
inline std::string FixtureModelDir() {
  return std::string(KESTREL_SOURCE_DIR) + "/tests/data/models/qwen3";
}

inline std::unique_ptr<Model> LoadModel(
    const std::string& dir, int64_t kv_cache_tokens, CpuKernels kernels = CpuKernels::kAuto,
    ModelLoadOptions::KvCacheDType kv_dtype = ModelLoadOptions::KvCacheDType::kAuto) {
  ModelLoadOptions options;
  options.kernels = kernels;
  options.kv_cache_dtype = kv_dtype;
  options.kv_cache_tokens = kv_cache_tokens;
  Result<std::unique_ptr<Model>> model = Model::Load(dir, options);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

// Everything a request produced, concatenated.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // when the request asked for them
  std::string text;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  RequestUsage usage;
  int32_t stop_index = -1;
  Status error;
  int n_events = 0;
};

// Reads events until the finished one (fails the test after `limit`).
inline Collected Collect(RequestHandle& handle,
                         std::chrono::seconds limit = std::chrono::seconds(120)) {
  Collected c;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  RequestOutput ev;
  while (!c.finished) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no finished event in time";
      break;
    }
    if (!handle.Next(&ev, std::chrono::milliseconds(100))) continue;
    ++c.n_events;
    EXPECT_EQ(ev.token_ids.size(), ev.samples.size());
    c.tokens.insert(c.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    for (const SampleResult& s : ev.samples) c.logprobs.push_back(s.logprob);
    c.text += ev.text;
    c.finished = ev.finished;
    c.reason = ev.finish_reason;
    c.stop_index = ev.stop_index;
    c.usage = ev.usage;
    c.error = ev.error;
  }
  return c;
}

inline std::shared_ptr<RequestHandle> MustSubmit(Engine& engine, const EngineRequest& request) {
  Result<std::shared_ptr<RequestHandle>> h = engine.Submit(request);
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : nullptr;
}

// Submits every request at once, then collects them all. With start_after_submit (an engine
// not started yet) the first step sees every request, so the batch compositions, and with them
// the rounding of the fast kernels, do not depend on thread timing.
inline std::vector<Collected> RunConcurrently(Engine& engine,
                                              const std::vector<EngineRequest>& requests,
                                              bool start_after_submit = false) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const EngineRequest& r : requests) handles.push_back(MustSubmit(engine, r));
  if (start_after_submit) engine.Start();
  std::vector<Collected> out;
  for (auto& h : handles) out.push_back(h ? Collect(*h) : Collected{});
  return out;
}

// One request at a time.
inline std::vector<Collected> RunOneByOne(Engine& engine,
                                          const std::vector<EngineRequest>& requests) {
  std::vector<Collected> out;
  for (const EngineRequest& r : requests) {
    std::shared_ptr<RequestHandle> h = MustSubmit(engine, r);
    out.push_back(h ? Collect(*h) : Collected{});
  }
  return out;
}

// Waits until the engine thread has published an idle state (nothing running or queued).
inline EngineMetrics WaitIdle(const Engine& engine) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  EngineMetrics m = engine.Metrics();
  while ((m.running != 0 || m.waiting != 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    m = engine.Metrics();
  }
  return m;
}

}  // namespace kestrel::testing
