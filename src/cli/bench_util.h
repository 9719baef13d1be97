// Small helpers shared by the benchmark verbs (cmd_bench.cpp, cmd_bench_cuda.cpp,
// bench_engine.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace kestrel::cli {

// The median (the upper one for an even count); v must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> RandomIds(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(dist(rng));
  return ids;
}

}  // namespace kestrel::cli
