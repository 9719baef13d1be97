// The HTTP worker pool: bounded threads, bounded backlog, blocking enqueue, clean shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <set>
#include <thread>

#include "server/task_queue.h"

namespace kestrel::server {
namespace {

using namespace std::chrono_literals;

TEST(BoundedTaskQueue, RunsEveryJob) {
  std::atomic<int> done{0};
  {
    BoundedTaskQueue q(4, 8);
    for (int i = 0; i < 100; ++i) q.enqueue([&done] { done.fetch_add(1); });
    q.shutdown();  // runs what is queued, then joins
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(BoundedTaskQueue, OverflowHandlerTakesWhatFindsNoRoom) {
  std::atomic<int> overflowed{0}, ran_inline{0};
  std::thread::id overflow_thread;
  BoundedTaskQueue q(/*n_threads=*/1, /*max_pending=*/1, [&](std::function<void()>& job) {
    overflowed.fetch_add(1);
    overflow_thread = std::this_thread::get_id();
    job();  // the server answers 503 in the job; here it just runs
  });
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> started{0};
  q.enqueue([&started, released] {
    started.fetch_add(1);
    released.wait();
  });
  while (started.load() == 0) std::this_thread::sleep_for(1ms);
  q.enqueue([] {});  // the one backlog slot
  EXPECT_EQ(q.pending(), 1u);
  q.enqueue([&ran_inline] { ran_inline.fetch_add(1); });  // no room: the handler, at once
  EXPECT_EQ(overflowed.load(), 1);
  EXPECT_EQ(ran_inline.load(), 1);
  EXPECT_EQ(overflow_thread, std::this_thread::get_id());
  EXPECT_EQ(q.n_overflows(), 1u);
  release.set_value();
  q.shutdown();
}

TEST(BoundedTaskQueue, EnqueueBlocksWhenTheBacklogIsFull) {
  BoundedTaskQueue q(/*n_threads=*/1, /*max_pending=*/1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> started{0};
  auto blocker = [&started, released] {
    started.fetch_add(1);
    released.wait();
  };
  q.enqueue(blocker);  // runs on the only thread
  while (started.load() == 0) std::this_thread::sleep_for(1ms);
  q.enqueue(blocker);  // waits in the backlog (1 slot)
  EXPECT_EQ(q.pending(), 1u);

  std::atomic<bool> third_enqueued{false};
  std::thread producer([&] {
    q.enqueue([] {});
    third_enqueued.store(true);
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(third_enqueued.load());  // the accept loop would be held here
  release.set_value();
  producer.join();
  EXPECT_TRUE(third_enqueued.load());
  q.shutdown();
  EXPECT_EQ(started.load(), 2);
}

TEST(BoundedTaskQueue, ReusesTheMostRecentlyIdleThread) {
  BoundedTaskQueue q(8, 8);
  std::this_thread::sleep_for(50ms);  // every worker idle
  std::set<std::thread::id> used;
  for (int i = 0; i < 50; ++i) {
    std::promise<std::thread::id> ran;
    q.enqueue([&ran] { ran.set_value(std::this_thread::get_id()); });
    used.insert(ran.get_future().get());
    std::this_thread::sleep_for(1ms);  // the worker goes back to idle
  }
  // One request at a time is served by one warm thread, not spread over the pool.
  EXPECT_LE(used.size(), 2u);
  q.shutdown();
}

TEST(BoundedTaskQueue, JobsAfterShutdownStillRun) {
  BoundedTaskQueue q(2, 2);
  q.shutdown();
  bool ran = false;
  q.enqueue([&ran] { ran = true; });  // owns a socket that must be closed: runs inline
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace kestrel::server
