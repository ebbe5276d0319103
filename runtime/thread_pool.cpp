#include "runtime/thread_pool.h"
#include "runtime/error.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace optjit {

// How long an idle worker spins before it sleeps on the condition variable: about what 4000 yields took on an idle
// core, enough for back-to-back steps (a benchmark's) to find it awake.
constexpr std::chrono::microseconds kSpinBeforeSleep{1000};

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("OPTJIT_NUM_THREADS"); env && std::atoi(env) > 0)
      return std::atoi(env);
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }());
  return pool;
}

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)), active_(threads_) {
  for (int i = 1; i < threads_; ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_)
    worker.join();
}

void ThreadPool::set_active_threads(int threads) {
  if (threads < 1 || threads > threads_)
    throw Error("invalid thread count " + std::to_string(threads) + ": must be between 1 and " +
                std::to_string(threads_));
  active_ = threads;
}

void ThreadPool::drain(Job& job) {
  for (;;) {
    int64_t begin = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (begin >= job.n)
      return;
    int64_t end = std::min(job.n, begin + job.grain);
    job.invoke(job.context, begin, end);
    job.done.fetch_add(end - begin, std::memory_order_release);
  }
}

void ThreadPool::run(Job& job) {
  job.max_participants = active_ - 1;
  {
    std::lock_guard lock(mutex_);
    current_ = &job;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain(job);
  while (job.done.load(std::memory_order_acquire) < job.n)
    std::this_thread::yield();
  {
    std::lock_guard lock(mutex_); // after this no worker can join `job`
    current_ = nullptr;
  }
  while (job.participants.load(std::memory_order_acquire) != 0) // and those that joined have left it
    std::this_thread::yield();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little before sleeping: steps come back to back. The spin is bounded in time, not in yields: on a busy
    // machine each yield hands the core to another process for a whole time slice, and 4000 of them held a worker
    // (and the pool's destructor joining it at exit) for seconds.
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_until)
      std::this_thread::yield();
    Job* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      if (stop_)
        return;
      seen = generation_.load();
      job = current_;
      if (!job || job->participants.load() >= job->max_participants)
        continue;
      job->participants.fetch_add(1, std::memory_order_acq_rel);
    }
    drain(*job);
    job->participants.fetch_sub(1, std::memory_order_acq_rel);
  }
}

} // namespace optjit
