// hoist_scalars — contract: reorders the graph so that every per-tensor value (hyperparameters, scalar state,
// bias corrections, the casts that round them to the element dtype) comes before every element value. Codegen
// evaluates that prefix once per tensor in the kernel's tensor phase instead of once per element. Assumes a
// verified graph; per-tensor values never depend on element values, so the order stays topological.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace optjit {

Graph hoist_scalars(const Graph& graph) {
  Rewriter rw(graph, /*intern=*/false);
  for (Level level : {Level::PerTensor, Level::Element})
    for (ValueId id = 0; id < graph.size(); ++id)
      if (graph.node(id).level == level)
        rw.copy(id);
  return rw.finish();
}

} // namespace optjit
