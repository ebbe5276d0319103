// The process-wide kernel caches, one per kind of code (CPU kernels; GPU modules, and their PTX, which compiles
// apart from the module load): compiled kernels keyed by the text of their kernel plan and the target, so
// optimizers of the same structure share code (the text holds no addresses, sizes or hyperparameter values). They
// never hold user tensors. Each is bounded (OPTJIT_KERNEL_CACHE_SIZE, default 256) and logs when it evicts, which
// means a workload is thrashing it.
#pragma once

#include "runtime/error.h"

#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace optjit {

struct KernelCacheStats {
  int64_t hits = 0, misses = 0, evictions = 0;
  std::size_t size = 0, capacity = 0;
};

std::size_t kernel_cache_capacity_from_env();
void log_kernel_cache_eviction(const std::string& key_head, std::size_t capacity);

template <class Kernel> class KernelCache {
public:
  static KernelCache& global() {
    static KernelCache* cache = new KernelCache(kernel_cache_capacity_from_env());
    return *cache;
  }
  explicit KernelCache(std::size_t capacity) : capacity_(capacity) {}

  // The cached kernel for `key`, or make() compiled and inserted; `hit` says which. A kernel another thread is
  // compiling now is waited for (a hit: compiled once); if that compile fails, each waiter throws the error too, and
  // the next ask compiles again. make() must not ask this cache for `key` itself (it would wait for itself).
  std::shared_ptr<Kernel> get_or_compile(const std::string& key, const std::function<std::shared_ptr<Kernel>()>& make,
                                         bool& hit) {
    std::promise<std::shared_ptr<Kernel>> compiled;
    std::shared_future<std::shared_ptr<Kernel>> in_flight;
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++stats_.hits;
        hit = true;
        return it->second->second;
      }
      if (auto it = compiling_.find(key); it != compiling_.end()) {
        ++stats_.hits;
        in_flight = it->second;
      } else {
        ++stats_.misses;
        compiling_.emplace(key, compiled.get_future().share());
      }
    }
    hit = in_flight.valid();
    if (hit) {
      try {
        return in_flight.get();
      } catch (const Error& e) {
        throw Error(e.what()); // a copy of its own: threads never share an optjit::Error
      }
    }
    // Every way out of make() settles the compile, so no waiter waits forever: its kernel, or its error (the waiters
    // get a copy of an optjit::Error; this thread rethrows its own).
    std::shared_ptr<Kernel> kernel;
    std::exception_ptr own, shared;
    try {
      kernel = make(); // outside the lock: compiling takes milliseconds
    } catch (const Error& e) {
      own = std::current_exception();
      try {
        shared = std::make_exception_ptr(Error(e.what()));
      } catch (...) {
        shared = own;
      }
    } catch (...) {
      own = shared = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      compiling_.erase(key);
      if (own) {
        compiled.set_exception(shared);
      } else {
        compiled.set_value(kernel);
        lru_.emplace_front(key, kernel);
        index_[key] = lru_.begin();
        while (lru_.size() > capacity_) {
          log_kernel_cache_eviction(lru_.back().first.substr(0, 60), capacity_);
          index_.erase(lru_.back().first);
          lru_.pop_back();
          ++stats_.evictions;
        }
      }
    }
    if (own)
      std::rethrow_exception(own);
    return kernel;
  }

  // Whether `key` is cached now (neither a hit nor a miss); if so it becomes the most recently used, so that a
  // kernel a compile found here is still here when the compile loads it.
  bool touch(const std::string& key) {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end())
      return false;
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }

  KernelCacheStats stats() {
    std::lock_guard lock(mutex_);
    KernelCacheStats s = stats_;
    s.size = lru_.size();
    s.capacity = capacity_;
    return s;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    lru_.clear();
    index_.clear();
  }

private:
  std::size_t capacity_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<Kernel>>> lru_;
  std::unordered_map<std::string, typename decltype(lru_)::iterator> index_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<Kernel>>> compiling_; // by one thread, now
  KernelCacheStats stats_;
};

} // namespace optjit
