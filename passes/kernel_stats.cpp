// kernel_stats — contract: counts, without changing anything, the launches per step after fusion and op by op
// (one per element op, as eager foreach launches), the arithmetic per element and per tensor, and the bytes of
// tensor data read and written per element (each slot read once, each store written once) — the traffic a
// memory-bound kernel is judged against.
#include "passes/passes.h"

#include <set>

namespace optjit {

KernelStats kernel_stats(const Graph& graph, const std::vector<KernelPlan>& kernels) {
  KernelStats stats;
  stats.kernels = static_cast<int>(kernels.size());
  std::set<std::string> loaded;
  for (const Node& n : graph.nodes) {
    if (n.op == Op::tensor)
      loaded.insert(n.name);
    if (op_has_trait(n.op, kInput))
      continue;
    ++(n.level == Level::Element ? stats.element_ops : stats.per_tensor_ops);
  }
  stats.unfused_kernels = stats.element_ops;
  int stored = 0;
  for (const Store& s : graph.stores)
    stored += s.kind == StoreKind::Tensor;
  stats.bytes_per_element =
      static_cast<int>((loaded.size() + static_cast<std::size_t>(stored)) * dtype_size(graph.dtype));
  return stats;
}

} // namespace optjit
