// The CPU thread pool: fork-join parallel loops over index ranges, the caller taking part. Workers spin briefly
// before sleeping so that back-to-back steps do not pay a wake-up each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace optjit {

class ThreadPool {
public:
  // The process-wide pool; its size is OPTJIT_NUM_THREADS or the number of hardware threads.
  static ThreadPool& global();

  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // Uses at most `threads` threads (1 ..= size()) for later loops.
  void set_active_threads(int threads);
  int active_threads() const { return active_; }

  // Calls body(begin, end) over disjoint ranges covering [0, n), each at most `grain` long, and returns once all
  // have run. Runs inline when one range covers everything or one thread is active.
  template <class Body> void parallel_for(int64_t n, int64_t grain, Body&& body) {
    if (n <= 0)
      return;
    if (grain < 1)
      grain = 1;
    if (n <= grain || active_ == 1) {
      for (int64_t begin = 0; begin < n; begin += grain)
        body(begin, begin + grain < n ? begin + grain : n);
      return;
    }
    Job job{&body, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Body*>(ctx))(b, e); }, n, grain};
    run(job);
  }

private:
  struct Job {
    void* context;
    void (*invoke)(void*, int64_t, int64_t);
    int64_t n, grain;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::atomic<int> participants{0};
    int max_participants = 0;
  };
  void run(Job& job);
  static void drain(Job& job);
  void worker_loop();

  int threads_;
  int active_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  Job* current_ = nullptr;              // guarded by mutex_; a worker joins only while it is set
  std::atomic<uint64_t> generation_{0}; // bumped when a job is published, read lock-free while spinning
  std::atomic<bool> stop_{false};       // set under mutex_, read lock-free while spinning
};

} // namespace optjit
