// apply_fusion — contract: turns a fusion plan into kernel plans: each kernel's nodes (keeping the hoisted order,
// so per-tensor nodes form a prefix), its stores, its argument layout, and the per-tensor values that the element
// phase reads from scratch (every non-constant per-tensor value used by an element node). Assumes the graph
// plan_fusion saw; a value used across kernels would need materialising and is an internal error today.
#include "passes/passes.h"
#include "passes/rewrite.h"
#include "runtime/error.h"

namespace optjit {

std::vector<KernelPlan> apply_fusion(const Graph& graph, const FusionPlan& plan) {
  std::vector<KernelPlan> kernels;
  for (int k = 0; k < plan.kernel_count; ++k) {
    Rewriter rw(graph, /*intern=*/false);
    KernelPlan kp;
    kp.name = graph.name + "_k" + std::to_string(k);
    for (ValueId id = 0; id < graph.size(); ++id) {
      if (plan.kernel_of[static_cast<std::size_t>(id)] != k)
        continue;
      for (ValueId in : graph.node(id).inputs)
        OPTJIT_ASSERT(plan.kernel_of[static_cast<std::size_t>(in)] == k, "value crosses kernels");
      rw.copy(id);
    }
    kp.graph = rw.finish();
    kp.graph.name = kp.name;
    kp.abi = signature_of(kp.graph);
    std::vector<bool> in_scratch(static_cast<std::size_t>(kp.graph.size()), false);
    for (ValueId id = 0; id < kp.graph.size(); ++id) {
      const Node& n = kp.graph.node(id);
      if (n.level == Level::PerTensor) {
        OPTJIT_ASSERT(kp.prologue_size == id, "graph is not hoisted: per-tensor node after an element node");
        kp.prologue_size = id + 1;
        continue;
      }
      for (ValueId in : n.inputs) {
        const Node& operand = kp.graph.node(in);
        if (operand.level == Level::PerTensor && operand.op != Op::constant &&
            !in_scratch[static_cast<std::size_t>(in)]) {
          in_scratch[static_cast<std::size_t>(in)] = true;
          kp.scratch.push_back(in);
        }
      }
    }
    kernels.push_back(std::move(kp));
  }
  return kernels;
}

} // namespace optjit
