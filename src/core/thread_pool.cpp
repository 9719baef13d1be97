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
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

static void RunChunk(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int chunks,
                     int index) {
  if (index >= chunks) return;
  int64_t begin = n * index / chunks;
  int64_t end = n * (index + 1) / chunks;
  if (begin < end) fn(begin, end, index);
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  int64_t g = std::max<int64_t>(grain, 1);
  int chunks = static_cast<int>(std::min<int64_t>(n_threads_, (n + g - 1) / g));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  RunChunk(fn, n, chunks, 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    RunChunk(*job, n, chunks, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

}  // namespace kestrel
