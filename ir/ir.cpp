#include "ir/ir.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

namespace optjit {
namespace {

struct OpInfo {
  std::string_view name;
  int arity;
  unsigned traits;
};

constexpr OpInfo kOps[] = {
#define OPTJIT_OP(name, arity, traits) {#name, arity, traits},
#include "ir/ops.def"
#undef OPTJIT_OP
};

void add_unique(std::vector<std::string>& list, const std::string& name) {
  if (std::find(list.begin(), list.end(), name) == list.end())
    list.push_back(name);
}

} // namespace

std::string_view op_name(Op op) { return kOps[static_cast<int>(op)].name; }
int op_arity(Op op) { return kOps[static_cast<int>(op)].arity; }
bool op_has_trait(Op op, OpTraits trait) { return (kOps[static_cast<int>(op)].traits & trait) != 0; }

bool op_from_name(std::string_view name, Op& op) {
  for (std::size_t i = 0; i < std::size(kOps); ++i)
    if (kOps[i].name == name) {
      op = static_cast<Op>(i);
      return true;
    }
  return false;
}

MatrixProductForm matrix_product_form(const Node& node) {
  const std::string& name = node.name;
  MatrixProductForm form;
  const bool shaped =
      name.size() >= 4 && (name[0] == 'n' || name[0] == 't') && (name[1] == 'n' || name[1] == 't') && name[2] == ' ';
  if (shaped && (name.substr(3) == "bf16" || name.substr(3) == "f32")) {
    form.dtype = name.substr(3) == "bf16" ? Dtype::bf16 : Dtype::f32;
    form.transpose_a = name[0] == 't';
    form.transpose_b = name[1] == 't';
    return form;
  }
  throw Error("node " + std::string(op_name(node.op)) + " \"" + name +
              "\": a matrix product's name says which operands it reads transposed and the dtype its products run "
              "in: \"<n|t><n|t> <bf16|f32>\", as \"nt bf16\"");
}

std::string matrix_product_name(const MatrixProductForm& form) {
  return std::string(form.transpose_a ? "t" : "n") + (form.transpose_b ? "t" : "n") + " " +
         std::string(dtype_name(form.dtype));
}

std::string_view slot_role_name(SlotRole role) {
  switch (role) {
  case SlotRole::Param:
    return "param";
  case SlotRole::Grad:
    return "grad";
  case SlotRole::State:
    return "state";
  case SlotRole::Scratch:
    return "scratch";
  }
  __builtin_unreachable();
}

std::string scales_slot_name(const std::string& name) { return name + ".scale"; }

std::string slot_storage_name(const Slot& slot) {
  if (!slot.blocks)
    return std::string(dtype_name(slot.dtype));
  return block_format_name(slot.blocks->format) + "/" + std::to_string(slot.blocks->block);
}

std::string_view slot_kind_name(SlotKind kind) {
  switch (kind) {
  case SlotKind::Tensor:
    return "tensor";
  case SlotKind::Scalar:
    return "scalar";
  case SlotKind::Rows:
    return "rows";
  case SlotKind::Cols:
    return "cols";
  }
  __builtin_unreachable();
}

GraphSignature signature_of(const Graph& graph) {
  GraphSignature sig;
  for (const Node& n : graph.nodes) {
    if (n.op == Op::tensor)
      add_unique(sig.tensor_slots, n.name);
    else if (n.op == Op::scalar_state)
      add_unique(sig.scalar_slots, n.name);
    else if (n.op == Op::hyper)
      add_unique(sig.hypers, n.name);
    else if (n.op == Op::carried || n.op == Op::carried_rows || n.op == Op::carried_cols)
      add_unique(sig.carried_in, n.name);
  }
  for (const Store& s : graph.stores) {
    switch (s.kind) {
    case StoreKind::Tensor:
      add_unique(sig.tensor_slots, s.name);
      break;
    case StoreKind::Scalar:
      add_unique(sig.scalar_slots, s.name);
      break;
    case StoreKind::Carry:
      add_unique(sig.carried_out, s.name);
      break;
    }
  }
  return sig;
}

std::pair<char, char> matrix_dims(MatrixShape shape) {
  switch (shape) {
  case MatrixShape::MN:
    return {'m', 'n'};
  case MatrixShape::MM:
    return {'m', 'm'};
  case MatrixShape::NN:
    return {'n', 'n'};
  case MatrixShape::NM:
    return {'n', 'm'};
  }
  __builtin_unreachable();
}

std::vector<MatrixShape> matrix_shapes(const Graph& graph) {
  std::vector<MatrixShape> shapes(static_cast<std::size_t>(graph.size()), MatrixShape::MN);
  const auto of = [&](ValueId id) { return shapes[static_cast<std::size_t>(id)]; };
  const auto name = [](std::pair<char, char> dims) { return std::string{'(', dims.first, ',', ' ', dims.second, ')'}; };
  for (ValueId id = 0; id < graph.size(); ++id) {
    const Node& n = graph.node(id);
    if (op_has_trait(n.op, kMatrix)) {
      const MatrixProductForm form = matrix_product_form(n);
      const std::size_t first = n.op == Op::addmm ? 1 : 0;
      auto a = matrix_dims(of(n.inputs[first])), b = matrix_dims(of(n.inputs[first + 1]));
      if (form.transpose_a)
        std::swap(a.first, a.second);
      if (form.transpose_b)
        std::swap(b.first, b.second);
      if (a.second != b.first)
        throw Error(fmt::format("%{} = {} \"{}\" multiplies an {} by a {} matrix of each (m, n) param: the inner "
                                "sizes differ",
                                id, op_name(n.op), n.name, name(a), name(b)));
      const std::pair<char, char> result{a.first, b.second};
      const MatrixShape shape = result == std::pair{'m', 'n'}   ? MatrixShape::MN
                                : result == std::pair{'m', 'm'} ? MatrixShape::MM
                                : result == std::pair{'n', 'n'} ? MatrixShape::NN
                                                                : MatrixShape::NM;
      if (n.op == Op::addmm && of(n.inputs[0]) != shape)
        throw Error(fmt::format("%{} = addmm \"{}\" adds an {} matrix to an {} product", id, n.name,
                                name(matrix_dims(of(n.inputs[0]))), name(result)));
      shapes[static_cast<std::size_t>(id)] = shape;
      continue;
    }
    for (ValueId in : n.inputs) // pointwise ops pair elements of the param's shape; reductions reduce those
      if (graph.node(in).level == Level::Element && of(in) != MatrixShape::MN)
        throw Error(fmt::format("%{} = {} reads %{}, an {} matrix of each (m, n) param: pointwise ops and "
                                "reductions take values of the param's shape (the others go to products)",
                                id, op_name(n.op), in, name(matrix_dims(of(in)))));
  }
  for (const Store& s : graph.stores)
    if (of(s.value) != MatrixShape::MN)
      throw Error(fmt::format("store to '{}' of %{}, an {} matrix of each (m, n) param: a slot holds the param's "
                              "shape",
                              s.name, s.value, name(matrix_dims(of(s.value)))));
  return shapes;
}

std::vector<int> reduction_phases(const Graph& graph) {
  std::vector<int> phase(static_cast<std::size_t>(graph.size()), 0);
  for (ValueId id = 0; id < graph.size(); ++id) {
    const Node& n = graph.node(id);
    int p = 0;
    for (ValueId in : n.inputs)
      p = std::max(p, phase[static_cast<std::size_t>(in)]);
    int step = op_has_trait(n.op, kReduction) ? 1 : 0;
    if (op_has_trait(n.op, kListReduction)) // combined after the kernel computing its operand: an element
      step = op_has_trait(graph.node(n.inputs[0]).op, kReduction) ? 0 : 1; // reduction's result is there by then
    if (op_has_trait(n.op, kMatrix)) { // after the kernel writing its operands out, or right after a product's
      p = 0;
      for (ValueId in : n.inputs)
        p = std::max(p, phase[static_cast<std::size_t>(in)] + (op_has_trait(graph.node(in).op, kMatrix) ? 0 : 1));
    }
    phase[static_cast<std::size_t>(id)] = p + step;
  }
  return phase;
}

} // namespace optjit
