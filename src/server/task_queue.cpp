#include "server/task_queue.h"

#include <algorithm>

namespace kestrel::server {

BoundedTaskQueue::BoundedTaskQueue(size_t n_threads, size_t max_pending, OverflowHandler on_full)
    : max_pending_(std::max<size_t>(max_pending, 1)), on_full_(std::move(on_full)) {
  n_threads = std::max<size_t>(n_threads, 1);
  workers_.reserve(n_threads);
  threads_.reserve(n_threads);
  for (size_t i = 0; i < n_threads; ++i) {
    workers_.push_back(std::make_unique<Worker>());
    threads_.emplace_back([this, w = workers_.back().get()] { Work(w); });
  }
}

BoundedTaskQueue::~BoundedTaskQueue() {
  shutdown();
}

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (on_full_ && !shutdown_ && idle_.empty() && jobs_.size() >= max_pending_) {
    lock.unlock();
    ++n_overflows_;
    on_full_(fn);
    return;
  }
  has_room_.wait(lock,
                 [this] { return !idle_.empty() || jobs_.size() < max_pending_ || shutdown_; });
  // After shutdown the job still runs (inline): it owns an accepted socket that must be closed.
  if (shutdown_) {
    lock.unlock();
    fn();
    return;
  }
  if (!idle_.empty()) {
    Worker* w = idle_.back();
    idle_.pop_back();
    w->job = std::move(fn);
    w->has_job = true;
    lock.unlock();
    w->wake.notify_one();
    return;
  }
  jobs_.push_back(std::move(fn));
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    for (auto& w : workers_) w->wake.notify_one();
  }
  has_room_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

size_t BoundedTaskQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

void BoundedTaskQueue::Work(Worker* self) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::function<void()> fn;
    if (self->has_job) {
      fn = std::move(self->job);
      self->has_job = false;
    } else if (!jobs_.empty()) {
      fn = std::move(jobs_.front());
      jobs_.pop_front();
      has_room_.notify_one();
    } else if (shutdown_) {
      return;  // queued jobs are drained first, so a shutdown never drops a socket
    } else {
      idle_.push_back(self);
      self->wake.wait(lock, [this, self] { return self->has_job || shutdown_; });
      if (!self->has_job) idle_.erase(std::find(idle_.begin(), idle_.end(), self));
      continue;
    }
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace kestrel::server
