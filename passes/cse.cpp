// eliminate_common_subexpressions — contract: every set of identical nodes (same op, dtype, name, number and
// operands, after commutative operands are sorted) becomes one node. Assumes a verified graph; keeps every store.
// The builder interns as it builds, so this pass is a copy through an interning builder; traced graphs are
// already CSE'd, graphs from the parser or from other passes may not be.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace optjit {

Graph eliminate_common_subexpressions(const Graph& graph) {
  Rewriter rw(graph, /*intern=*/true);
  for (ValueId id = 0; id < graph.size(); ++id)
    rw.copy(id);
  return rw.finish();
}

} // namespace optjit
