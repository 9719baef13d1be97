// httplib's task queue with both bounds a server needs: a fixed number of worker threads (each
// serves one connection at a time) and a bounded backlog of accepted connections. When the
// backlog is full, enqueue hands the job to the overflow handler when there is one (the server
// answers it with 503 at once, see http_transport.h), else blocks the accept loop, so further
// clients wait in the kernel's listen queue instead of growing memory without limit. (httplib
// 0.11's own ThreadPool has an unbounded job list.)
//
// Work goes to the most recently idle thread (a LIFO of idle workers), so the threads in use
// stay as few as the peak concurrency: a pool sized for the worst case does not touch the stacks,
// malloc arenas and thread-local caches (tokenizer scratch) of threads it does not need.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace kestrel::server {

class BoundedTaskQueue : public httplib::TaskQueue {
 public:
  // Runs a job that finds no room, on the caller's thread, instead of queueing it.
  using OverflowHandler = std::function<void(std::function<void()>& job)>;
  BoundedTaskQueue(size_t n_threads, size_t max_pending, OverflowHandler on_full = nullptr);
  ~BoundedTaskQueue() override;

  // Without an overflow handler, blocks while max_pending jobs wait.
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;                         // runs the jobs already queued, then joins

  size_t pending() const;  // accepted, waiting for a thread
  size_t n_overflows() const { return n_overflows_.load(); }

 private:
  struct Worker {
    std::condition_variable wake;
    std::function<void()> job;  // handed over directly by enqueue
    bool has_job = false;
  };
  void Work(Worker* self);

  mutable std::mutex mu_;
  std::condition_variable has_room_;
  std::deque<std::function<void()>> jobs_;  // only while no worker is idle
  std::vector<Worker*> idle_;               // back = the most recently idle
  size_t max_pending_;
  OverflowHandler on_full_;
  std::atomic<size_t> n_overflows_{0};
  bool shutdown_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
};

}  // namespace kestrel::server
