#include "ir/ir.h"

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

std::string_view slot_role_name(SlotRole role) {
  switch (role) {
  case SlotRole::Param:
    return "param";
  case SlotRole::Grad:
    return "grad";
  case SlotRole::State:
    return "state";
  }
  __builtin_unreachable();
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
    phase[static_cast<std::size_t>(id)] = p + step;
  }
  return phase;
}

} // namespace optjit
