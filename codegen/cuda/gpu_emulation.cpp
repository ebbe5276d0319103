// GPU kernels on host threads: each block's threads are host threads, and blocks run one after another, so the
// kernel's shared memory (one host array) is never used by two blocks at once, and the done counters and partials
// that the GPU's blocks hand each other through global memory are seen in block order (or in reverse, in turns),
// orders a GPU allows. A block's threads run either concurrently, meeting at a real barrier (the kernel's bar.sync), or
// in turns: one thread at a time from one barrier to the next, in thread order between two barriers and in reverse
// order between the next two, alternately. In turns, a write that a missing barrier would let race with another
// thread's read happens before that read in one of the two orders, every time, instead of by the chance of a schedule;
// it costs a thread switch per thread and barrier.
#include "codegen/cuda/gpu_emulation.h"
#include "codegen/codegen.h"
#include "runtime/error.h"

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <semaphore>
#include <thread>
#include <vector>

namespace optjit {
namespace {

// The turn of a block's threads: only the thread holding it runs, and only it reads or writes the position.
class Turns {
public:
  explicit Turns(unsigned threads) : threads_(threads) {
    for (unsigned k = 0; k < threads; ++k)
      turn_.push_back(std::make_unique<std::binary_semaphore>(0));
  }
  void start() { turn_[thread_at(0)]->release(); }
  // Thread `k` waits for its turn; a kernel whose threads meet different barriers never gets it back.
  void wait(unsigned k) {
    if (!turn_[k]->try_acquire_for(std::chrono::seconds(120))) {
      std::fputs("optjit: an emulated GPU block waited 120 s for a turn: its threads meet different barriers "
                 "(a bar.sync under divergent control flow)\n",
                 stderr);
      std::abort();
    }
  }
  // The holder hands the turn to the next thread of this phase, or to the first of the next phase.
  void pass() {
    if (++position_ == threads_) {
      position_ = 0;
      ++phase_;
    }
    turn_[thread_at(position_)]->release();
  }

private:
  unsigned thread_at(unsigned position) const { return phase_ % 2 == 0 ? position : threads_ - 1 - position; }

  unsigned threads_;
  std::vector<std::unique_ptr<std::binary_semaphore>> turn_;
  unsigned position_ = 0;
  uint64_t phase_ = 0;
};

thread_local uint32_t thread_index = 0, block_threads = 0, block_index = 0;
thread_local Turns* block_turns = nullptr;            // in turns
thread_local std::barrier<>* block_barrier = nullptr; // concurrently

void barrier() {
  if (block_barrier) {
    block_barrier->arrive_and_wait();
    return;
  }
  block_turns->pass();
  block_turns->wait(thread_index);
}

} // namespace

const GpuEmulationHooks& gpu_emulation_hooks() {
  static const GpuEmulationHooks hooks{
      [] { return thread_index; },
      [] { return block_threads; },
      [] { return block_index; },
      [] { barrier(); },
  };
  return hooks;
}

void EmulatedGpuKernel::launch_with(unsigned grid, unsigned threads, const void* argument,
                                    EmulatedSchedule schedule) const {
  if (threads == 0 || threads % 32 != 0 || threads > static_cast<unsigned>(kGpuMaxBlockThreads))
    throw Error("an emulated block has " + std::to_string(threads) + " threads: a multiple of 32 up to " +
                std::to_string(kGpuMaxBlockThreads));
  const bool in_turns = schedule == EmulatedSchedule::InTurns;
  Turns turns(in_turns ? threads : 0);
  std::barrier<> concurrent(static_cast<std::ptrdiff_t>(threads));
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned k = 0; k < threads; ++k)
    workers.emplace_back([&, k] {
      thread_index = k;
      block_threads = threads;
      block_turns = in_turns ? &turns : nullptr;
      block_barrier = in_turns ? nullptr : &concurrent;
      if (in_turns)
        turns.wait(k);
      for (unsigned k = 0; k < grid; ++k) {
        block_index = in_turns ? grid - 1 - k : k;
        entry_(argument);
        if (k + 1 < grid)
          barrier(); // the block has ended before the next begins
      }
      if (in_turns)
        turns.pass();
    });
  if (in_turns)
    turns.start();
  for (std::thread& w : workers)
    w.join();
}

} // namespace optjit
