// The one calling convention of compiled kernels, used by codegen (which lays the same struct out in LLVM IR) and
// by the launcher. A kernel is two entry points over one argument block:
//   tensor phase:  for t in [begin, end): compute per-tensor scalars into scratch, update per-tensor state;
//   element phase: for i in [begin, end): run the element body over items[i], reading scratch of items[i].tensor.
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
  void* const* slots;     // slots[s * n_tensors + t]: data of slot s (tensor slots, then scalar-state slots)
  int64_t n_tensors;
  const double* hyper;    // hyper[group_of[t] * n_hyper + k]: step-wide hyperparameters, per param group
  const int64_t* group_of;
  int64_t n_hyper;
  void* scratch;          // scratch[t * n_scratch + k]: 8-byte per-tensor values from the tensor phase
  int64_t n_scratch;
  const WorkItem* items;
  int64_t n_items;
};

using KernelPhaseFn = void (*)(const KernelArgs*, int64_t begin, int64_t end);

// Field indices, as codegen addresses them.
enum KernelArgsField : unsigned {
  kArgSlots,
  kArgTensors,
  kArgHyper,
  kArgGroupOf,
  kArgHyperCount,
  kArgScratch,
  kArgScratchCount,
  kArgItems,
  kArgItemCount,
  kArgFieldCount
};
static_assert(sizeof(KernelArgs) == kArgFieldCount * 8, "KernelArgs fields must all be 8 bytes");

// The GPU kernel: one launch of one block per work item, gpu_block_threads() threads each (any multiple of 32 up
// to kGpuMaxBlockThreads: the kernel strides by the block's size). Its parameters, by value
// in this order, all pointers into device memory:
//   slots            u64[slot * n_tensors + t]  data of each tensor slot, then each scalar-state slot
//   group_of         i64[t]                     param group of tensor t
//   items            WorkItem[block]            the tensor and element range block `block` updates
//   items_of_tensor  i64[t]                     how many items tensor t has (>= 1: an empty tensor gets one)
//   done             u32[t]                     items of t finished this launch; zero between launches
//   hyper            f64[group * n_hyper + k]   this step's hyperparameters
//   n_tensors, n_hyper (i64)
// Every block computes tensor t's per-tensor scalars from the old scalar state; the last block of t to finish
// (counted in `done`) writes the new scalar state, so no block reads a value another has already replaced.
struct GpuKernelParams {
  uint64_t slots, group_of, items, items_of_tensor, done, hyper;
  int64_t n_tensors, n_hyper;
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

} // namespace optjit
