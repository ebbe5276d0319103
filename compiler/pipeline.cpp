#include "compiler/pipeline.h"
#include "passes/pass_manager.h"
#include "passes/passes.h"

#include <algorithm>

namespace optjit {

PipelineResult run_pipeline(Graph traced) {
  PipelineResult result;
  result.traced = std::move(traced);
  PassManager passes({
      {"fold_constants", fold_constants},
      {"cse", eliminate_common_subexpressions},
      {"dce", eliminate_dead_code},
      {"hoist_scalars", hoist_scalars},
  });
  result.optimized = passes.run(result.traced);
  if (has_matrix_products(result.optimized))
    result.scratch = scratch_buffers(result.optimized); // checks the products' shapes first
  result.fusion = plan_fusion(result.optimized);
  result.kernels = apply_fusion(result.optimized, result.fusion);
  share_scratch_storage(result.scratch, result.kernels);
  result.stats = kernel_stats(result.optimized, result.kernels);
  return result;
}

bool has_matrix_products(const Graph& graph) {
  return std::any_of(graph.nodes.begin(), graph.nodes.end(), [](const Node& n) { return op_has_trait(n.op, kMatrix); });
}

Graph run_host_scalar_state_pipeline(const Graph& optimized, const std::vector<std::string>& host_slots) {
  PassManager passes({
      {"keep_host_scalar_stores", [&](const Graph& g) { return keep_host_scalar_stores(g, host_slots); }},
      {"dce", eliminate_dead_code},
  });
  return passes.run(optimized);
}

std::string print_fused(const PipelineResult& result) {
  std::string text = "fusion of @" + result.optimized.name + ": " + std::to_string(result.stats.kernels) +
                     " kernel(s) per step (op by op: " + std::to_string(result.stats.unfused_kernels) + ")\n";
  for (const std::string& line : result.fusion.decisions)
    text += "  " + line + "\n";
  for (const ScratchBuffer& s : result.scratch)
    text += "scratch \"" + s.name + "\" : " + std::string(dtype_name(s.dtype)) + " " +
            [&] {
              const auto [rows, cols] = matrix_dims(s.shape);
              return std::string{rows, 'x', cols};
            }() +
            ", storage " + std::to_string(s.storage) + "\n";
  for (const KernelPlan& k : result.kernels) {
    text += print_kernel_plan(k);
    for (const LibraryCall& call : k.calls_after)
      text += "then " + print_library_call(call) + "\n";
  }
  return text;
}

} // namespace optjit
