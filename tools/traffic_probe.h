// The memory-traffic probe step kernels are measured against: for each element, read `reads` f32 arrays and write
// back the first `writes` of them, with no arithmetic worth the name (Adam: p, g, m, v in and p, m, v out, 28 B per
// element), over the same tensor sizes, work items and thread pool as the kernel it is compared with. Steps over
// arrays of several widths (bf16 params with f32 state or master weights) take the mixed probe: each array of the
// step, at its own width, read, read and written back, or only written, streamed over each work item's range.
#pragma once

#include "runtime/kernel_abi.h"
#include "runtime/tensor.h"

#include <vector>

namespace optjit {

class TrafficProbe {
public:
  // Buffers of the given element counts, separate from the measured optimizer's. An optimizer step reads its
  // param, grad and S state arrays and writes the param and the state back: reads = S + 2, writes = S + 1, with
  // S from 0 to 3. Throws optjit::Error for other shapes of traffic.
  TrafficProbe(const std::vector<int64_t>& numels, int reads = 4, int writes = 3);
  // One array a step touches: its width in bytes (1, 2, 4 or 8), whether it is read and written, and how many of
  // the step's elements share one of its entries (1; 2 for 4-bit codes, two a byte; a block for its scales).
  struct Array {
    int bytes;
    bool read, written;
    int64_t per = 1;
    int64_t entries(int64_t numel) const { return (numel + per - 1) / per; }
    // The bytes a pass over a tensor of `numel` elements moves in this array: each entry read and written as it is.
    int64_t traffic(int64_t numel) const { return bytes * ((read ? 1 : 0) + (written ? 1 : 0)) * entries(numel); }
  };
  TrafficProbe(const std::vector<int64_t>& numels, const std::vector<Array>& arrays);
  void run(); // one pass over every buffer
  int64_t bytes_per_pass() const { return bytes_; }

private:
  std::vector<std::vector<Tensor>> tensors_; // per tensor: `reads` arrays, the written ones first
  std::vector<WorkItem> items_;              // cut as the compiled kernels cut their tensors
  int64_t grain_ = 1;
  int64_t bytes_ = 0;
  int state_arrays_ = 0;
  std::vector<Array> mixed_; // empty: the f32 model above
  void run_mixed(const std::vector<Tensor>& arrays, int64_t begin, int64_t end) const;
};

} // namespace optjit
