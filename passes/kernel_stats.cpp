// kernel_stats — contract: counts, without changing anything, the launches per step after fusion and op by op
// (one per element op, as eager foreach launches), the arithmetic per element and per tensor, and the bytes of
// tensor data read and written per element (each slot read once and each store written once per kernel) — the traffic a
// memory-bound kernel is judged against.
#include "passes/passes.h"

#include <set>

namespace optjit {

KernelStats kernel_stats(const Graph& graph, const std::vector<KernelPlan>& kernels) {
  KernelStats stats;
  stats.kernels = static_cast<int>(kernels.size());
  for (const Node& n : graph.nodes)
    if (op_has_trait(n.op, kMatrix))
      ++stats.library_calls;
    else if (!op_has_trait(n.op, kInput))
      ++(n.level == Level::Element && !op_has_trait(n.op, kReduction) ? stats.element_ops : stats.per_tensor_ops);
  stats.unfused_kernels = stats.element_ops;
  // Each kernel reads the slots it loads and writes the ones it stores: a plan of several kernels pays every pass.
  std::size_t slots = 0;
  for (const KernelPlan& k : kernels) {
    // Rows and columns slots hold one value per row or column, not per element: they are left out.
    const auto per_element = [&](const std::string& name) { return k.graph.slot(name)->kind == SlotKind::Tensor; };
    std::set<std::string> loaded;
    for (const Node& n : k.graph.nodes)
      if (n.op == Op::tensor && per_element(n.name))
        loaded.insert(n.name);
    slots += loaded.size();
    for (const Store& s : k.graph.stores)
      slots += s.kind == StoreKind::Tensor && per_element(s.name);
  }
  stats.bytes_per_element = static_cast<int>(slots * dtype_size(graph.dtype));
  return stats;
}

} // namespace optjit
