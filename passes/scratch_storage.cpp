// share_scratch_storage: which scratch buffers of a plan may lie in the same memory.
//
// Contract: reads the plan's kernels and library calls in the order a step runs them (a kernel, then the calls after
// it) and sets each buffer's `storage`. A buffer lives from the first kernel or call that uses it to the last (a
// kernel uses the scratch slots it declares; a call its result, operands and addmm's input). Two buffers share a
// storage only if they have the same dtype and matrix shape and one's life ends before the other's begins: a call
// never writes its result over an operand it reads, and a kernel never stores one buffer over another it loads.
// Storages are numbered from 0 in the order their first buffer begins; a buffer no kernel or call uses keeps one of
// its own. Deterministic: the same plan gives the same storages.
#include "passes/passes.h"

#include <algorithm>
#include <map>
#include <utility>

namespace optjit {

void share_scratch_storage(std::vector<ScratchBuffer>& scratch, const std::vector<KernelPlan>& kernels) {
  // Each buffer's life: [first use, last use] in positions of the run order.
  std::map<std::string, std::pair<int, int>> life;
  int position = 0;
  const auto use = [&](const std::string& name) {
    auto [it, first] = life.try_emplace(name, position, position);
    if (!first)
      it->second.second = position;
  };
  for (const KernelPlan& kernel : kernels) {
    for (const Slot& slot : kernel.graph.slots)
      if (slot.role == SlotRole::Scratch)
        use(slot.name);
    ++position;
    for (const LibraryCall& call : kernel.calls_after) {
      for (const std::string* name : {&call.a, &call.b, &call.input, &call.result})
        if (!name->empty())
          use(*name);
      ++position;
    }
  }
  // Buffers by the start of their lives (unused ones last, in list order); each takes the first free storage of its
  // kind, or a new one.
  std::vector<std::size_t> order(scratch.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  const auto start = [&](std::size_t i) {
    auto it = life.find(scratch[i].name);
    return it == life.end() ? position : it->second.first;
  };
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return std::pair(start(x), x) < std::pair(start(y), y); });
  struct Storage {
    Dtype dtype;
    MatrixShape shape;
    int free_after; // the last position its current buffer uses
  };
  std::vector<Storage> storages;
  for (std::size_t i : order) {
    ScratchBuffer& buffer = scratch[i];
    auto it = life.find(buffer.name);
    int chosen = -1;
    if (it != life.end())
      for (std::size_t s = 0; s < storages.size() && chosen < 0; ++s)
        if (storages[s].dtype == buffer.dtype && storages[s].shape == buffer.shape &&
            storages[s].free_after < it->second.first)
          chosen = static_cast<int>(s);
    if (chosen < 0) {
      chosen = static_cast<int>(storages.size());
      storages.push_back({buffer.dtype, buffer.shape, 0});
    }
    storages[static_cast<std::size_t>(chosen)].free_after = it == life.end() ? position + 1 : it->second.second;
    buffer.storage = chosen;
  }
}

} // namespace optjit
