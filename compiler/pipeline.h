// The pipeline: the only place that knows the pass order. Traced graph -> optimized graph -> fusion plan ->
// kernel plans (+ statistics). Codegen takes it from there.
#pragma once

#include "ir/ir.h"
#include "ir/kernel_plan.h"

#include <string>
#include <vector>

namespace optjit {

struct PipelineResult {
  Graph traced;
  Graph optimized; // after fold, CSE, DCE and scalar hoisting
  FusionPlan fusion;
  std::vector<KernelPlan> kernels;    // with the matrix products each is followed by (KernelPlan::calls_after)
  std::vector<ScratchBuffer> scratch; // the buffers kernels and products hand each other (none without products)
  KernelStats stats;
};

PipelineResult run_pipeline(Graph traced);
bool has_matrix_products(const Graph& graph);
// The host's part of a bucket whose scalar state lives on the host beside device params
// (compiler/backends/host_scalar_state.h): the optimized graph's stores to `host_slots` and the nodes they need
// (keep_host_scalar_stores, dce). Throws optjit::Error when such a store needs what only the device has.
Graph run_host_scalar_state_pipeline(const Graph& optimized, const std::vector<std::string>& host_slots);
// The fused stage as text: the fusion decisions, then every kernel plan.
std::string print_fused(const PipelineResult& result);

} // namespace optjit
