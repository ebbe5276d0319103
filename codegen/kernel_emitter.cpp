#include "codegen/kernel_emitter.h"
#include "runtime/kernel_abi.h"

#include <algorithm>
#include <functional>

namespace optjit {
namespace {

using llvm::IRBuilder;
using llvm::Value;

int index_in(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  OPTJIT_ASSERT(it != names.end(), "slot '" + name + "' missing from the kernel ABI");
  return static_cast<int>(it - names.begin());
}

// Emits `for (i = begin; i < end; i += step) body(i)`; returns with the builder after the loop.
void emit_loop(IRBuilder<>& b, Value* begin, Value* end, int64_t step, const std::string& name,
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
  Value* next = b.CreateAdd(i, b.getInt64(step), name + ".next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, b.GetInsertBlock());
  b.CreateBr(head);
  b.SetInsertPoint(exit);
}

class Emitter {
public:
  Emitter(const KernelPlan& plan, llvm::Module& module, int lanes)
      : plan_(plan), graph_(plan.graph), module_(module), ctx_(module.getContext()), lanes_(lanes) {
    ptr_ = llvm::PointerType::getUnqual(ctx_);
    i64_ = llvm::Type::getInt64Ty(ctx_);
    args_type_ = llvm::StructType::create(ctx_, {ptr_, i64_, ptr_, ptr_, i64_, ptr_, i64_, ptr_, i64_},
                                          "optjit.KernelArgs");
  }

  void emit_tensor_phase(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    auto [fn, args, begin, end] = declare(symbol, b);
    Value* n_tensors = field(b, args, kArgTensors);
    Value* slots = field(b, args, kArgSlots);
    Value* hyper = field(b, args, kArgHyper);
    Value* group_of = field(b, args, kArgGroupOf);
    Value* n_hyper = field(b, args, kArgHyperCount);
    Value* scratch = field(b, args, kArgScratch);
    Value* n_scratch = field(b, args, kArgScratchCount);
    const int n_tensor_slots = static_cast<int>(plan_.abi.tensor_slots.size());
    emit_loop(b, begin, end, 1, "tensor", [&](Value* t) {
      std::vector<Value*> values(static_cast<std::size_t>(graph_.size()), nullptr);
      for (ValueId id = 0; id < plan_.prologue_size; ++id) {
        const Node& n = graph_.node(id);
        Value* v = nullptr;
        switch (n.op) {
        case Op::constant:
          v = llvm::ConstantFP::get(b.getDoubleTy(), n.number);
          break;
        case Op::hyper: {
          Value* group = b.CreateLoad(i64_, b.CreateGEP(i64_, group_of, t));
          Value* index = b.CreateAdd(b.CreateMul(group, n_hyper), b.getInt64(index_in(plan_.abi.hypers, n.name)));
          v = b.CreateLoad(b.getDoubleTy(), b.CreateGEP(b.getDoubleTy(), hyper, index), n.name);
          break;
        }
        case Op::scalar_state: {
          int s = n_tensor_slots + index_in(plan_.abi.scalar_slots, n.name);
          Value* stored = b.CreateLoad(element_type(), slot_pointer(b, slots, s, n_tensors, t), n.name);
          v = b.CreateFPExt(stored, b.getDoubleTy());
          break;
        }
        default:
          std::vector<Value*> operands;
          for (ValueId in : n.inputs)
            operands.push_back(values[static_cast<std::size_t>(in)]);
          v = emit_op(b, n, operands, scalar_type(n.dtype));
        }
        values[static_cast<std::size_t>(id)] = v;
      }
      for (const Store& s : graph_.stores) {
        if (s.kind != StoreKind::Scalar)
          continue;
        int slot = n_tensor_slots + index_in(plan_.abi.scalar_slots, s.name);
        Value* v = b.CreateFPTrunc(values[static_cast<std::size_t>(s.value)], element_type());
        b.CreateStore(v, slot_pointer(b, slots, slot, n_tensors, t));
      }
      Value* row = b.CreateMul(t, n_scratch);
      for (std::size_t k = 0; k < plan_.scratch.size(); ++k) {
        Value* address = b.CreateGEP(i64_, scratch, b.CreateAdd(row, b.getInt64(static_cast<int64_t>(k))));
        b.CreateStore(values[static_cast<std::size_t>(plan_.scratch[k])], address);
      }
    });
    b.CreateRetVoid();
    (void)fn;
  }

  void emit_element_phase(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    auto [fn, args, begin, end] = declare(symbol, b);
    Value* n_tensors = field(b, args, kArgTensors);
    Value* slots = field(b, args, kArgSlots);
    Value* scratch = field(b, args, kArgScratch);
    Value* n_scratch = field(b, args, kArgScratchCount);
    Value* items = field(b, args, kArgItems);
    emit_loop(b, begin, end, 1, "item", [&](Value* i) {
      Value* item = b.CreateGEP(i64_, items, b.CreateMul(i, b.getInt64(3)));
      Value* t = b.CreateLoad(i64_, item, "tensor");
      Value* first = b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(1)), "begin");
      Value* last = b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(2)), "end");
      // Per-tensor operands: scratch values of this tensor, and constants.
      std::vector<Value*> scalars(static_cast<std::size_t>(graph_.size()), nullptr);
      Value* row = b.CreateMul(t, n_scratch);
      for (std::size_t k = 0; k < plan_.scratch.size(); ++k) {
        const Node& n = graph_.node(plan_.scratch[k]);
        Value* address = b.CreateGEP(i64_, scratch, b.CreateAdd(row, b.getInt64(static_cast<int64_t>(k))));
        scalars[static_cast<std::size_t>(plan_.scratch[k])] = b.CreateLoad(scalar_type(n.dtype), address);
      }
      for (ValueId id = 0; id < plan_.prologue_size; ++id)
        if (graph_.node(id).op == Op::constant)
          scalars[static_cast<std::size_t>(id)] = llvm::ConstantFP::get(b.getDoubleTy(), graph_.node(id).number);
      std::vector<Value*> bases;
      for (std::size_t s = 0; s < plan_.abi.tensor_slots.size(); ++s)
        bases.push_back(slot_pointer(b, slots, static_cast<int>(s), n_tensors, t, plan_.abi.tensor_slots[s]));
      // Vector steps over [first, vector_end), then one element at a time.
      Value* count = b.CreateSub(last, first);
      Value* vector_end = b.CreateAdd(first, b.CreateMul(b.CreateSDiv(count, b.getInt64(lanes_)), b.getInt64(lanes_)));
      auto splats = splat_all(b, scalars, lanes_);
      emit_loop(b, first, vector_end, lanes_, "vec", [&](Value* j) { emit_body(b, bases, splats, j, lanes_); });
      emit_loop(b, vector_end, last, 1, "tail", [&](Value* j) { emit_body(b, bases, scalars, j, 1); });
    });
    b.CreateRetVoid();
    (void)fn;
  }

private:
  struct Signature {
    llvm::Function* fn;
    Value* args;
    Value* begin;
    Value* end;
  };

  Signature declare(const std::string& symbol, IRBuilder<>& b) {
    auto* type = llvm::FunctionType::get(b.getVoidTy(), {ptr_, i64_, i64_}, false);
    auto* fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, symbol, module_);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    fn->addParamAttr(0, llvm::Attribute::NoAlias);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
    b.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn));
    return {fn, fn->getArg(0), fn->getArg(1), fn->getArg(2)};
  }

  Value* field(IRBuilder<>& b, Value* args, unsigned index) {
    llvm::Type* type = args_type_->getElementType(index);
    return b.CreateLoad(type, b.CreateStructGEP(args_type_, args, index));
  }

  // The data pointer of tensor t in slot `slot`: slots[slot * n_tensors + t].
  Value* slot_pointer(IRBuilder<>& b, Value* slots, int slot, Value* n_tensors, Value* t, const llvm::Twine& name = "") {
    Value* index = b.CreateAdd(b.CreateMul(b.getInt64(slot), n_tensors), t);
    return b.CreateLoad(ptr_, b.CreateGEP(ptr_, slots, index), name);
  }

  llvm::Type* scalar_type(Dtype d) { return d == Dtype::f32 ? llvm::Type::getFloatTy(ctx_) : llvm::Type::getDoubleTy(ctx_); }
  llvm::Type* element_type() { return scalar_type(graph_.dtype); }
  llvm::Type* lane_type(int lanes) {
    return lanes == 1 ? element_type() : llvm::FixedVectorType::get(element_type(), static_cast<unsigned>(lanes));
  }

  std::vector<Value*> splat_all(IRBuilder<>& b, const std::vector<Value*>& scalars, int lanes) {
    std::vector<Value*> out(scalars.size(), nullptr);
    for (std::size_t id = 0; id < scalars.size(); ++id)
      if (scalars[id])
        out[id] = b.CreateVectorSplat(static_cast<unsigned>(lanes), scalars[id]);
    return out;
  }

  // The element DAG for `lanes` consecutive elements starting at index j: loads, arithmetic, stores.
  void emit_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor, Value* j,
                 int lanes) {
    llvm::Type* type = lane_type(lanes);
    const llvm::Align align(dtype_size(graph_.dtype));
    std::vector<Value*> values = per_tensor;
    for (ValueId id = plan_.prologue_size; id < graph_.size(); ++id) {
      const Node& n = graph_.node(id);
      Value* v;
      if (n.op == Op::tensor) {
        Value* base = bases[static_cast<std::size_t>(index_in(plan_.abi.tensor_slots, n.name))];
        v = b.CreateAlignedLoad(type, b.CreateGEP(element_type(), base, j), align, n.name);
      } else {
        std::vector<Value*> operands;
        for (ValueId in : n.inputs)
          operands.push_back(values[static_cast<std::size_t>(in)]);
        v = emit_op(b, n, operands, type);
      }
      values[static_cast<std::size_t>(id)] = v;
    }
    for (const Store& s : graph_.stores) {
      if (s.kind != StoreKind::Tensor)
        continue;
      Value* base = bases[static_cast<std::size_t>(index_in(plan_.abi.tensor_slots, s.name))];
      b.CreateAlignedStore(values[static_cast<std::size_t>(s.value)], b.CreateGEP(element_type(), base, j), align);
    }
  }

  // One op on scalars or vectors of `type`; the meaning follows compiler/op_semantics.h.
  Value* emit_op(IRBuilder<>& b, const Node& n, const std::vector<Value*>& in, llvm::Type* type) {
    auto as_type = [&](Value* v) { return b.CreateUIToFP(v, type); };
    Value* zero = llvm::Constant::getNullValue(type);
    switch (n.op) {
    case Op::cast:
      return b.CreateFPCast(in[0], type);
    case Op::neg:
      return b.CreateFNeg(in[0]);
    case Op::sqrt:
      return b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, in[0]);
    case Op::abs:
      return b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, in[0]);
    case Op::exp:
      return b.CreateUnaryIntrinsic(llvm::Intrinsic::exp, in[0]);
    case Op::log:
      return b.CreateUnaryIntrinsic(llvm::Intrinsic::log, in[0]);
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
      return b.CreateBinaryIntrinsic(llvm::Intrinsic::pow, in[0], in[1]);
    case Op::lt:
      return as_type(b.CreateFCmpOLT(in[0], in[1]));
    case Op::gt:
      return as_type(b.CreateFCmpOGT(in[0], in[1]));
    case Op::eq:
      return as_type(b.CreateFCmpOEQ(in[0], in[1]));
    case Op::select:
      return b.CreateSelect(b.CreateFCmpUNE(in[0], zero), in[1], in[2]);
    case Op::constant:
    case Op::hyper:
    case Op::scalar_state:
    case Op::tensor:
      break;
    }
    OPTJIT_ASSERT(false, "emit_op called on input op " + std::string(op_name(n.op)));
  }

  const KernelPlan& plan_;
  const Graph& graph_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  int lanes_;
  llvm::PointerType* ptr_;
  llvm::Type* i64_;
  llvm::StructType* args_type_;
};

} // namespace

EmittedKernel emit_cpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol_prefix,
                              int lanes) {
  Emitter emitter(plan, module, lanes);
  EmittedKernel names{symbol_prefix + "_tensor_phase", symbol_prefix + "_element_phase"};
  emitter.emit_tensor_phase(names.tensor_phase);
  emitter.emit_element_phase(names.element_phase);
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(module, &os))
    OPTJIT_ASSERT(false, "emitted LLVM IR does not verify: " + problems);
  return names;
}

} // namespace optjit
