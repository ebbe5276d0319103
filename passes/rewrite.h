// A helper for graph passes: copies nodes into a new builder with operands renumbered, so a pass only says what
// to do with the nodes it changes.
#pragma once

#include "ir/builder.h"

#include <vector>

namespace optjit {

class Rewriter {
public:
  Rewriter(const Graph& source, bool intern) : source_(source), builder_(source.name, source.dtype, intern) {
    for (const Slot& slot : source.slots)
      builder_.declare_slot(slot);
    map_.assign(static_cast<std::size_t>(source.size()), -1);
  }
  // The new id of old value `id`.
  ValueId mapped(ValueId id) const { return map_[static_cast<std::size_t>(id)]; }
  void map(ValueId old_id, ValueId new_id) { map_[static_cast<std::size_t>(old_id)] = new_id; }
  // Copies old node `id` with renumbered operands and records the mapping.
  ValueId copy(ValueId id) {
    Node n = source_.node(id);
    for (ValueId& in : n.inputs)
      in = mapped(in);
    ValueId made = builder_.add(std::move(n));
    map(id, made);
    return made;
  }
  GraphBuilder& builder() { return builder_; }
  // Copies the stores with renumbered values and returns the new graph.
  Graph finish() {
    for (Store s : source_.stores) {
      s.value = mapped(s.value);
      builder_.add_store(std::move(s));
    }
    return builder_.finish();
  }

private:
  const Graph& source_;
  GraphBuilder builder_;
  std::vector<ValueId> map_;
};

} // namespace optjit
