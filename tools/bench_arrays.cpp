#include "tools/bench_arrays.h"
#include "compiler/pipeline.h"

namespace optjit {

std::vector<TrafficProbe::Array> arrays_of(const Optimizer& opt, const ParamBucket& bucket) {
  std::vector<TrafficProbe::Array> arrays;
  for (const KernelPlan& kernel : run_pipeline(opt.trace_bucket(bucket)).kernels) {
    const Graph& graph = kernel.graph;
    for (const Slot& slot : graph.slots) {
      if (slot.kind != SlotKind::Tensor)
        continue;
      TrafficProbe::Array a{static_cast<int>(dtype_size(slot.dtype)), false, false};
      for (const Node& n : graph.nodes)
        a.read |= n.op == Op::tensor && n.name == slot.name;
      for (const Store& s : graph.stores)
        a.written |= s.kind == StoreKind::Tensor && s.name == slot.name;
      if (!(a.read || a.written))
        continue;
      if (slot.blocks) { // its codes (a byte, or a nibble, per element) and its f32 scales (one per block)
        arrays.push_back({1, a.read, a.written, block_format_bits(slot.blocks->format) == 4 ? 2 : 1});
        arrays.push_back({4, a.read, a.written, slot.blocks->block});
        continue;
      }
      arrays.push_back(a);
    }
  }
  return arrays;
}

} // namespace optjit
