// Binding: the argument block of one kernel launch (runtime/kernel_abi.h), built from a step's ListArguments in
// the kernel's ABI order and cut into work items. It is cached while the addresses it holds stay valid and only
// the hyperparameters are rewritten each step.
#pragma once

#include "ir/arguments.h"
#include "ir/kernel_plan.h"
#include "runtime/kernel_abi.h"
#include "runtime/work_items.h"

#include <optional>
#include <vector>

namespace optjit {

class Binding {
public:
  void bind(const KernelPlan& plan, const ListArguments& args, const LaunchShape& shape = {});
  // Points slot `slot` (an index into the ABI's tensor slots, then scalar slots) of list entry `tensor` at new
  // data of the same shape: a replaced grad buffer costs one store, not a new table.
  void repoint(int slot, int64_t tensor, void* data) {
    slots_[static_cast<std::size_t>(slot) * static_cast<std::size_t>(args_.n_tensors) +
           static_cast<std::size_t>(tensor)] = data;
  }
  // Copies this step's hyperparameters (per group, in args.hyper_names order) into the ABI's order. An entry the
  // plan reads on the device (KernelPlan::hypers_on_device) gets the address set_hyper_addresses gave for it, or,
  // where that is null (the group holds a number), the address of a cell after the table's groups x hypers entries
  // that holds the value in the dtype the kernel reads.
  void set_hyper(const std::vector<double>& values_by_group);
  // Per group, in args.hyper_names order (as set_hyper's values): the device address of each hyperparameter read on
  // the device, null for a number; kept for the following set_hyper calls.
  void set_hyper_addresses(std::vector<const void*> addresses_by_group) {
    hyper_addresses_ = std::move(addresses_by_group);
  }
  // Where the kernels find hyper() (the GPU's copy of it): the cells' addresses are in that copy. 0: hyper() itself.
  void set_hyper_table_address(uint64_t address) { hyper_table_address_ = address; }
  // The plan's carry buffer (8 bytes per tensor and carried value), shared by every kernel of the plan.
  void set_carry(void* carry, int64_t n_carry) {
    args_.carry = carry;
    args_.n_carry = n_carry;
  }
  const std::vector<int64_t>& group_of() const { return group_of_; }
  const std::vector<WorkItem>& items() const { return items_; }
  const std::vector<int64_t>& first_item() const { return first_item_; }
  // Rows (columns) of every tensor together: the length of the plan's array of a carried row (column) sum.
  int64_t axis_length(CarryKind kind) const { return kind == CarryKind::Rows ? row_base_.back() : col_base_.back(); }
  // Per tensor: m, n and numel ([..., m, n]); where its rows and columns start (one more entry: the totals).
  const std::vector<int64_t>& matrix() const { return matrix_; }
  const std::vector<int64_t>& row_base() const { return row_base_; }
  const std::vector<int64_t>& col_base() const { return col_base_; }
  // Per tensor: the items each of its matrices is cut into (1: whole matrices in every item), and where its region
  // of the column scratch starts (in doubles; GPU kernels over rows and columns, KernelPlan's ColumnSplit).
  const std::vector<int64_t>& col_split() const { return col_split_; }
  int64_t col_scratch_doubles() const { return col_scratch_doubles_; }
  // The plan's axis arrays, by carry index (null for a per-tensor carry), shared by every kernel of the plan.
  void set_axis(double* const* arrays) { args_.axis = arrays; }
  int64_t n_reduce() const { return args_.n_reduce; }
  const std::vector<void*>& slots() const { return slots_; }
  const std::vector<double>& hyper() const { return hyper_; }
  const KernelArgs& args() const { return args_; }
  int64_t item_grain() const { return item_grain_; }
  int64_t tensor_grain() const { return tensor_grain_; }

private:
  std::vector<void*> slots_;
  std::vector<int64_t> group_of_;
  std::vector<double> hyper_;
  std::vector<int> hyper_source_;                     // ABI hyper k comes from args hyper hyper_source_[k]
  std::vector<std::optional<Dtype>> hyper_on_device_; // per ABI hyper: the dtype it is read in on the device
  std::vector<const void*> hyper_addresses_;          // as set_hyper_addresses gave them
  uint64_t hyper_table_address_ = 0;
  int64_t source_hyper_count_ = 0;
  std::vector<uint64_t> scratch_;
  std::vector<WorkItem> items_;
  std::vector<double> partials_;             // partials[i * n_reduce + r]
  std::vector<int64_t> first_item_;          // per tensor, and one past the last
  std::vector<int64_t> matrix_;              // per tensor: m, n, numel
  std::vector<int64_t> row_base_, col_base_; // per tensor, and one past the last
  std::vector<int64_t> col_split_;           // per tensor: pieces, column scratch offset
  int64_t col_scratch_doubles_ = 0;
  KernelArgs args_{};
  int64_t item_grain_ = 1, tensor_grain_ = 1;
};

} // namespace optjit
