// keep_host_scalar_stores — contract: keeps only the graph's stores to the scalar-state slots `host_slots` (the scalar
// state a step holds on the host beside device params, as torch keeps `step` for steps that are not capturable), and
// checks that the host can compute each: it may depend on constants, hyperparameters and scalar state held on the
// host, never on tensor data (an element value, a reduction, a list reduction, a carried value) nor on scalar state
// on the device, or an optjit::Error names the slot. Every node stays (dce removes what the kept stores do not
// need). compiler/pipeline.cpp's run_host_scalar_state_pipeline runs it, then dce.
#include "passes/passes.h"
#include "runtime/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace optjit {

Graph keep_host_scalar_stores(const Graph& graph, const std::vector<std::string>& host_slots) {
  const auto on_host = [&](const std::string& slot) {
    return std::find(host_slots.begin(), host_slots.end(), slot) != host_slots.end();
  };
  Graph kept = graph;
  std::erase_if(kept.stores, [&](const Store& s) { return s.kind != StoreKind::Scalar || !on_host(s.name); });
  // Each node is checked once: a node reached again (from a shared operand, or from another store) was found clean.
  std::vector<bool> checked(static_cast<std::size_t>(kept.size()), false);
  for (const Store& s : kept.stores) {
    std::vector<ValueId> pending{s.value};
    while (!pending.empty()) {
      const ValueId id = pending.back();
      pending.pop_back();
      if (checked[static_cast<std::size_t>(id)])
        continue;
      checked[static_cast<std::size_t>(id)] = true;
      const Node& n = kept.node(id);
      if (n.level == Level::Element || op_has_trait(n.op, kReduction) || op_has_trait(n.op, kListReduction) ||
          n.op == Op::carried)
        throw Error(fmt::format("graph @{}: scalar state '{}' is computed from tensor data (%{} = {}), which only the "
                                "params' device has: keep this state on the params' device",
                                graph.name, s.name, id, op_name(n.op)));
      if (n.op == Op::scalar_state && !on_host(n.name))
        throw Error(fmt::format("graph @{}: scalar state '{}', held on the host, is computed from scalar state '{}', "
                                "which is on the params' device: keep both on one side",
                                graph.name, s.name, n.name));
      pending.insert(pending.end(), n.inputs.begin(), n.inputs.end());
    }
  }
  return kept;
}

} // namespace optjit
