#include "runtime/allocator.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"

#include <map>
#include <mutex>
#include <vector>

namespace optjit {
namespace {

// Sizes are rounded so that blocks are reusable across slightly different requests: 512 B steps below 1 MiB,
// 2 MiB steps above (the driver's own granularity for large allocations).
std::size_t rounded(std::size_t bytes) {
  const std::size_t step = bytes < (std::size_t{1} << 20) ? 512 : std::size_t{2} << 20;
  return bytes == 0 ? step : (bytes + step - 1) / step * step;
}

struct DeviceCache {
  std::mutex mutex;
  std::map<std::pair<int, std::size_t>, std::vector<uint64_t>> free_blocks; // (device, rounded size) -> blocks
  AllocatorStats stats;

  void release_all(int device) {
    for (auto it = free_blocks.begin(); it != free_blocks.end();) {
      if (it->first.first != device) {
        ++it;
        continue;
      }
      for (uint64_t ptr : it->second) {
        cuda::mem_free(device, ptr);
        stats.bytes_cached -= it->first.second;
      }
      it = free_blocks.erase(it);
    }
  }
};

DeviceCache& cache() {
  static DeviceCache* c = new DeviceCache; // never destroyed: tensors may be released during static destruction
  return *c;
}

} // namespace

uint64_t device_allocate(int device, std::size_t bytes) {
  DeviceCache& c = cache();
  const std::size_t size = rounded(bytes);
  std::lock_guard lock(c.mutex);
  ++c.stats.allocations;
  auto it = c.free_blocks.find({device, size});
  if (it != c.free_blocks.end() && !it->second.empty()) {
    uint64_t ptr = it->second.back();
    it->second.pop_back();
    c.stats.bytes_cached -= size;
    ++c.stats.reused;
    return ptr;
  }
  try {
    return cuda::mem_alloc(device, size);
  } catch (const Error&) {
    if (c.stats.bytes_cached == 0)
      throw;
    c.release_all(device);
    return cuda::mem_alloc(device, size);
  }
}

void device_release(int device, uint64_t ptr, std::size_t bytes) {
  DeviceCache& c = cache();
  const std::size_t size = rounded(bytes);
  std::lock_guard lock(c.mutex);
  c.free_blocks[{device, size}].push_back(ptr);
  c.stats.bytes_cached += size;
}

AllocatorStats device_allocator_stats() {
  std::lock_guard lock(cache().mutex);
  return cache().stats;
}

} // namespace optjit
