// GraphBuilder: the only way graphs are made. It checks each node on construction (operand count, levels,
// dtypes), sorts the operands of commutative ops, inserts the cast that rounds a per-tensor scalar to the element
// dtype where the two meet (as torch rounds a Python scalar to the tensor's dtype), and, when interning, returns
// the existing node for an identical one (CSE for free).
#pragma once

#include "ir/ir.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace optjit {

// Throws optjit::Error unless `name` can name a graph: an identifier, since it becomes the kernels' symbols.
void check_graph_name(const std::string& name);

class GraphBuilder {
public:
  GraphBuilder(std::string name, Dtype dtype, bool intern = true);

  // Declares a slot; nodes and stores may name only declared slots, of the matching kind.
  void declare_slot(Slot slot);
  const Slot& slot(const std::string& name) const; // throws optjit::Error naming the declared slots

  ValueId constant(double value);
  ValueId hyper(const std::string& name);
  ValueId scalar_state(const std::string& name);
  ValueId tensor(const std::string& name);
  ValueId cast(ValueId value, Dtype dtype);
  ValueId unary(Op op, ValueId value);
  ValueId binary(Op op, ValueId lhs, ValueId rhs);
  ValueId select(ValueId condition, ValueId if_true, ValueId if_false);
  ValueId fma(ValueId a, ValueId b, ValueId c); // a * b + c, rounded once
  // A reduction (an op with kReduction: reduce_sum, reduce_max) of element value `value` over each tensor: a
  // per-tensor f64 value; or a list reduction (list_sum, list_max) of per-tensor f64 value `value` over the list.
  ValueId reduce(Op op, ValueId value);
  void store(const std::string& slot, ValueId value);
  void store_scalar(const std::string& slot, ValueId value);

  // Adds a node as given (operands are not cast); checks it like every other. Used by the parser and passes.
  ValueId add(Node node);
  void add_store(Store store);

  const Node& node(ValueId id) const { return graph_.node(id); }
  const std::vector<Slot>& graph_slots() const { return graph_.slots; }
  bool has_slot(const std::string& name) const { return graph_.slot(name) != nullptr; }
  bool stores_to(const std::string& slot) const {
    return std::any_of(graph_.stores.begin(), graph_.stores.end(), [&](const Store& s) { return s.name == slot; });
  }
  Dtype dtype() const { return graph_.dtype; }
  int size() const { return graph_.size(); }
  Graph finish();

private:
  ValueId operand_for(ValueId value, Level partner_level);
  ValueId ternary(Op op, ValueId a, ValueId b, ValueId c); // operands cast to the highest level's dtype

  Graph graph_;
  bool intern_;
  std::map<std::tuple<Op, Dtype, std::vector<ValueId>, uint64_t, std::string>, ValueId> interned_;
};

// The level and dtype a node must have, given its operands; throws optjit::Error naming the rule when the
// operands do not fit. Shared by the builder and the verifier.
void check_and_type(const Graph& graph, Node& node);

} // namespace optjit
