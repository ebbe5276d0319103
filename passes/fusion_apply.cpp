// apply_fusion — contract: turns a fusion plan into kernel plans, run in plan order: each kernel's nodes (its
// per-tensor nodes first, then its element nodes, then the reductions its element pass accumulates), its stores,
// its argument layout, and the per-tensor values that its element phase reads from scratch. Which kernel computes
// what follows kernel_membership: a per-tensor value (a reduction's result included) computed in one kernel and
// used in a later one is handed on — the producing kernel stores it (`store_carry "cN"`) and the using kernel reads
// it (`carried "cN"`, same dtype); constants, hyperparameters and extents are cheaper to repeat than to carry, so
// each kernel that uses them gets its own copy; an element value is computed again in every kernel that needs it.
// A list reduction is not a node of any kernel: the kernel computing its operand stores the operand as the list
// reduction's carry (kind ListSum or ListMax), which the host combines over the list when that kernel has ended.
// A matrix product is no kernel's node either: the kernel it follows stores its element operands to scratch slots
// (operand_scratch) and lists it in calls_after; later kernels load its result from its own (product_scratch).
// Assumes the graph plan_fusion saw. Internal errors (a bad plan): a value used by an earlier kernel than the one
// computing it, or a kernel loading a slot that an earlier kernel already stored (it would read the new value).
#include "passes/kernel_membership.h"
#include "passes/passes.h"
#include "passes/rewrite.h"
#include "runtime/error.h"

#include <map>
#include <set>

namespace optjit {

namespace {

bool is_product(const Graph& graph, ValueId id) { return op_has_trait(graph.node(id).op, kMatrix); }

// The scratch buffer a product reads as operand `in`: a product's result, or the value written out in its dtype.
std::string operand_buffer(const Graph& graph, ValueId in, Dtype dtype) {
  return is_product(graph, in) ? product_scratch(in) : operand_scratch(in, dtype);
}

// beta or alpha of a library call: a constant or a hyperparameter, which the executable reads per list entry.
LibraryCall::Scalar library_scalar(const Graph& graph, ValueId id, ValueId product) {
  const Node& n = graph.node(id);
  if (n.op == Op::constant)
    return {"", n.number};
  if (n.op == Op::hyper)
    return {n.name, 0};
  throw Error("%" + std::to_string(product) + " = " + std::string(op_name(graph.node(product).op)) + " takes %" +
              std::to_string(id) + " (" + std::string(op_name(n.op)) +
              ") as beta or alpha: a compiled product takes a constant or a hyperparameter there");
}

LibraryCall library_call(const Graph& graph, ValueId id) {
  const Node& n = graph.node(id);
  const Dtype dtype = matrix_product_form(n).dtype;
  LibraryCall call;
  call.op = n.op;
  call.form = n.name;
  call.result = product_scratch(id);
  const std::size_t first = n.op == Op::addmm ? 1 : 0;
  call.a = operand_buffer(graph, n.inputs[first], dtype);
  call.b = operand_buffer(graph, n.inputs[first + 1], dtype);
  if (n.op == Op::addmm) {
    call.input = operand_buffer(graph, n.inputs[0], dtype);
    call.beta = library_scalar(graph, n.inputs[3], id);
    call.alpha = library_scalar(graph, n.inputs[4], id);
  } else {
    call.alpha = {"", 1.0};
  }
  return call;
}

} // namespace

std::vector<ScratchBuffer> scratch_buffers(const Graph& graph) {
  std::vector<ScratchBuffer> buffers;
  std::set<std::string> named;
  const std::vector<MatrixShape> shapes = matrix_shapes(graph);
  const auto add = [&](std::string name, Dtype dtype, MatrixShape shape) {
    if (named.insert(name).second)
      buffers.push_back({std::move(name), dtype, shape});
  };
  for (ValueId id = 0; id < graph.size(); ++id)
    if (is_product(graph, id)) {
      const Dtype dtype = matrix_product_form(graph.node(id)).dtype;
      for (ValueId in : graph.node(id).inputs)
        if (graph.node(in).level == Level::Element && !is_product(graph, in))
          add(operand_scratch(in, dtype), dtype, shapes[static_cast<std::size_t>(in)]);
      add(product_scratch(id), dtype, shapes[static_cast<std::size_t>(id)]);
    }
  return buffers;
}

std::vector<KernelPlan> apply_fusion(const Graph& graph, const FusionPlan& plan) {
  const std::vector<std::vector<char>> computes = kernel_membership(graph, plan);
  const auto in_kernel = [&](ValueId id, int k) {
    return computes[static_cast<std::size_t>(k)][static_cast<std::size_t>(id)] != 0;
  };
  // Values handed on, in order of their producers' first use elsewhere: value id -> carry name.
  std::map<ValueId, std::string> carry_of;
  std::vector<std::pair<ValueId, std::string>> carried_values; // in carry order
  std::vector<std::string> carries;   // the graph's own carry stores (values the driver reads), then the plan's
  std::vector<CarryKind> carry_kinds; // per carry: one value per tensor, or an array of a tensor's row or column sums
  const auto kind_of = [&](ValueId value) {
    const Op op = graph.node(value).op;
    if (op_has_trait(op, kListReduction))
      return list_carry_kind(op);
    return op == Op::row_sum ? CarryKind::Rows : op == Op::col_sum ? CarryKind::Cols : CarryKind::PerTensor;
  };
  for (const Store& s : graph.stores)
    if (s.kind == StoreKind::Carry) {
      carries.push_back(s.name);
      carry_kinds.push_back(kind_of(s.value));
    }
  const auto hand_on = [&](ValueId in, int k) {
    if (is_product(graph, in) || in_kernel(in, k) || repeated_per_kernel(graph.node(in)) || carry_of.count(in))
      return;
    OPTJIT_ASSERT(graph.node(in).level == Level::PerTensor || op_has_trait(graph.node(in).op, kAxis),
                  "fusion plan hands element value %" + std::to_string(in) + " to another kernel");
    std::string name = "c"; // appended, not "c" + ...: GCC 12 warns wrongly on that form (PR 105651)
    name += std::to_string(carries.size());
    carry_of[in] = name;
    carried_values.emplace_back(in, name);
    carries.push_back(std::move(name));
    carry_kinds.push_back(kind_of(in));
  };
  for (int k = 0; k < plan.kernel_count; ++k) {
    for (ValueId id = 0; id < graph.size(); ++id)
      if (in_kernel(id, k))
        for (ValueId in : graph.node(id).inputs)
          hand_on(in, k);
    for (std::size_t s = 0; s < graph.stores.size(); ++s)
      if (store_kernel(graph, plan, s) == k)
        hand_on(graph.stores[s].value, k);
  }

  std::vector<KernelPlan> kernels;
  std::set<std::string> stored_by_earlier;
  for (int k = 0; k < plan.kernel_count; ++k) {
    Rewriter rw(graph, /*intern=*/false);
    GraphBuilder& b = rw.builder();
    // A scratch slot in the products' dtype (scratch_buffers lists the same), declared by the kernels that use it.
    const auto scratch_slot = [&](const std::string& name, Dtype dtype) {
      if (!b.has_slot(name))
        b.declare_slot({name, SlotRole::Scratch, SlotKind::Tensor, dtype, {}});
      return name;
    };
    std::map<ValueId, ValueId> local; // values of other kernels, as this kernel sees them
    auto operand = [&](ValueId in) {
      if (in_kernel(in, k))
        return rw.mapped(in);
      if (auto it = local.find(in); it != local.end())
        return it->second;
      if (is_product(graph, in)) // its result, which the library wrote after an earlier kernel
        return local[in] = b.tensor(scratch_slot(product_scratch(in), matrix_product_form(graph.node(in)).dtype));
      Node copy = graph.node(in);
      if (copy.op == Op::row_sum || copy.op == Op::col_sum) // an array of the tensor's rows or columns
        copy = Node{copy.op == Op::row_sum ? Op::carried_rows : Op::carried_cols,
                    Level::Element,
                    copy.dtype,
                    {},
                    0,
                    carry_of.at(in)};
      else if (!repeated_per_kernel(copy))
        copy = Node{Op::carried, Level::PerTensor, copy.dtype, {}, 0, carry_of.at(in)};
      return local[in] = b.add(std::move(copy));
    };
    // Per-tensor values from other kernels first, so the kernel stays hoisted (carried axis sums are element values:
    // they come with the element nodes that read them).
    const auto early = [&](ValueId in) {
      if (!op_has_trait(graph.node(in).op, kAxis) && !is_product(graph, in))
        operand(in);
    };
    for (ValueId id = 0; id < graph.size(); ++id)
      if (in_kernel(id, k))
        for (ValueId in : graph.node(id).inputs)
          early(in);
    for (std::size_t s = 0; s < graph.stores.size(); ++s)
      if (store_kernel(graph, plan, s) == k)
        early(graph.stores[s].value);
    const auto is_reduction = [&](ValueId id) { return op_has_trait(graph.node(id).op, kReduction); };
    const auto copy_node = [&](ValueId id) {
      const Node& n = graph.node(id);
      if (op_has_trait(n.op, kListReduction)) { // this kernel stores the operand; the host combines it over the list
        rw.map(id, operand(n.inputs[0]));
        return;
      }
      if (n.op == Op::tensor || n.op == Op::scalar_state)
        OPTJIT_ASSERT(!stored_by_earlier.count(n.name),
                      "fusion plan loads slot '" + n.name + "' after an earlier kernel stored it");
      Node copy = n;
      for (ValueId& in : copy.inputs)
        in = operand(in);
      rw.map(id, b.add(std::move(copy)));
    };
    const auto is_list_reduction = [&](ValueId id) { return op_has_trait(graph.node(id).op, kListReduction); };
    for (Level level : {Level::PerTensor, Level::Element})
      for (ValueId id = 0; id < graph.size(); ++id)
        if (in_kernel(id, k) && graph.node(id).level == level && !is_reduction(id) && !is_list_reduction(id))
          copy_node(id);
    for (std::size_t s = 0; s < graph.stores.size(); ++s) // a stored axis sum of an earlier kernel, read here
      if (store_kernel(graph, plan, s) == k && op_has_trait(graph.node(graph.stores[s].value).op, kAxis))
        operand(graph.stores[s].value);
    for (ValueId id = 0; id < graph.size(); ++id)
      if (in_kernel(id, k) && is_reduction(id))
        copy_node(id);
    for (ValueId id = 0; id < graph.size(); ++id) // after the reductions their operands may be
      if (in_kernel(id, k) && is_list_reduction(id))
        copy_node(id);
    for (std::size_t s = 0; s < graph.stores.size(); ++s)
      if (store_kernel(graph, plan, s) == k) {
        const Store& store = graph.stores[s];
        b.add_store(Store{store.kind, store.name, operand(store.value)});
      }
    for (const auto& [value, name] : carried_values)
      if (in_kernel(value, k))
        b.add_store(Store{StoreKind::Carry, name, rw.mapped(value)});
    // The products that run after this kernel: it writes their element operands out; they follow it in order.
    std::vector<LibraryCall> calls;
    std::set<std::string> written;
    for (ValueId id = 0; id < graph.size(); ++id)
      if (is_product(graph, id) && plan.kernel_of[static_cast<std::size_t>(id)] == k) {
        const Dtype dtype = matrix_product_form(graph.node(id)).dtype;
        for (ValueId in : graph.node(id).inputs)
          if (graph.node(in).level == Level::Element && !is_product(graph, in) &&
              written.insert(operand_scratch(in, dtype)).second)
            b.add_store(Store{StoreKind::Tensor, scratch_slot(operand_scratch(in, dtype), dtype), operand(in)});
        calls.push_back(library_call(graph, id));
      }
    Graph kernel_graph = b.finish();
    for (const Store& s : kernel_graph.stores)
      stored_by_earlier.insert(s.name);
    kernels.push_back(
        make_kernel_plan(graph.name + "_k" + std::to_string(k), std::move(kernel_graph), carries, carry_kinds));
    kernels.back().calls_after = std::move(calls);
  }
  return kernels;
}

} // namespace optjit
