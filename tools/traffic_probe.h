// The memory-traffic probe step kernels are measured against: for each element, read four arrays and write three
// (Adam's p, g, m, v in and p, m, v out: 28 B per f32 element) with no arithmetic worth the name, over the same
// tensor sizes and the same thread pool as the kernel it is compared with.
#pragma once

#include "runtime/kernel_abi.h"
#include "runtime/tensor.h"

#include <vector>

namespace optjit {

class TrafficProbe {
public:
  // Buffers of the given element counts (f32), separate from the measured optimizer's.
  explicit TrafficProbe(const std::vector<int64_t>& numels);
  void run();                                    // one pass over every buffer
  int64_t bytes_per_pass() const { return bytes_; }

private:
  struct Buffers {
    Tensor p, g, m, v;
  };
  std::vector<Buffers> tensors_;
  std::vector<WorkItem> items_; // cut as the compiled kernels cut their tensors
  int64_t grain_ = 1;
  int64_t bytes_ = 0;
};

} // namespace optjit
