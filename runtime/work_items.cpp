#include "runtime/work_items.h"

#include <algorithm>

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

int64_t items_per_task(const std::vector<WorkItem>& items, const LaunchShape& shape) {
  if (items.empty())
    return 1;
  int64_t total = 0;
  for (const WorkItem& item : items)
    total += item.end - item.begin;
  const int64_t average_item = std::max<int64_t>(1, total / static_cast<int64_t>(items.size()));
  return std::max<int64_t>(1, shape.elements_per_task / average_item);
}

} // namespace optjit
