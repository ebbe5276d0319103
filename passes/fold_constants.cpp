// fold_constants — contract: replaces per-tensor ops whose operands are all constants by their value, and
// applies only IEEE-exact identities (x*1, 1*x, x/1, x-0, x+(-0), -(-x), select on a constant condition).
// Never x*0, x-x, x+0 or anything else that changes NaN, infinity or signed-zero results: optimizers must match
// torch bit for bit where they can. Assumes a verified graph; keeps every store.
#include "ir/op_semantics.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

#include <cmath>
#include <optional>

namespace optjit {
namespace {

// The constant a value holds, looking through casts of constants that the cast does not change.
std::optional<double> constant_value(const GraphBuilder& b, ValueId id) {
  const Node& n = b.node(id);
  if (n.op == Op::constant)
    return n.number;
  if (n.op == Op::cast) {
    auto inner = constant_value(b, n.inputs[0]);
    if (inner && round_to_dtype(n.dtype, *inner) == *inner)
      return inner;
  }
  return std::nullopt;
}

bool is_value(std::optional<double> v, double expected) {
  return v && *v == expected && std::signbit(*v) == std::signbit(expected);
}

// The value the node simplifies to, or -1 to keep it.
ValueId simplify(GraphBuilder& b, const Node& n) {
  auto operand = [&](int k) { return constant_value(b, n.inputs[static_cast<std::size_t>(k)]); };
  // A list reduction of a constant depends on the list's length: never folded.
  if (n.level == Level::PerTensor && n.dtype == Dtype::f64 && n.op != Op::constant && !op_has_trait(n.op, kInput) &&
      !op_has_trait(n.op, kListReduction)) {
    bool all_constant = true;
    std::vector<double> values;
    for (ValueId in : n.inputs) {
      const Node& operand_node = b.node(in);
      all_constant = all_constant && operand_node.op == Op::constant;
      values.push_back(operand_node.number);
    }
    if (all_constant) {
      if (n.op == Op::select)
        return b.constant(values[0] != 0 ? values[1] : values[2]);
      if (n.op == Op::fma)
        return b.constant(std::fma(values[0], values[1], values[2]));
      if (n.op == Op::cast)
        return n.inputs[0];
      return b.constant(values.size() == 1 ? apply_unary<double>(n.op, values[0])
                                           : apply_binary<double>(n.op, values[0], values[1]));
    }
  }
  switch (n.op) {
  case Op::mul:
    if (is_value(operand(1), 1.0) && b.node(n.inputs[0]).level == n.level)
      return n.inputs[0];
    if (is_value(operand(0), 1.0) && b.node(n.inputs[1]).level == n.level)
      return n.inputs[1];
    break;
  case Op::div:
    if (is_value(operand(1), 1.0) && b.node(n.inputs[0]).level == n.level)
      return n.inputs[0];
    break;
  case Op::sub:
    if (is_value(operand(1), 0.0) && b.node(n.inputs[0]).level == n.level)
      return n.inputs[0];
    break;
  case Op::add:
    if (is_value(operand(1), -0.0) && b.node(n.inputs[0]).level == n.level)
      return n.inputs[0];
    if (is_value(operand(0), -0.0) && b.node(n.inputs[1]).level == n.level)
      return n.inputs[1];
    break;
  case Op::neg:
    if (b.node(n.inputs[0]).op == Op::neg)
      return b.node(n.inputs[0]).inputs[0];
    break;
  case Op::select:
    if (auto c = operand(0); c && b.node(n.inputs[1]).level == n.level && b.node(n.inputs[2]).level == n.level)
      return *c != 0 ? n.inputs[1] : n.inputs[2];
    break;
  default:
    break;
  }
  return -1;
}

} // namespace

Graph fold_constants(const Graph& graph) {
  Rewriter rw(graph, /*intern=*/false);
  for (ValueId id = 0; id < graph.size(); ++id) {
    Node n = graph.node(id);
    for (ValueId& in : n.inputs)
      in = rw.mapped(in);
    ValueId folded = simplify(rw.builder(), n);
    rw.map(id, folded >= 0 ? folded : rw.builder().add(std::move(n)));
  }
  return rw.finish();
}

} // namespace optjit
