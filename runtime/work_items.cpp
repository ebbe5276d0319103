#include "runtime/work_items.h"

#include <algorithm>
#include <limits>

namespace optjit {

std::vector<WorkItem> make_work_items(const std::vector<int64_t>& numels, const LaunchShape& shape) {
  std::vector<WorkItem> items;
  for (std::size_t t = 0; t < numels.size(); ++t) {
    for (int64_t begin = 0; begin < numels[t]; begin += shape.chunk_elements)
      items.push_back({static_cast<int64_t>(t), begin, std::min(numels[t], begin + shape.chunk_elements)});
    if (numels[t] == 0 && shape.item_per_empty_tensor)
      items.push_back({static_cast<int64_t>(t), 0, 0});
  }
  return items;
}

AxisWorkItems make_axis_work_items(const std::vector<MatrixExtents>& tensors, const LaunchShape& shape) {
  AxisWorkItems out;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto [batches, m, n] = tensors[t];
    const auto tensor = static_cast<int64_t>(t);
    if (batches * m * n == 0) {
      out.items.push_back({tensor, 0, 0});
      out.pieces.push_back(1);
      continue;
    }
    const int64_t rows = std::max(kMinAxisItemRows, (shape.axis_item_elements + n - 1) / n);
    if (m > rows) {
      const int64_t pieces = (m + rows - 1) / rows;
      const int64_t piece_rows = (m + pieces - 1) / pieces;
      for (int64_t q = 0; q < batches; ++q)
        for (int64_t first = 0; first < m; first += piece_rows)
          out.items.push_back({tensor, (q * m + first) * n, (q * m + std::min(m, first + piece_rows)) * n});
      out.pieces.push_back((m + piece_rows - 1) / piece_rows);
    } else {
      const int64_t matrices = std::max<int64_t>(1, rows / m);
      for (int64_t q = 0; q < batches; q += matrices)
        out.items.push_back({tensor, q * m * n, std::min(batches, q + matrices) * m * n});
      out.pieces.push_back(1);
    }
  }
  return out;
}

int64_t items_per_task(const std::vector<WorkItem>& items, const LaunchShape& shape) {
  if (items.empty())
    return 1;
  int64_t total = 0;
  for (const WorkItem& item : items)
    total += item.end - item.begin;
  const int64_t average_item = std::max<int64_t>(1, total / static_cast<int64_t>(items.size()));
  return std::max<int64_t>(1, shape.elements_per_task / average_item);
}

LaunchShape with_whole_blocks(LaunchShape shape, int64_t alignment) {
  if (alignment <= 1 || shape.chunk_elements == std::numeric_limits<int64_t>::max())
    return shape;
  const int64_t rest = shape.chunk_elements % alignment;
  shape.chunk_elements =
      std::max(alignment, rest == 0 ? shape.chunk_elements : shape.chunk_elements + alignment - rest);
  return shape;
}

} // namespace optjit
