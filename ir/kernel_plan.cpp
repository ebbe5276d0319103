#include "ir/kernel_plan.h"
#include "ir/builder.h"
#include "ir/op_semantics.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "runtime/error.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

namespace optjit {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i ? ", " : "") + names[i];
  return text.empty() ? "-" : text;
}

std::string scratch_text(const std::vector<ValueId>& scratch) {
  std::string text;
  for (std::size_t i = 0; i < scratch.size(); ++i)
    text += (i ? ", %" : "%") + std::to_string(scratch[i]);
  return text.empty() ? "-" : text;
}

constexpr std::pair<const char*, CarryKind> kCarrySuffixes[] = {
    {" (rows)", CarryKind::Rows},        {" (cols)", CarryKind::Cols},          {" (list sum)", CarryKind::ListSum},
    {" (list max)", CarryKind::ListMax}, {" (group sum)", CarryKind::GroupSum}, {" (group max)", CarryKind::GroupMax}};

// "c0, c1 (rows), c2 (cols), c3 (list sum)": an axis sum's array or a list reduction says which.
std::string carries_text(const KernelPlan& plan) {
  std::vector<std::string> names = plan.carries;
  for (std::size_t i = 0; i < names.size(); ++i)
    for (const auto& [suffix, kind] : kCarrySuffixes)
      if (plan.carry_kinds[i] == kind)
        names[i] += suffix;
  return join(names);
}

// "lr (f32 on device), beta1": a hyperparameter read from device memory says so, with its dtype.
constexpr std::string_view kOnDeviceSuffix = " on device)";
std::string hypers_text(const KernelPlan& plan) {
  std::vector<std::string> names = plan.abi.hypers;
  for (std::string& name : names)
    if (const HyperOnDevice* h = hyper_on_device(plan, name))
      name += " (" + std::string(dtype_name(h->dtype)) + std::string(kOnDeviceSuffix);
  return join(names);
}

std::string phases_text(const KernelPlan& plan) {
  // Appended, not "%" + ...: GCC 12 warns wrongly on that form (PR 105651).
  const auto range = [](int begin, int end) {
    std::string text = "%";
    text.append(std::to_string(begin)).append("..%").append(std::to_string(end - 1));
    return text;
  };
  std::string text = range(0, plan.prologue_size);
  text.append(", element phase: ").append(range(plan.prologue_size, plan.reductions_begin));
  if (plan.reductions_begin < plan.graph.size())
    text.append(", reductions: ").append(range(plan.reductions_begin, plan.graph.size()));
  return text;
}

// The header lines of a plan, in print order, each with its label.
std::vector<std::pair<std::string, std::string>> header_lines(const KernelPlan& plan) {
  return {{"tensor slots", join(plan.abi.tensor_slots)},
          {"scalar slots", join(plan.abi.scalar_slots)},
          {"hypers", hypers_text(plan)},
          {"carries", carries_text(plan)},
          {"scratch", scratch_text(plan.scratch)},
          {"tensor phase", phases_text(plan)}};
}

// "a, b" -> {"a", "b"}; "-" -> {}.
std::vector<std::string> split_names(std::string_view text) {
  std::vector<std::string> names;
  if (text == "-")
    return names;
  while (!text.empty()) {
    const auto comma = text.find(", ");
    names.emplace_back(text.substr(0, comma));
    text.remove_prefix(comma == std::string_view::npos ? text.size() : comma + 2);
  }
  return names;
}

} // namespace

ColumnSplit column_split(const KernelPlan& plan) {
  ColumnSplit split;
  for (const Node& n : plan.graph.nodes)
    split.sums += n.op == Op::col_sum;
  for (const Store& s : plan.graph.stores)
    split.stores += s.kind == StoreKind::Tensor && plan.graph.slot(s.name)->kind == SlotKind::Cols;
  return split;
}

namespace {

// A kernel quantizes each block of a store from all of its values, so its work items hold whole blocks (one size for
// its stores: an item's blocks are walked one after another), and it walks no rows or columns (their walk is by rows).
void check_quantized_slots(const KernelPlan& kp) {
  std::optional<int64_t> stored_block;
  for (const Store& s : kp.graph.stores) {
    const Slot* slot = s.kind == StoreKind::Tensor ? kp.graph.slot(s.name) : nullptr;
    if (!slot || !slot->blocks)
      continue;
    if (stored_block && *stored_block != slot->blocks->block)
      throw Error("kernel " + kp.name + " stores block-quantized slots of blocks of " + std::to_string(*stored_block) +
                  " and of " + std::to_string(slot->blocks->block) +
                  ": a kernel's quantized stores share one block size");
    stored_block = slot->blocks->block;
  }
  if (kp.has_axis && !quantized_slots(kp).empty())
    throw Error("kernel " + kp.name +
                " walks rows or columns and reads or writes block-quantized state: a row's walk does not follow "
                "blocks, so such state is for optimizers without axis sums");
}

int64_t lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

} // namespace

std::vector<std::string> quantized_slots(const KernelPlan& plan) {
  std::vector<std::string> names;
  for (const std::string& name : plan.abi.tensor_slots)
    if (const Slot* slot = plan.graph.slot(name); slot && slot->blocks)
      names.push_back(name);
  return names;
}

int64_t quantization_alignment(const KernelPlan& plan) {
  int64_t alignment = 1;
  for (const std::string& name : quantized_slots(plan))
    alignment = lcm(alignment, plan.graph.slot(name)->blocks->block);
  return alignment;
}

std::optional<int64_t> stored_block(const KernelPlan& plan) {
  for (const Store& s : plan.graph.stores)
    if (const Slot* slot = s.kind == StoreKind::Tensor ? plan.graph.slot(s.name) : nullptr; slot && slot->blocks)
      return slot->blocks->block;
  return std::nullopt;
}

KernelPlan make_kernel_plan(std::string name, Graph graph, std::vector<std::string> carries,
                            std::vector<CarryKind> carry_kinds) {
  check_graph_name(name); // the kernel's name is its graph's and its symbol's (found by the IR fuzzer)
  KernelPlan kp;
  kp.name = std::move(name);
  kp.graph = std::move(graph);
  kp.graph.name = kp.name;
  kp.carries = std::move(carries);
  kp.carry_kinds = std::move(carry_kinds);
  kp.carry_kinds.resize(kp.carries.size(), CarryKind::PerTensor);

  kp.abi = signature_of(kp.graph);
  // A kernel declares only the slots it uses (a plan's graph declares every slot of the step).
  std::erase_if(kp.graph.slots, [&](const Slot& s) {
    const auto used = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), s.name) != names.end();
    };
    return !used(kp.abi.tensor_slots) && !used(kp.abi.scalar_slots);
  });
  for (const Node& n : kp.graph.nodes)
    kp.has_axis = kp.has_axis || op_has_trait(n.op, kAxis) || n.op == Op::carried_rows || n.op == Op::carried_cols;
  for (const Slot& s : kp.graph.slots)
    kp.has_axis = kp.has_axis || s.kind == SlotKind::Rows || s.kind == SlotKind::Cols;
  check_quantized_slots(kp);
  for (const auto* list : {&kp.abi.carried_in, &kp.abi.carried_out})
    for (const std::string& c : *list)
      if (std::find(kp.carries.begin(), kp.carries.end(), c) == kp.carries.end())
        throw Error("kernel " + kp.name + " uses carried value '" + c + "', which the plan's carries do not list");
  std::vector<bool> in_scratch(static_cast<std::size_t>(kp.graph.size()), false);
  kp.reductions_begin = kp.graph.size();
  for (ValueId id = 0; id < kp.graph.size(); ++id) {
    const Node& n = kp.graph.node(id);
    const bool reduction = op_has_trait(n.op, kReduction);
    if (reduction && kp.reductions_begin == kp.graph.size())
      kp.reductions_begin = id;
    if (!reduction && kp.reductions_begin < id)
      throw Error("kernel " + kp.name + ": node " + print_node(kp.graph, id) +
                  " comes after a reduction; a kernel's reductions come last");
    if (reduction)
      continue;
    if (n.level == Level::PerTensor) {
      if (kp.prologue_size != id)
        throw Error("kernel " + kp.name + ": per-tensor node " + print_node(kp.graph, id) +
                    " comes after an element node; the graph must be hoisted");
      kp.prologue_size = id + 1;
      continue;
    }
    for (ValueId in : n.inputs) {
      const Node& operand = kp.graph.node(in);
      if (operand.level == Level::PerTensor && operand.op != Op::constant &&
          !in_scratch[static_cast<std::size_t>(in)]) {
        in_scratch[static_cast<std::size_t>(in)] = true;
        kp.scratch.push_back(in);
      }
    }
  }
  // A reduction's value exists once the element phase has ended: in this kernel it can only be handed on.
  for (ValueId id = 0; id < kp.graph.size(); ++id)
    for (ValueId in : kp.graph.node(id).inputs)
      if (in >= kp.reductions_begin)
        throw Error("kernel " + kp.name + ": node " + print_node(kp.graph, id) + " uses reduction %" +
                    std::to_string(in) + " in the kernel that computes it; a later kernel reads it carried");
  for (const Store& s : kp.graph.stores)
    if (s.value >= kp.reductions_begin && s.kind != StoreKind::Carry)
      throw Error("kernel " + kp.name + ": store to '" + s.name + "' uses reduction %" + std::to_string(s.value) +
                  " in the kernel that computes it; a later kernel stores it");
  return kp;
}

// Each list reduction op and the carry kind it makes.
constexpr std::pair<Op, CarryKind> kListReductions[] = {{Op::list_sum, CarryKind::ListSum},
                                                        {Op::list_max, CarryKind::ListMax},
                                                        {Op::group_sum, CarryKind::GroupSum},
                                                        {Op::group_max, CarryKind::GroupMax}};

CarryKind list_carry_kind(Op op) {
  for (const auto& [reduction, kind] : kListReductions)
    if (reduction == op)
      return kind;
  OPTJIT_ASSERT(false, "list_carry_kind of " + std::string(op_name(op)) + ", which is no list reduction");
}

Op list_reduction_op(CarryKind kind) {
  for (const auto& [reduction, made] : kListReductions)
    if (made == kind)
      return reduction;
  OPTJIT_ASSERT(false, "list_reduction_op of a carry that no list reduction makes");
}

void combine_over_list(CarryKind kind, double* values, std::size_t count, const int64_t* groups) {
  OPTJIT_ASSERT(is_list_carry(kind), "combine_over_list of a carry that no list reduction made");
  const bool sum = kind == CarryKind::ListSum || kind == CarryKind::GroupSum;
  const double empty = sum ? 0.0 : -std::numeric_limits<double>::infinity();
  const auto combine = [&](double total, double value) {
    return sum ? total + value : max_propagating_nan(total, value);
  };
  if (!is_group_carry(kind)) {
    double total = empty;
    for (std::size_t t = 0; t < count; ++t)
      total = combine(total, values[t]);
    std::fill(values, values + count, total);
    return;
  }
  OPTJIT_ASSERT(groups != nullptr || count == 0, "a group reduction combined without its entries' groups");
  std::map<int64_t, double> totals; // each group's, its entries in list order
  for (std::size_t t = 0; t < count; ++t) {
    const auto at = totals.try_emplace(groups[t], empty).first;
    at->second = combine(at->second, values[t]);
  }
  for (std::size_t t = 0; t < count; ++t)
    values[t] = totals.at(groups[t]);
}

std::vector<std::size_t> list_carry_columns(const KernelPlan& plan) {
  std::vector<std::size_t> columns;
  for (const PausedCarry& paused : paused_carries(plan, /*over_shards=*/false))
    columns.push_back(paused.column);
  return columns;
}

ShardCombine shard_combine_of(Op op) {
  return op == Op::reduce_sum ? ShardCombine::Sum : op == Op::reduce_max ? ShardCombine::Max : ShardCombine::None;
}

std::vector<PausedCarry> paused_carries(const KernelPlan& plan, bool over_shards) {
  std::vector<PausedCarry> paused;
  for (const std::string& name : plan.abi.carried_out) {
    const std::size_t c = carry_index(plan, name);
    ShardCombine shards = ShardCombine::None;
    if (over_shards)
      for (const Store& s : plan.graph.stores)
        if (s.kind == StoreKind::Carry && s.name == name && s.value >= plan.reductions_begin) {
          const Op op = plan.graph.node(s.value).op;
          shards = shard_combine_of(op);
          OPTJIT_ASSERT(shards != ShardCombine::None,
                        "kernel " + plan.name + " carries " + std::string(op_name(op)) + " over shards");
        }
    if (is_list_carry(plan.carry_kinds[c]) || shards != ShardCombine::None)
      paused.push_back({c, plan.carry_kinds[c], shards});
  }
  return paused;
}

void combine_each_over_list(std::vector<ListPartials>& pending) {
  for (ListPartials& p : pending)
    if (is_list_carry(p.kind))
      combine_over_list(p.kind, p.values.data(), p.values.size(), p.groups ? p.groups->data() : nullptr);
}

std::size_t carry_index(const KernelPlan& plan, const std::string& name) {
  auto it = std::find(plan.carries.begin(), plan.carries.end(), name);
  OPTJIT_ASSERT(it != plan.carries.end(), "kernel " + plan.name + " carries no value '" + name + "'");
  return static_cast<std::size_t>(it - plan.carries.begin());
}

int per_tensor_reductions(const KernelPlan& plan) {
  int count = 0;
  for (ValueId id = plan.reductions_begin; id < plan.graph.size(); ++id)
    count += !op_has_trait(plan.graph.node(id).op, kAxis);
  return count;
}

const HyperOnDevice* hyper_on_device(const KernelPlan& plan, const std::string& name) {
  for (const HyperOnDevice& h : plan.hypers_on_device)
    if (h.name == name)
      return &h;
  return nullptr;
}

std::string print_library_call(const LibraryCall& call) {
  const auto scalar = [](const LibraryCall::Scalar& s) {
    return s.hyper.empty() ? format_number(s.value) : "hyper \"" + s.hyper + "\"";
  };
  std::string text = "\"" + call.result + "\" = " + std::string(op_name(call.op)) + " \"" + call.form + "\" ";
  if (call.op == Op::addmm)
    text += "\"" + call.input + "\", ";
  text += "\"" + call.a + "\", \"" + call.b + "\"";
  if (call.op == Op::addmm)
    text += ", beta " + scalar(call.beta) + ", alpha " + scalar(call.alpha);
  return text;
}

GemmShape gemm_shape(const MatrixProductForm& form, const Shape& a, const Shape& b) {
  const std::size_t ra = a.size() - 2, rb = b.size() - 2; // each one's rows dimension
  const GemmShape shape{.batch = a.size() == 3 ? a[0] : 1,
                        .m = form.transpose_a ? a[ra + 1] : a[ra],
                        .n = form.transpose_b ? b[rb] : b[rb + 1],
                        .k = form.transpose_a ? a[ra] : a[ra + 1],
                        .transpose_a = form.transpose_a,
                        .transpose_b = form.transpose_b,
                        .operands = form.dtype,
                        .result = form.dtype};
  const int64_t inner_b = form.transpose_b ? b[rb + 1] : b[rb];
  if (inner_b != shape.k)
    throw Error("a matrix product \"" + matrix_product_name(form) + "\" of matrices " + shape_to_string(a) + " and " +
                shape_to_string(b) + ": the inner sizes differ (" + std::to_string(shape.k) + " and " +
                std::to_string(inner_b) + ")");
  return shape;
}

std::string print_kernel_plan(const KernelPlan& plan) {
  std::string text = "kernel @" + plan.name + " " + std::string(dtype_name(plan.graph.dtype)) + "\n";
  for (const auto& [label, value] : header_lines(plan))
    text += "  " + label + ": " + value + "\n";
  return text + print_graph(plan.graph);
}

KernelPlan parse_kernel_plan(std::string_view text) {
  // The header: "kernel @name dtype", then the labelled lines up to the graph.
  const auto graph_at = text.find("\ngraph @");
  if (!text.starts_with("kernel @") || graph_at == std::string_view::npos)
    throw Error("parse error: a kernel plan starts with 'kernel @name dtype' and holds a 'graph @' block");
  std::vector<std::string_view> lines;
  for (std::string_view header = text.substr(0, graph_at); !header.empty();) {
    const auto newline = header.find('\n');
    lines.push_back(header.substr(0, newline));
    header.remove_prefix(newline == std::string_view::npos ? header.size() : newline + 1);
  }
  Graph graph = parse_graph(text.substr(graph_at + 1));
  const std::string_view title = lines.front().substr(8);
  const std::string name(title.substr(0, title.find(' ')));
  std::vector<std::string> carries;
  std::vector<CarryKind> kinds;
  for (std::string_view line : lines)
    if (line.starts_with("  carries: "))
      carries = split_names(line.substr(11));
  for (std::string& carry : carries) {
    kinds.push_back(CarryKind::PerTensor);
    for (const auto& [suffix, kind] : kCarrySuffixes)
      if (carry.ends_with(suffix)) {
        carry.resize(carry.size() - std::string_view(suffix).size());
        kinds.back() = kind;
      }
  }
  KernelPlan plan = make_kernel_plan(name, std::move(graph), std::move(carries), std::move(kinds));
  for (std::string_view line : lines)
    if (line.starts_with("  hypers: "))
      for (const std::string& hyper : split_names(line.substr(10)))
        if (const auto open = hyper.rfind(" ("); open != std::string::npos && hyper.ends_with(kOnDeviceSuffix)) {
          const Dtype dtype = parse_dtype(hyper.substr(open + 2, hyper.size() - open - 2 - kOnDeviceSuffix.size()));
          if (dtype != Dtype::f32 && dtype != Dtype::f64)
            throw Error("parse error: hyperparameter '" + hyper + "' of kernel @" + name +
                        ": a hyperparameter read on the device is f32 or f64");
          plan.hypers_on_device.push_back({hyper.substr(0, open), dtype});
        }
  // Every header line must say what the graph implies.
  const std::string expected = print_kernel_plan(plan);
  const std::string_view expected_header = std::string_view(expected).substr(0, expected.find("\ngraph @"));
  std::size_t at = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto newline = expected_header.find('\n', at);
    const std::string_view want =
        expected_header.substr(at, newline == std::string_view::npos ? std::string_view::npos : newline - at);
    if (lines[i] != want)
      throw Error("parse error: kernel plan line " + std::to_string(i + 1) + " reads '" + std::string(lines[i]) +
                  "', but the graph gives '" + std::string(want) + "'");
    at = newline == std::string_view::npos ? expected_header.size() : newline + 1;
  }
  if (at < expected_header.size())
    throw Error("parse error: kernel plan @" + name + " lacks header lines; expected:\n" +
                std::string(expected_header));
  return plan;
}

std::vector<KernelPlan> parse_kernel_plans(std::string_view text) {
  std::vector<KernelPlan> plans;
  while (!text.empty()) {
    const auto next = text.find("\nkernel @", 1);
    plans.push_back(parse_kernel_plan(text.substr(0, next == std::string_view::npos ? text.size() : next + 1)));
    text.remove_prefix(next == std::string_view::npos ? text.size() : next + 1);
  }
  return plans;
}

} // namespace optjit
