// kernel_stats — contract: counts, without changing anything, the launches per step after fusion and op by op
// (one per element op, as eager foreach launches), the arithmetic per element and per tensor, and the bytes of
// tensor data read and written per element (each slot read once and each store written once per kernel, in the slot's
// own storage: its dtype, or a block-quantized slot's codes and its scale per block) — the traffic a memory-bound
// kernel is judged against.
#include "passes/passes.h"

#include <set>

namespace optjit {

// What one element of a slot takes in memory: its dtype's size, or a quantized slot's code (a byte, or half of one)
// and its share of its block's f32 scale.
static double slot_bytes_per_element(const Slot& slot) {
  if (!slot.blocks)
    return static_cast<double>(dtype_size(slot.dtype));
  return block_format_bits(slot.blocks->format) / 8.0 + 4.0 / static_cast<double>(slot.blocks->block);
}

KernelStats kernel_stats(const Graph& graph, const std::vector<KernelPlan>& kernels) {
  KernelStats stats;
  stats.kernels = static_cast<int>(kernels.size());
  for (const Node& n : graph.nodes)
    if (op_has_trait(n.op, kMatrix))
      ++stats.library_calls;
    else if (!op_has_trait(n.op, kInput))
      ++(n.level == Level::Element && !op_has_trait(n.op, kReduction) ? stats.element_ops : stats.per_tensor_ops);
  stats.unfused_kernels = stats.element_ops;
  // Each kernel reads the slots it loads and writes the ones it stores: a plan of several kernels pays every pass.
  double bytes = 0;
  for (const KernelPlan& k : kernels) {
    // Rows and columns slots hold one value per row or column, not per element: they are left out.
    const auto per_element = [&](const std::string& name) { return k.graph.slot(name)->kind == SlotKind::Tensor; };
    std::set<std::string> loaded;
    for (const Node& n : k.graph.nodes)
      if (n.op == Op::tensor && per_element(n.name))
        loaded.insert(n.name);
    for (const std::string& name : loaded)
      bytes += slot_bytes_per_element(*k.graph.slot(name));
    for (const Store& s : k.graph.stores)
      if (s.kind == StoreKind::Tensor && per_element(s.name))
        bytes += slot_bytes_per_element(*k.graph.slot(s.name));
  }
  stats.bytes_per_element = bytes;
  return stats;
}

} // namespace optjit
