// KernelBody: what every kernel of a plan is made of, whatever the target: the LLVM types of slots and values, the
// per-tensor prologue and stores, the element DAG (loads, ops, stores) over scalars or vectors, the reductions'
// accumulators and the addresses of axis sums. A target derives from it and decides how the iteration space is split:
// codegen/cpu_kernel.cpp (tensor, element and finish phases), codegen/cuda/gpu_kernel.cpp (a block per work item) and
// codegen/cuda/axis_sweeps.cpp (rows and columns on the GPU). Conversions to and from storage dtypes (bf16 by hand,
// stochastic rounding) are defined in codegen/storage_rounding.cpp. Internal to codegen/: not installed.
#pragma once

#include "codegen/cuda/device_math.h"
#include "codegen/kernel_emitter.h"
#include "runtime/kernel_abi.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optjit::emission {

using llvm::IRBuilder;
using llvm::Value;

// The index of `name` in a kernel ABI's list of names (asserted present).
int index_in(const std::vector<std::string>& names, const std::string& name);

// Emits `for (i = begin; i < end; i += step) body(i)`; returns with the builder after the loop.
void emit_loop(IRBuilder<>& b, Value* begin, Value* end, Value* step, const std::string& name,
               const std::function<void(Value*)>& body);

// Emits `if (condition) body();`; returns with the builder after it.
void emit_if(IRBuilder<>& b, Value* condition, const std::string& name, const std::function<void()>& body);

// Asserts that the emitted module verifies.
void verify_module(const llvm::Module& module);

class KernelBody {
public:
  // `device_math`: exp, log and pow from codegen/cuda/device_math.h (targets without libm); `native_bf16`: see
  // emit_cpu_kernel.
  KernelBody(const KernelPlan& plan, llvm::Module& module, int lanes, bool device_math, bool native_bf16);

  // Where per-tensor work reads and writes for tensor t: the slot table, the hyperparameters by group, the carried
  // values of the plan.
  struct PerTensorInputs {
    Value* slots;
    Value* n_tensors;
    Value* hyper;
    Value* group_of;
    Value* n_hyper;
    Value* carry;
    Value* n_carry;
    Value* t;
    Value* matrix = nullptr; // the CPU's per-tensor extents (extent nodes read it)
  };
  struct WorkItemValues {
    Value* tensor;
    Value* begin;
    Value* end;
  };
  // Rows and columns of the item the element phase is in (kernels with has_axis): m, n and the tensor's bases.
  struct AxisIndex {
    Value* m;
    Value* n;
    Value* row_base;
    Value* col_base;
    Value* arrays; // the axis argument
    // Of the current step's (first) element j, counted by emit_axis_loop:
    Value* row = nullptr;           // its row in its tensor (j / n)
    Value* col = nullptr;           // its column in its tensor ((j / (m n)) n + j % n)
    Value* col_in_row = nullptr;    // j % n
    Value* row_in_matrix = nullptr; // (j / n) % m
    // Per axis reduction: its row's running sum, with the lanes of the current step (emit_axis_loop).
    const std::vector<llvm::AllocaInst*>* row_sums = nullptr;
  };
  bool has_reductions() const { return !tensor_reductions_.empty(); }
  std::size_t reduction_count() const { return tensor_reductions_.size(); }
  // Reduction r of the kernel (node reductions_begin + r), its identity, and how two partials combine.
  Op reduction_op(std::size_t r) const { return graph_.node(tensor_reductions_[r]).op; }
  static Value* identity(IRBuilder<>& b, Op op);
  static Value* combine(IRBuilder<>& b, Op op, Value* acc, Value* v);
  static llvm::Type* vector_type_of(llvm::Type* element, int lanes);
  // `if (condition) body();`
  void emit_if(IRBuilder<>& b, Value* condition, const std::string& name, const std::function<void()>& body);
  // `if (condition) *address = value;`
  void store_if(IRBuilder<>& b, Value* condition, Value* value, Value* address, llvm::Align align);
  // The rows of a tensor of `elements` elements and rows of `n` (none when n is 0: no element names a row).
  Value* row_count(IRBuilder<>& b, Value* elements, Value* n);
  // Adds the evaluated elements `values` (scalars or vectors) to each reduction's accumulator (of the same lanes, f64).
  void accumulate(IRBuilder<>& b, const std::vector<Value*>& values, const std::vector<llvm::AllocaInst*>& acc);
  // The current element's row (kind Rows) or column (Cols) in its tensor, as emit_axis_loop counts them.
  Value* axis_index(SlotKind kind) const;
  // The array of carried axis sum `name` (axis[carry index]).
  Value* axis_array(IRBuilder<>& b, Value* arrays, const std::string& name);
  // The array of carried axis sum `name`, at the current element's row or column.
  Value* axis_array_address(IRBuilder<>& b, const std::string& name, SlotKind kind);
  // The carry a reduction of this kernel hands its value on as.
  const std::string& carry_of_reduction(ValueId id) const;
  // The data pointer of tensor t in slot `slot`: slots[slot * n_tensors + t].
  Value* slot_pointer(IRBuilder<>& b, Value* slots, int slot, Value* n_tensors, Value* t, const llvm::Twine& name = "");
  llvm::Type* scalar_type(Dtype d);
  // The LLVM type a computed value of `d` is held in: its storage type, except bf16, held as a float (rounded to
  // bf16) since LLVM computes on no bf16 here.
  llvm::Type* value_type(Dtype d) { return d == Dtype::bf16 ? llvm::Type::getFloatTy(ctx_) : scalar_type(d); }
  // The compute type of element values.
  llvm::Type* element_type() { return scalar_type(graph_.dtype); }
  llvm::Type* vector_type(Dtype dtype, int lanes);
  llvm::Type* lane_type(int lanes) { return vector_type(graph_.dtype, lanes); }
  static int lanes_in(llvm::Type* type);
  // The storage dtype of the kernel's tensor slot `slot` (an index into the ABI's tensor slots), and of a slot by
  // name.
  Dtype tensor_slot_dtype(int slot) { return slot_dtype(plan_.abi.tensor_slots[static_cast<std::size_t>(slot)]); }
  Dtype slot_dtype(const std::string& name);
  // `v` as `type` (scalars or vectors of the same length): loads widen storage to compute, stores round back.
  Value* convert(IRBuilder<>& b, Value* v, llvm::Type* type);
  // `element`, with as many lanes as `like` has (a scalar when it is one).
  static llvm::Type* with_lanes(llvm::Type* element, llvm::Type* like);
  std::vector<Value*> splat_all(IRBuilder<>& b, const std::vector<Value*>& scalars, int lanes);
  SlotKind tensor_slot_kind(int slot) const;
  // Where element j of a tensor slot lives: j itself, or its row or column in a rows or columns slot.
  Value* element_at(int slot, Value* j);
  // The address of element j of tensor slot `slot` (`bases`: each slot's data for the current tensor).
  Value* slot_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j);
  // `lanes` elements of slot `slot` from element j (a rows slot's one value splat over them), widened to `type`.
  Value* load_slot(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes, llvm::Type* type);
  // `lanes` values from `address` of `element` type: a vector load, or one value splat over the lanes when they
  // share it (a row's value: the lanes of an axis loop's vector share their row).
  Value* load_lanes(IRBuilder<>& b, llvm::Type* element, Value* address, int lanes, bool shared, llvm::Align align,
                    const llvm::Twine& name = "");
  // The element DAG for `lanes` consecutive elements starting at index j: loads, arithmetic, stores.
  void emit_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor, Value* j,
                 int lanes, const std::vector<llvm::AllocaInst*>& accumulators = {});
  // The element nodes over operands of `type`, given the per-tensor values, how to load a tensor slot and the
  // elements' indexes in their tensor (i64, with as many lanes as `type`).
  std::vector<Value*> evaluate_elements(IRBuilder<>& b, const std::vector<Value*>& per_tensor,
                                        const std::function<Value*(int slot)>& load, llvm::Type* type, Value* index);
  // Where tensor t's carried value `name` lives: carry[t * n_carry + index of name in the plan's carries].
  Value* carry_address(IRBuilder<>& b, const PerTensorInputs& in, const std::string& name);
  // The per-tensor nodes [0, prologue_size) of tensor t, in double precision (scalar state read in the element
  // type and widened).
  std::vector<Value*> emit_prologue(IRBuilder<>& b, const PerTensorInputs& in);
  // Work item `index` of the (tensor, begin, end) table (runtime/kernel_abi.h's WorkItem).
  WorkItemValues load_work_item(IRBuilder<>& b, Value* items, Value* index);
  // Tensor t's per-tensor results: its new scalar state (each scalar store, narrowed to the element type, into its
  // slot) and the values it hands to later kernels (into the carry buffer, in their own dtype).
  void emit_per_tensor_stores(IRBuilder<>& b, const std::vector<Value*>& values, const PerTensorInputs& in);
  int scalar_slot(const std::string& name) const;
  // One op on scalars or vectors of `type`; the meaning follows ir/op_semantics.h.
  Value* emit_op(IRBuilder<>& b, const Node& n, const std::vector<Value*>& in, llvm::Type* type);
  // A device math function (double precision) on scalar operands of `type`.
  Value* call_device_math(IRBuilder<>& b, llvm::Function* fn, const std::vector<Value*>& in, llvm::Type* type);

  // Storage dtypes and rounding (codegen/storage_rounding.cpp).
  // A value loaded from `storage` (scalar or vector), in the compute type `type`. bf16 is kept as its 16 bits and
  // widened by hand (its bits are a float's upper half), so that no target needs a bf16 conversion routine.
  Value* from_storage(IRBuilder<>& b, Value* v, Dtype storage, llvm::Type* type);
  // A computed value (scalar or vector) rounded to `storage`, to nearest with ties to even. bf16 by hand (below), or
  // by the CPU's conversion where it has one: that conversion flushes subnormals, so a vector holding one (rare:
  // below 2^-126) branches to the exact rounding.
  Value* to_storage(IRBuilder<>& b, Value* v, Dtype storage);
  // f32 (scalar or vector) to bf16 bits by integer arithmetic: add 0x7fff plus the lowest kept bit and keep the upper
  // half; NaNs stay quiet NaNs. Exact for every input, subnormals included.
  Value* round_to_bf16_bits(IRBuilder<>& b, Value* v);
  // runtime/stochastic_rounding.h's rounding_mix, lane by lane.
  Value* rounding_mix(IRBuilder<>& b, Value* x);
  // sround: in[0] (f32 lanes) rounded to bf16 with runtime/stochastic_rounding.h's bits for counter in[1] and stream
  // in[2] (f64 lanes holding whole numbers) at element `index`; the same operations as stochastic_round_bf16.
  Value* emit_stochastic_round(IRBuilder<>& b, const std::vector<Value*>& in, Value* index);

  // Block-quantized slots (codegen/block_codes.cpp).
  // The format of ABI tensor slot `slot`, or null for a plain slot.
  const SlotBlocks* slot_blocks(int slot) const;
  // Where quantized slot `slot`'s scales are in the element phase's bases (after the tensor slots' data).
  int scales_base(int slot) const;
  Value* code_table(BlockFormat format);
  Value* table_lookup(IRBuilder<>& b, Value* table, Value* index);
  Value* lane_indexes(IRBuilder<>& b, Value* j, int lanes);
  Value* load_codes(IRBuilder<>& b, Value* base, BlockFormat format, Value* j, int lanes);
  Value* block_scales(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes);
  Value* load_quantized(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes,
                        llvm::Type* type);
  void buffer_quantized_store(IRBuilder<>& b, int slot, Value* j, Value* value);
  Value* to_e4m3_bits(IRBuilder<>& b, Value* x);
  Value* from_e4m3_bits(IRBuilder<>& b, Value* bits);
  Value* nearest_codes(IRBuilder<>& b, Value* x, BlockFormat format);
  Value* code_search_table(BlockFormat format);
  // A block's scale made ready to divide by without a division per value (divide_by_scale): a power of two that
  // brings it into [1, 2), the scaled divisor and its rounded reciprocal.
  struct ScaleDivision {
    Value* factor;
    Value* divisor;
    Value* reciprocal;
  };
  ScaleDivision prepare_scale_division(IRBuilder<>& b, Value* scale);
  Value* divide_by_scale(IRBuilder<>& b, Value* values, const ScaleDivision& d);
  void quantize_block(IRBuilder<>& b, const std::vector<Value*>& bases);
  // A kernel that stores quantized state walks its items (whole blocks: Binding cuts them so) block by block: per
  // quantized store, a buffer of the block's values and their running maximum, made once in `fn`'s entry block.
  void prepare_block_walk(llvm::Function* fn, int64_t block);
  // The running maxima of a new block, zero.
  void reset_block_maxima(IRBuilder<>& b);
  // A walk over whole blocks of `block` elements (a kernel that stores quantized state): the block's first element
  // and its index, and per quantized store (by ABI tensor slot) its buffer of the block's values and their running
  // absolute maximum (a vector's lanes, and the scalar tail's; as the bits of the magnitudes, buffer_quantized_store).
  struct BlockWalk {
    struct Buffer {
      llvm::AllocaInst* values;
      llvm::AllocaInst* vector_absmax;
      llvm::AllocaInst* scalar_absmax;
    };
    int64_t block = 0;
    Value* start = nullptr;
    Value* index = nullptr;
    std::map<int, Buffer> buffers;
  };

protected:
  std::optional<BlockWalk> block_walk_;
  const KernelPlan& plan_;
  const Graph& graph_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  int lanes_;
  bool native_bf16_;
  std::optional<DeviceMath> math_;                           // set for targets without libm
  std::vector<ValueId> tensor_reductions_, axis_reductions_; // the kernel's reductions, per tensor and along an axis
  std::optional<AxisIndex> axis_;
  llvm::PointerType* ptr_;
  llvm::Type* i64_;
};

} // namespace optjit::emission
