#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace kestrel {

int ThreadPool::DefaultThreadCount() {
  if (const char* env = std::getenv("KESTREL_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

ThreadPool::ThreadPool(int n_threads) {
  n_threads_ = n_threads > 0 ? n_threads : DefaultThreadCount();
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {

// Iterations of busy waiting before sleeping: ~50-100 us.
constexpr int kSpinIterations = 20000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void RunChunk(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int chunks,
              int index) {
  if (index >= chunks) return;
  int64_t begin = n * index / chunks;
  int64_t end = n * (index + 1) / chunks;
  if (begin < end) fn(begin, end, index);
}

}  // namespace

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  int64_t g = std::max<int64_t>(grain, 1);
  int chunks = static_cast<int>(std::min<int64_t>(n_threads_, (n + g - 1) / g));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);  // a worker about to sleep sees the new generation
  }
  cv_start_.notify_all();
  RunChunk(fn, n, chunks, 0);
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) {
    CpuRelax();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_ = true;
    cv_done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    caller_sleeping_ = false;
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen || stop_.load()) break;
      CpuRelax();
    }
    if (generation_.load(std::memory_order_acquire) == seen && !stop_.load()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] {
        return stop_.load() || generation_.load(std::memory_order_acquire) != seen;
      });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    RunChunk(*job_, job_n_, job_chunks_, index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      if (caller_sleeping_) cv_done_.notify_one();
    }
  }
}

}  // namespace kestrel
