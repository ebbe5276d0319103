// plan_fusion — contract: decides which nodes form which kernel and records why, without changing the graph;
// every decision is also logged (OPTJIT_LOG=fusion). Vertical fusion joins producer->consumer chains into
// connected components; horizontal fusion joins every component into one kernel, because all of them run over the
// same tensor list and one launch can walk a table of (tensor, chunk) work items. The only split is at a reduction
// (reduce_sum, reduce_max): its value exists once a whole pass over the data has ended, so the values that use it
// run in the next kernel. A list reduction (list_sum, list_max) belongs to the kernel that computes its operand: the
// host combines it over the list when that kernel has ended, and the values that use it run in the next kernel. A graph
// whose longest path crosses R reductions plans into R + 1 kernels, the fewest possible: kernel k computes every value
// of reduction phase k (reduction_phases) and accumulates the reductions that end that pass. Per-tensor values are
// handed to later kernels as carried values; element values are recomputed from loads in every kernel that needs them
// (apply_fusion). A tensor store waits for the last kernel that loads its slot, so every kernel reads the values from
// before the step. A matrix product (mm, addmm) splits like a reduction: it runs in the matrix library after the kernel
// that writes its element operands out (or right after the product it reads), and the values that use it run in the
// next kernel, which loads its result. Assumes a verified, hoisted graph. A graph without stores needs no kernel.
#include "passes/kernel_membership.h"
#include "passes/passes.h"
#include "runtime/log.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace optjit {
namespace {

int find_root(std::vector<int>& parent, int x) {
  while (parent[static_cast<std::size_t>(x)] != x)
    x = parent[static_cast<std::size_t>(x)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
  return x;
}

// Moves each tensor store after the last kernel that loads its slot; repeats until no store moves (moving one can
// make its value, and so its loads, needed in a later kernel).
void place_tensor_stores(const Graph& graph, FusionPlan& plan) {
  for (bool moved = true; moved;) {
    moved = false;
    const std::vector<std::vector<char>> computes = kernel_membership(graph, plan);
    for (std::size_t s = 0; s < graph.stores.size(); ++s) {
      if (graph.stores[s].kind != StoreKind::Tensor)
        continue;
      for (int k = plan.kernel_count - 1; k > plan.store_kernel[s]; --k)
        for (ValueId id = 0; id < graph.size(); ++id)
          if (computes[static_cast<std::size_t>(k)][static_cast<std::size_t>(id)] && graph.node(id).op == Op::tensor &&
              graph.node(id).name == graph.stores[s].name) {
            plan.store_kernel[s] = k; // the last such kernel: the loops stop once k reaches it
            moved = true;
          }
    }
  }
}

// The decisions of a plan that splits at reductions: what each kernel accumulates, and what later kernels compute
// again.
void explain_split(const Graph& graph, const FusionPlan& plan, std::vector<std::string>& decisions) {
  const std::vector<std::vector<char>> computes = kernel_membership(graph, plan);
  for (int k = 0; k < plan.kernel_count; ++k) {
    std::string reductions, list_reductions, recomputed, stores;
    for (ValueId id = 0; id < graph.size(); ++id) {
      if (!computes[static_cast<std::size_t>(k)][static_cast<std::size_t>(id)])
        continue;
      const Node& n = graph.node(id);
      if (op_has_trait(n.op, kReduction))
        reductions += (reductions.empty() ? "%" : ", %") + std::to_string(id);
      else if (op_has_trait(n.op, kListReduction))
        list_reductions += (list_reductions.empty() ? "%" : ", %") + std::to_string(id);
      else if (n.level == Level::Element && plan.kernel_of[static_cast<std::size_t>(id)] < k)
        recomputed += (recomputed.empty() ? "%" : ", %") + std::to_string(id);
    }
    for (std::size_t s = 0; s < graph.stores.size(); ++s)
      if (store_kernel(graph, plan, s) == k)
        stores += (stores.empty() ? "" : ", ") + graph.stores[s].name;
    decisions.push_back(
        "split: kernel k" + std::to_string(k) + (reductions.empty() ? std::string() : " accumulates " + reductions) +
        (list_reductions.empty() ? std::string() : ", then the host combines " + list_reductions + " over the list") +
        (recomputed.empty() ? std::string() : ", recomputes " + recomputed + " from its loads") +
        (stores.empty() ? std::string() : ", stores " + stores));
  }
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
  const std::vector<int> phase = reduction_phases(graph);
  int reductions = 0;
  for (ValueId id = 0; id < graph.size(); ++id) {
    const bool reduction = op_has_trait(graph.node(id).op, kReduction);
    reductions += reduction;
    // A list reduction belongs to the kernel that computes its operand: the host combines it when that one ends.
    // A matrix product runs after the kernel of the phase before its own (kernel_of: that kernel).
    const bool product = op_has_trait(graph.node(id).op, kMatrix);
    const int kernel = op_has_trait(graph.node(id).op, kListReduction)
                           ? plan.kernel_of[static_cast<std::size_t>(graph.node(id).inputs[0])]
                           : phase[static_cast<std::size_t>(id)] - (reduction || product ? 1 : 0);
    plan.kernel_of[static_cast<std::size_t>(id)] = kernel;
  }
  for (const Store& s : graph.stores)
    plan.store_kernel.push_back(first_kernel_to_store(graph, plan, s));
  plan.kernel_count = 1 + *std::max_element(plan.store_kernel.begin(), plan.store_kernel.end());
  place_tensor_stores(graph, plan);

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
  plan.decisions.push_back("vertical: " + std::to_string(element_ops) + " element ops and " +
                           std::to_string(scalar_ops) + " per-tensor ops in " + std::to_string(components) +
                           " producer->consumer component(s), no intermediate written to memory");
  plan.decisions.push_back("horizontal: the " + std::to_string(components) +
                           " component(s) share the tensor list, so each pass over the data is one kernel, which "
                           "walks a table of (tensor, chunk) work items: one launch for every tensor");
  int products = 0;
  for (const Node& n : graph.nodes)
    products += op_has_trait(n.op, kMatrix);
  if (products > 0)
    plan.decisions.push_back("library: " + std::to_string(products) +
                             " matrix product(s) run in the matrix library between kernels, each after the kernel that "
                             "writes its operands out (or right after the product it reads)");
  if (plan.kernel_count == 1) {
    plan.decisions.push_back(reductions == 0 ? "refused: none (every op is pointwise)"
                                             : "refused: none (no value uses a reduction's result)");
  } else {
    plan.decisions.push_back("refused: " + std::to_string(plan.kernel_count - 1) +
                             " join(s) across a reduction, whose result exists only after a whole pass: " +
                             std::to_string(plan.kernel_count) + " kernels");
    explain_split(graph, plan, plan.decisions);
  }
  for (const std::string& line : plan.decisions)
    OPTJIT_LOG(fusion, "@{}: {}", graph.name, line);
  return plan;
}

} // namespace optjit
