#include "cli/bench_engine.h"
#include "cli/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "core/check.h"
#include "engine/engine.h"

namespace kestrel::cli {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

json BenchEngineDecode(std::shared_ptr<Model> model, const std::vector<int64_t>& batches,
                       int32_t tokens, int repeats, uint64_t seed) {
  KCHECK(!batches.empty() && tokens >= 2 && repeats >= 1);
  std::mt19937_64 rng(seed);
  const int64_t vocab = model->config().vocab_size;
  const int32_t max_rows = static_cast<int32_t>(*std::max_element(batches.begin(), batches.end()));
  EngineConfig config;
  config.max_num_seqs = max_rows;
  config.max_batched_tokens = std::max(2048, 32 * max_rows);
  config.prefix_caching = false;
  Engine engine(std::move(model), nullptr, {}, config);
  engine.Start();
  json rows = json::array();
  for (bool async : {false, true}) {
    engine.set_async_scheduling(async);
    for (int64_t b64 : batches) {
      const int32_t b = static_cast<int32_t>(b64);
      std::vector<double> rates;
      for (int r = 0; r < repeats + 1; ++r) {  // the first run warms up (graphs, GEMM picks)
        std::vector<std::shared_ptr<RequestHandle>> handles;
        for (int32_t i = 0; i < b; ++i) {
          EngineRequest req;
          req.prompt_ids = RandomIds(32, vocab, rng);
          req.sampling.temperature = 0.0f;
          req.max_new_tokens = tokens;
          req.ignore_eos = true;
          Result<std::shared_ptr<RequestHandle>> h = engine.Submit(std::move(req));
          KCHECK_MSG(h.ok(), h.status().message().c_str());
          handles.push_back(*h);
        }
        // Arrival time of every token, per request.
        std::vector<std::vector<Clock::time_point>> arrivals(static_cast<size_t>(b));
        for (auto& a : arrivals) a.reserve(static_cast<size_t>(tokens));
        int32_t n_done = 0;
        RequestOutput ev;
        while (n_done < b) {
          bool any = false;
          for (int32_t i = 0; i < b; ++i) {
            while (handles[i]->Next(&ev, std::chrono::milliseconds(0))) {
              any = true;
              arrivals[i].insert(arrivals[i].end(), ev.token_ids.size(), Clock::now());
              if (ev.finished) ++n_done;
            }
          }
          if (!any) std::this_thread::yield();
        }
        Clock::time_point t0 = arrivals[0].front(), t1 = arrivals[0].back();
        for (const auto& a : arrivals) {
          t0 = std::max(t0, a.front());
          t1 = std::max(t1, a.back());
        }
        int64_t n_window = 0;  // tokens delivered after every request had its first
        for (const auto& a : arrivals) {
          n_window +=
              std::count_if(a.begin(), a.end(), [t0](Clock::time_point t) { return t > t0; });
        }
        const double s = std::chrono::duration<double>(t1 - t0).count();
        if (r > 0 && s > 0) rates.push_back(static_cast<double>(n_window) / s);
      }
      const double tok_s = rates.empty() ? 0.0 : Median(rates);
      std::fprintf(stderr, "engine batch %4d async %d: %9.1f tok/s  %7.3f ms/step\n", b,
                   async ? 1 : 0, tok_s, tok_s > 0 ? 1e3 * b / tok_s : 0.0);
      rows.push_back({{"batch", b},
                      {"async_scheduling", async},
                      {"prompt_tokens", 32},
                      {"new_tokens", tokens},
                      {"tok_per_s", tok_s},
                      {"ms_per_step", tok_s > 0 ? 1e3 * b / tok_s : 0.0}});
    }
  }
  engine.Shutdown(/*cancel_running=*/false);
  return rows;
}

json BenchPrefixHit(std::shared_ptr<Model> model, const std::vector<int64_t>& lengths, int repeats,
                    uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t vocab = model->config().vocab_size;
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_batched_tokens = 8192;
  config.prefix_caching = true;
  config.async_scheduling = false;
  Engine engine(std::move(model), nullptr, {}, config);
  engine.Start();
  // Seconds from Submit to the first token, and the prompt tokens served from the cache.
  auto first_token = [&engine](std::vector<int32_t> prompt, int32_t* cached) {
    EngineRequest req;
    req.prompt_ids = std::move(prompt);
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = 1;
    req.ignore_eos = true;
    const Clock::time_point t0 = Clock::now();
    Result<std::shared_ptr<RequestHandle>> h = engine.Submit(std::move(req));
    KCHECK_MSG(h.ok(), h.status().message().c_str());
    RequestOutput ev;
    double seconds = -1;
    while (!ev.finished) {
      if (!(*h)->Next(&ev, std::chrono::milliseconds(100))) continue;
      if (seconds < 0 && !ev.token_ids.empty()) {
        seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    KCHECK_MSG(ev.error.ok(), ev.error.message().c_str());
    *cached = ev.usage.cached_tokens;
    return seconds;
  };
  json rows = json::array();
  for (int64_t n : lengths) {
    std::vector<double> cold, hit;
    int32_t cached = 0;
    for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up
      std::vector<int32_t> prompt = RandomIds(n, vocab, rng);
      int32_t cold_cached = 0;
      const double c = first_token(prompt, &cold_cached);
      KCHECK(cold_cached == 0);
      std::vector<int32_t> extended = prompt;
      extended.push_back(RandomIds(1, vocab, rng)[0]);
      const double h = first_token(std::move(extended), &cached);
      if (r == 0) continue;
      cold.push_back(c);
      hit.push_back(h);
    }
    const double c = Median(cold), h = Median(hit);
    rows.push_back({{"tokens", n},
                    {"cold_ttft_s", c},
                    {"hit_ttft_s", h},
                    {"cached_tokens", cached},
                    {"speedup", h > 0 ? c / h : 0.0}});
    std::fprintf(stderr, "prefix hit %6lld tokens: cold %8.1f ms, hit %7.1f ms (%d cached), %.1fx\n",
                 static_cast<long long>(n), 1e3 * c, 1e3 * h, cached, h > 0 ? c / h : 0.0);
  }
  engine.Shutdown(false);
  return rows;
}

}  // namespace kestrel::cli
