#include "ir/verifier.h"
#include "ir/builder.h"
#include "runtime/error.h"

namespace optjit {

void verify(const Graph& graph) {
  // Rebuilding through an uninterned builder re-checks every node against the typing rules.
  GraphBuilder check(graph.name, graph.dtype, /*intern=*/false);
  for (const Slot& slot : graph.slots) {
    try {
      check.declare_slot(slot);
    } catch (const Error& e) {
      throw Error("invalid graph @" + graph.name + ": " + e.what());
    }
  }
  for (int id = 0; id < graph.size(); ++id) {
    const Node& node = graph.node(id);
    Node copy = node;
    try {
      check.add(copy);
    } catch (const Error& e) {
      throw Error("invalid graph @" + graph.name + " at %" + std::to_string(id) + ": " + e.what());
    }
    const Node& typed = check.node(id);
    if (typed.level != node.level || typed.dtype != node.dtype || typed.inputs != node.inputs)
      throw Error("invalid graph @" + graph.name + " at %" + std::to_string(id) +
                  ": recorded type or operand order differs from the builder's");
  }
  for (const Store& store : graph.stores) {
    try {
      check.add_store(store);
    } catch (const Error& e) {
      throw Error("invalid graph @" + graph.name + ": " + e.what());
    }
  }
}

} // namespace optjit
