// A process-wide tuning switch of the CUDA backend (a kernel variant, a tile shape, PDL on or
// off): a Set call gives its value; until one does, the first read takes it from an environment
// variable. Relaxed atomics: a switch is changed between launches (tests, benchmarks), not while
// kernels are being enqueued from other threads, and a captured graph keeps what it captured.
#pragma once

#include <atomic>
#include <climits>
#include <cstdlib>

namespace kestrel::cuda {

class EnvSetting {
 public:
  // parse: the variable's text (null when it is not set) to the value; never INT_MIN.
  using Parse = int (*)(const char* env);
  constexpr EnvSetting(const char* name, Parse parse) : name_(name), parse_(parse) {}
  EnvSetting(const EnvSetting&) = delete;
  EnvSetting& operator=(const EnvSetting&) = delete;

  int Get() {
    const int v = value_.load(std::memory_order_relaxed);
    if (v != kUnread) return v;
    int expected = kUnread;  // a concurrent first read or a Set may have won: theirs stays
    value_.compare_exchange_strong(expected, parse_(std::getenv(name_)), std::memory_order_relaxed);
    return value_.load(std::memory_order_relaxed);
  }
  void Set(int v) { value_.store(v, std::memory_order_relaxed); }

 private:
  static constexpr int kUnread = INT_MIN;
  const char* name_;
  Parse parse_;
  std::atomic<int> value_{kUnread};
};

}  // namespace kestrel::cuda
