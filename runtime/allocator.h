// Host memory for tensors: 64-byte aligned, huge pages for large buffers, and freed blocks kept for reuse so that
// a step's intermediates do not re-fault fresh pages (a fresh 4 KiB page costs ~12 us on these VMs).
#pragma once

#include <cstddef>
#include <memory>

namespace optjit {

struct AllocatorStats {
  std::size_t allocations = 0;  // requests served
  std::size_t reused = 0;       // requests served from the cache
  std::size_t bytes_cached = 0; // bytes held in the cache right now
};

// Returns 64-byte aligned memory of at least `bytes`; never null (throws optjit::Error when out of memory).
void* host_allocate(std::size_t bytes);
// Gives memory from host_allocate back; it is cached for reuse up to a bound (OPTJIT_HOST_CACHE_MB, default 1024).
void host_release(void* ptr, std::size_t bytes);
AllocatorStats host_allocator_stats();
// Frees every cached block (tests and benchmarks use it to measure cold behaviour).
void host_allocator_trim();

// Device memory on cuda:`device`, 256-byte aligned, from a caching allocator: freed blocks are kept per (device,
// rounded size) and handed out again, so steady-state steps never call cuMemAlloc. When the driver runs out of
// memory the cache of that device is freed and the allocation retried once. Throws optjit::Error.
uint64_t device_allocate(int device, std::size_t bytes);
void device_release(int device, uint64_t ptr, std::size_t bytes);
AllocatorStats device_allocator_stats();

} // namespace optjit
