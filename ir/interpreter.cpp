#include "ir/interpreter.h"
#include "ir/block_slots.h"
#include "ir/op_semantics.h"
#include "runtime/error.h"
#include "runtime/gemm.h"
#include "runtime/stochastic_rounding.h"
#include "runtime/thread_pool.h"
#include "runtime/work_items.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <variant>

namespace optjit {

const std::vector<Tensor>& ListArguments::slot(const std::string& name) const {
  for (std::size_t i = 0; i < slot_names.size(); ++i)
    if (slot_names[i] == name)
      return slot_tensors[i];
  throw Error("no tensors are bound to slot '" + name + "'");
}

int ListArguments::hyper_index(const std::string& name) const {
  for (std::size_t i = 0; i < hyper_names.size(); ++i)
    if (hyper_names[i] == name)
      return static_cast<int>(i);
  throw Error("no hyperparameter '" + name + "' is bound");
}

namespace {

using PerTensorValues = std::vector<double>; // one per list entry (f32 values are kept exactly rounded)
using ElementValues = std::vector<Tensor>;   // one tensor per list entry
using Value = std::variant<PerTensorValues, ElementValues>;

double scalar_op(const Node& n, const std::vector<double>& in) {
  if (n.op == Op::cast)
    return round_to_dtype(n.dtype, in[0]);
  if (n.op == Op::select)
    return in[0] != 0 ? in[1] : in[2];
  if (n.op == Op::fma)
    return visit_compute_dtype(n.dtype, [&]<class T>() -> double {
      return std::fma(static_cast<T>(in[0]), static_cast<T>(in[1]), static_cast<T>(in[2]));
    });
  // Per-tensor math in the node's dtype: f32 values are rounded after every op, as a float on the host would be.
  return visit_compute_dtype(n.dtype, [&]<class T>() -> double {
    if (in.size() == 1)
      return apply_unary<T>(n.op, static_cast<T>(in[0]));
    return apply_binary<T>(n.op, static_cast<T>(in[0]), static_cast<T>(in[1]));
  });
}

// An operand of an element op: a whole tensor, or one per-tensor scalar broadcast over it.
template <class T> struct Operand {
  const T* data = nullptr;
  T scalar = 0;
  T at(int64_t i) const { return data ? data[i] : scalar; }
};

// Calls body(f) with f the element function of `op` (unary or binary, per the op table), so that the switch over
// ops runs once per chunk instead of once per element.
template <class T, class Body> void with_element_function(Op op, Body&& body) {
  switch (op) {
#define OPTJIT_OP(name, arity, traits)                                                                                 \
  case Op::name:                                                                                                       \
    if constexpr ((arity) == 1)                                                                                        \
      body([](T x) { return apply_unary<T>(Op::name, x); });                                                           \
    else if constexpr ((arity) == 2)                                                                                   \
      body([](T a, T b) { return apply_binary<T>(Op::name, a, b); });                                                  \
    break;
#include "ir/ops.def"
#undef OPTJIT_OP
  }
}

// dst[i] = f(a[i], b[i]) over [begin, end), with scalar operands hoisted out of the loop.
template <class T, class F>
void binary_loop(F f, const Operand<T>& a, const Operand<T>& b, T* dst, int64_t begin, int64_t end) {
  if (a.data && b.data) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = f(a.data[i], b.data[i]);
  } else if (a.data) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = f(a.data[i], b.scalar);
  } else if (b.data) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = f(a.scalar, b.data[i]);
  } else {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = f(a.scalar, b.scalar);
  }
}

// One element op over elements [begin, end) of list entry t.
template <class T>
void element_op(const Node& n, const std::vector<const Value*>& in, int64_t t, const Tensor& out, int64_t begin,
                int64_t end) {
  Operand<T> ops[3];
  for (std::size_t k = 0; k < in.size(); ++k) {
    if (auto* pt = std::get_if<PerTensorValues>(in[k]))
      ops[k].scalar = static_cast<T>((*pt)[static_cast<std::size_t>(t)]);
    else
      ops[k].data = std::get<ElementValues>(*in[k])[static_cast<std::size_t>(t)].template data_as<T>();
  }
  T* dst = out.data_as<T>();
  if (n.op == Op::sround) { // the counter and stream are whole numbers: read them in f64, not as T
    const auto counter = static_cast<uint64_t>(std::get<PerTensorValues>(*in[1])[static_cast<std::size_t>(t)]);
    const auto stream = static_cast<uint64_t>(std::get<PerTensorValues>(*in[2])[static_cast<std::size_t>(t)]);
    for (int64_t i = begin; i < end; ++i)
      dst[i] = static_cast<T>(stochastic_round_bf16(static_cast<float>(ops[0].at(i)),
                                                    rounding_bits(counter, stream, static_cast<uint64_t>(i))));
    return;
  }
  if (n.op == Op::select) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = ops[0].at(i) != T(0) ? ops[1].at(i) : ops[2].at(i);
    return;
  }
  if (n.op == Op::fma) {
    for (int64_t i = begin; i < end; ++i)
      dst[i] = std::fma(ops[0].at(i), ops[1].at(i), ops[2].at(i));
    return;
  }
  with_element_function<T>(n.op, [&](auto f) {
    if constexpr (std::is_invocable_v<decltype(f), T>) {
      if (!ops[0].data) {
        const T value = f(ops[0].scalar);
        for (int64_t i = begin; i < end; ++i)
          dst[i] = value;
      } else {
        for (int64_t i = begin; i < end; ++i)
          dst[i] = f(ops[0].data[i]);
      }
    } else {
      binary_loop<T>(f, ops[0], ops[1], dst, begin, end);
    }
  });
}

Shape param_shape(const Graph& graph, const ListArguments& args, std::size_t t) {
  return list_entry_shape(graph, args, t);
}

// A tensor of rank >= 2, [..., m, n], as matrices; an optjit::Error for a lower rank.
Extents matrix_of(const Shape& shape, const char* what) {
  if (shape.size() < 2)
    throw Error(std::string(what) + " of a tensor of rank " + std::to_string(shape.size()) +
                ": rows and columns need a tensor of rank 2 or more");
  return extents_of(shape);
}

// Row r of element e is e / n; column c is (e / (m n)) n + e % n (contiguous element order).
int64_t axis_index(const Extents& x, int64_t e, SlotKind kind) {
  return kind == SlotKind::Rows ? e / x.n : (e / (x.m * x.n)) * x.n + e % x.n;
}

// A rows or columns tensor broadcast over the elements of a param of shape `shape`, in `dtype`.
Tensor broadcast_axis(const Tensor& axis, const Shape& shape, SlotKind kind, Dtype dtype) {
  const Extents x = matrix_of(shape, kind == SlotKind::Rows ? "a rows slot" : "a columns slot");
  const std::vector<double> values = axis.to_vector();
  std::vector<double> out(static_cast<std::size_t>(shape_numel(shape)));
  for (int64_t e = 0; e < static_cast<int64_t>(out.size()); ++e)
    out[static_cast<std::size_t>(e)] = values[static_cast<std::size_t>(axis_index(x, e, kind))];
  return Tensor::from_values(shape, out, dtype);
}

// The sums over the rows (or columns) of `x`, in element order in f64, broadcast back over its elements. A tensor of
// rank < 2 is one row (torch's sum(dim=-1) of it is its sum, as the compiled kernels take it); it has no columns.
Tensor axis_sum(const Tensor& x, SlotKind kind, Dtype dtype) {
  const Extents m = kind == SlotKind::Rows ? extents_of(x.shape()) : matrix_of(x.shape(), "col_sum");
  const std::vector<double> values = x.to_vector();
  std::vector<double> sums(static_cast<std::size_t>(kind == SlotKind::Rows ? m.batches * m.m : m.batches * m.n), 0.0);
  for (int64_t e = 0; e < static_cast<int64_t>(values.size()); ++e)
    sums[static_cast<std::size_t>(axis_index(m, e, kind))] += values[static_cast<std::size_t>(e)];
  std::vector<double> out(values.size());
  for (int64_t e = 0; e < static_cast<int64_t>(out.size()); ++e)
    out[static_cast<std::size_t>(e)] = sums[static_cast<std::size_t>(axis_index(m, e, kind))];
  return Tensor::from_values(x.shape(), out, dtype);
}

// Stores element values `v` (a param's shape) into a rows or columns tensor: each row (column) from its last element.
void store_axis(const Tensor& target, const Tensor& v, SlotKind kind) {
  const Extents x = matrix_of(v.shape(), "a store to a rows or columns slot");
  const std::vector<double> values = v.to_vector();
  std::vector<double> out(static_cast<std::size_t>(target.numel()));
  for (int64_t e = 0; e < static_cast<int64_t>(values.size()); ++e) {
    const bool last = kind == SlotKind::Rows ? e % x.n == x.n - 1 : (e / x.n) % x.m == x.m - 1;
    if (last)
      out[static_cast<std::size_t>(axis_index(x, e, kind))] = values[static_cast<std::size_t>(e)];
  }
  target.copy_from(Tensor::from_values(target.shape(), out, target.dtype()));
}

// A reduction of element values `in` (one tensor per list entry, in the graph's dtype T) to one f64 per entry: each
// work item's partial is summed (or maxed) in element order, then a tensor's partials in item order, so the result
// does not depend on how the items are spread over threads.
template <class T> PerTensorValues reduce_elements(Op op, const ElementValues& in) {
  std::vector<int64_t> numels;
  for (const Tensor& t : in)
    numels.push_back(t.numel());
  const std::vector<WorkItem> items = make_work_items(numels, LaunchShape{});
  const bool sum = op == Op::reduce_sum;
  const double identity = sum ? 0.0 : -std::numeric_limits<double>::infinity();
  std::vector<double> partials(items.size(), identity);
  ThreadPool::global().parallel_for(
      static_cast<int64_t>(items.size()), items_per_task(items, LaunchShape{}), [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const WorkItem& item = items[static_cast<std::size_t>(k)];
          const T* x = in[static_cast<std::size_t>(item.tensor)].data_as<T>();
          double acc = identity;
          for (int64_t i = item.begin; i < item.end; ++i)
            acc = sum ? acc + static_cast<double>(x[i]) : max_propagating_nan(acc, static_cast<double>(x[i]));
          partials[static_cast<std::size_t>(k)] = acc;
        }
      });
  PerTensorValues out(in.size(), identity);
  for (std::size_t k = 0; k < items.size(); ++k) {
    double& acc = out[static_cast<std::size_t>(items[k].tensor)];
    acc = sum ? acc + partials[k] : max_propagating_nan(acc, partials[k]);
  }
  return out;
}

// A matrix of list entry t, as the library reads it: its values in `dtype` (rounded), contiguous, rank 2.
Tensor library_matrix(const Tensor& value, Dtype dtype, const Node& n) {
  if (value.dim() != 2)
    throw Error(std::string(op_name(n.op)) + " of a tensor of shape " + shape_to_string(value.shape()) +
                ": matrix products take matrices (rank 2)");
  Tensor converted = value.to(dtype);
  return converted.is_contiguous() ? converted : converted.clone();
}

// mm and addmm (ir/ops.def) of every list entry, one library call each (runtime/gemm.h), held in `graph_dtype`.
ElementValues matrix_products(const Node& n, const std::vector<const Value*>& in, Dtype graph_dtype) {
  const MatrixProductForm form = matrix_product_form(n);
  const bool add = n.op == Op::addmm;
  const ElementValues& a_values = std::get<ElementValues>(*in[add ? 1 : 0]);
  const ElementValues& b_values = std::get<ElementValues>(*in[add ? 2 : 1]);
  ElementValues out;
  for (std::size_t t = 0; t < a_values.size(); ++t) {
    const Tensor a = library_matrix(a_values[t], form.dtype, n), b = library_matrix(b_values[t], form.dtype, n);
    GemmShape shape = gemm_shape(form, a.shape(), b.shape());
    Tensor c = Tensor::empty({shape.m, shape.n}, form.dtype);
    if (add) {
      const Tensor addend = library_matrix(std::get<ElementValues>(*in[0])[t], form.dtype, n);
      if (addend.shape() != c.shape())
        throw Error("addmm \"" + n.name + "\" adds a matrix of shape " + shape_to_string(addend.shape()) +
                    " to a product of shape " + shape_to_string(c.shape()));
      c.copy_from(addend);
      shape.beta = std::get<PerTensorValues>(*in[3])[t];
      shape.alpha = std::get<PerTensorValues>(*in[4])[t];
    }
    prepared_gemm(shape).run(a.data(), b.data(), c.data());
    out.push_back(c.to(graph_dtype));
  }
  return out;
}

} // namespace

// The interpretation's values so far, and where it is: evaluate() one node, store() at the end.
struct Interpretation::State {
  const Graph& graph;
  const ListArguments& args;
  CarriedValues* carried;
  int64_t n_tensors;
  std::vector<Value> values;
  // Every element value has the list's shapes: cut them into work items once, so that one parallel loop per op
  // covers many small tensors as well as one large one.
  std::vector<WorkItem> items;
  int64_t grain = 1;
  // Whether the graph multiplies matrices: only then may an element value have another shape than the param's.
  bool products =
      std::any_of(graph.nodes.begin(), graph.nodes.end(), [](const Node& n) { return op_has_trait(n.op, kMatrix); });
  int next = 0;    // the next node to evaluate
  int paused = -1; // the list reduction advance() paused at, if any

  void evaluate(int id);
  void store();
};

void Interpretation::State::evaluate(int id) {
  const Node& n = graph.node(id);
  Value& out = values[static_cast<std::size_t>(id)];
  switch (n.op) {
  case Op::constant:
    out = PerTensorValues(static_cast<std::size_t>(n_tensors), n.number);
    return;
  case Op::hyper: {
    int k = args.hyper_index(n.name);
    PerTensorValues v(static_cast<std::size_t>(n_tensors));
    for (int64_t t = 0; t < n_tensors; ++t)
      v[static_cast<std::size_t>(t)] = args.hyper_value(t, k);
    out = std::move(v);
    return;
  }
  case Op::scalar_state: {
    PerTensorValues v;
    for (const Tensor& s : args.slot(n.name))
      v.push_back(s.item(0));
    out = std::move(v);
    return;
  }
  case Op::tensor: {
    // Loads alias the argument (stores replace contents only at the end); a slot stored in another dtype than
    // the graph computes in (bf16, f16) is loaded as a converted copy. A rows or columns slot is broadcast over
    // its param's elements.
    ElementValues loaded = args.slot(n.name);
    const Slot& slot = *graph.slot(n.name);
    for (std::size_t t = 0; t < loaded.size(); ++t) {
      if (slot.blocks) // the values its codes and scales stand for
        loaded[t] =
            load_block_slot(slot, loaded[t], args.slot(scales_slot_name(n.name))[t], param_shape(graph, args, t))
                .to(graph.dtype);
      else
        loaded[t] = slot.kind == SlotKind::Tensor
                        ? loaded[t].to(graph.dtype)
                        : broadcast_axis(loaded[t], param_shape(graph, args, t), slot.kind, graph.dtype);
    }
    out = std::move(loaded);
    return;
  }
  case Op::carried: {
    OPTJIT_ASSERT(carried && carried->per_tensor.count(n.name),
                  "carried value '" + n.name + "' read before a kernel wrote it");
    out = carried->per_tensor.at(n.name);
    return;
  }
  case Op::extent: {
    PerTensorValues v;
    for (int64_t t = 0; t < n_tensors; ++t) {
      const Extents e = extents_of(param_shape(graph, args, static_cast<std::size_t>(t)));
      v.push_back(static_cast<double>(n.name == "numel" ? e.numel : n.name == "n" ? e.n : e.m));
    }
    out = std::move(v);
    return;
  }
  case Op::carried_rows:
  case Op::carried_cols: {
    OPTJIT_ASSERT(carried && carried->arrays.count(n.name),
                  "carried value '" + n.name + "' read before a kernel wrote it");
    out = carried->arrays.at(n.name);
    return;
  }
  default:
    break;
  }
  std::vector<const Value*> in;
  for (ValueId operand : n.inputs)
    in.push_back(&values[static_cast<std::size_t>(operand)]);
  if (op_has_trait(n.op, kAxis)) {
    ElementValues sums;
    for (const Tensor& x : std::get<ElementValues>(*in[0]))
      sums.push_back(axis_sum(x, n.op == Op::row_sum ? SlotKind::Rows : SlotKind::Cols, graph.dtype));
    out = std::move(sums);
    return;
  }
  if (op_has_trait(n.op, kReduction)) {
    const ElementValues& operand = std::get<ElementValues>(*in[0]);
    out = visit_compute_dtype(graph.dtype, [&]<class T>() { return reduce_elements<T>(n.op, operand); });
    return;
  }
  if (op_has_trait(n.op, kMatrix)) {
    out = matrix_products(n, in, graph.dtype);
    return;
  }
  if (n.level == Level::PerTensor) {
    PerTensorValues v(static_cast<std::size_t>(n_tensors));
    std::vector<double> operands(n.inputs.size());
    for (int64_t t = 0; t < n_tensors; ++t) {
      for (std::size_t k = 0; k < in.size(); ++k)
        operands[k] = std::get<PerTensorValues>(*in[k])[static_cast<std::size_t>(t)];
      v[static_cast<std::size_t>(t)] = scalar_op(n, operands);
    }
    out = std::move(v);
    return;
  }
  // An element op: the shape of each list entry comes from any element operand.
  const ElementValues* shape_source = nullptr;
  for (const Value* v : in)
    if (auto* e = std::get_if<ElementValues>(v))
      shape_source = e;
  // Element ops walk memory flat: results take their operand's layout, as every tensor of a list entry shares one
  // (loads of other dtypes convert in place of layout; compiler/layout_staging.h stages the others).
  if (products) // a pointwise op pairs elements: its operands have the param's shape, not another product's
    for (const Value* v : in)
      if (auto* e = std::get_if<ElementValues>(v))
        for (std::size_t t = 0; t < e->size(); ++t)
          if ((*e)[t].shape() != param_shape(graph, args, t))
            throw Error(std::string(op_name(n.op)) + " of a matrix product's " + shape_to_string((*e)[t].shape()) +
                        " result, where the param is " + shape_to_string(param_shape(graph, args, t)) +
                        ": pointwise ops take values of the param's shape (a product's other shapes go to products)");
  ElementValues result;
  for (const Tensor& like : *shape_source)
    result.push_back(Tensor::empty_like(like, graph.dtype, like.device()));
  if (items.empty()) {
    std::vector<int64_t> numels;
    for (const Tensor& t : result)
      numels.push_back(t.numel());
    items = make_work_items(numels, LaunchShape{});
    grain = items_per_task(items, LaunchShape{});
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(items.size()), grain, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const WorkItem& item = items[static_cast<std::size_t>(k)];
      const Tensor& dst = result[static_cast<std::size_t>(item.tensor)];
      visit_compute_dtype(graph.dtype,
                          [&]<class T>() { element_op<T>(n, in, item.tensor, dst, item.begin, item.end); });
    }
  });
  out = std::move(result);
}

void Interpretation::State::store() {
  // A store whose value is a plain load still aliases its slot; copy it before any store can overwrite it.
  for (const Store& s : graph.stores)
    if (graph.node(s.value).op == Op::tensor) {
      ElementValues copies;
      for (const Tensor& t : std::get<ElementValues>(values[static_cast<std::size_t>(s.value)]))
        copies.push_back(t.clone());
      values[static_cast<std::size_t>(s.value)] = std::move(copies);
    }
  for (const Store& s : graph.stores) {
    const Value& v = values[static_cast<std::size_t>(s.value)];
    if (s.kind == StoreKind::Carry) {
      OPTJIT_ASSERT(carried, "a kernel hands on '" + s.name + "' but nothing receives it");
      if (auto* arrays = std::get_if<ElementValues>(&v))
        carried->arrays[s.name] = *arrays;
      else
        carried->per_tensor[s.name] = std::get<PerTensorValues>(v);
      continue;
    }
    const std::vector<Tensor>& targets = args.slot(s.name);
    const Slot& slot = *graph.slot(s.name);
    const SlotKind kind = slot.kind;
    for (int64_t t = 0; t < n_tensors; ++t) {
      const Tensor& target = targets[static_cast<std::size_t>(t)];
      if (slot.blocks) {
        store_block_slot(slot, std::get<ElementValues>(v)[static_cast<std::size_t>(t)], target,
                         args.slot(scales_slot_name(s.name))[static_cast<std::size_t>(t)]);
      } else if (kind == SlotKind::Rows || kind == SlotKind::Cols) {
        store_axis(target, std::get<ElementValues>(v)[static_cast<std::size_t>(t)], kind);
      } else if (s.kind == StoreKind::Scalar) {
        target.set_item(0, std::get<PerTensorValues>(v)[static_cast<std::size_t>(t)]);
      } else {
        const Tensor& source = std::get<ElementValues>(v)[static_cast<std::size_t>(t)];
        if (!source.same(target))
          target.copy_from(source.to(target.dtype())); // rounds once to the slot's storage dtype
      }
    }
  }
}

Interpretation::Interpretation(const Graph& graph, const ListArguments& args, CarriedValues* carried, bool over_shards)
    : state_(new State{.graph = graph,
                       .args = args,
                       .carried = carried,
                       .n_tensors = args.n_tensors(),
                       .values = std::vector<Value>(static_cast<std::size_t>(graph.size())),
                       .items = {}}),
      over_shards_(over_shards) {
  check_block_slot_arguments(graph, args); // before anything is read or written
}

Interpretation::~Interpretation() = default;

bool Interpretation::advance(std::vector<ListPartials>& pending) {
  State& st = *state_;
  if (st.paused >= 0) { // the combined values are the paused node's
    OPTJIT_ASSERT(pending.size() == 1, "advance() was not handed back the reduction it paused at");
    st.values[static_cast<std::size_t>(st.paused)] = std::move(pending[0].values);
    st.paused = -1;
  }
  pending.clear();
  while (st.next < st.graph.size()) {
    const int id = st.next++;
    const Node& n = st.graph.node(id);
    if (op_has_trait(n.op, kListReduction)) {
      pending.push_back({list_carry_kind(n.op),
                         std::get<PerTensorValues>(st.values[static_cast<std::size_t>(n.inputs[0])]),
                         &st.args.group_of});
      st.paused = id;
      return true;
    }
    st.evaluate(id);
    if (const ShardCombine shards = shard_combine_of(n.op); over_shards_ && shards != ShardCombine::None) {
      pending.push_back({CarryKind::PerTensor, std::get<PerTensorValues>(st.values[static_cast<std::size_t>(id)]),
                         &st.args.group_of, shards});
      st.paused = id;
      return true;
    }
  }
  st.store();
  return false;
}

void interpret(const Graph& graph, const ListArguments& args, CarriedValues* carried) {
  Interpretation run(graph, args, carried);
  std::vector<ListPartials> pending;
  while (run.advance(pending))
    combine_each_over_list(pending);
}

void interpret_kernels(const std::vector<KernelPlan>& kernels, const ListArguments& args) {
  CarriedValues carried;
  for (const KernelPlan& kernel : kernels) // every kernel's quantized state, before the first writes any
    check_block_slot_arguments(kernel.graph, args);
  for (const KernelPlan& kernel : kernels) {
    interpret(kernel.graph, args, &carried);
    for (std::size_t c : list_carry_columns(kernel)) { // list reductions, combined between kernels
      std::vector<double>& values = carried.per_tensor.at(kernel.carries[c]);
      combine_over_list(kernel.carry_kinds[c], values.data(), values.size(), args.group_of.data());
    }
  }
}

} // namespace optjit
