// How the driver compiles and launches a step: the stages it can show, and the options a user chooses.
#pragma once

#include "compiler/target.h"
#include "ir/kernel_plan.h"
#include "runtime/work_items.h"

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace optjit {

enum class Stage { Traced, Optimized, Fused, LLVM, PTX };
// "traced", "optimized", "fused", "llvm", "ptx"; throws optjit::Error otherwise.
Stage parse_stage(std::string_view text);
// The target whose code a dump of `stage` shows for a bucket on `target`: its own, or the CUDA target sm_`gpu_sm`
// when one is asked for (PTX needs no GPU), or sm_80 for PTX of a bucket that is not on a GPU.
Target code_target(const Target& target, Stage stage, int gpu_sm);

struct CompileOptions {
  LaunchShape launch;           // how CPU launches cut tensors into work items
  std::size_t max_variants = 8; // compiled variants kept per step (guard sets seen); the oldest goes first
  bool cuda_graphs = false;     // GPU buckets: replay a captured CUDA graph of the step, re-captured on rebind
  Execution execution = Execution::Compiled; // Interpreted: the eager path (traced graphs run op by op)
  // A step over shards: each process holds a part of every tensor (FSDP2's DTensors, stepped through their local
  // tensors) and steps its part. A reduction over a tensor (a norm, a sum, a max) then spans the processes: the
  // step pauses when one has been computed and calls `shard_reducer(values, how)` with this process's per-tensor
  // partials of every such reduction combined `how` (summed, or the largest taken), which it must replace in place
  // with their combination over every process (an all-reduce). Every process must step the same lists (the same
  // params with grads), so that each makes the same calls with as many values. A clipping step's grad norm and an
  // in-step inf check go through it too (the optimizer's own reducers are then refused: they would combine twice).
  // Steps that read a tensor's size or its rows or columns, which span the shards too, are refused. Stochastic
  // rounding draws by the element's place in the shard, so each process's k-th element draws alike.
  std::function<void(std::vector<double>& values, ShardCombine how)> shard_reducer;
};

} // namespace optjit
