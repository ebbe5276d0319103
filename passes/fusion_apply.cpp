// apply_fusion — contract: turns a fusion plan into kernel plans, run in plan order: each kernel's nodes (keeping
// the hoisted order, so per-tensor nodes form a prefix), its stores, its argument layout, and the per-tensor
// values that its element phase reads from scratch. A per-tensor value computed in one kernel and used in a later
// one is handed on: the producing kernel stores it (`store_carry "cN"`) and the using kernel reads it
// (`carried "cN"`, same dtype); constants and hyperparameters are cheaper to repeat than to carry, so each kernel
// that uses them gets its own copy. Assumes the graph plan_fusion saw. Internal errors (a bad plan): a value used
// by an earlier kernel than the one computing it, an element value crossing kernels (it would need a temporary
// tensor), or a kernel loading a slot that an earlier kernel already stored (it would read the new value).
#include "passes/passes.h"
#include "passes/rewrite.h"
#include "runtime/error.h"

#include <map>
#include <set>

namespace optjit {
namespace {

bool repeated_per_kernel(const Node& n) { return n.op == Op::constant || n.op == Op::hyper; }

} // namespace

std::vector<KernelPlan> apply_fusion(const Graph& graph, const FusionPlan& plan) {
  const auto kernel_of = [&](ValueId id) { return plan.kernel_of[static_cast<std::size_t>(id)]; };
  // Values handed on, in order of their producers: value id -> carry name.
  std::map<ValueId, std::string> carry_of;
  std::vector<std::pair<ValueId, std::string>> carried_values; // in carry order
  std::vector<std::string> carries;
  for (ValueId id = 0; id < graph.size(); ++id)
    for (ValueId in : graph.node(id).inputs) {
      if (kernel_of(in) == kernel_of(id) || repeated_per_kernel(graph.node(in)) || carry_of.count(in))
        continue;
      OPTJIT_ASSERT(kernel_of(in) < kernel_of(id), "fusion plan uses %" + std::to_string(in) + " in kernel " +
                                                       std::to_string(kernel_of(id)) + " before computing it");
      OPTJIT_ASSERT(graph.node(in).level == Level::PerTensor,
                    "fusion plan hands element value %" + std::to_string(in) + " to another kernel");
      std::string name = "c"; // appended, not "c" + ...: GCC 12 warns wrongly on that form (PR 105651)
      name += std::to_string(carries.size());
      carry_of[in] = name;
      carried_values.emplace_back(in, name);
      carries.push_back(std::move(name));
    }

  std::vector<KernelPlan> kernels;
  std::set<std::string> stored_by_earlier;
  for (int k = 0; k < plan.kernel_count; ++k) {
    Rewriter rw(graph, /*intern=*/false);
    GraphBuilder& b = rw.builder();
    std::map<ValueId, ValueId> local; // values of other kernels, as this kernel sees them
    auto operand = [&](ValueId in) {
      if (kernel_of(in) == k)
        return rw.mapped(in);
      if (auto it = local.find(in); it != local.end())
        return it->second;
      Node copy = graph.node(in);
      if (!repeated_per_kernel(copy)) {
        copy = Node{Op::carried, Level::PerTensor, copy.dtype, {}, 0, carry_of.at(in)};
      }
      return local[in] = b.add(std::move(copy));
    };
    // Values from other kernels first: they are per-tensor, and the kernel must stay hoisted.
    for (ValueId id = 0; id < graph.size(); ++id)
      if (kernel_of(id) == k)
        for (ValueId in : graph.node(id).inputs)
          operand(in);
    for (Level level : {Level::PerTensor, Level::Element})
      for (ValueId id = 0; id < graph.size(); ++id) {
        const Node& n = graph.node(id);
        if (kernel_of(id) != k || n.level != level)
          continue;
        if (n.op == Op::tensor || n.op == Op::scalar_state)
          OPTJIT_ASSERT(!stored_by_earlier.count(n.name),
                        "fusion plan loads slot '" + n.name + "' after an earlier kernel stored it");
        Node copy = n;
        for (ValueId& in : copy.inputs)
          in = operand(in);
        rw.map(id, b.add(std::move(copy)));
      }
    for (const Store& s : graph.stores)
      if (kernel_of(s.value) == k)
        b.add_store(Store{s.kind, s.name, rw.mapped(s.value)});
    for (const auto& [value, name] : carried_values)
      if (kernel_of(value) == k)
        b.add_store(Store{StoreKind::Carry, name, rw.mapped(value)});
    Graph kernel_graph = b.finish();
    for (const Store& s : kernel_graph.stores)
      stored_by_earlier.insert(s.name);
    kernels.push_back(make_kernel_plan(graph.name + "_k" + std::to_string(k), std::move(kernel_graph), carries));
  }
  return kernels;
}

} // namespace optjit
