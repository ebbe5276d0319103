#include "codegen/kernel_body.h"

#include <algorithm>
#include <limits>

namespace optjit::emission {

int index_in(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  OPTJIT_ASSERT(it != names.end(), "slot '" + name + "' missing from the kernel ABI");
  return static_cast<int>(it - names.begin());
}

// Emits `for (i = begin; i < end; i += step) body(i)`; returns with the builder after the loop.
void emit_loop(IRBuilder<>& b, Value* begin, Value* end, Value* step, const std::string& name,
               const std::function<void(Value*)>& body) {
  llvm::Function* fn = b.GetInsertBlock()->getParent();
  llvm::LLVMContext& ctx = b.getContext();
  llvm::BasicBlock* pre = b.GetInsertBlock();
  auto* head = llvm::BasicBlock::Create(ctx, name + ".head", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, name + ".body", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, name + ".exit", fn);
  b.CreateBr(head);
  b.SetInsertPoint(head);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, name + ".i");
  i->addIncoming(begin, pre);
  b.CreateCondBr(b.CreateICmpSLT(i, end), loop, exit);
  b.SetInsertPoint(loop);
  body(i);
  Value* next = b.CreateAdd(i, step, name + ".next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, b.GetInsertBlock());
  b.CreateBr(head);
  b.SetInsertPoint(exit);
}

void verify_module(const llvm::Module& module) {
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(module, &os))
    OPTJIT_ASSERT(false, "emitted LLVM IR does not verify: " + problems);
}

KernelBody::KernelBody(const KernelPlan& plan, llvm::Module& module, int lanes, bool device_math, bool native_bf16)
    : plan_(plan), graph_(plan.graph), module_(module), ctx_(module.getContext()), lanes_(lanes),
      native_bf16_(native_bf16) {
  for (ValueId id = plan.reductions_begin; id < plan.graph.size(); ++id)
    (op_has_trait(plan.graph.node(id).op, kAxis) ? axis_reductions_ : tensor_reductions_).push_back(id);
  if (device_math)
    math_ = define_device_math(module);
  ptr_ = llvm::PointerType::getUnqual(ctx_);
  i64_ = llvm::Type::getInt64Ty(ctx_);
}

Value* KernelBody::identity(IRBuilder<>& b, Op op) {
  return llvm::ConstantFP::get(b.getDoubleTy(), op == Op::reduce_sum ? 0.0 : -std::numeric_limits<double>::infinity());
}

Value* KernelBody::combine(IRBuilder<>& b, Op op, Value* acc, Value* v) {
  OPTJIT_ASSERT(op == Op::reduce_sum || op == Op::reduce_max, "not a reduction: " + std::string(op_name(op)));
  return op == Op::reduce_sum ? b.CreateFAdd(acc, v) : b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, acc, v);
}

llvm::Type* KernelBody::vector_type_of(llvm::Type* element, int lanes) {
  return llvm::FixedVectorType::get(element, static_cast<unsigned>(lanes));
}

void emit_if(IRBuilder<>& b, Value* condition, const std::string& name, const std::function<void()>& body) {
  llvm::Function* fn = b.GetInsertBlock()->getParent();
  auto* then = llvm::BasicBlock::Create(b.getContext(), name, fn);
  auto* after = llvm::BasicBlock::Create(b.getContext(), name + ".after", fn);
  b.CreateCondBr(condition, then, after);
  b.SetInsertPoint(then);
  body();
  b.CreateBr(after);
  b.SetInsertPoint(after);
}

// `if (condition) body();`
void KernelBody::emit_if(IRBuilder<>& b, Value* condition, const std::string& name, const std::function<void()>& body) {
  emission::emit_if(b, condition, name, body);
}

// `if (condition) *address = value;`
void KernelBody::store_if(IRBuilder<>& b, Value* condition, Value* value, Value* address, llvm::Align align) {
  emit_if(b, condition, "store", [&] { b.CreateAlignedStore(value, address, align); });
}

// The rows of a tensor of `elements` elements and rows of `n` (none when n is 0: no element names a row).
Value* KernelBody::row_count(IRBuilder<>& b, Value* elements, Value* n) {
  Value* has_columns = b.CreateICmpSGT(n, b.getInt64(0));
  return b.CreateSelect(has_columns, b.CreateSDiv(elements, b.CreateSelect(has_columns, n, b.getInt64(1))),
                        b.getInt64(0));
}

// Adds the evaluated elements `values` (scalars or vectors) to each reduction's accumulator (of the same lanes, f64).
void KernelBody::accumulate(IRBuilder<>& b, const std::vector<Value*>& values,
                            const std::vector<llvm::AllocaInst*>& acc) {
  for (std::size_t r = 0; r < acc.size(); ++r) {
    const Node& n = graph_.node(tensor_reductions_[r]);
    Value* v = values[static_cast<std::size_t>(n.inputs[0])];
    Value* wide = b.CreateFPExt(v, with_lanes(b.getDoubleTy(), v->getType()));
    b.CreateStore(combine(b, n.op, b.CreateLoad(acc[r]->getAllocatedType(), acc[r]), wide), acc[r]);
  }
}

// The current element's row (kind Rows) or column (Cols) in its tensor, as emit_axis_loop counts them.
Value* KernelBody::axis_index(SlotKind kind) const {
  Value* index = axis_ ? (kind == SlotKind::Rows ? axis_->row : axis_->col) : nullptr;
  OPTJIT_ASSERT(index, "kernel " + plan_.name + " reads rows or columns outside a walk over them");
  return index;
}

// The array of carried axis sum `name` (axis[carry index]).
Value* KernelBody::axis_array(IRBuilder<>& b, Value* arrays, const std::string& name) {
  Value* array =
      b.CreateLoad(ptr_, b.CreateGEP(ptr_, arrays, b.getInt64(static_cast<int64_t>(carry_index(plan_, name)))));
  return arrays->getType() == ptr_ ? array : b.CreateAddrSpaceCast(array, arrays->getType()); // GPU: global
}

// The array of carried axis sum `name`, at the current element's row or column.
Value* KernelBody::axis_array_address(IRBuilder<>& b, const std::string& name, SlotKind kind) {
  Value* array = axis_array(b, axis_->arrays, name);
  Value* base = kind == SlotKind::Rows ? axis_->row_base : axis_->col_base;
  return b.CreateGEP(b.getDoubleTy(), array, b.CreateAdd(base, axis_index(kind)));
}

// The carry a reduction of this kernel hands its value on as.
const std::string& KernelBody::carry_of_reduction(ValueId id) const {
  for (const Store& s : graph_.stores)
    if (s.value == id && s.kind == StoreKind::Carry)
      return s.name;
  OPTJIT_ASSERT(false, "kernel " + plan_.name + ": reduction %" + std::to_string(id) + " is handed on to no kernel");
}

// The data pointer of tensor t in slot `slot`: slots[slot * n_tensors + t].
Value* KernelBody::slot_pointer(IRBuilder<>& b, Value* slots, int slot, Value* n_tensors, Value* t,
                                const llvm::Twine& name) {
  Value* index = b.CreateAdd(b.CreateMul(b.getInt64(slot), n_tensors), t);
  return b.CreateLoad(ptr_, b.CreateGEP(ptr_, slots, index), name);
}

llvm::Type* KernelBody::scalar_type(Dtype d) {
  switch (d) {
  case Dtype::f32:
    return llvm::Type::getFloatTy(ctx_);
  case Dtype::f64:
    return llvm::Type::getDoubleTy(ctx_);
  case Dtype::bf16:
    return llvm::Type::getInt16Ty(ctx_); // its bits: from_storage and to_storage convert by hand
  case Dtype::f16:
    return llvm::Type::getHalfTy(ctx_);
  case Dtype::u8: // a quantized slot's codes, addressed as bytes
  case Dtype::e4m3:
    return llvm::Type::getInt8Ty(ctx_);
  case Dtype::c64:
  case Dtype::c128:
    break; // the verifier refuses complex slots: kernels run on real views
  }
  OPTJIT_ASSERT(false, "dtype without an LLVM type");
}

llvm::Type* KernelBody::vector_type(Dtype dtype, int lanes) {
  return lanes == 1 ? scalar_type(dtype) : llvm::FixedVectorType::get(scalar_type(dtype), static_cast<unsigned>(lanes));
}

int KernelBody::lanes_in(llvm::Type* type) {
  auto* vector = llvm::dyn_cast<llvm::FixedVectorType>(type);
  return vector ? static_cast<int>(vector->getNumElements()) : 1;
}

Dtype KernelBody::slot_dtype(const std::string& name) {
  const Slot* slot = graph_.slot(name);
  OPTJIT_ASSERT(slot, "kernel " + plan_.name + " uses undeclared slot '" + name + "'");
  return slot->dtype;
}

// `v` as `type` (scalars or vectors of the same length): loads widen storage to compute, stores round back.
Value* KernelBody::convert(IRBuilder<>& b, Value* v, llvm::Type* type) {
  return v->getType() == type ? v : b.CreateFPCast(v, type);
}

// `element`, with as many lanes as `like` has (a scalar when it is one).
llvm::Type* KernelBody::with_lanes(llvm::Type* element, llvm::Type* like) {
  if (auto* vector = llvm::dyn_cast<llvm::FixedVectorType>(like))
    return llvm::FixedVectorType::get(element, vector->getNumElements());
  return element;
}

std::vector<Value*> KernelBody::splat_all(IRBuilder<>& b, const std::vector<Value*>& scalars, int lanes) {
  std::vector<Value*> out(scalars.size(), nullptr);
  for (std::size_t id = 0; id < scalars.size(); ++id)
    if (scalars[id])
      out[id] = b.CreateVectorSplat(static_cast<unsigned>(lanes), scalars[id]);
  return out;
}

SlotKind KernelBody::tensor_slot_kind(int slot) const {
  return graph_.slot(plan_.abi.tensor_slots[static_cast<std::size_t>(slot)])->kind;
}

// Where element j of a tensor slot lives: j itself, or its row or column in a rows or columns slot.
Value* KernelBody::element_at(int slot, Value* j) {
  const SlotKind kind = tensor_slot_kind(slot);
  return kind == SlotKind::Tensor ? j : axis_index(kind);
}

// The address of element j of tensor slot `slot` (`bases`: each slot's data for the current tensor).
Value* KernelBody::slot_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j) {
  return b.CreateGEP(scalar_type(tensor_slot_dtype(slot)), bases[static_cast<std::size_t>(slot)], element_at(slot, j));
}

// `lanes` elements of slot `slot` from element j (a rows slot's one value splat over them), widened to `type`.
Value* KernelBody::load_slot(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes,
                             llvm::Type* type) {
  if (slot_blocks(slot))
    return load_quantized(b, bases, slot, j, lanes, type);
  const Dtype storage = tensor_slot_dtype(slot);
  Value* v = load_lanes(b, scalar_type(storage), slot_address(b, bases, slot, j), lanes,
                        tensor_slot_kind(slot) == SlotKind::Rows, llvm::Align(dtype_size(storage)),
                        plan_.abi.tensor_slots[slot]);
  return from_storage(b, v, storage, type);
}

// `lanes` values from `address` of `element` type: a vector load, or one value splat over the lanes when they
// share it (a row's value: the lanes of an axis loop's vector share their row).
Value* KernelBody::load_lanes(IRBuilder<>& b, llvm::Type* element, Value* address, int lanes, bool shared,
                              llvm::Align align, const llvm::Twine& name) {
  if (lanes == 1 || shared) {
    Value* v = b.CreateAlignedLoad(element, address, align, name);
    return lanes == 1 ? v : b.CreateVectorSplat(static_cast<unsigned>(lanes), v);
  }
  return b.CreateAlignedLoad(vector_type_of(element, lanes), address, align, name);
}

// The element DAG for `lanes` consecutive elements starting at index j: loads, arithmetic, stores.
void KernelBody::emit_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor,
                           Value* j, int lanes, const std::vector<llvm::AllocaInst*>& accumulators) {
  llvm::Type* type = lane_type(lanes);
  auto load = [&](int slot) { return load_slot(b, bases, slot, j, lanes, type); };
  Value* index = lane_indexes(b, j, lanes); // stochastic rounding draws its bits by element index
  std::vector<Value*> values = evaluate_elements(b, per_tensor, load, type, index);
  accumulate(b, values, accumulators);
  for (std::size_t k = 0; k < axis_reductions_.size(); ++k) { // the tensor's row or column sums
    const Node& n = graph_.node(axis_reductions_[k]);
    Value* v = values[static_cast<std::size_t>(n.inputs[0])];
    Value* wide = b.CreateFPExt(v, with_lanes(b.getDoubleTy(), v->getType()));
    if (n.op == Op::row_sum) {
      // A row's elements are consecutive: its sum is kept in registers, stored once by emit_axis_loop.
      OPTJIT_ASSERT(axis_->row_sums, "row sums are accumulated by emit_axis_loop's elements only");
      llvm::AllocaInst* running = axis_->row_sums->at(k);
      b.CreateStore(b.CreateFAdd(b.CreateLoad(running->getAllocatedType(), running), wide), running);
      continue;
    }
    Value* address = axis_array_address(b, carry_of_reduction(axis_reductions_[k]), SlotKind::Cols);
    Value* sum = b.CreateFAdd(b.CreateAlignedLoad(wide->getType(), address, llvm::Align(8)), wide);
    b.CreateAlignedStore(sum, address, llvm::Align(8)); // a vector of columns starts at any column
  }
  for (const Store& s : graph_.stores) {
    if (s.kind != StoreKind::Tensor)
      continue;
    const int slot = index_in(plan_.abi.tensor_slots, s.name);
    if (slot_blocks(slot)) { // written when its block ends (quantize_block)
      buffer_quantized_store(b, slot, j, values[static_cast<std::size_t>(s.value)]);
      continue;
    }
    const Dtype storage = tensor_slot_dtype(slot);
    Value* address = slot_address(b, bases, slot, j);
    Value* stored = to_storage(b, values[static_cast<std::size_t>(s.value)], storage);
    const SlotKind kind = graph_.slot(s.name)->kind;
    if (kind == SlotKind::Tensor) {
      b.CreateAlignedStore(stored, address, llvm::Align(dtype_size(storage)));
      continue;
    }
    // A row (column) is written once, by its last element: every element of it has read the old value by then
    // (the item is the whole tensor, walked in row order). A vector's last lane is its row's last element when the
    // vector ends the row; a vector of a matrix's last row holds its columns' last elements.
    if (kind == SlotKind::Rows) {
      Value* ends_row = b.CreateICmpEQ(b.CreateAdd(axis_->col_in_row, b.getInt64(lanes)), axis_->n);
      if (lanes > 1)
        stored = b.CreateExtractElement(stored, static_cast<uint64_t>(lanes - 1));
      store_if(b, ends_row, stored, address, llvm::Align(dtype_size(storage)));
    } else {
      store_if(b, b.CreateICmpEQ(axis_->row_in_matrix, b.CreateSub(axis_->m, b.getInt64(1))), stored, address,
               llvm::Align(dtype_size(storage)));
    }
  }
}

// The element nodes over operands of `type`, given the per-tensor values, how to load a tensor slot and the
// elements' indexes in their tensor (i64, with as many lanes as `type`).
std::vector<Value*> KernelBody::evaluate_elements(IRBuilder<>& b, const std::vector<Value*>& per_tensor,
                                                  const std::function<Value*(int slot)>& load, llvm::Type* type,
                                                  Value* index) {
  std::vector<Value*> values = per_tensor;
  for (ValueId id = plan_.prologue_size; id < plan_.reductions_begin; ++id) {
    const Node& n = graph_.node(id);
    Value* v;
    if (n.op == Op::tensor) {
      v = load(index_in(plan_.abi.tensor_slots, n.name));
    } else if (n.op == Op::carried_rows || n.op == Op::carried_cols) {
      const SlotKind kind = n.op == Op::carried_rows ? SlotKind::Rows : SlotKind::Cols;
      const int lanes = lanes_in(type);
      v = convert(b,
                  load_lanes(b, b.getDoubleTy(), axis_array_address(b, n.name, kind), lanes, kind == SlotKind::Rows,
                             llvm::Align(8)),
                  type);
    } else {
      std::vector<Value*> operands;
      for (ValueId in : n.inputs)
        operands.push_back(values[static_cast<std::size_t>(in)]);
      v = n.op == Op::sround ? emit_stochastic_round(b, operands, index) : emit_op(b, n, operands, type);
    }
    values[static_cast<std::size_t>(id)] = v;
  }
  return values;
}

// Where tensor t's carried value `name` lives: carry[t * n_carry + index of name in the plan's carries].
Value* KernelBody::carry_address(IRBuilder<>& b, const PerTensorInputs& in, const std::string& name) {
  Value* index = b.CreateAdd(b.CreateMul(in.t, in.n_carry), b.getInt64(index_in(plan_.carries, name)));
  return b.CreateGEP(i64_, in.carry, index);
}

// The per-tensor nodes [0, prologue_size) of tensor t, in double precision (scalar state read in the element
// type and widened).
std::vector<Value*> KernelBody::emit_prologue(IRBuilder<>& b, const PerTensorInputs& in) {
  std::vector<Value*> values(static_cast<std::size_t>(graph_.size()), nullptr);
  for (ValueId id = 0; id < plan_.prologue_size; ++id) {
    const Node& n = graph_.node(id);
    Value* v = nullptr;
    switch (n.op) {
    case Op::constant:
      v = llvm::ConstantFP::get(b.getDoubleTy(), n.number);
      break;
    case Op::hyper: {
      Value* group = b.CreateLoad(i64_, b.CreateGEP(i64_, in.group_of, in.t));
      Value* index = b.CreateAdd(b.CreateMul(group, in.n_hyper), b.getInt64(index_in(plan_.abi.hypers, n.name)));
      Value* entry = b.CreateGEP(b.getDoubleTy(), in.hyper, index);
      if (const HyperOnDevice* on_device = hyper_on_device(plan_, n.name)) {
        // The entry holds the address of the value (a tensor on the device): it is read where it lives.
        Value* address = b.CreateLoad(ptr_, entry, n.name + ".address");
        v = from_storage(b, b.CreateLoad(scalar_type(on_device->dtype), address, n.name), on_device->dtype,
                         b.getDoubleTy());
      } else {
        v = b.CreateLoad(b.getDoubleTy(), entry, n.name);
      }
      break;
    }
    case Op::scalar_state: {
      Value* address = slot_pointer(b, in.slots, scalar_slot(n.name), in.n_tensors, in.t);
      v = from_storage(b, b.CreateLoad(scalar_type(slot_dtype(n.name)), address, n.name), slot_dtype(n.name),
                       b.getDoubleTy());
      break;
    }
    case Op::carried:
      v = b.CreateLoad(value_type(n.dtype), carry_address(b, in, n.name), n.name);
      break;
    case Op::extent: {
      OPTJIT_ASSERT(in.matrix, "kernel " + plan_.name + " reads an extent without the matrix argument");
      const int64_t k = n.name == "m" ? 0 : n.name == "n" ? 1 : 2;
      Value* at = b.CreateAdd(b.CreateMul(in.t, b.getInt64(3)), b.getInt64(k));
      v = b.CreateSIToFP(b.CreateLoad(i64_, b.CreateGEP(i64_, in.matrix, at)), b.getDoubleTy(), n.name);
      break;
    }
    default:
      std::vector<Value*> operands;
      for (ValueId input : n.inputs)
        operands.push_back(values[static_cast<std::size_t>(input)]);
      v = emit_op(b, n, operands, value_type(n.dtype));
    }
    values[static_cast<std::size_t>(id)] = v;
  }
  return values;
}

// Work item `index` of the (tensor, begin, end) table (runtime/kernel_abi.h's WorkItem).
KernelBody::WorkItemValues KernelBody::load_work_item(IRBuilder<>& b, Value* items, Value* index) {
  Value* item = b.CreateGEP(i64_, items, b.CreateMul(index, b.getInt64(3)));
  return {b.CreateLoad(i64_, item, "tensor"), b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(1)), "begin"),
          b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(2)), "end")};
}

// Tensor t's per-tensor results: its new scalar state (each scalar store, narrowed to the element type, into its
// slot) and the values it hands to later kernels (into the carry buffer, in their own dtype).
void KernelBody::emit_per_tensor_stores(IRBuilder<>& b, const std::vector<Value*>& values, const PerTensorInputs& in) {
  for (const Store& s : graph_.stores) {
    if (s.value >= plan_.reductions_begin)
      continue; // a reduction's result, handed on by the finish phase
    Value* value = values[static_cast<std::size_t>(s.value)];
    switch (s.kind) {
    case StoreKind::Tensor:
      break;
    case StoreKind::Scalar:
      b.CreateStore(to_storage(b, value, slot_dtype(s.name)),
                    slot_pointer(b, in.slots, scalar_slot(s.name), in.n_tensors, in.t));
      break;
    case StoreKind::Carry:
      b.CreateStore(value, carry_address(b, in, s.name));
      break;
    }
  }
}

int KernelBody::scalar_slot(const std::string& name) const {
  return static_cast<int>(plan_.abi.tensor_slots.size()) + index_in(plan_.abi.scalar_slots, name);
}

// One op on scalars or vectors of `type`; the meaning follows compiler/op_semantics.h.
Value* KernelBody::emit_op(IRBuilder<>& b, const Node& n, const std::vector<Value*>& in, llvm::Type* type) {
  auto as_type = [&](Value* v) { return b.CreateUIToFP(v, type); };
  Value* zero = llvm::Constant::getNullValue(type);
  switch (n.op) {
  case Op::cast:
    if (n.dtype == Dtype::bf16) // rounded to bf16, held in a float (value_type)
      return from_storage(b, to_storage(b, in[0], Dtype::bf16), Dtype::bf16, type);
    return b.CreateFPCast(in[0], type);
  case Op::round_bf16:
    return from_storage(b, to_storage(b, in[0], Dtype::bf16), Dtype::bf16, type); // through f32, as torch
  case Op::neg:
    return b.CreateFNeg(in[0]);
  case Op::sqrt:
    return b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, in[0]);
  case Op::abs:
    return b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, in[0]);
  case Op::exp:
    return math_ ? call_device_math(b, math_->exp, in, type) : b.CreateUnaryIntrinsic(llvm::Intrinsic::exp, in[0]);
  case Op::log:
    return math_ ? call_device_math(b, math_->log, in, type) : b.CreateUnaryIntrinsic(llvm::Intrinsic::log, in[0]);
  case Op::sign:
    return b.CreateFSub(as_type(b.CreateFCmpOGT(in[0], zero)), as_type(b.CreateFCmpOLT(in[0], zero)));
  case Op::add:
    return b.CreateFAdd(in[0], in[1]);
  case Op::sub:
    return b.CreateFSub(in[0], in[1]);
  case Op::mul:
    return b.CreateFMul(in[0], in[1]);
  case Op::div:
    return b.CreateFDiv(in[0], in[1]);
  case Op::maximum:
    return b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, in[0], in[1]);
  case Op::minimum:
    return b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, in[0], in[1]);
  case Op::pow:
    return math_ ? call_device_math(b, math_->pow, in, type)
                 : b.CreateBinaryIntrinsic(llvm::Intrinsic::pow, in[0], in[1]);
  case Op::lt:
    return as_type(b.CreateFCmpOLT(in[0], in[1]));
  case Op::gt:
    return as_type(b.CreateFCmpOGT(in[0], in[1]));
  case Op::eq:
    return as_type(b.CreateFCmpOEQ(in[0], in[1]));
  case Op::select:
    return b.CreateSelect(b.CreateFCmpUNE(in[0], zero), in[1], in[2]);
  case Op::fma:
    return b.CreateIntrinsic(llvm::Intrinsic::fma, {type}, {in[0], in[1], in[2]});
  case Op::sround:     // needs the element index: emit_stochastic_round
  case Op::reduce_sum: // accumulated by the element phase (emit_body), combined by the finish phase
  case Op::reduce_max:
  case Op::list_sum: // no kernel computes one: the host combines its operand between kernels (apply_fusion)
  case Op::list_max:
  case Op::group_sum:
  case Op::group_max:
  case Op::row_sum: // accumulated into the tensor's rows or columns by the element phase
  case Op::col_sum:
  case Op::carried_rows:
  case Op::carried_cols:
  case Op::mm: // a library call between kernels (KernelPlan::calls_after), never a kernel's node
  case Op::addmm:
  case Op::extent:
  case Op::constant:
  case Op::hyper:
  case Op::scalar_state:
  case Op::tensor:
  case Op::carried:
    break;
  }
  OPTJIT_ASSERT(false, "emit_op called on input op " + std::string(op_name(n.op)));
}

// A device math function (double precision) on scalar operands of `type`.
Value* KernelBody::call_device_math(IRBuilder<>& b, llvm::Function* fn, const std::vector<Value*>& in,
                                    llvm::Type* type) {
  OPTJIT_ASSERT(!type->isVectorTy(), "device math runs on scalars");
  std::vector<Value*> wide;
  for (Value* v : in)
    wide.push_back(b.CreateFPExt(v, b.getDoubleTy()));
  return b.CreateFPTrunc(b.CreateCall(fn, wide), type);
}

} // namespace optjit::emission
