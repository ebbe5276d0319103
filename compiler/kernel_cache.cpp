#include "compiler/kernel_cache.h"
#include "runtime/log.h"

#include <cstdlib>

namespace optjit {

std::size_t kernel_cache_capacity_from_env() {
  const char* env = std::getenv("OPTJIT_KERNEL_CACHE_SIZE");
  long value = env ? std::atol(env) : 0;
  return value > 0 ? static_cast<std::size_t>(value) : 256;
}

void log_kernel_cache_eviction(const std::string& key_head, std::size_t capacity) {
  // Always visible: eviction means compiled code is thrown away and will be compiled again.
  spdlog::warn("optjit: kernel cache full ({} kernels), evicting '{}...'; the workload is thrashing the cache "
               "(raise OPTJIT_KERNEL_CACHE_SIZE)",
               capacity, key_head);
}

} // namespace optjit
