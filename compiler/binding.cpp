#include "compiler/binding.h"
#include "ir/block_slots.h"
#include "runtime/error.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace optjit {

namespace {

// A sum over columns (col_sum: torch's sum(dim=-2)) needs a second-to-last dimension, which torch refuses to invent;
// the kernel's [..., m, n] view would take m = 1 and hand each element back as its column's sum.
void check_column_sums(const KernelPlan& plan, const std::vector<Shape>& shapes) {
  const auto& nodes = plan.graph.nodes;
  if (std::none_of(nodes.begin(), nodes.end(), [](const Node& n) { return n.op == Op::col_sum; }))
    return;
  for (std::size_t t = 0; t < shapes.size(); ++t)
    if (shapes[t].size() < 2)
      throw Error("kernel " + plan.name + " sums over columns (col_sum, torch's sum(dim=-2)) of tensor " +
                  std::to_string(t) + " of its list (its bucket of params), of shape " + shape_to_string(shapes[t]) +
                  ", which has no second-to-last dimension (torch refuses it too): step tensors of rank 2 or more");
}

} // namespace

void Binding::bind(const KernelPlan& plan, const ListArguments& args, const LaunchShape& shape) {
  const int64_t n = args.n_tensors();
  check_block_slot_arguments(plan.graph, args);
  std::vector<std::string> slot_order = plan.abi.tensor_slots;
  slot_order.insert(slot_order.end(), plan.abi.scalar_slots.begin(), plan.abi.scalar_slots.end());
  for (const std::string& name : quantized_slots(plan)) // their scales, after the scalar slots
    slot_order.push_back(scales_slot_name(name));
  slots_.assign(slot_order.size() * static_cast<std::size_t>(n), nullptr);
  for (std::size_t s = 0; s < slot_order.size(); ++s) {
    const std::vector<Tensor>& tensors = args.slot(slot_order[s]);
    OPTJIT_ASSERT(static_cast<int64_t>(tensors.size()) == n, "slot " + slot_order[s] + " has the wrong length");
    for (int64_t t = 0; t < n; ++t)
      slots_[s * static_cast<std::size_t>(n) + static_cast<std::size_t>(t)] =
          tensors[static_cast<std::size_t>(t)].data();
  }
  group_of_ = args.group_of;
  hyper_source_.clear();
  hyper_on_device_.clear();
  for (const std::string& name : plan.abi.hypers) {
    hyper_source_.push_back(args.hyper_index(name));
    const HyperOnDevice* on_device = hyper_on_device(plan, name);
    hyper_on_device_.push_back(on_device ? std::optional<Dtype>(on_device->dtype) : std::nullopt);
  }
  source_hyper_count_ = static_cast<int64_t>(args.hyper_names.size());
  set_hyper(args.hyper);
  scratch_.assign(std::max<std::size_t>(1, plan.scratch.size() * static_cast<std::size_t>(n)), 0);

  // Work items: every tensor cut into chunks; the element phase hands whole items to threads. A kernel that adds
  // into rows and columns walks each tensor as one item, in element order (no two threads add to one row), unless
  // the shape cuts such kernels into items of whole rows (the GPU's).
  std::vector<int64_t> numels(static_cast<std::size_t>(n), 0);
  std::vector<Shape> shapes = args.shapes;
  OPTJIT_ASSERT(!plan.has_axis || !shapes.empty(), "kernel " + plan.name +
                                                       " walks rows and columns: its arguments "
                                                       "must give the params' shapes");
  if (shapes.empty()) {
    for (const std::string& name : plan.abi.tensor_slots)
      if (const Slot* slot = plan.graph.slot(name); slot->kind == SlotKind::Tensor && !slot->blocks) {
        for (const Tensor& t : args.slot(name))
          shapes.push_back(t.shape());
        break;
      }
  }
  for (std::size_t t = 0; t < shapes.size() && t < numels.size(); ++t)
    numels[t] = shape_numel(shapes[t]);
  check_column_sums(plan, shapes);
  std::vector<Extents> extents;
  for (std::size_t t = 0; t < numels.size(); ++t)
    extents.push_back(extents_of(t < shapes.size() ? shapes[t] : Shape{}));
  col_split_.assign(2 * numels.size(), 0);
  col_scratch_doubles_ = 0;
  if (plan.has_axis && shape.axis_item_elements > 0) {
    std::vector<MatrixExtents> matrices;
    for (const Extents& e : extents)
      matrices.push_back({e.batches, e.m, e.n});
    AxisWorkItems cut = make_axis_work_items(matrices, shape);
    items_ = std::move(cut.items);
    // Per tensor cut into pieces: its partial column sums by piece, then its pending columns stores.
    const ColumnSplit split = column_split(plan);
    for (std::size_t t = 0; t < numels.size(); ++t) {
      col_split_[2 * t] = cut.pieces[t];
      col_split_[2 * t + 1] = col_scratch_doubles_;
      if (cut.pieces[t] > 1)
        col_scratch_doubles_ += (split.sums * cut.pieces[t] + split.stores) * extents[t].batches * extents[t].n;
    }
  } else {
    LaunchShape cut = shape;
    if (plan.has_axis)
      cut.chunk_elements = std::numeric_limits<int64_t>::max();
    // Items of whole blocks where the kernel touches quantized state (a tensor's numel is a multiple of its blocks).
    cut = with_whole_blocks(cut, quantization_alignment(plan));
    items_ = make_work_items(numels, cut);
    for (std::size_t t = 0; t < numels.size(); ++t)
      col_split_[2 * t] = 1;
  }
  item_grain_ = items_per_task(items_, shape);
  tensor_grain_ = shape.tensors_per_task;

  args_.slots = slots_.data();
  args_.n_tensors = n;
  args_.group_of = group_of_.data();
  args_.n_hyper = static_cast<int64_t>(plan.abi.hypers.size());
  args_.scratch = scratch_.data();
  args_.n_scratch = static_cast<int64_t>(plan.scratch.size());
  args_.items = items_.data();
  args_.n_items = static_cast<int64_t>(items_.size());
  // Reductions: one partial per item and reduction, and where each tensor's items start.
  const auto n_reduce = static_cast<std::size_t>(per_tensor_reductions(plan));
  partials_.assign(std::max<std::size_t>(1, n_reduce * items_.size()), 0.0);
  first_item_.assign(static_cast<std::size_t>(n) + 1, static_cast<int64_t>(items_.size()));
  for (std::size_t i = items_.size(); i-- > 0;)
    first_item_[static_cast<std::size_t>(items_[i].tensor)] = static_cast<int64_t>(i);
  for (std::size_t t = static_cast<std::size_t>(n); t-- > 0;) // a tensor without items starts where the next does
    first_item_[t] = std::min(first_item_[t], first_item_[t + 1]);
  args_.partials = partials_.data();
  args_.n_reduce = static_cast<int64_t>(n_reduce);
  args_.first_item = first_item_.data();
  // Rows and columns: each tensor's m and n, and where its rows and columns start in an axis array.
  matrix_.assign(3 * static_cast<std::size_t>(n), 1);
  row_base_.assign(static_cast<std::size_t>(n) + 1, 0);
  col_base_.assign(static_cast<std::size_t>(n) + 1, 0);
  for (std::size_t t = 0; t < static_cast<std::size_t>(n); ++t) {
    const Extents& e = extents[t];
    matrix_[3 * t] = e.m;
    matrix_[3 * t + 1] = e.n;
    matrix_[3 * t + 2] = e.numel;
    row_base_[t + 1] = row_base_[t] + e.batches * e.m;
    col_base_[t + 1] = col_base_[t] + e.batches * e.n;
  }
  args_.matrix = matrix_.data();
  args_.row_base = row_base_.data();
  args_.col_base = col_base_.data();
}

void Binding::set_hyper(const std::vector<double>& values_by_group) {
  const std::size_t k = hyper_source_.size();
  const std::size_t groups =
      source_hyper_count_ ? values_by_group.size() / static_cast<std::size_t>(source_hyper_count_) : 0;
  const bool any_on_device =
      std::any_of(hyper_on_device_.begin(), hyper_on_device_.end(), [](const auto& d) { return d.has_value(); });
  hyper_.resize(std::max<std::size_t>(1, groups * k * (any_on_device ? 2 : 1))); // then the cells, if any
  const uint64_t table = hyper_table_address_ ? hyper_table_address_ : reinterpret_cast<uint64_t>(hyper_.data());
  for (std::size_t g = 0; g < groups; ++g)
    for (std::size_t h = 0; h < k; ++h) {
      const std::size_t source =
          g * static_cast<std::size_t>(source_hyper_count_) + static_cast<std::size_t>(hyper_source_[h]);
      hyper_[g * k + h] = values_by_group[source];
      if (!hyper_on_device_[h])
        continue;
      // The entry holds an address (8 bytes, as the kernel loads them): the tensor's, or a cell's with the number.
      uint64_t address = source < hyper_addresses_.size() ? reinterpret_cast<uint64_t>(hyper_addresses_[source]) : 0;
      if (address == 0) {
        const std::size_t cell = groups * k + g * k + h;
        hyper_[cell] = 0;
        if (*hyper_on_device_[h] == Dtype::f32) {
          const auto narrow = static_cast<float>(values_by_group[source]);
          std::memcpy(&hyper_[cell], &narrow, sizeof narrow);
        } else {
          hyper_[cell] = values_by_group[source];
        }
        address = table + cell * sizeof(double);
      }
      std::memcpy(&hyper_[g * k + h], &address, sizeof address);
    }
  args_.hyper = hyper_.data();
}

} // namespace optjit
