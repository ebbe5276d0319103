// Independent jobs of milliseconds each (compiling a step's kernels) run at the same time: LLVM compiles modules of
// separate contexts concurrently, so a step of six kernels compiles in the time of two or three.
#pragma once

#include <cstddef>
#include <functional>

namespace optjit {

// Runs job(i) for every i in [0, n), on up to `threads` threads at once (the calling thread one of them; one extra
// thread is started per further worker), and returns when every job has ended. A job that throws does not stop the
// others; the exception of the first job (by index) that threw is rethrown then.
void run_concurrently(std::size_t n, int threads, const std::function<void(std::size_t)>& job);

} // namespace optjit
