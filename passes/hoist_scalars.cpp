// hoist_scalars — contract: reorders the graph so that, pass by pass over the data (reduction_phases), every
// per-tensor value (hyperparameters, scalar state, bias corrections, the casts that round them to the element
// dtype, and the reductions that end the pass before) comes before every element value of that pass. Codegen
// evaluates such a prefix once per tensor in a kernel's tensor phase instead of once per element. A graph without
// reductions is one pass: all its per-tensor values first. Assumes a verified graph; the order stays topological,
// since a per-tensor value depends on element values only through a reduction of an earlier pass.
#include "passes/passes.h"
#include "passes/rewrite.h"

#include <algorithm>

namespace optjit {

Graph hoist_scalars(const Graph& graph) {
  const std::vector<int> phase = reduction_phases(graph);
  const int passes = graph.size() == 0 ? 0 : 1 + *std::max_element(phase.begin(), phase.end());
  Rewriter rw(graph, /*intern=*/false);
  for (int p = 0; p < passes; ++p)
    for (Level level : {Level::PerTensor, Level::Element})
      for (ValueId id = 0; id < graph.size(); ++id)
        if (phase[static_cast<std::size_t>(id)] == p && graph.node(id).level == level)
          rw.copy(id);
  return rw.finish();
}

} // namespace optjit
