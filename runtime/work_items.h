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
  // Kernels over rows and columns: 0 walks each tensor as one item (the CPU: no two threads add to one row or
  // column); > 0 (the GPU) cuts tensors into items of whole rows, about this many elements (make_axis_work_items).
  int64_t axis_item_elements = 0;
};

// A tensor as kernels over rows and columns see it: `batches` matrices of m rows of n elements ([..., m, n]).
struct MatrixExtents {
  int64_t batches, m, n;
};

// Items of whole rows, for kernels that walk rows and columns (per tensor, in order):
//   - a matrix of more than R rows is cut into `pieces` items of about equal rows, R = max(kMinAxisItemRows,
//     ceil(shape.axis_item_elements / n)): its column sums are then partial per item, and combined in item order;
//   - smaller matrices are grouped whole, floor(R / m) to an item (pieces = 1): every item's column sums are whole.
// The cut depends on the shape alone, so sums have the same order on every run. Empty tensors give one empty item.
struct AxisWorkItems {
  std::vector<WorkItem> items;
  std::vector<int64_t> pieces; // per tensor: the items each of its matrices is cut into (1: whole matrices)
};
constexpr int64_t kMinAxisItemRows = 32; // fewer would make column partials a large share of the traffic
AxisWorkItems make_axis_work_items(const std::vector<MatrixExtents>& tensors, const LaunchShape& shape);

// Tensors of the given element counts cut into work items of at most shape.chunk_elements (empty tensors give
// none, or one empty item with shape.item_per_empty_tensor). The compiled kernels, the interpreter and the benchmark's
// traffic probe all walk this table.
std::vector<WorkItem> make_work_items(const std::vector<int64_t>& numels, const LaunchShape& shape);
// `shape` with items of whole blocks of `alignment` elements (block-quantized state: no block in two items): its chunk
// rounded up to a multiple of the alignment. A chunk of int64's largest (one item per tensor) is kept as it is.
LaunchShape with_whole_blocks(LaunchShape shape, int64_t alignment);
// How many whole items one task takes so that it holds about shape.elements_per_task elements.
int64_t items_per_task(const std::vector<WorkItem>& items, const LaunchShape& shape);

} // namespace optjit
