#include "runtime/concurrent_jobs.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace optjit {

void run_concurrently(std::size_t n, int threads, const std::function<void(std::size_t)>& job) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        job(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const std::size_t extra = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(threads, 1))) - (n > 0);
  std::vector<std::thread> workers;
  workers.reserve(extra);
  for (std::size_t w = 0; w < extra; ++w) {
    try {
      workers.emplace_back(work);
    } catch (...) {
      break; // no thread to be had (system_error, bad_alloc): the ones running take the remaining jobs
    }
  }
  work();
  for (std::thread& worker : workers)
    worker.join();
  for (const std::exception_ptr& error : errors)
    if (error)
      std::rethrow_exception(error);
}

} // namespace optjit
