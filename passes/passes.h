// Every pass of the pipeline. One file each; the contract of each is at the top of its file. Graph passes return
// a new graph and never mutate their input.
#pragma once

#include "ir/ir.h"
#include "ir/kernel_plan.h"

#include <string>
#include <vector>

namespace optjit {

Graph fold_constants(const Graph& graph);
Graph eliminate_common_subexpressions(const Graph& graph);
Graph eliminate_dead_code(const Graph& graph);
Graph hoist_scalars(const Graph& graph);
Graph keep_host_scalar_stores(const Graph& graph, const std::vector<std::string>& host_slots);
FusionPlan plan_fusion(const Graph& graph);
std::vector<KernelPlan> apply_fusion(const Graph& graph, const FusionPlan& plan);
// The scratch buffers apply_fusion's kernels and library calls hand each other: each matrix product's result, and
// each element operand of a product that is not one, in the product's dtype. Throws optjit::Error where a product's
// shapes do not fit (matrix_shapes).
std::vector<ScratchBuffer> scratch_buffers(const Graph& graph);
// Gives scratch buffers whose lives in `kernels` (from the first kernel or library call that uses one to the last)
// do not overlap one storage where they have the same dtype and shape, fewest storages first: a step's memory for
// its products is then the few matrices live at once (Newton-Schulz's two iterates and two Gram-sized matrices),
// not one per product.
void share_scratch_storage(std::vector<ScratchBuffer>& scratch, const std::vector<KernelPlan>& kernels);
KernelStats kernel_stats(const Graph& graph, const std::vector<KernelPlan>& kernels);

} // namespace optjit
