// Launching a compiled CPU kernel: the tensor phase over all tensors, then the element phase over all work items,
// then (for a kernel that ends with reductions) the finish phase over all tensors, each split across the thread
// pool (inline when the work is small).
#pragma once

#include "runtime/kernel_abi.h"
#include "runtime/thread_pool.h"

namespace optjit {

inline void launch_cpu_kernel(KernelPhaseFn tensor_phase, KernelPhaseFn element_phase, KernelPhaseFn finish_phase,
                              const KernelArgs& args, int64_t tensor_grain, int64_t item_grain,
                              ThreadPool& pool = ThreadPool::global()) {
  pool.parallel_for(args.n_tensors, tensor_grain, [&](int64_t b, int64_t e) { tensor_phase(&args, b, e); });
  pool.parallel_for(args.n_items, item_grain, [&](int64_t b, int64_t e) { element_phase(&args, b, e); });
  if (finish_phase)
    pool.parallel_for(args.n_tensors, tensor_grain, [&](int64_t b, int64_t e) { finish_phase(&args, b, e); });
}

} // namespace optjit
