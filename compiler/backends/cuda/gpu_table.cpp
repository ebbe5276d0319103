#include "compiler/backends/cuda/gpu_table.h"

#include <algorithm>
#include <cstring>

namespace optjit {
namespace {

std::size_t align16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

} // namespace

LaunchShape gpu_launch_shape(const KernelPlan& plan) {
  LaunchShape shape;
  shape.chunk_elements = kGpuChunkBytes / static_cast<int64_t>(dtype_size(plan.graph.dtype));
  shape.item_per_empty_tensor = true;
  // Kernels over rows and columns: two chunks of rows per item (at least kMinAxisItemRows). One item per tensor
  // left an H200 about 48x from bandwidth on a Transformer's matrices: too few blocks, each too long.
  shape.axis_item_elements = 2 * shape.chunk_elements;
  return shape;
}

GpuKernelParams GpuTable::at(uint64_t base, uint64_t carry, uint64_t axis, uint64_t col_scratch) const {
  GpuKernelParams p = params;
  for (uint64_t* field : {&p.slots, &p.group_of, &p.items, &p.items_of_tensor, &p.done, &p.hyper, &p.first_item,
                          &p.partials, &p.matrix, &p.row_base, &p.col_base, &p.col_split})
    *field += base;
  p.carry = carry;
  p.axis = axis;
  p.col_scratch = col_scratch;
  return p;
}

GpuTable make_gpu_table(const KernelPlan& plan, const Binding& host) {
  GpuTable table;
  const std::size_t n = host.group_of().size();
  std::vector<int64_t> items_of_tensor(n, 0);
  int64_t elements = 0;
  for (const WorkItem& item : host.items()) {
    ++items_of_tensor[static_cast<std::size_t>(item.tensor)];
    elements += item.end - item.begin;
  }
  table.grid = static_cast<unsigned>(host.items().size());
  const int64_t mean_item = elements / std::max<int64_t>(1, static_cast<int64_t>(host.items().size()));
  if (const std::optional<int64_t> block = stored_block(plan)) // a thread per quantization block (emit_gpu_block_walk)
    table.block_threads =
        static_cast<int>(std::clamp<int64_t>((mean_item / *block + 31) / 32 * 32, 32, kGpuMaxBlockThreads));
  else
    table.block_threads = gpu_block_threads(mean_item);
  const std::size_t n_partials = host.items().size() * static_cast<std::size_t>(host.n_reduce());
  const std::size_t sizes[] = {host.slots().size() * 8,
                               n * 8,
                               host.items().size() * sizeof(WorkItem),
                               n * 8,
                               n * 4,
                               host.hyper().size() * 8,
                               host.first_item().size() * 8,
                               std::max<std::size_t>(1, n_partials) * 8,
                               host.matrix().size() * 8,
                               host.row_base().size() * 8,
                               host.col_base().size() * 8,
                               host.col_split().size() * 8};
  constexpr int kRegions = 12;
  std::size_t offsets[kRegions], total = 0;
  for (int k = 0; k < kRegions; ++k) {
    offsets[k] = total;
    total += align16(sizes[k]);
  }
  table.image.assign(total, 0);
  std::memcpy(table.image.data() + offsets[0], host.slots().data(), sizes[0]);
  std::memcpy(table.image.data() + offsets[1], host.group_of().data(), sizes[1]);
  std::memcpy(table.image.data() + offsets[2], host.items().data(), sizes[2]);
  std::memcpy(table.image.data() + offsets[3], items_of_tensor.data(), sizes[3]);
  std::memcpy(table.image.data() + offsets[5], host.hyper().data(), sizes[5]);
  std::memcpy(table.image.data() + offsets[6], host.first_item().data(), sizes[6]);
  std::memcpy(table.image.data() + offsets[8], host.matrix().data(), sizes[8]);
  std::memcpy(table.image.data() + offsets[9], host.row_base().data(), sizes[9]);
  std::memcpy(table.image.data() + offsets[10], host.col_base().data(), sizes[10]);
  std::memcpy(table.image.data() + offsets[11], host.col_split().data(), sizes[11]);
  GpuKernelParams& p = table.params;
  p.slots = offsets[0];
  p.group_of = offsets[1];
  p.items = offsets[2];
  p.items_of_tensor = offsets[3];
  p.done = offsets[4];
  p.hyper = offsets[5];
  p.first_item = offsets[6];
  p.partials = offsets[7];
  p.matrix = offsets[8];
  p.row_base = offsets[9];
  p.col_base = offsets[10];
  p.col_split = offsets[11];
  table.col_scratch_doubles = host.col_scratch_doubles();
  p.n_tensors = static_cast<int64_t>(n);
  p.n_hyper = static_cast<int64_t>(plan.abi.hypers.size());
  p.n_carry = static_cast<int64_t>(plan.carries.size());
  return table;
}

} // namespace optjit
