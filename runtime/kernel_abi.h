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
static_assert(sizeof(WorkItem) == 24, "WorkItem is three int64");

} // namespace optjit
