#include "runtime/allocator.h"
#include "runtime/error.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <sys/mman.h>

namespace optjit {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kHugePage = std::size_t(2) << 20;

// Blocks are cached by their rounded size; the same sizes recur every step, so exact matches suffice.
std::size_t rounded_size(std::size_t bytes) {
  if (bytes >= kHugePage)
    return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

std::size_t cache_limit_bytes() {
  const char* env = std::getenv("OPTJIT_HOST_CACHE_MB");
  std::size_t mb = env ? std::strtoull(env, nullptr, 10) : 1024;
  return mb << 20;
}

struct Cache {
  std::mutex mutex;
  std::multimap<std::size_t, void*> free_blocks;
  AllocatorStats stats;
  std::size_t limit = cache_limit_bytes();

  ~Cache() {
    for (auto& [size, ptr] : free_blocks)
      std::free(ptr);
  }
};

Cache& cache() {
  static Cache* instance = new Cache(); // never destroyed: tensors may outlive static destruction order
  return *instance;
}

void* fresh_block(std::size_t size) {
  std::size_t alignment = size >= kHugePage ? kHugePage : kAlignment;
  void* ptr = std::aligned_alloc(alignment, size);
  if (!ptr)
    throw Error("out of host memory: could not allocate " + std::to_string(size) + " bytes");
  if (size >= kHugePage)
    madvise(ptr, size, MADV_HUGEPAGE); // a hint; failure only costs speed
  return ptr;
}

} // namespace

void* host_allocate(std::size_t bytes) {
  std::size_t size = rounded_size(bytes == 0 ? 1 : bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    ++c.stats.allocations;
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end()) {
      void* ptr = it->second;
      c.free_blocks.erase(it);
      c.stats.bytes_cached -= size;
      ++c.stats.reused;
      return ptr;
    }
  }
  return fresh_block(size);
}

void host_release(void* ptr, std::size_t bytes) {
  if (!ptr)
    return;
  std::size_t size = rounded_size(bytes == 0 ? 1 : bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (c.stats.bytes_cached + size <= c.limit) {
      c.free_blocks.emplace(size, ptr);
      c.stats.bytes_cached += size;
      return;
    }
  }
  std::free(ptr);
}

AllocatorStats host_allocator_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.stats;
}

void host_allocator_trim() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [size, ptr] : c.free_blocks)
    std::free(ptr);
  c.free_blocks.clear();
  c.stats.bytes_cached = 0;
}

} // namespace optjit
