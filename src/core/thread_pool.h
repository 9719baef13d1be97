// A fixed pool of worker threads for data-parallel loops in CPU kernels.
// ParallelFor splits [0, n) into contiguous chunks; the calling thread takes part.
// Not re-entrant: one ParallelFor at a time (the engine thread owns the pool).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kestrel {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads counts the caller; <= 0 means all cores
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint chunks covering [0, n).
  // grain: the smallest chunk worth a thread.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t, int)>& fn);

  static int DefaultThreadCount();

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // A job is published by bumping generation_ (release); workers and the caller spin on the
  // atomics for a short while (a decode step runs hundreds of parallel regions a few tens of
  // microseconds apart, and a futex wake-up costs about as much as one), then sleep on the
  // condition variables. The mutex orders sleeping against publishing: whoever publishes or
  // finishes takes it before notifying, so no wake-up is lost.
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  bool caller_sleeping_ = false;  // guarded by mu_
};

}  // namespace kestrel
