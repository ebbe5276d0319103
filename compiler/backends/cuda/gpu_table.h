// GpuTable: the argument table of one GPU kernel as bytes (runtime/kernel_abi.h's GpuKernelParams and the arrays its
// fields point at), laid out from a bound host Binding: slots | group_of | items | items_of_tensor | done | hyper |
// first_item | partials | matrix | row_base | col_base | col_split, each 16-byte aligned. GpuBinding uploads the image
// to the device; tests run emulated GPU kernels on it in host memory (codegen.h's EmulatedGpuKernel).
#pragma once

#include "compiler/binding.h"
#include "runtime/kernel_abi.h"

#include <vector>

namespace optjit {

// The launch shape GPU kernels cut work items by (kGpuChunkBytes chunks; an item for each empty tensor).
LaunchShape gpu_launch_shape(const KernelPlan& plan);

struct GpuTable {
  std::vector<unsigned char> image; // the done counters are zero
  GpuKernelParams params{};         // global fields: offsets into the image (rebased by at()); carry, axis: 0
  int block_threads = 0;            // gpu_block_threads for the items' mean size
  unsigned grid = 0;                // blocks: one per work item
  int64_t col_scratch_doubles = 0;  // the column scratch the kernel needs (Binding::col_scratch_doubles)

  // The parameters with the image at `base`, the plan's carry buffer at `carry`, its table of axis arrays (one
  // address per carry, runtime/kernel_abi.def) at `axis` and a column scratch of col_scratch_doubles at
  // `col_scratch` (0 when none is needed).
  GpuKernelParams at(uint64_t base, uint64_t carry, uint64_t axis, uint64_t col_scratch) const;
};

// The table of `plan` over `host`, a Binding bound with gpu_launch_shape(plan).
GpuTable make_gpu_table(const KernelPlan& plan, const Binding& host);

} // namespace optjit
