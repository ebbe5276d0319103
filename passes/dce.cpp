// eliminate_dead_code — contract: removes every node no store depends on, keeping the order of the rest.
// Assumes a verified graph; keeps every store.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace optjit {

Graph eliminate_dead_code(const Graph& graph) {
  std::vector<bool> live(static_cast<std::size_t>(graph.size()), false);
  for (const Store& s : graph.stores)
    live[static_cast<std::size_t>(s.value)] = true;
  for (ValueId id = graph.size() - 1; id >= 0; --id)
    if (live[static_cast<std::size_t>(id)])
      for (ValueId in : graph.node(id).inputs)
        live[static_cast<std::size_t>(in)] = true;
  Rewriter rw(graph, /*intern=*/false);
  for (ValueId id = 0; id < graph.size(); ++id)
    if (live[static_cast<std::size_t>(id)])
      rw.copy(id);
  return rw.finish();
}

} // namespace optjit
