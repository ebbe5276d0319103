// The CPU split of a kernel plan (codegen/kernel_emitter.h): a tensor-phase loop over tensors, an element-phase loop
// over work items, each item's range walked with vectors of `lanes` elements and a scalar tail (or row by row, for
// kernels that touch rows and columns), and a finish phase that combines each tensor's reduction partials.
#include "codegen/kernel_body.h"

#include <array>

namespace optjit {
namespace emission {
namespace {

// Independent vector accumulators of a max reduction in the CPU element phase (see emit_element_phase).
constexpr std::size_t kMaxChains = 4;

class CpuKernelEmitter : public KernelBody {
public:
  CpuKernelEmitter(const KernelPlan& plan, llvm::Module& module, int lanes, bool native_bf16)
      : KernelBody(plan, module, lanes, /*device_math=*/false, native_bf16) {
    const auto llvm_type = [&](std::string_view kind) -> llvm::Type* { return kind == "ptr" ? ptr_ : i64_; };
    args_type_ = llvm::StructType::create(ctx_,
                                          {
#define OPTJIT_CPU_ARG(name, type, kind) llvm_type(#kind),
#include "runtime/kernel_abi.def"
#undef OPTJIT_CPU_ARG
                                          },
                                          "optjit.KernelArgs");
  }

  void emit_tensor_phase(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    auto [fn, args, begin, end] = declare(symbol, b);
    Value* n_tensors = field(b, args, KernelArg::n_tensors);
    Value* slots = field(b, args, KernelArg::slots);
    Value* hyper = field(b, args, KernelArg::hyper);
    Value* group_of = field(b, args, KernelArg::group_of);
    Value* n_hyper = field(b, args, KernelArg::n_hyper);
    Value* scratch = field(b, args, KernelArg::scratch);
    Value* n_scratch = field(b, args, KernelArg::n_scratch);
    Value* carry = field(b, args, KernelArg::carry);
    Value* n_carry = field(b, args, KernelArg::n_carry);
    Value* axis_arrays = field(b, args, KernelArg::axis);
    Value* col_base = field(b, args, KernelArg::col_base);
    Value* matrix = field(b, args, KernelArg::matrix);
    emit_loop(b, begin, end, b.getInt64(1), "tensor", [&](Value* t) {
      const PerTensorInputs in{slots, n_tensors, hyper, group_of, n_hyper, carry, n_carry, t, matrix};
      for (ValueId id : axis_reductions_) { // column sums: the element phase adds into them (row sums are stored)
        if (graph_.node(id).op != Op::col_sum)
          continue;
        Value* array = axis_array(b, axis_arrays, carry_of_reduction(id));
        Value* from = b.CreateLoad(i64_, b.CreateGEP(i64_, col_base, t));
        Value* to = b.CreateLoad(i64_, b.CreateGEP(i64_, col_base, b.CreateAdd(t, b.getInt64(1))));
        emit_loop(b, from, to, b.getInt64(1), "zero", [&](Value* k) {
          b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), b.CreateGEP(b.getDoubleTy(), array, k));
        });
      }
      std::vector<Value*> values = emit_prologue(b, in);
      emit_per_tensor_stores(b, values, in);
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
    Value* n_tensors = field(b, args, KernelArg::n_tensors);
    Value* slots = field(b, args, KernelArg::slots);
    Value* scratch = field(b, args, KernelArg::scratch);
    Value* n_scratch = field(b, args, KernelArg::n_scratch);
    Value* items = field(b, args, KernelArg::items);
    Value* partials = field(b, args, KernelArg::partials);
    Value* n_reduce = field(b, args, KernelArg::n_reduce);
    // Per reduction: one f64 accumulator per vector lane and one for the scalar tail, reset for every item. A max
    // has kMaxChains vector accumulators, each taking every kMaxChains-th vector: a chain of llvm.maximum (several
    // dependent instructions on x86) would otherwise bound the pass by its latency, not by memory. Max is exact, so
    // splitting it changes no result; sums keep one chain (their order is their result).
    std::vector<llvm::AllocaInst*> vector_acc, tail_acc;
    std::array<std::vector<llvm::AllocaInst*>, kMaxChains> chain_acc;
    bool any_max = false;
    for (std::size_t r = 0; r < tensor_reductions_.size(); ++r) {
      vector_acc.push_back(b.CreateAlloca(vector_type_of(b.getDoubleTy(), lanes_)));
      tail_acc.push_back(b.CreateAlloca(b.getDoubleTy()));
      const bool max = reduction_op(r) == Op::reduce_max;
      any_max |= max;
      chain_acc[0].push_back(vector_acc.back());
      for (std::size_t k = 1; k < kMaxChains; ++k)
        chain_acc[k].push_back(max ? b.CreateAlloca(vector_type_of(b.getDoubleTy(), lanes_)) : vector_acc.back());
    }
    const std::vector<std::string> quantized = quantized_slots(plan_);
    if (const std::optional<int64_t> block = stored_block(plan_))
      prepare_block_walk(fn, *block);
    Value* matrix = field(b, args, KernelArg::matrix);
    Value* axis_arrays = field(b, args, KernelArg::axis);
    Value* row_base = field(b, args, KernelArg::row_base);
    Value* col_base = field(b, args, KernelArg::col_base);
    emit_loop(b, begin, end, b.getInt64(1), "item", [&](Value* i) {
      auto [t, first, last] = load_work_item(b, items, i);
      // Per-tensor operands: scratch values of this tensor, and constants.
      std::vector<Value*> scalars(static_cast<std::size_t>(graph_.size()), nullptr);
      Value* row = b.CreateMul(t, n_scratch);
      for (std::size_t k = 0; k < plan_.scratch.size(); ++k) {
        const Node& n = graph_.node(plan_.scratch[k]);
        Value* address = b.CreateGEP(i64_, scratch, b.CreateAdd(row, b.getInt64(static_cast<int64_t>(k))));
        scalars[static_cast<std::size_t>(plan_.scratch[k])] = b.CreateLoad(value_type(n.dtype), address);
      }
      for (ValueId id = 0; id < plan_.prologue_size; ++id)
        if (graph_.node(id).op == Op::constant)
          scalars[static_cast<std::size_t>(id)] = llvm::ConstantFP::get(b.getDoubleTy(), graph_.node(id).number);
      std::vector<Value*> bases;
      for (std::size_t s = 0; s < plan_.abi.tensor_slots.size(); ++s)
        bases.push_back(slot_pointer(b, slots, static_cast<int>(s), n_tensors, t, plan_.abi.tensor_slots[s]));
      const std::size_t slot_rows = plan_.abi.tensor_slots.size() + plan_.abi.scalar_slots.size();
      for (std::size_t k = 0; k < quantized.size(); ++k) // the quantized slots' scales follow the scalar slots
        bases.push_back(slot_pointer(b, slots, static_cast<int>(slot_rows + k), n_tensors, t, quantized[k] + ".scale"));
      // Vector steps over [first, vector_end), then one element at a time. A kernel that reads or writes rows and
      // columns walks its (whole-tensor) items row by row (emit_axis_loop).
      Value* count = b.CreateSub(last, first);
      Value* vector_end =
          plan_.has_axis ? first
                         : b.CreateAdd(first, b.CreateMul(b.CreateSDiv(count, b.getInt64(lanes_)), b.getInt64(lanes_)));
      if (plan_.has_axis)
        axis_ = AxisIndex{
            b.CreateLoad(i64_, b.CreateGEP(i64_, matrix, b.CreateMul(t, b.getInt64(3)))),
            b.CreateLoad(i64_, b.CreateGEP(i64_, matrix, b.CreateAdd(b.CreateMul(t, b.getInt64(3)), b.getInt64(1)))),
            b.CreateLoad(i64_, b.CreateGEP(i64_, row_base, t)), b.CreateLoad(i64_, b.CreateGEP(i64_, col_base, t)),
            axis_arrays};
      auto splats = splat_all(b, scalars, lanes_);
      for (std::size_t r = 0; r < vector_acc.size(); ++r) {
        const Op op = reduction_op(r);
        for (const auto& set : chain_acc)
          b.CreateStore(b.CreateVectorSplat(static_cast<unsigned>(lanes_), identity(b, op)), set[r]);
        b.CreateStore(identity(b, op), tail_acc[r]);
      }
      if (block_walk_) {
        emit_block_walk(b, bases, splats, scalars, first, last, vector_acc, tail_acc);
        store_partials(b, i, n_reduce, partials, vector_acc, tail_acc);
        return;
      }
      Value* chained_end = first;
      if (!plan_.has_axis && any_max) {
        const int64_t stride = static_cast<int64_t>(kMaxChains) * lanes_;
        chained_end = b.CreateAdd(first, b.CreateMul(b.CreateSDiv(count, b.getInt64(stride)), b.getInt64(stride)));
        emit_loop(b, first, chained_end, b.getInt64(stride), "vec_chains", [&](Value* j) {
          for (std::size_t k = 0; k < kMaxChains; ++k)
            emit_body(b, bases, splats, b.CreateAdd(j, b.getInt64(static_cast<int64_t>(k) * lanes_)), lanes_,
                      chain_acc[k]);
        });
      }
      if (!plan_.has_axis)
        emit_loop(b, chained_end, vector_end, b.getInt64(lanes_), "vec",
                  [&](Value* j) { emit_body(b, bases, splats, j, lanes_, vector_acc); });
      for (std::size_t r = 0; r < vector_acc.size() && any_max; ++r) // the chains, in order, lane by lane
        for (std::size_t k = 1; k < kMaxChains; ++k)
          if (chain_acc[k][r] != vector_acc[r]) {
            llvm::Type* type = vector_acc[r]->getAllocatedType();
            b.CreateStore(
                combine(b, Op::reduce_max, b.CreateLoad(type, vector_acc[r]), b.CreateLoad(type, chain_acc[k][r])),
                vector_acc[r]);
          }
      if (plan_.has_axis)
        emit_axis_loop(b, first, last, [&](Value* j, int lanes) {
          if (lanes > 1)
            emit_body(b, bases, splats, j, lanes, vector_acc);
          else
            emit_body(b, bases, scalars, j, 1, tail_acc);
        });
      else
        emit_loop(b, vector_end, last, b.getInt64(1), "tail",
                  [&](Value* j) { emit_body(b, bases, scalars, j, 1, tail_acc); });
      store_partials(b, i, n_reduce, partials, vector_acc, tail_acc);
    });
    b.CreateRetVoid();
    (void)fn;
  }
  // The item's partial of each reduction: the lanes in order, then the tail; a fixed order, whatever thread runs the
  // item.
  void store_partials(IRBuilder<>& b, Value* i, Value* n_reduce, Value* partials,
                      const std::vector<llvm::AllocaInst*>& vector_acc,
                      const std::vector<llvm::AllocaInst*>& tail_acc) {
    for (std::size_t r = 0; r < vector_acc.size(); ++r) {
      const Op op = reduction_op(r);
      Value* lanes = b.CreateLoad(vector_acc[r]->getAllocatedType(), vector_acc[r]);
      Value* partial = b.CreateExtractElement(lanes, uint64_t{0});
      for (int lane = 1; lane < lanes_; ++lane)
        partial = combine(b, op, partial, b.CreateExtractElement(lanes, static_cast<uint64_t>(lane)));
      partial = combine(b, op, partial, b.CreateLoad(b.getDoubleTy(), tail_acc[r]));
      Value* at = b.CreateAdd(b.CreateMul(i, n_reduce), b.getInt64(static_cast<int64_t>(r)));
      b.CreateStore(partial, b.CreateGEP(b.getDoubleTy(), partials, at));
    }
  }
  // Each block of [first, last): its elements a vector at a time (the block's last block % lanes one at a time), their
  // quantized stores buffered, then the block's scales and codes written (quantize_block). Reductions accumulate as
  // in the plain walk, over the same vector and tail accumulators.
  void emit_block_walk(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& splats,
                       const std::vector<Value*>& scalars, Value* first, Value* last,
                       const std::vector<llvm::AllocaInst*>& vector_acc,
                       const std::vector<llvm::AllocaInst*>& tail_acc) {
    const int64_t block = block_walk_->block;
    const int64_t vector_part = block - block % lanes_;
    emit_loop(b, first, last, b.getInt64(block), "block", [&](Value* start) {
      block_walk_->start = start;
      block_walk_->index = b.CreateSDiv(start, b.getInt64(block));
      reset_block_maxima(b);
      if (vector_part > 0)
        emit_loop(b, start, b.CreateAdd(start, b.getInt64(vector_part)), b.getInt64(lanes_), "block.vec",
                  [&](Value* j) { emit_body(b, bases, splats, j, lanes_, vector_acc); });
      if (vector_part < block)
        emit_loop(b, b.CreateAdd(start, b.getInt64(vector_part)), b.CreateAdd(start, b.getInt64(block)), b.getInt64(1),
                  "block.tail", [&](Value* j) { emit_body(b, bases, scalars, j, 1, tail_acc); });
      quantize_block(b, bases);
    });
    block_walk_->start = block_walk_->index = nullptr;
  }
  // The element loop of a kernel that touches rows and columns: its item is a whole tensor (from element 0), walked
  // row by row, in row order: the row's first n - n % lanes elements a vector at a time, then the rest one at a
  // time. Counters give each step its row, its column and its row in its matrix, so that nothing divides to find
  // them; a vector's lanes share one row and cover consecutive columns. Row sums are accumulated in registers (a
  // vector and a tail accumulator per sum) and stored once at the row's end, their lanes combined in order then the
  // tail: a fixed order, whatever thread walks the tensor.
  void emit_axis_loop(IRBuilder<>& b, Value* first, Value* last, const std::function<void(Value*, int)>& body) {
    llvm::Function* fn = b.GetInsertBlock()->getParent();
    IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    llvm::AllocaInst* row_in_matrix = entry.CreateAlloca(i64_);
    llvm::AllocaInst* matrix_col_base = entry.CreateAlloca(i64_);
    std::vector<llvm::AllocaInst*> vector_sums, tail_sums;
    for (std::size_t k = 0; k < axis_reductions_.size(); ++k) {
      vector_sums.push_back(entry.CreateAlloca(vector_type_of(b.getDoubleTy(), lanes_)));
      tail_sums.push_back(entry.CreateAlloca(b.getDoubleTy()));
    }
    for (llvm::AllocaInst* counter : {row_in_matrix, matrix_col_base})
      b.CreateStore(b.getInt64(0), counter);
    Value* n = axis_->n;
    Value* rows = row_count(b, b.CreateSub(last, first), n);
    Value* vector_columns = b.CreateMul(b.CreateSDiv(n, b.getInt64(lanes_)), b.getInt64(lanes_));
    emit_loop(b, b.getInt64(0), rows, b.getInt64(1), "row", [&](Value* row) {
      axis_->row = row;
      axis_->row_in_matrix = b.CreateLoad(i64_, row_in_matrix);
      Value* col_base = b.CreateLoad(i64_, matrix_col_base);
      for (std::size_t k = 0; k < axis_reductions_.size(); ++k) {
        b.CreateStore(llvm::Constant::getNullValue(vector_sums[k]->getAllocatedType()), vector_sums[k]);
        b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), tail_sums[k]);
      }
      Value* row_start = b.CreateAdd(first, b.CreateMul(row, n));
      const auto columns = [&](Value* from, Value* to, int lanes, std::vector<llvm::AllocaInst*>& sums) {
        emit_loop(b, from, to, b.getInt64(lanes), lanes > 1 ? "cols.vec" : "cols.tail", [&](Value* c) {
          axis_->col_in_row = c;
          axis_->col = b.CreateAdd(col_base, c);
          axis_->row_sums = &sums;
          body(b.CreateAdd(row_start, c), lanes);
        });
      };
      if (lanes_ > 1)
        columns(b.getInt64(0), vector_columns, lanes_, vector_sums);
      columns(lanes_ > 1 ? vector_columns : b.getInt64(0), n, 1, tail_sums);
      for (std::size_t k = 0; k < axis_reductions_.size(); ++k) {
        if (graph_.node(axis_reductions_[k]).op != Op::row_sum)
          continue;
        Value* sum = b.CreateLoad(b.getDoubleTy(), tail_sums[k]);
        if (lanes_ > 1) {
          Value* lanes = b.CreateLoad(vector_sums[k]->getAllocatedType(), vector_sums[k]);
          Value* vector_sum = b.CreateExtractElement(lanes, uint64_t{0});
          for (int lane = 1; lane < lanes_; ++lane)
            vector_sum = b.CreateFAdd(vector_sum, b.CreateExtractElement(lanes, static_cast<uint64_t>(lane)));
          sum = b.CreateFAdd(vector_sum, sum);
        }
        b.CreateStore(sum, axis_array_address(b, carry_of_reduction(axis_reductions_[k]), SlotKind::Rows));
      }
      Value* next_row = b.CreateAdd(axis_->row_in_matrix, b.getInt64(1));
      Value* matrix_ends = b.CreateICmpEQ(next_row, axis_->m);
      b.CreateStore(b.CreateSelect(matrix_ends, b.getInt64(0), next_row), row_in_matrix);
      b.CreateStore(b.CreateAdd(col_base, b.CreateSelect(matrix_ends, n, b.getInt64(0))), matrix_col_base);
    });
    axis_->row = axis_->col = axis_->col_in_row = axis_->row_in_matrix = nullptr;
    axis_->row_sums = nullptr;
  }
  // Kernels that end with reductions: each tensor's partials combined in item order, handed on as carried values.
  void emit_finish_phase(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    auto [fn, args, begin, end] = declare(symbol, b);
    Value* partials = field(b, args, KernelArg::partials);
    Value* n_reduce = field(b, args, KernelArg::n_reduce);
    Value* first_item = field(b, args, KernelArg::first_item);
    const PerTensorInputs in{nullptr,
                             nullptr,
                             nullptr,
                             nullptr,
                             nullptr,
                             field(b, args, KernelArg::carry),
                             field(b, args, KernelArg::n_carry),
                             nullptr};
    std::vector<llvm::AllocaInst*> acc;
    for (std::size_t r = 0; r < tensor_reductions_.size(); ++r)
      acc.push_back(b.CreateAlloca(b.getDoubleTy()));
    emit_loop(b, begin, end, b.getInt64(1), "tensor", [&](Value* t) {
      Value* items_begin = b.CreateLoad(i64_, b.CreateGEP(i64_, first_item, t));
      Value* items_end = b.CreateLoad(i64_, b.CreateGEP(i64_, first_item, b.CreateAdd(t, b.getInt64(1))));
      for (std::size_t r = 0; r < acc.size(); ++r)
        b.CreateStore(identity(b, reduction_op(r)), acc[r]);
      emit_loop(b, items_begin, items_end, b.getInt64(1), "item", [&](Value* i) {
        for (std::size_t r = 0; r < acc.size(); ++r) {
          Value* at = b.CreateAdd(b.CreateMul(i, n_reduce), b.getInt64(static_cast<int64_t>(r)));
          Value* partial = b.CreateLoad(b.getDoubleTy(), b.CreateGEP(b.getDoubleTy(), partials, at));
          b.CreateStore(combine(b, reduction_op(r), b.CreateLoad(b.getDoubleTy(), acc[r]), partial), acc[r]);
        }
      });
      PerTensorInputs here = in;
      here.t = t;
      for (const Store& s : graph_.stores) // make_kernel_plan: only carry stores use a reduction
        if (auto r = std::find(tensor_reductions_.begin(), tensor_reductions_.end(), s.value);
            r != tensor_reductions_.end())
          b.CreateStore(b.CreateLoad(b.getDoubleTy(), acc[static_cast<std::size_t>(r - tensor_reductions_.begin())]),
                        carry_address(b, here, s.name));
    });
    b.CreateRetVoid();
    (void)fn;
  }
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
  Value* field(IRBuilder<>& b, Value* args, KernelArg arg) {
    const unsigned index = static_cast<unsigned>(arg);
    llvm::Type* type = args_type_->getElementType(index);
    return b.CreateLoad(type, b.CreateStructGEP(args_type_, args, index));
  }

private:
  llvm::StructType* args_type_;
};

} // namespace
} // namespace emission

EmittedKernel emit_cpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol_prefix, int lanes,
                              bool native_bf16) {
  emission::CpuKernelEmitter emitter(plan, module, lanes, native_bf16);
  EmittedKernel names{symbol_prefix + "_tensor_phase", symbol_prefix + "_element_phase", ""};
  emitter.emit_tensor_phase(names.tensor_phase);
  emitter.emit_element_phase(names.element_phase);
  if (emitter.has_reductions()) {
    names.finish_phase = symbol_prefix + "_finish_phase";
    emitter.emit_finish_phase(names.finish_phase);
  }
  emission::verify_module(module);
  return names;
}

} // namespace optjit
