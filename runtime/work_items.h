// Work items: how a launch cuts a list of tensors into (tensor, element range) pieces. The compiled kernels (CPU and
// GPU), the interpreter and the benchmark's traffic probe all walk the same table, so they split work alike.
#pragma once

#include "runtime/kernel_abi.h"

#include <cstdint>
#include <vector>

namespace optjit {

struct LaunchShape {
  int64_t chunk_elements = 32768;     // the largest work item
  int64_t elements_per_task = 65536;  // what one thread takes at a time (whole items)
  int64_t tensors_per_task = 512;     // tensor-phase grain
  bool item_per_empty_tensor = false; // GPU: scalar state is written by a tensor's blocks, so each tensor needs one
};

// Tensors of the given element counts cut into work items of at most shape.chunk_elements (empty tensors give
// none, or one empty item with shape.item_per_empty_tensor). The compiled kernels, the interpreter and the benchmark's
// traffic probe all walk this table.
std::vector<WorkItem> make_work_items(const std::vector<int64_t>& numels, const LaunchShape& shape);
// How many whole items one task takes so that it holds about shape.elements_per_task elements.
int64_t items_per_task(const std::vector<WorkItem>& items, const LaunchShape& shape);

} // namespace optjit
