// Which nodes each kernel of a fusion plan computes, shared by the planner (which places stores by it) and
// apply_fusion (which builds the kernels from it). A per-tensor value is computed once, in the kernel the plan gives
// it; an element value cannot cross kernels (it would need a temporary tensor), so each kernel that needs one — for
// a store or for a reduction it accumulates — computes it again from its own loads; constants, hyperparameters and
// extents are read by every kernel that uses them (repeated_per_kernel). A matrix product is computed by no kernel:
// the kernel it follows computes its element operands (and writes them out), later kernels load its result.
#pragma once

#include "ir/kernel_plan.h"
#include "runtime/error.h"

#include <vector>

namespace optjit {

// The scratch buffer of matrix product `id`'s result, and of element value `id` written out as a product's operand
// in `dtype`.
inline std::string product_scratch(ValueId id) { return "product %" + std::to_string(id); }
inline std::string operand_scratch(ValueId id, Dtype dtype) {
  return "operand %" + std::to_string(id) + " " + std::string(dtype_name(dtype));
}

// Inputs cheaper to repeat than to carry: each kernel that uses one reads its own.
inline bool repeated_per_kernel(const Node& n) {
  return n.op == Op::constant || n.op == Op::hyper || n.op == Op::extent;
}

// The first kernel that can perform `store`: its value's, or for a reduction's value the next (the value exists only
// once the pass that accumulates it has ended; a list reduction's once the host has combined it after that kernel),
// unless it only hands the value on (a carry store, which the kernel's finish phase performs, or the host's combine).
inline int first_kernel_to_store(const Graph& graph, const FusionPlan& plan, const Store& store) {
  const Op op = graph.node(store.value).op;
  const bool after_pass =
      (op_has_trait(op, kReduction) || op_has_trait(op, kListReduction) || op_has_trait(op, kMatrix)) &&
      store.kind != StoreKind::Carry;
  return plan.kernel_of[static_cast<std::size_t>(store.value)] + (after_pass ? 1 : 0);
}

// The kernel that performs store `s` of `graph`.
inline int store_kernel(const Graph& graph, const FusionPlan& plan, std::size_t s) {
  return plan.store_kernel.empty() ? first_kernel_to_store(graph, plan, graph.stores[s]) : plan.store_kernel[s];
}

// computes[k][id]: kernel k computes node id.
inline std::vector<std::vector<char>> kernel_membership(const Graph& graph, const FusionPlan& plan) {
  std::vector<std::vector<char>> computes(static_cast<std::size_t>(plan.kernel_count),
                                          std::vector<char>(static_cast<std::size_t>(graph.size()), 0));
  std::vector<std::pair<ValueId, int>> work; // (node, kernel that needs it)
  const auto need = [&](ValueId id, int k) {
    const Node& n = graph.node(id);
    if (op_has_trait(n.op, kMatrix))
      return; // a matrix product runs in the library after kernel kernel_of[id]; later kernels load its result
    const int home = plan.kernel_of[static_cast<std::size_t>(id)];
    OPTJIT_ASSERT(home <= k, "fusion plan uses %" + std::to_string(id) + " in kernel " + std::to_string(k) +
                                 " before kernel " + std::to_string(home) + " computes it");
    // A reduction (an axis one's result is an element value too) is accumulated once, by its own kernel.
    const bool recomputed = n.level == Level::Element && !op_has_trait(n.op, kReduction);
    const int at = recomputed || repeated_per_kernel(n) ? k : home;
    char& flag = computes[static_cast<std::size_t>(at)][static_cast<std::size_t>(id)];
    if (!flag) {
      flag = 1;
      work.emplace_back(id, at);
    }
  };
  for (std::size_t s = 0; s < graph.stores.size(); ++s)
    need(graph.stores[s].value, store_kernel(graph, plan, s));
  // A matrix product's element operands that are not products: written out by the kernel the product follows.
  for (ValueId id = 0; id < graph.size(); ++id)
    if (op_has_trait(graph.node(id).op, kMatrix))
      for (ValueId in : graph.node(id).inputs)
        if (graph.node(in).level == Level::Element)
          need(in, plan.kernel_of[static_cast<std::size_t>(id)]);
  while (!work.empty()) {
    const auto [id, k] = work.back();
    work.pop_back();
    for (ValueId in : graph.node(id).inputs)
      need(in, k);
  }
  return computes;
}

} // namespace optjit
