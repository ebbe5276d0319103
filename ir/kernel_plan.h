// What fusion decides and what codegen consumes. A FusionPlan says which node goes to which kernel and why; a
// KernelPlan is one kernel of a step's plan (a list of kernels, run in order) ready for codegen: its nodes in phase
// order (per-tensor prologue first), its ABI layout, the per-tensor values that cross from its tensor phase to its
// element phase (scratch), and the per-tensor values it reads from or hands to other kernels of the plan (carried:
// `carried "c0"` nodes and `store_carry "c0"` stores). Every kernel iterates over the same list of tensors.
#pragma once

#include "ir/ir.h"
#include "runtime/gemm.h"
#include "runtime/tensor.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace optjit {

struct FusionPlan {
  // Per node: the kernel that computes it (a reduction: the kernel whose element pass accumulates it). Later kernels
  // read a per-tensor value as a carried value; an element value cannot cross kernels, so every kernel that needs one
  // computes it again from its loads (apply_fusion).
  std::vector<int> kernel_of;
  // Per store: the kernel that performs it; empty: each in the kernel of its value. A tensor store can come later
  // than its value, after the last kernel that loads the slot (which must read the values from before the step).
  std::vector<int> store_kernel;
  int kernel_count = 0;
  std::vector<std::string> decisions; // why nodes were grouped (or refused), one line each
};

// A carried value: one per tensor, an axis sum's array (one value per row or per column of each tensor), or a list
// reduction's value: one per tensor as its kernel stores it (the operand), combined over the list (or over each
// param group of it) by the host when that kernel has ended (a sum, or the largest, NaN-propagating; in list order),
// so every tensor then holds its list's or group's value.
enum class CarryKind : uint8_t { PerTensor, Rows, Cols, ListSum, ListMax, GroupSum, GroupMax };
inline bool is_axis_carry(CarryKind kind) { return kind == CarryKind::Rows || kind == CarryKind::Cols; }
inline bool is_group_carry(CarryKind kind) { return kind == CarryKind::GroupSum || kind == CarryKind::GroupMax; }
inline bool is_list_carry(CarryKind kind) {
  return kind == CarryKind::ListSum || kind == CarryKind::ListMax || is_group_carry(kind);
}
// The carry kind of list reduction op `op` (list_sum, list_max, group_sum, group_max), and the op of such a kind.
CarryKind list_carry_kind(Op op);
Op list_reduction_op(CarryKind kind);
// Combines `values` (one per tensor of the list, in list order) into every entry, as list carry `kind` says: over
// the whole list, or over the entries of each param group (`groups`: each entry's group) for a group carry.
void combine_over_list(CarryKind kind, double* values, std::size_t count, const int64_t* groups);

// How one process's per-tensor value of a reduction combines with the other processes' when each holds a shard of
// every tensor (FSDP2's DTensors, stepped through their local tensors): summed (reduce_sum), or the largest taken
// (reduce_max). None: the value is not a reduction of the tensor's elements and is whole already.
enum class ShardCombine : uint8_t { None, Sum, Max };
// How reduction op `op`'s per-tensor value combines over shards: reduce_sum Sum, reduce_max Max, any other op None.
ShardCombine shard_combine_of(Op op);

// A list reduction a run has reached: each list entry's operand, which the caller combines in place (over this list
// alone, or over the lists of every bucket of a step, which then hands each its part back), and each entry's param
// group (the run's bound arguments', alive while it is paused; a list carry alone may go without). A run over shards
// (Executable::Pauses::ShardReductionsToo) also pauses at per-tensor reductions (kind PerTensor, combined over no
// list): values whose `shards` is not None are this process's partials, which the caller combines over the
// processes first, in place.
struct ListPartials {
  CarryKind kind;
  std::vector<double> values;
  const std::vector<int64_t>* groups = nullptr;
  ShardCombine shards = ShardCombine::None;
};
// Combines each of `pending` over its own list alone.
void combine_each_over_list(std::vector<ListPartials>& pending);

// A temporary matrix of every list entry, which a plan's kernels and library calls hand each other: an operand of a
// matrix product written out by a kernel, or a product's result. The executable makes it when it binds.
struct ScratchBuffer {
  std::string name;  // its slot's in the kernels that load or store it
  Dtype dtype;       // the product's dtype (bf16 or f32)
  MatrixShape shape; // as a matrix of the entry's (m, n) param
  int storage = 0;   // buffers of one storage share their memory: their lives in the plan do not overlap
                     // (share_scratch_storage); each buffer its own until then
  bool operator==(const ScratchBuffer&) const = default;
};

// A matrix product (mm, addmm: ir/ops.def) a plan runs after one of its kernels, for every list entry, in the matrix
// library (runtime/gemm.h), over scratch buffers: result = beta input + alpha op(a) op(b) (addmm; mm: op(a) op(b)).
// beta and alpha are constants or hyperparameters.
struct LibraryCall {
  struct Scalar {
    std::string hyper; // empty: `value`
    double value = 0;
    bool operator==(const Scalar&) const = default;
  };
  Op op = Op::mm;
  std::string form; // "nt bf16" (MatrixProductForm)
  std::string result, a, b, input;
  Scalar beta, alpha;
  bool operator==(const LibraryCall&) const = default;
};
std::string print_library_call(const LibraryCall& call);
// The library's product of `form` over operands whose last two dimensions are their matrices (`a` and `b`: [rows,
// cols] or [batch, rows, cols], stored before any transpose): alpha 1 and beta 0, which the caller sets. Throws
// optjit::Error naming the shapes when op(a)'s columns are not op(b)'s rows.
GemmShape gemm_shape(const MatrixProductForm& form, const Shape& a, const Shape& b);

// A hyperparameter the kernel reads from device memory: its entry in the argument table holds the address of a
// 1-element tensor of `dtype` (a tensor lr, GradScaler's scale on the params' device) instead of the value, so that
// the host never copies the value back.
struct HyperOnDevice {
  std::string name;
  Dtype dtype = Dtype::f32; // f32 or f64
  bool operator==(const HyperOnDevice&) const = default;
};

struct KernelPlan {
  std::string name;
  Graph graph;                          // the kernel's nodes (per-tensor prefix, then element nodes) and stores
  GraphSignature abi;                   // slot and hyperparameter order of the kernel's arguments
  std::vector<ValueId> scratch;         // per-tensor values read by the element phase, in scratch order
  int prologue_size = 0;                // nodes [0, prologue_size) are per-tensor, then element nodes
  int reductions_begin = 0;             // nodes [reductions_begin, size) are reductions of element values over each
                                        // tensor (accumulated by the element phase), whose results go only to carries
  std::vector<std::string> carries;     // every carried value of the plan, in carry-buffer order (the same list in
                                        // each kernel of a plan)
  std::vector<CarryKind> carry_kinds;   // per carried value
  bool has_axis = false;                // the kernel reads or writes rows or columns (slots, sums, carried sums)
  std::vector<LibraryCall> calls_after; // the plan's matrix products that run once this kernel has ended, in order
  std::vector<HyperOnDevice> hypers_on_device; // of abi.hypers, those read from device memory (set by the driver)
  bool operator==(const KernelPlan&) const = default;
};
// The entry of hypers_on_device for hyperparameter `name`, or null when the kernel reads its value from the table.
const HyperOnDevice* hyper_on_device(const KernelPlan& plan, const std::string& name);

// What a GPU item that holds part of a matrix cannot finish alone (runtime/work_items.h's make_axis_work_items): its
// column sums, kept as one partial per column and item, and its stores to columns slots, whose old values other items
// of the matrix may still read, kept per column. The tensor's last item combines and writes them.
struct ColumnSplit {
  int64_t sums = 0;   // the kernel's col_sum nodes
  int64_t stores = 0; // its tensor stores to columns slots
};
ColumnSplit column_split(const KernelPlan& plan);

// A kernel plan for `graph`, whose per-tensor nodes must come first (a hoisted graph) and whose reductions, if any,
// come last and are used only by carry stores: derives its ABI, scratch, prologue and reductions; the graph takes the
// name `name`, which must be an identifier (check_graph_name). Throws optjit::Error naming the node when the graph is
// not hoisted or reads or writes a carried value missing from `carries`.
KernelPlan make_kernel_plan(std::string name, Graph graph, std::vector<std::string> carries,
                            std::vector<CarryKind> carry_kinds = {});
// The position of carried value `name` in the plan's carries (an internal error when it carries none such).
std::size_t carry_index(const KernelPlan& plan, const std::string& name);
// The carry positions of the list reductions the kernel stores, in its carried_out order: what the host combines
// over the list when it has ended.
std::vector<std::size_t> list_carry_columns(const KernelPlan& plan);
// A carry a run pauses at when the kernel has ended, and how the host combines it.
struct PausedCarry {
  std::size_t column = 0;
  CarryKind kind = CarryKind::PerTensor;
  ShardCombine shards = ShardCombine::None; // how it combines over the shards of a run over shards
  bool operator==(const PausedCarry&) const = default;
};
// The carries the kernel stores that a run pauses at, in its carried_out order: its list reductions, and in a run over
// shards (`over_shards`) also its per-tensor reductions, whose values each process holds for its own shards alone.
std::vector<PausedCarry> paused_carries(const KernelPlan& plan, bool over_shards);
// Block-quantized slots (Slot::blocks) a kernel reads or writes, in its ABI's tensor slot order: their scales follow
// the kernel's scalar slots in its slot table, in this order.
std::vector<std::string> quantized_slots(const KernelPlan& plan);
// What the kernel's work items must be cut at: a multiple of the block of every quantized slot it touches (1: none).
int64_t quantization_alignment(const KernelPlan& plan);
// The block of the kernel's quantized stores (make_kernel_plan: one size); none when it stores no quantized slot.
std::optional<int64_t> stored_block(const KernelPlan& plan);
// How many of the kernel's reductions reduce to one value per tensor (the others sum along rows or columns): the
// partials each work item writes.
int per_tensor_reductions(const KernelPlan& plan);

struct KernelStats {
  int kernels = 0;              // launches per step after fusion
  int unfused_kernels = 0;      // launches per step op by op (one per element op, as eager foreach)
  int element_ops = 0;          // arithmetic per element
  int per_tensor_ops = 0;       // arithmetic per tensor
  double bytes_per_element = 0; // tensor bytes read + written per element (a quantized slot's codes and scales)
  int library_calls = 0;        // matrix products per step, each a call of the matrix library per list entry
};

// The text of a kernel plan, deterministic: a header with the ABI, carries and scratch, then the graph. It parses
// back: parse_kernel_plan(print_kernel_plan(p)) == p. The header is derived from the graph, so the parser checks
// that it agrees and names the first line that does not.
//
//   kernel @adam_k0 f32
//     tensor slots: param, grad, exp_avg, exp_avg_sq
//     scalar slots: step
//     hypers: lr, beta1, beta2, eps
//     carries: -
//     scratch: %8, %9
//     tensor phase: %0..%23, element phase: %24..%40
// (a kernel that ends with reductions adds ", reductions: %41..%42" to the last line)
//   graph @adam_k0 f32 { ... }
std::string print_kernel_plan(const KernelPlan& plan);
KernelPlan parse_kernel_plan(std::string_view text);
// Several plans printed one after another (a step's kernels), read back in order.
std::vector<KernelPlan> parse_kernel_plans(std::string_view text);

} // namespace optjit
