#include "ir/builder.h"
#include "ir/printer.h"
#include "runtime/error.h"

#include <algorithm>
#include <bit>
#include <cctype>

namespace optjit {
namespace {

std::string describe(const Graph& graph, ValueId id) {
  const Node& n = graph.node(id);
  return std::string("%").append(std::to_string(id)) + " (" + std::string(op_name(n.op)) + ", " +
         (n.level == Level::PerTensor ? "pt " : "el ") + std::string(dtype_name(n.dtype)) + ")";
}

// Slot `name` must be declared, of `kind` (SlotKind::Tensor: any slot element values read and write).
void check_slot_kind(const Graph& graph, const std::string& name, SlotKind kind, const std::string& what) {
  const Slot* slot = graph.slot(name);
  if (!slot)
    throw Error(what + " uses slot '" + name + "', which graph @" + graph.name + " does not declare");
  if (kind == SlotKind::Tensor ? !is_element_slot(slot->kind) : slot->kind != kind)
    throw Error(what + " uses slot '" + name + "' as a " + std::string(slot_kind_name(kind)) + " slot, but it is a " +
                std::string(slot_kind_name(slot->kind)) + " slot");
}

} // namespace

void check_and_type(const Graph& graph, Node& node) {
  const std::string what = "node " + std::string(op_name(node.op));
  if (static_cast<int>(node.inputs.size()) != op_arity(node.op))
    throw Error(what + " takes " + std::to_string(op_arity(node.op)) + " operands, got " +
                std::to_string(node.inputs.size()));
  for (ValueId in : node.inputs)
    if (in < 0 || in >= graph.size())
      throw Error(what + " uses %" + std::to_string(in) + ", which is not defined before it");
  switch (node.op) {
  case Op::constant:
    node.level = Level::PerTensor;
    node.dtype = Dtype::f64;
    return;
  case Op::hyper:
  case Op::scalar_state:
  case Op::tensor:
    if (node.name.empty())
      throw Error(what + " needs a slot name");
    if (node.op != Op::hyper)
      check_slot_kind(graph, node.name, node.op == Op::tensor ? SlotKind::Tensor : SlotKind::Scalar, what);
    node.level = node.op == Op::tensor ? Level::Element : Level::PerTensor;
    node.dtype = node.op == Op::tensor ? graph.dtype : Dtype::f64;
    return;
  case Op::carried: // keeps the dtype of the value handed on
    if (node.name.empty())
      throw Error(what + " needs a carried value's name");
    node.level = Level::PerTensor;
    return;
  case Op::extent:
    if (node.name != "numel" && node.name != "m" && node.name != "n")
      throw Error(what + " \"" + node.name + "\": an extent is \"numel\", \"m\" or \"n\" (of a shape [..., m, n])");
    node.level = Level::PerTensor;
    node.dtype = Dtype::f64;
    return;
  case Op::carried_rows:
  case Op::carried_cols:
    if (node.name.empty())
      throw Error(what + " needs a carried value's name");
    node.level = Level::Element;
    node.dtype = graph.dtype;
    return;
  case Op::row_sum:
  case Op::col_sum:
    if (graph.node(node.inputs[0]).level != Level::Element)
      throw Error(what + " of " + describe(graph, node.inputs[0]) +
                  ": an axis reduction reduces an element value along a dimension of each tensor");
    node.level = Level::Element;
    node.dtype = graph.dtype;
    return;
  case Op::sround: {
    const Node& value = graph.node(node.inputs[0]);
    if (value.level != Level::Element || graph.dtype != Dtype::f32)
      throw Error(what + " rounds " + describe(graph, node.inputs[0]) +
                  ": it rounds element values of an f32 graph to bf16");
    for (int k = 1; k <= 2; ++k)
      if (const Node& key = graph.node(node.inputs[static_cast<std::size_t>(k)]);
          key.level != Level::PerTensor || key.dtype != Dtype::f64)
        throw Error(what + " takes its counter and stream as per-tensor f64 values, not " +
                    describe(graph, node.inputs[static_cast<std::size_t>(k)]));
    node.level = Level::Element;
    node.dtype = graph.dtype;
    return;
  }
  case Op::list_sum:
  case Op::list_max:
  case Op::group_sum:
  case Op::group_max: {
    const Node& value = graph.node(node.inputs[0]);
    if (value.level != Level::PerTensor || value.dtype != Dtype::f64)
      throw Error(what + " of " + describe(graph, node.inputs[0]) +
                  ": a list reduction combines a per-tensor f64 value over the list's tensors (reduce each tensor "
                  "first, and cast to f64)");
    if (op_has_trait(value.op, kListReduction))
      throw Error(what + " of " + describe(graph, node.inputs[0]) +
                  ": that value is already the same for every tensor of the list (a list reduction of it is the "
                  "value itself, or the value times the list's length)");
    node.level = Level::PerTensor;
    node.dtype = Dtype::f64;
    return;
  }
  case Op::reduce_sum:
  case Op::reduce_max:
    if (graph.node(node.inputs[0]).level != Level::Element)
      throw Error(what + " of " + describe(graph, node.inputs[0]) +
                  ": a reduction reduces an element value over each tensor to a per-tensor value");
    node.level = Level::PerTensor;
    node.dtype = Dtype::f64;
    return;
  case Op::mm:
  case Op::addmm: {
    matrix_product_form(node); // throws for a name that is not one
    const std::size_t matrices = node.op == Op::mm ? 2 : 3;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const Node& operand = graph.node(node.inputs[k]);
      if (k < matrices && operand.level != Level::Element)
        throw Error(what + " of " + describe(graph, node.inputs[k]) + ": its matrices are element values");
      if (k >= matrices && (operand.level != Level::PerTensor || operand.dtype != Dtype::f64))
        throw Error(what + " takes beta and alpha as per-tensor f64 values, not " + describe(graph, node.inputs[k]));
    }
    node.level = Level::Element;
    node.dtype = graph.dtype;
    return;
  }
  case Op::cast:
    node.level = graph.node(node.inputs[0]).level;
    if (node.level == Level::Element && node.dtype != graph.dtype)
      throw Error(what + " of element value " + describe(graph, node.inputs[0]) + " to " +
                  std::string(dtype_name(node.dtype)) + ": element values keep the graph dtype " +
                  std::string(dtype_name(graph.dtype)));
    return;
  default:
    break;
  }
  // Pointwise ops: operands agree in dtype; the result takes the higher level.
  const Node& first = graph.node(node.inputs[0]);
  node.level = Level::PerTensor;
  for (ValueId in : node.inputs) {
    const Node& operand = graph.node(in);
    if (operand.dtype != first.dtype)
      throw Error(what + " mixes dtypes: " + describe(graph, node.inputs[0]) + " and " + describe(graph, in) +
                  "; cast one operand first");
    if (operand.level == Level::Element)
      node.level = Level::Element;
  }
  node.dtype = first.dtype;
}

void check_graph_name(const std::string& name) {
  // The name becomes the kernels' symbols (the JIT's and PTX's entry points), which LLVM takes only as identifiers.
  const auto identifier_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) ||
      !std::all_of(name.begin(), name.end(), identifier_char))
    throw Error("graph @" + name +
                ": a graph's name is an identifier (letters, digits and _, not starting with a digit)");
}

GraphBuilder::GraphBuilder(std::string name, Dtype dtype, bool intern) : intern_(intern) {
  check_graph_name(name);
  if (compute_dtype(dtype) != dtype || is_complex(dtype))
    throw Error("graph @" + name + " computes in " + std::string(dtype_name(dtype)) +
                ": graphs compute in f32 or f64 (bf16 and f16 are storage dtypes, computed in f32)");
  graph_.name = std::move(name);
  graph_.dtype = dtype;
}

void GraphBuilder::declare_slot(Slot slot) {
  if (slot.name.empty())
    throw Error("graph @" + graph_.name + " declares a slot without a name");
  if (graph_.slot(slot.name))
    throw Error("graph @" + graph_.name + " declares slot '" + slot.name + "' twice");
  if (is_code_dtype(slot.dtype))
    throw Error("graph @" + graph_.name + " declares slot '" + slot.name + "' as " +
                std::string(dtype_name(slot.dtype)) +
                ": codes are the storage of block-quantized slots (declare the format and block, signed8/256)");
  if (slot.blocks) {
    const SlotBlocks& blocks = *slot.blocks;
    const std::string what =
        "graph @" + graph_.name + " declares slot '" + slot.name + "' as " + slot_storage_name(slot);
    if (slot.role != SlotRole::State || slot.kind != SlotKind::Tensor)
      throw Error(what + ": only state tensors are block-quantized");
    if (blocks.block <= 0 || blocks.block > kMaxQuantizationBlock)
      throw Error(what + ": a block holds 1 to " + std::to_string(kMaxQuantizationBlock) + " values");
    if (block_format_bits(blocks.format) == 4 && blocks.block % 2 != 0)
      throw Error(what + ": two 4-bit codes share a byte, so blocks are even");
    slot.dtype = Dtype::f32; // what its codes times their scales are
  }
  if (is_complex(slot.dtype))
    throw Error("graph @" + graph_.name + " declares slot '" + slot.name + "' as " +
                std::string(dtype_name(slot.dtype)) + ": complex tensors are stepped on their real view (declare " +
                std::string(dtype_name(component_dtype(slot.dtype))) + ")");
  graph_.slots.push_back(std::move(slot));
}

const Slot& GraphBuilder::slot(const std::string& name) const {
  if (const Slot* s = graph_.slot(name))
    return *s;
  std::string declared;
  for (const Slot& s : graph_.slots)
    declared += (declared.empty() ? "" : ", ") + s.name;
  throw Error("graph @" + graph_.name + " uses slot '" + name +
              "', which it does not declare (declared: " + (declared.empty() ? std::string("none") : declared) + ")");
}

ValueId GraphBuilder::add(Node node) {
  if (op_has_trait(node.op, kCommutative))
    std::sort(node.inputs.begin(), node.inputs.end());
  check_and_type(graph_, node);
  if (intern_) {
    auto key = std::make_tuple(node.op, node.dtype, node.inputs, std::bit_cast<uint64_t>(node.number), node.name);
    auto [it, inserted] = interned_.emplace(key, graph_.size());
    if (!inserted)
      return it->second;
  }
  graph_.nodes.push_back(std::move(node));
  return graph_.size() - 1;
}

ValueId GraphBuilder::constant(double value) {
  Node n;
  n.op = Op::constant;
  n.number = value;
  return add(std::move(n));
}

ValueId GraphBuilder::hyper(const std::string& name) { return add(Node{Op::hyper, {}, {}, {}, 0, name}); }
ValueId GraphBuilder::scalar_state(const std::string& name) { return add(Node{Op::scalar_state, {}, {}, {}, 0, name}); }
ValueId GraphBuilder::tensor(const std::string& name) { return add(Node{Op::tensor, {}, {}, {}, 0, name}); }

ValueId GraphBuilder::cast(ValueId value, Dtype dtype) {
  if (node(value).dtype == dtype)
    return value;
  Node n;
  n.op = Op::cast;
  n.dtype = dtype;
  n.inputs = {value};
  return add(std::move(n));
}

ValueId GraphBuilder::operand_for(ValueId value, Level partner_level) {
  // A per-tensor scalar meeting an element value is rounded to the element dtype first, as torch does.
  if (partner_level == Level::Element && node(value).level == Level::PerTensor)
    return cast(value, graph_.dtype);
  return value;
}

ValueId GraphBuilder::unary(Op op, ValueId value) {
  Node n;
  n.op = op;
  n.inputs = {value};
  return add(std::move(n));
}

ValueId GraphBuilder::binary(Op op, ValueId lhs, ValueId rhs) {
  Level level = std::max(node(lhs).level, node(rhs).level);
  Node n;
  n.op = op;
  n.inputs = {operand_for(lhs, level), operand_for(rhs, level)};
  return add(std::move(n));
}

ValueId GraphBuilder::ternary(Op op, ValueId a, ValueId b, ValueId c) {
  Level level = std::max({node(a).level, node(b).level, node(c).level});
  Node n;
  n.op = op;
  n.inputs = {operand_for(a, level), operand_for(b, level), operand_for(c, level)};
  return add(std::move(n));
}

ValueId GraphBuilder::select(ValueId condition, ValueId if_true, ValueId if_false) {
  return ternary(Op::select, condition, if_true, if_false);
}

ValueId GraphBuilder::fma(ValueId a, ValueId b, ValueId c) { return ternary(Op::fma, a, b, c); }

ValueId GraphBuilder::reduce(Op op, ValueId value) {
  if (!op_has_trait(op, kReduction) && !op_has_trait(op, kListReduction))
    throw Error(std::string(op_name(op)) + " is not a reduction");
  Node n;
  n.op = op;
  n.inputs = {value};
  return add(std::move(n));
}

void GraphBuilder::add_store(Store store) {
  if (store.value < 0 || store.value >= graph_.size())
    throw Error("store to '" + store.name + "' uses %" + std::to_string(store.value) + ", which is not defined");
  const Node& value = node(store.value);
  if (store.kind != StoreKind::Carry)
    check_slot_kind(graph_, store.name, store.kind == StoreKind::Tensor ? SlotKind::Tensor : SlotKind::Scalar,
                    std::string(store.kind == StoreKind::Tensor ? "store" : "store_scalar"));
  if (store.kind == StoreKind::Tensor && value.level != Level::Element)
    throw Error("store to tensor slot '" + store.name + "' needs an element value, got " +
                describe(graph_, store.value));
  if (store.kind == StoreKind::Scalar && (value.level != Level::PerTensor || value.dtype != Dtype::f64))
    throw Error("store to scalar slot '" + store.name + "' needs a per-tensor f64 value, got " +
                describe(graph_, store.value));
  if (store.kind == StoreKind::Carry && value.level != Level::PerTensor && !op_has_trait(value.op, kAxis))
    throw Error("carried value '" + store.name + "' needs a per-tensor value or an axis sum, got " +
                describe(graph_, store.value));
  for (const Store& s : graph_.stores)
    if (s.name == store.name)
      throw Error("slot '" + store.name + "' is stored twice; a graph writes each slot once");
  graph_.stores.push_back(std::move(store));
}

void GraphBuilder::store(const std::string& slot, ValueId value) { add_store(Store{StoreKind::Tensor, slot, value}); }
void GraphBuilder::store_scalar(const std::string& slot, ValueId value) {
  add_store(Store{StoreKind::Scalar, slot, value});
}

Graph GraphBuilder::finish() {
  Graph out = std::move(graph_);
  graph_ = Graph{out.name, out.dtype, {}, {}, {}};
  interned_.clear();
  return out;
}

} // namespace optjit
