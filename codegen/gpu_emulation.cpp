// GPU kernels on host threads: each block's threads are host threads that share a std::barrier (the kernel's
// bar.sync) and read their indices from thread-local registers. Blocks run one after another, so the kernel's
// shared memory (one host array) is never used by two blocks at once, and the done counters and partials that
// the GPU's blocks hand each other through global memory are seen in block order, one of the orders a GPU allows.
#include "codegen/gpu_emulation.h"
#include "codegen/codegen.h"
#include "runtime/error.h"

#include <barrier>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace optjit {
namespace {

thread_local uint32_t thread_index = 0, block_threads = 0, block_index = 0;
thread_local std::barrier<>* block_barrier = nullptr;

} // namespace

const GpuEmulationHooks& gpu_emulation_hooks() {
  static const GpuEmulationHooks hooks{
      [] { return thread_index; },
      [] { return block_threads; },
      [] { return block_index; },
      [] { block_barrier->arrive_and_wait(); },
  };
  return hooks;
}

void EmulatedGpuKernel::launch(unsigned grid, unsigned threads, const GpuKernelParams& params) const {
  if (threads == 0 || threads % 32 != 0 || threads > static_cast<unsigned>(kGpuMaxBlockThreads))
    throw Error("an emulated block has " + std::to_string(threads) + " threads: a multiple of 32 up to " +
                std::to_string(kGpuMaxBlockThreads));
  std::barrier<> barrier(static_cast<std::ptrdiff_t>(threads));
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned k = 0; k < threads; ++k)
    workers.emplace_back([&, k] {
      thread_index = k;
      block_threads = threads;
      block_barrier = &barrier;
      for (unsigned block = 0; block < grid; ++block) {
        block_index = block;
        entry_(&params);
        barrier.arrive_and_wait(); // the block has ended before the next begins
      }
    });
  for (std::thread& w : workers)
    w.join();
}

} // namespace optjit
