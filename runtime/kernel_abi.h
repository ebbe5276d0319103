// The one calling convention of compiled kernels. Its fields are declared once, in runtime/kernel_abi.def, and
// read from there by these structs, by codegen (which lays the same fields out in LLVM IR) and by the bindings.
// A step runs a plan's kernels in order; each kernel is two entry points over one argument block on the CPU:
//   tensor phase:  for t in [begin, end): compute per-tensor scalars into scratch, update per-tensor state, and
//                  write the per-tensor values later kernels read (carry);
//   element phase: for i in [begin, end): run the element body over items[i], reading scratch of items[i].tensor,
//                  and write the item's partial of each reduction the kernel ends with (partials);
//   finish phase:  (kernels that end with reductions) for t in [begin, end): combine tensor t's partials in item
//                  order and write the results as carried values. A fixed order over fixed items: no result
//                  depends on the thread count.
// Every field is 8 bytes wide so the layout is the same on every 64-bit target.
#pragma once

#include <cstddef>
#include <cstdint>

namespace optjit {

struct WorkItem {
  int64_t tensor; // index into the tensor list
  int64_t begin;  // element range [begin, end) of that tensor
  int64_t end;
};

struct KernelArgs {
#define OPTJIT_CPU_ARG(name, type, kind) type name;
#include "runtime/kernel_abi.def"
#undef OPTJIT_CPU_ARG
};

using KernelPhaseFn = void (*)(const KernelArgs*, int64_t begin, int64_t end);

// Field indices, as codegen addresses them.
enum class KernelArg : unsigned {
#define OPTJIT_CPU_ARG(name, type, kind) name,
#include "runtime/kernel_abi.def"
#undef OPTJIT_CPU_ARG
  count
};
static_assert(sizeof(KernelArgs) == static_cast<unsigned>(KernelArg::count) * 8,
              "KernelArgs fields must all be 8 bytes");

// The GPU kernel: one launch of one block per work item, gpu_block_threads() threads each (any multiple of 32 up
// to kGpuMaxBlockThreads: the kernel strides by the block's size), with the parameters of runtime/kernel_abi.def.
// Every block computes tensor t's per-tensor scalars from the old scalar state; the last block of t to finish
// (counted in `done`) writes the new scalar state and the carried values, so no block reads a value another has
// already replaced. A kernel that ends with reductions has each block reduce its item (every thread its elements,
// then a fixed tree over the threads in shared memory) into `partials`, and the last block of t combines t's partials
// in item order: a fixed order, as on the CPU. A kernel that reads or writes rows and columns has items of whole
// rows (runtime/work_items.h's make_axis_work_items): each block sweeps its item's columns (a thread per column) and
// then its rows (a warp per row), so that row and column sums have fixed orders; a matrix cut into pieces has its
// column sums combined in piece order, and its columns slots written, by the tensor's last block
// (codegen/cuda/axis_sweeps.cpp's emit_gpu_axis_kernel).
struct GpuKernelParams {
#define OPTJIT_GPU_PARAM(name, type, kind) type name;
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
};
enum class GpuParam : unsigned {
#define OPTJIT_GPU_PARAM(name, type, kind) name,
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
  count
};
constexpr int kGpuMaxBlockThreads = 512;
// Threads per block for work items of `mean_item_elements` on average: 512 for full chunks (fewer, longer blocks
// stream best: 1.03-1.04x the copy bound on an H100 against 1.05-1.06x at 256), 128 for small tensors (more blocks
// in flight hide each block's per-tensor prologue: 1.32x against 1.55x at 256 for 10,000 x 1k).
// OPTJIT_GPU_BLOCK_THREADS (a multiple of 32 from 32 to 512) overrides it.
int gpu_block_threads(int64_t mean_item_elements);
constexpr int64_t kGpuChunkBytes = 64 * 1024; // per slot and work item: 16k f32 or 8k f64 elements
constexpr int kGpuVectorBytes = 16;           // 128-bit loads and stores where the item's addresses allow
static_assert(sizeof(WorkItem) == 24, "WorkItem is three int64");

// The grad pass's totals on a GPU (codegen's grad total kernel): one block of kGpuGradTotalThreads threads combines
// the per-tensor values that every bucket's grad pass kernels left in their device carry buffers, so that the
// update's kernels read the results where they were made. With a norm: each tensor's contribution (its sum of
// squares, whose square root it rounds to the grad's dtype and squares again, as GradNormTotal does on the host; or
// its largest |element|) into the total norm and the clip coefficient min(max_norm / (total + 1e-6), 1), which the
// update reads as a hyperparameter. With the in-step inf check: whether any tensor's check value is not 0 (an inf or
// NaN in its grads), which writes 1 to found_inf, where the update's kernels read it and keep every old value. Its
// one parameter is the device address of a descriptor: a GpuGradTotalHeader, then n_buckets GpuGradTotalBucket.
// Each thread combines the tensors j = thread, thread + kGpuGradTotalThreads, ... of each bucket in bucket order,
// then a tree halving the stride over the threads, so the order depends only on the tensor counts.
struct GpuGradTotalHeader {
  int64_t n_buckets;
  uint64_t total;       // device address of the f64 total norm (with a norm)
  uint64_t coefficient; // device address of the f64 clip coefficient (with a norm)
  double max_norm;
  uint64_t total_copy; // device address of another f64 the total is written to; 0 for none
  uint64_t found_inf;  // device address of the f32 found_inf the check writes 1 to (with the check)
};
struct GpuGradTotalBucket {
  uint64_t carry; // device address of the bucket's grad pass carry buffer: n_tensors rows of n_carry f64
  int64_t n_tensors;
  int64_t n_carry;
  int64_t norm_column; // the norm contribution's column (with a norm)
  int64_t rounding;    // the bucket's grads' dtype, which a 2-norm's per-tensor norm is rounded to: GpuGradRounding
  int64_t nonfinite_column; // the check value's column (with the check)
};
enum class GpuGradRounding : int64_t {
  none,
  f32,
  bf16,
  f16
}; // none: f64 grads (bf16 and f16 through f32, as the host)
static_assert(sizeof(GpuGradTotalHeader) == 48 && sizeof(GpuGradTotalBucket) == 48, "8-byte fields");
constexpr int kGpuGradTotalThreads = 256;
// What a grad total kernel combines (each its own kernel): the norm (none, the 2-norm or the infinity norm) and
// whether the step checks for infs and NaNs.
struct GpuGradTotalForm {
  enum class Norm { none, l2, infinity } norm = Norm::none;
  bool checks = false;
};

} // namespace optjit
