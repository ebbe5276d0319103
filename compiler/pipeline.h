// The pipeline: the only place that knows the pass order. Traced graph -> optimized graph -> fusion plan ->
// kernel plans (+ statistics). Codegen takes it from there.
#pragma once

#include "ir/ir.h"
#include "ir/kernel_plan.h"

#include <vector>

namespace optjit {

struct PipelineResult {
  Graph traced;
  Graph optimized; // after fold, CSE, DCE and scalar hoisting
  FusionPlan fusion;
  std::vector<KernelPlan> kernels;
  KernelStats stats;
};

PipelineResult run_pipeline(Graph traced);
// The fused stage as text: the fusion decisions, then every kernel plan.
std::string print_fused(const PipelineResult& result);

} // namespace optjit
