// plan_fusion — contract: decides which nodes form which kernel and records why, without changing the graph;
// every decision is also logged (OPTJIT_LOG=fusion). Vertical fusion joins producer->consumer chains into
// connected components; horizontal fusion then joins every component into one kernel, because all of them run
// over the same tensor list and one launch can walk a table of (tensor, chunk) work items. A plan of several
// kernels hands per-tensor values from one kernel to the next (apply_fusion); the planner starts a new kernel only
// where an op needs its operands complete first, which no op of the IR does yet: every op is pointwise, so today
// every graph plans into one kernel, and the refusals line says so. Assumes a verified, hoisted graph. A graph
// without stores needs no kernel.
#include "passes/passes.h"
#include "runtime/log.h"

#include <numeric>
#include <set>

namespace optjit {
namespace {

int find_root(std::vector<int>& parent, int x) {
  while (parent[static_cast<std::size_t>(x)] != x)
    x = parent[static_cast<std::size_t>(x)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
  return x;
}

} // namespace

FusionPlan plan_fusion(const Graph& graph) {
  FusionPlan plan;
  plan.kernel_of.assign(static_cast<std::size_t>(graph.size()), graph.stores.empty() ? -1 : 0);
  if (graph.stores.empty()) {
    plan.decisions.push_back("no stores: the step has nothing to do, no kernel");
    OPTJIT_LOG(fusion, "@{}: {}", graph.name, plan.decisions.back());
    return plan;
  }
  std::vector<int> parent(static_cast<std::size_t>(graph.size()));
  std::iota(parent.begin(), parent.end(), 0);
  int element_ops = 0, scalar_ops = 0;
  for (ValueId id = 0; id < graph.size(); ++id) {
    const Node& n = graph.node(id);
    if (!op_has_trait(n.op, kInput))
      ++(n.level == Level::Element ? element_ops : scalar_ops);
    for (ValueId in : n.inputs)
      parent[static_cast<std::size_t>(find_root(parent, in))] = find_root(parent, id);
  }
  std::set<int> roots;
  for (const Store& s : graph.stores)
    roots.insert(find_root(parent, s.value));
  const int components = static_cast<int>(roots.size());
  plan.kernel_count = 1;
  plan.decisions.push_back("vertical: " + std::to_string(element_ops) + " element ops and " +
                           std::to_string(scalar_ops) + " per-tensor ops in " + std::to_string(components) +
                           " producer->consumer component(s), no intermediate written to memory");
  plan.decisions.push_back("horizontal: the " + std::to_string(components) +
                           " component(s) share the tensor list, so they join kernel k0, which walks a table of "
                           "(tensor, chunk) work items: one launch for every tensor");
  plan.decisions.push_back("refused: none (every op is pointwise)");
  for (const std::string& line : plan.decisions)
    OPTJIT_LOG(fusion, "@{}: {}", graph.name, line);
  return plan;
}

} // namespace optjit
