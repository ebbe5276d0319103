#include "codegen/kernel_emitter.h"
#include "codegen/cuda/device_math.h"
#include "runtime/kernel_abi.h"
#include "runtime/stochastic_rounding.h"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <optional>

namespace optjit {
namespace {

// Independent vector accumulators of a max reduction in the CPU element phase (see emit_element_phase).
constexpr std::size_t kMaxChains = 4;
// Reductions that share one pass of a GPU block's reduction tree (emit_block_reduction).
constexpr std::size_t kBlockReductionsAtOnce = 4;
// Row sums of one GPU axis kernel (emit_gpu_row_sweep): 8 KB of shared memory each.
constexpr std::size_t kGpuMaxRowSums = 4;
// The registers a GPU axis kernel may use (.maxnreg): two blocks of 512 threads per SM. Its warps wait on long
// chains per element (a row's and a column's values, several divisions), so warps in flight pay more than the
// registers ptxas would take (124 to 148, one block per SM) and the few spills the cap costs. On an H200, Adafactor's
// f32 kernels over a Transformer encoder's matrices: 347 -> 204 us (update) and 179 -> 139 us (its RMS); 80 or 96
// registers gained less (264, 256 us: still one block per SM).
constexpr int kGpuAxisMaxRegisters = 64;
// The static shared memory of a GPU block.
constexpr std::size_t kGpuStaticSharedBytes = 48 * 1024;

using llvm::IRBuilder;
using llvm::Value;

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

class Emitter {
public:
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

  Emitter(const KernelPlan& plan, llvm::Module& module, int lanes, bool device_math = false, bool native_bf16 = false,
          const GpuEmulationHooks* emulation = nullptr)
      : plan_(plan), graph_(plan.graph), module_(module), ctx_(module.getContext()), lanes_(lanes),
        native_bf16_(native_bf16), emulation_(emulation) {
    for (ValueId id = plan.reductions_begin; id < plan.graph.size(); ++id)
      (op_has_trait(plan.graph.node(id).op, kAxis) ? axis_reductions_ : tensor_reductions_).push_back(id);
    if (device_math)
      math_ = define_device_math(module);
    ptr_ = llvm::PointerType::getUnqual(ctx_);
    i64_ = llvm::Type::getInt64Ty(ctx_);
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
      // The item's partial: the lanes in order, then the tail; a fixed order, whatever thread runs the item.
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
    });
    b.CreateRetVoid();
    (void)fn;
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

  bool has_reductions() const { return !tensor_reductions_.empty(); }

  struct WorkItemValues {
    Value* tensor;
    Value* begin;
    Value* end;
  };

  // What every GPU kernel starts with (runtime/kernel_abi.h): the entry point, its thread and block registers, the
  // block's work item, its tensor's per-tensor values, the tensor's slot addresses and each thread's reduction
  // accumulators.
  struct GpuEntry {
    llvm::Function* fn;
    llvm::PointerType* global; // the address space of the kernel's global memory
    Value *block, *thread, *threads;
    WorkItemValues item;
    PerTensorInputs in;
    std::vector<Value*> values;                // the per-tensor nodes [0, prologue_size)
    std::vector<Value*> bases;                 // per tensor slot: tensor t's data
    std::vector<llvm::AllocaInst*> thread_acc; // per reduction: the thread's value over the elements it visits
    Value* param(GpuParam p) const { return fn->getArg(static_cast<unsigned>(p)); }
  };

  GpuEntry begin_gpu_kernel(IRBuilder<>& b, const std::string& symbol) {
    GpuEntry e;
    e.global = llvm::PointerType::get(ctx_, emulation_ ? 0 : 1);
    const auto llvm_type = [&](std::string_view kind) -> llvm::Type* { return kind == "global" ? e.global : i64_; };
    auto* type = llvm::FunctionType::get(b.getVoidTy(),
                                         {
#define OPTJIT_GPU_PARAM(name, type, kind) llvm_type(#kind),
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
                                         },
                                         false);
    e.fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, symbol, module_);
    e.fn->addFnAttr(llvm::Attribute::NoUnwind);
    if (!emulation_) {
      e.fn->setCallingConv(llvm::CallingConv::PTX_Kernel);
      annotate_kernel(e.fn, plan_.has_axis ? kGpuAxisMaxRegisters : 0);
    }
    Value* slots = e.param(GpuParam::slots);
    Value* n_tensors = e.param(GpuParam::n_tensors);
    b.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", e.fn));
    e.block = b.CreateZExt(gpu_register(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x), i64_);
    e.thread = b.CreateZExt(gpu_register(b, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x), i64_);
    e.threads = b.CreateZExt(gpu_register(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x), i64_);
    e.item = load_work_item(b, e.param(GpuParam::items), e.block);
    e.in = PerTensorInputs{slots,
                           n_tensors,
                           e.param(GpuParam::hyper),
                           e.param(GpuParam::group_of),
                           e.param(GpuParam::n_hyper),
                           e.param(GpuParam::carry),
                           e.param(GpuParam::n_carry),
                           e.item.tensor,
                           e.param(GpuParam::matrix)};
    for (std::size_t r = 0; r < reduction_count(); ++r) {
      e.thread_acc.push_back(b.CreateAlloca(b.getDoubleTy()));
      b.CreateStore(identity(b, reduction_op(r)), e.thread_acc.back());
    }
    e.values = emit_prologue(b, e.in);
    for (std::size_t s = 0; s < plan_.abi.tensor_slots.size(); ++s)
      e.bases.push_back(b.CreateAddrSpaceCast(slot_pointer(b, slots, static_cast<int>(s), n_tensors, e.item.tensor),
                                              e.global, plan_.abi.tensor_slots[s]));
    return e;
  }

  // What every GPU kernel ends with: the block's reductions, then the last block of the tensor writes its scalar
  // state and carried values (after `last_block`, which every thread of that block runs, when given).
  void end_gpu_kernel(IRBuilder<>& b, const GpuEntry& e, const std::function<void()>& last_block = {}) {
    std::vector<Value*> block_partials = emit_block_reduction(b, e.fn, e.thread_acc, e.thread, e.threads);
    emit_gpu_per_tensor_stores(
        b, e.fn, e.values, e.in, {e.param(GpuParam::items_of_tensor), e.param(GpuParam::done), e.thread},
        {e.block, block_partials, e.param(GpuParam::partials), e.param(GpuParam::first_item)}, last_block);
    b.CreateRetVoid();
  }

  // The GPU kernel (runtime/kernel_abi.h): block = work item, threads stride over its elements `lanes` at a time
  // (128-bit accesses when every slot's address of the item is aligned, scalar ones otherwise), then one at a time
  // over the item's last elements.
  void emit_gpu_kernel(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    GpuEntry e = begin_gpu_kernel(b, symbol);
    auto [t, first, last] = e.item;
    Value* scalar_begin = first;
    if (lanes_ > 1) {
      // Vector accesses only when every slot's first element of the item is aligned to them.
      Value* aligned = lanes_aligned(b, e.bases, first);
      Value* whole = b.CreateMul(b.CreateSDiv(b.CreateSub(last, first), b.getInt64(lanes_)), b.getInt64(lanes_));
      Value* vector_end = b.CreateAdd(first, whole);
      // Threads take lanes_ elements at a time, aligned or not, so that a reduction's order depends on the shape
      // alone; alignment only picks vector or scalar accesses.
      const auto lanes_loop = [&](bool vector_access) {
        emit_loop(b, b.CreateAdd(first, b.CreateMul(e.thread, b.getInt64(lanes_))), vector_end,
                  b.CreateMul(e.threads, b.getInt64(lanes_)), "vec", [&](Value* j) {
                    if (vector_access) {
                      emit_gpu_vector_body(b, e.bases, e.values, j, e.thread_acc);
                      return;
                    }
                    for (int lane = 0; lane < lanes_; ++lane)
                      emit_body(b, e.bases, e.values, b.CreateAdd(j, b.getInt64(lane)), 1, e.thread_acc);
                  });
      };
      emit_if(b, aligned, "vec.aligned", [&] { lanes_loop(true); });
      emit_if(b, b.CreateNot(aligned), "vec.unaligned", [&] { lanes_loop(false); });
      scalar_begin = vector_end;
    }
    emit_loop(b, b.CreateAdd(scalar_begin, e.thread), last, e.threads, "elem",
              [&](Value* j) { emit_body(b, e.bases, e.values, j, 1, e.thread_acc); });
    end_gpu_kernel(b, e);
  }

  // The GPU kernel of a plan that reads or writes rows and columns: a block per item of whole rows
  // (runtime/work_items.h's make_axis_work_items), in two sweeps over the item's rows, so that every sum has an order
  // fixed by the tensor's shape and the block's size, and a row or column is written only after every element has
  // read its old value.
  //   Column sweep (kernels with column sums): a thread per column of the item, its rows in order. It evaluates each
  //   element for the sums and stores nothing. A barrier follows. An item of whole matrices writes its column sums;
  //   a piece of a matrix writes them as partials to the column scratch.
  //   Row sweep (kernels with row sums, per-tensor reductions or stores): a group of min(n, 32) lanes per row (a
  //   warp, or a part of one for rows shorter than 32), in rounds of one row per group; the lanes take every
  //   width-th column. A round runs its rows in two stages, each ended by a barrier: first the rows that are not
  //   the last of their matrix, then those that are. Elements store their tensor slots as they go, and a matrix's
  //   last row its columns slots (each column's other rows were read in earlier stages; a piece of a matrix keeps
  //   them in the column scratch instead, as other pieces may not have read them yet). After a stage's barrier,
  //   the group's lane 0 adds its lanes' sums in lane order (through shared memory, double buffered by stage), and
  //   the lane that had the row's last column writes its rows slots.
  //   Last item of a cut tensor (the whole block): each column's partials added in piece order, and the pending
  //   columns stores written.
  void emit_gpu_axis_kernel(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    GpuEntry e = begin_gpu_kernel(b, symbol);
    Value* t = e.item.tensor;
    Value* matrix = e.param(GpuParam::matrix);
    const auto extent_of = [&](int64_t k) {
      return b.CreateLoad(i64_, b.CreateGEP(i64_, matrix, b.CreateAdd(b.CreateMul(t, b.getInt64(3)), b.getInt64(k))));
    };
    const auto load_at = [&](GpuParam p, Value* index) {
      return b.CreateLoad(i64_, b.CreateGEP(i64_, e.param(p), index));
    };
    Value* col_base = load_at(GpuParam::col_base, t);
    axis_ = AxisIndex{extent_of(0), extent_of(1), load_at(GpuParam::row_base, t), col_base, e.param(GpuParam::axis)};
    AxisItem item;
    Value* n = b.CreateSelect(b.CreateICmpSGT(axis_->n, b.getInt64(0)), axis_->n, b.getInt64(1)); // no rows: any n
    item.first_row = b.CreateSDiv(e.item.begin, n);
    item.end_row = b.CreateSDiv(e.item.end, n);
    item.columns = b.CreateSub(load_at(GpuParam::col_base, b.CreateAdd(t, b.getInt64(1))), col_base);
    item.pieces = load_at(GpuParam::col_split, b.CreateMul(t, b.getInt64(2)));
    item.split = b.CreateICmpSGT(item.pieces, b.getInt64(1));
    Value* m = b.CreateSelect(b.CreateICmpSGT(axis_->m, b.getInt64(0)), axis_->m, b.getInt64(1));
    Value* item_in_tensor = b.CreateSub(e.block, load_at(GpuParam::first_item, t));
    item.piece = b.CreateSub(item_in_tensor, b.CreateMul(b.CreateSDiv(item.first_row, m), item.pieces));
    item.scratch = b.CreateGEP(b.getDoubleTy(), b.CreateAddrSpaceCast(e.param(GpuParam::col_scratch), e.global),
                               load_at(GpuParam::col_split, b.CreateAdd(b.CreateMul(t, b.getInt64(2)), b.getInt64(1))));
    item.lanes = item.vector = b.getInt1(false);
    if (lanes_ > 1) { // n a multiple of lanes_, and for vector accesses each tensor-shaped slot's data aligned too
      item.lanes = b.CreateICmpEQ(b.CreateSRem(axis_->n, b.getInt64(lanes_)), b.getInt64(0));
      item.vector = b.CreateAnd(item.lanes, lanes_aligned(b, e.bases, b.getInt64(0))); // rows start at multiples
    }
    const ColumnSplit split = column_split(plan_);
    bool row_sums = false;
    for (ValueId id : axis_reductions_)
      row_sums |= graph_.node(id).op == Op::row_sum;
    bool stores = false;
    for (const Store& s : graph_.stores)
      stores |= s.kind == StoreKind::Tensor;
    if (split.sums > 0) {
      emit_gpu_column_sweep(b, e, item);
      gpu_barrier(b);
    }
    if (row_sums || stores || reduction_count() > 0)
      emit_gpu_row_sweep(b, e, item);
    if (split.sums + split.stores == 0) {
      axis_.reset();
      end_gpu_kernel(b, e);
      return;
    }
    end_gpu_kernel(b, e, [&] {
      emit_if(b, item.split, "columns", [&] {
        emit_loop(b, e.thread, item.columns, e.threads, "columns.combine",
                  [&](Value* column) { emit_column_finish(b, e, item, column); });
      });
    });
    axis_.reset();
  }

  // The rows a GPU axis kernel's block walks (its item) and how its tensor is cut (emit_gpu_axis_kernel).
  struct AxisItem {
    Value* first_row; // the item's rows in the tensor: [first_row, end_row)
    Value* end_row;
    Value* columns; // the tensor's columns, over its matrices
    Value* pieces;  // the items each matrix is cut into
    Value* split;   // pieces > 1: the item is a piece of one matrix
    Value* piece;   // which piece (when split)
    Value* scratch; // the tensor's region of the column scratch (f64)
    // n is a multiple of lanes_: the row sweep's lanes take lanes_ columns at a time, whatever the alignment, so
    // that its sums' order depends on the shape alone.
    Value* lanes;
    Value* vector; // and every row of every tensor-shaped slot is aligned to them: 128-bit accesses
  };
  // Column sum number `k` (of the kernel's col_sum nodes): piece `piece`'s partial at tensor column `column`.
  Value* column_partial(IRBuilder<>& b, const AxisItem& item, int64_t k, Value* piece, Value* column) {
    Value* row = b.CreateAdd(b.CreateMul(b.getInt64(k), item.pieces), piece);
    return b.CreateGEP(b.getDoubleTy(), item.scratch, b.CreateAdd(b.CreateMul(row, item.columns), column));
  }
  // Columns store number `k` (of the kernel's tensor stores to columns slots): its pending value at `column`.
  Value* column_pending(IRBuilder<>& b, const AxisItem& item, int64_t k, Value* column) {
    Value* row = b.CreateAdd(b.CreateMul(b.getInt64(column_split(plan_).sums), item.pieces), b.getInt64(k));
    return b.CreateGEP(b.getDoubleTy(), item.scratch, b.CreateAdd(b.CreateMul(row, item.columns), column));
  }
  // The last item of a cut tensor, at tensor column `column`: each column sum over the pieces in piece order, and
  // each pending columns store written to its slot.
  void emit_column_finish(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item, Value* column) {
    axis_->col = column;
    IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
    int64_t k = 0;
    for (ValueId id : axis_reductions_) {
      if (graph_.node(id).op != Op::col_sum)
        continue;
      llvm::AllocaInst* sum = entry.CreateAlloca(b.getDoubleTy());
      b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
      emit_loop(b, b.getInt64(0), item.pieces, b.getInt64(1), "columns.piece", [&](Value* piece) {
        Value* partial = b.CreateLoad(b.getDoubleTy(), column_partial(b, item, k, piece, column));
        b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sum), partial), sum);
      });
      b.CreateStore(b.CreateLoad(b.getDoubleTy(), sum), axis_array_address(b, carry_of_reduction(id), SlotKind::Cols));
      ++k;
    }
    k = 0;
    for (const Store& s : graph_.stores) {
      if (s.kind != StoreKind::Tensor || graph_.slot(s.name)->kind != SlotKind::Cols)
        continue;
      const int slot = index_in(plan_.abi.tensor_slots, s.name);
      const Dtype storage = tensor_slot_dtype(slot);
      Value* value = b.CreateFPCast(b.CreateLoad(b.getDoubleTy(), column_pending(b, item, k, column)), element_type());
      b.CreateAlignedStore(to_storage(b, value, storage), slot_address(b, e.bases, slot, nullptr),
                           llvm::Align(dtype_size(storage)));
      ++k;
    }
    axis_->col = nullptr;
  }

  // A thread per column of the item's matrices (counted over the tensor's matrices, as col_base counts them), or per
  // lanes_ adjacent columns where item.vector allows, the item's rows of it in order: each column sum in element
  // order (the same order either way), stored once (a partial, when the item is a piece).
  void emit_gpu_column_sweep(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item) {
    Value* m = axis_->m;
    Value* n = axis_->n;
    // The item's matrices: [first_row / m, ceil(end_row / m)), none for an empty item (m, n > 0 otherwise).
    Value* empty = b.CreateICmpEQ(item.first_row, item.end_row);
    Value* safe_m = b.CreateSelect(empty, b.getInt64(1), m);
    Value* first = b.CreateMul(b.CreateSDiv(item.first_row, safe_m), n);
    Value* last = b.CreateMul(b.CreateSDiv(b.CreateAdd(item.end_row, b.CreateSub(safe_m, b.getInt64(1))), safe_m), n);
    last = b.CreateSelect(empty, first, last);
    // A thread takes `lanes` adjacent columns at a time (one vector access per row), each summed on its own.
    const auto sweep = [&](int lanes) {
      IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
      std::vector<std::vector<llvm::AllocaInst*>> sums(static_cast<std::size_t>(lanes));
      for (auto& lane_sums : sums)
        for (ValueId id : axis_reductions_)
          lane_sums.push_back(graph_.node(id).op == Op::col_sum ? entry.CreateAlloca(b.getDoubleTy()) : nullptr);
      Value* step = b.CreateMul(e.threads, b.getInt64(lanes));
      emit_loop(
          b, b.CreateAdd(first, b.CreateMul(e.thread, b.getInt64(lanes))), last, step, "column", [&](Value* column) {
            Value* in_matrix = b.CreateSDiv(column, n); // lanes divides n: the lanes share the matrix
            Value* c = b.CreateSub(column, b.CreateMul(in_matrix, n));
            Value* matrix_row = b.CreateMul(in_matrix, m);
            Value* rows_begin = b.CreateSelect(b.CreateICmpSGT(item.first_row, matrix_row), item.first_row, matrix_row);
            Value* matrix_end = b.CreateAdd(matrix_row, m);
            Value* rows_end = b.CreateSelect(b.CreateICmpSLT(item.end_row, matrix_end), item.end_row, matrix_end);
            for (const auto& lane_sums : sums)
              for (llvm::AllocaInst* sum : lane_sums)
                if (sum)
                  b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
            emit_loop(b, rows_begin, rows_end, b.getInt64(1), "column.row", [&](Value* row) {
              Value* first_j = b.CreateAdd(b.CreateMul(row, n), c);
              std::vector<Value*> loaded(e.bases.size(), nullptr);
              for (int lane = 0; lane < lanes; ++lane) {
                Value* j = lane == 0 ? first_j : b.CreateAdd(first_j, b.getInt64(lane));
                set_axis_position(b, row, in_matrix, b.CreateSub(row, matrix_row),
                                  lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
                const std::vector<Value*> values = evaluate_elements(
                    b, e.values, [&](int slot) { return load_lane(b, e.bases, loaded, first_j, lanes, lane, slot, j); },
                    element_type(), j);
                add_axis_sums(b, values, sums[static_cast<std::size_t>(lane)]);
              }
            });
            for (int lane = 0; lane < lanes; ++lane) {
              Value* lane_column = lane == 0 ? column : b.CreateAdd(column, b.getInt64(lane));
              set_axis_position(b, nullptr, in_matrix, nullptr, lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
              int64_t k = 0;
              for (std::size_t r = 0; r < axis_reductions_.size(); ++r) {
                llvm::AllocaInst* sum = sums[static_cast<std::size_t>(lane)][r];
                if (!sum)
                  continue;
                Value* whole = axis_array_address(b, carry_of_reduction(axis_reductions_[r]), SlotKind::Cols);
                Value* partial = column_partial(b, item, k++, item.piece, lane_column);
                b.CreateStore(b.CreateLoad(b.getDoubleTy(), sum), b.CreateSelect(item.split, partial, whole));
              }
            }
          });
    };
    if (lanes_ > 1)
      emit_if(b, item.vector, "columns.vector", [&] { sweep(lanes_); });
    emit_if(b, b.CreateNot(item.vector), "columns.scalar", [&] { sweep(1); });
    clear_axis_position();
  }

  // Tensor slot `slot` at element j, lane `lane` of the `lanes` elements from element `first`: a tensor-shaped slot
  // from one vector load of them (made on first use, kept in `loaded`), a rows or columns slot on its own.
  Value* load_lane(IRBuilder<>& b, const std::vector<Value*>& bases, std::vector<Value*>& loaded, Value* first,
                   int lanes, int lane, int slot, Value* j) {
    if (lanes == 1 || tensor_slot_kind(slot) != SlotKind::Tensor)
      return load_slot(b, bases, slot, j, 1, element_type());
    const Dtype storage = tensor_slot_dtype(slot);
    Value*& v = loaded[static_cast<std::size_t>(slot)];
    if (!v)
      v = b.CreateAlignedLoad(vector_type(storage, lanes), lanes_address(b, bases, slot, first),
                              lanes_align(slot, lanes), plan_.abi.tensor_slots[slot]);
    return from_storage(b, b.CreateExtractElement(v, static_cast<uint64_t>(lane)), storage, element_type());
  }
  // Lane `lane` of each store to a tensor-shaped slot, put into that store's vector in `stored` (per store).
  void keep_lane(IRBuilder<>& b, std::vector<Value*>& stored, const std::vector<Value*>& values, int lanes, int lane) {
    for (std::size_t k = 0; k < graph_.stores.size(); ++k) {
      const Store& s = graph_.stores[k];
      if (s.kind != StoreKind::Tensor || graph_.slot(s.name)->kind != SlotKind::Tensor)
        continue;
      const int slot = index_in(plan_.abi.tensor_slots, s.name);
      if (!stored[k])
        stored[k] = llvm::PoisonValue::get(vector_type(tensor_slot_dtype(slot), lanes));
      Value* value = to_storage(b, values[static_cast<std::size_t>(s.value)], tensor_slot_dtype(slot));
      stored[k] = b.CreateInsertElement(stored[k], value, static_cast<uint64_t>(lane));
    }
  }
  // Each vector of `stored` (keep_lane's) written from element `first`: one vector store per slot.
  void store_lanes(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& stored, Value* first,
                   int lanes) {
    for (std::size_t k = 0; k < graph_.stores.size(); ++k)
      if (stored[k]) {
        const int slot = index_in(plan_.abi.tensor_slots, graph_.stores[k].name);
        b.CreateAlignedStore(stored[k], lanes_address(b, bases, slot, first), lanes_align(slot, lanes));
      }
  }
  // Whether every tensor-shaped slot's element `first` is aligned to a vector of lanes_ (rows and columns slots are
  // read one value at a time).
  Value* lanes_aligned(IRBuilder<>& b, const std::vector<Value*>& bases, Value* first) {
    Value* misaligned = b.getInt64(0);
    for (int slot = 0; slot < static_cast<int>(bases.size()); ++slot)
      if (tensor_slot_kind(slot) == SlotKind::Tensor) {
        Value* address = b.CreatePtrToInt(lanes_address(b, bases, slot, first), i64_);
        misaligned = b.CreateOr(misaligned, b.CreateAnd(address, b.getInt64(lanes_align(slot, lanes_).value() - 1)));
      }
    return b.CreateICmpEQ(misaligned, b.getInt64(0));
  }
  Value* lanes_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* first) {
    return b.CreateGEP(scalar_type(tensor_slot_dtype(slot)), bases[static_cast<std::size_t>(slot)], first);
  }
  llvm::Align lanes_align(int slot, int lanes) {
    return llvm::Align(static_cast<uint64_t>(lanes) * dtype_size(tensor_slot_dtype(slot)));
  }

  // The item's rows in rounds of one row per lane group, each round in two stages (emit_gpu_axis_kernel).
  void emit_gpu_row_sweep(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item) {
    IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
    RowSweep sweep;
    for (std::size_t k = 0; k < axis_reductions_.size(); ++k)
      if (graph_.node(axis_reductions_[k]).op == Op::row_sum) {
        sweep.lane_sums.push_back(entry.CreateAlloca(b.getDoubleTy()));
        sweep.row_sums.push_back(k);
      } else {
        sweep.lane_sums.push_back(nullptr);
      }
    for (const Store& s : graph_.stores) // a rows slot's value at the lane's last column
      sweep.pending.push_back(s.kind == StoreKind::Tensor && graph_.slot(s.name)->kind == SlotKind::Rows
                                  ? entry.CreateAlloca(scalar_type(slot_dtype(s.name)))
                                  : nullptr);
    // Two buffers of a double per thread and row sum, beside the block reduction's (at most 16 KB): a GPU block has
    // 48 KB of static shared memory.
    if (sweep.row_sums.size() > kGpuMaxRowSums)
      throw Error("kernel " + plan_.name + " sums " + std::to_string(sweep.row_sums.size()) +
                  " values along rows in one pass: its GPU kernel holds at most " + std::to_string(kGpuMaxRowSums) +
                  " (shared memory); run these params on the CPU, or split the row sums across passes");
    llvm::GlobalVariable* shared = nullptr;
    if (!sweep.row_sums.empty())
      shared = shared_doubles(2 * kGpuMaxBlockThreads * sweep.row_sums.size(), plan_.name + "_row_sums");
    // Lane `lane`'s sum of row sum number `r` (of sweep.row_sums) in stage `stage`'s buffer.
    sweep.cell = [&](int stage, std::size_t r, Value* thread) {
      const int64_t buffer =
          (static_cast<int64_t>(stage) * static_cast<int64_t>(sweep.row_sums.size()) + static_cast<int64_t>(r)) *
          kGpuMaxBlockThreads;
      return b.CreateGEP(b.getDoubleTy(), shared, b.CreateAdd(b.getInt64(buffer), thread));
    };
    // Rows shorter than a warp share it: a group of `width` = min(n, 32) lanes per row, 32 / width rows per warp (the
    // lanes past the last whole group idle), so that a [196608, 3] tensor takes 16 rounds of 160 rows, not of 16.
    Value* m = axis_->m;
    Value* n = axis_->n;
    Value* width = b.CreateSelect(b.CreateICmpSLT(n, b.getInt64(32)), n, b.getInt64(32));
    width = b.CreateSelect(b.CreateICmpSGT(width, b.getInt64(0)), width, b.getInt64(1)); // no rows: any width
    Value* rows_per_warp = b.CreateSDiv(b.getInt64(32), width);
    Value* lane_in_warp = b.CreateAnd(e.thread, b.getInt64(31));
    Value* group = b.CreateSDiv(lane_in_warp, width);
    Value* lane = b.CreateSub(lane_in_warp, b.CreateMul(group, width)); // in the row's group
    Value* rows_per_round = b.CreateMul(b.CreateLShr(e.threads, 5), rows_per_warp);
    Value* first_row = b.CreateAdd(b.CreateMul(b.CreateLShr(e.thread, 5), rows_per_warp), group);
    Value* grouped = b.CreateICmpSLT(group, rows_per_warp);
    Value* rows = b.CreateSub(item.end_row, item.first_row);
    Value* rounds = b.CreateSDiv(b.CreateAdd(rows, b.CreateSub(rows_per_round, b.getInt64(1))), rows_per_round);
    // The lane of a row's last column (of its last lanes_ columns when the lanes take them together).
    Value* last_lane =
        b.CreateSelect(item.lanes, b.CreateSRem(b.CreateSub(b.CreateSDiv(n, b.getInt64(lanes_)), b.getInt64(1)), width),
                       b.CreateSRem(b.CreateSub(n, b.getInt64(1)), width));
    emit_loop(b, b.getInt64(0), rounds, b.getInt64(1), "round", [&](Value* round) {
      Value* row = b.CreateAdd(item.first_row, b.CreateAdd(b.CreateMul(round, rows_per_round), first_row));
      Value* valid = b.CreateAnd(grouped, b.CreateICmpSLT(row, item.end_row));
      Value* in_matrix = b.CreateSDiv(row, m); // m > 0: the tensor has rows
      Value* row_in_matrix = b.CreateSub(row, b.CreateMul(in_matrix, m));
      Value* last_row = b.CreateICmpEQ(row_in_matrix, b.CreateSub(m, b.getInt64(1)));
      for (int stage = 0; stage < 2; ++stage) {
        Value* active = b.CreateAnd(valid, stage == 0 ? b.CreateNot(last_row) : last_row);
        emit_if(b, active, "row", [&] {
          for (llvm::AllocaInst* sum : sweep.lane_sums)
            if (sum)
              b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
          const RowPosition at{row, in_matrix, row_in_matrix, stage == 1 ? &item : nullptr};
          // The same columns per lane and order with and without vector accesses: only the loads and stores differ.
          const auto lanes_loop = [&](bool vector_access) {
            emit_loop(b, b.CreateMul(lane, b.getInt64(lanes_)), n, b.CreateMul(width, b.getInt64(lanes_)), "row.vec",
                      [&](Value* c) { emit_row_elements(b, e, sweep, at, c, lanes_, vector_access); });
          };
          if (lanes_ > 1) {
            emit_if(b, item.vector, "row.vector", [&] { lanes_loop(true); });
            emit_if(b, b.CreateAnd(item.lanes, b.CreateNot(item.vector)), "row.lanes", [&] { lanes_loop(false); });
          }
          emit_if(b, b.CreateNot(item.lanes), "row.scalar", [&] {
            emit_loop(b, lane, n, width, "row.col", [&](Value* c) { emit_row_elements(b, e, sweep, at, c, 1, false); });
          });
          for (std::size_t r = 0; r < sweep.row_sums.size(); ++r)
            b.CreateStore(b.CreateLoad(b.getDoubleTy(), sweep.lane_sums[sweep.row_sums[r]]),
                          sweep.cell(stage, r, e.thread));
        });
        gpu_barrier(b);
        emit_if(b, active, "row.end", [&] {
          set_axis_position(b, row, in_matrix, row_in_matrix, nullptr);
          emit_if(b, b.CreateICmpEQ(lane, b.getInt64(0)), "row.sum", [&] {
            for (std::size_t r = 0; r < sweep.row_sums.size(); ++r) {
              llvm::AllocaInst* sum = sweep.lane_sums[sweep.row_sums[r]]; // lane 0's own sum, then the group's others
              emit_loop(b, b.getInt64(1), width, b.getInt64(1), "row.lane", [&](Value* l) {
                Value* other = b.CreateLoad(b.getDoubleTy(), sweep.cell(stage, r, b.CreateAdd(e.thread, l)));
                b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sum), other), sum);
              });
              b.CreateStore(
                  b.CreateLoad(b.getDoubleTy(), sum),
                  axis_array_address(b, carry_of_reduction(axis_reductions_[sweep.row_sums[r]]), SlotKind::Rows));
            }
          });
          emit_if(b, b.CreateICmpEQ(lane, last_lane), "row.store", [&] {
            for (std::size_t k = 0; k < graph_.stores.size(); ++k)
              if (sweep.pending[k]) {
                const Dtype storage = slot_dtype(graph_.stores[k].name);
                const int slot = index_in(plan_.abi.tensor_slots, graph_.stores[k].name);
                b.CreateAlignedStore(b.CreateLoad(sweep.pending[k]->getAllocatedType(), sweep.pending[k]),
                                     b.CreateGEP(scalar_type(storage), e.bases[static_cast<std::size_t>(slot)],
                                                 axis_index(SlotKind::Rows)),
                                     llvm::Align(dtype_size(storage)));
              }
          });
        });
      }
    });
    clear_axis_position();
  }

  struct RowSweep {
    std::vector<llvm::AllocaInst*> lane_sums; // per axis reduction: the lane's sum over its columns (row sums only)
    std::vector<std::size_t> row_sums;        // the axis reductions that are row sums
    std::vector<llvm::AllocaInst*> pending;   // per store: a rows slot's value at the lane's last column, or null
    std::function<Value*(int stage, std::size_t r, Value* thread)> cell;
  };

  // The row a row sweep's lane is on (emit_gpu_row_sweep); `last_row`: the item, when the row is its matrix's last.
  struct RowPosition {
    Value* row;
    Value* in_matrix;
    Value* row_in_matrix;
    const AxisItem* last_row;
  };
  // `lanes` elements of the row from column c: evaluated one at a time in column order, added to the lane's sums and
  // stored; with `vector_access` the tensor-shaped slots are read and written a vector at a time (128-bit accesses).
  void emit_row_elements(IRBuilder<>& b, const GpuEntry& e, const RowSweep& sweep, const RowPosition& at, Value* c,
                         int lanes, bool vector_access) {
    const int access = vector_access ? lanes : 1;
    Value* first = b.CreateAdd(b.CreateMul(at.row, axis_->n), c);
    std::vector<Value*> loaded(e.bases.size(), nullptr);
    std::vector<Value*> stored(graph_.stores.size(), nullptr);
    for (int lane = 0; lane < lanes; ++lane) {
      Value* j = lane == 0 ? first : b.CreateAdd(first, b.getInt64(lane));
      set_axis_position(b, at.row, at.in_matrix, at.row_in_matrix, lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
      const std::vector<Value*> values = evaluate_elements(
          b, e.values, [&](int slot) { return load_lane(b, e.bases, loaded, first, access, lane, slot, j); },
          element_type(), j);
      accumulate(b, values, e.thread_acc);
      add_axis_sums(b, values, sweep.lane_sums);
      store_gpu_element(b, e, values, j, at.last_row, sweep.pending, /*tensor_slots=*/!vector_access);
      if (vector_access)
        keep_lane(b, stored, values, lanes, lane);
    }
    store_lanes(b, e.bases, stored, first, lanes);
  }

  // Where the element being evaluated is (emit_gpu_axis_kernel's sweeps): its row in the tensor, its matrix, its row
  // in the matrix and its column in the row (null: not needed, or the sweep has none).
  void set_axis_position(IRBuilder<>& b, Value* row, Value* in_matrix, Value* row_in_matrix, Value* col_in_row) {
    axis_->row = row;
    axis_->row_in_matrix = row_in_matrix;
    axis_->col_in_row = col_in_row;
    axis_->col = col_in_row ? b.CreateAdd(b.CreateMul(in_matrix, axis_->n), col_in_row) : nullptr;
  }
  void clear_axis_position() { axis_->row = axis_->col = axis_->col_in_row = axis_->row_in_matrix = nullptr; }

  // Adds each axis reduction's element value to its running sum (the reductions with a sum in `sums`).
  void add_axis_sums(IRBuilder<>& b, const std::vector<Value*>& values, const std::vector<llvm::AllocaInst*>& sums) {
    for (std::size_t k = 0; k < sums.size(); ++k)
      if (sums[k]) {
        Value* v = values[static_cast<std::size_t>(graph_.node(axis_reductions_[k]).inputs[0])];
        b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sums[k]), b.CreateFPExt(v, b.getDoubleTy())), sums[k]);
      }
  }

  // The row sweep's stores of element j: its tensor slots (unless not `tensor_slots`); its columns slots when
  // `last_row` gives the item (a matrix's last row: to the slot, or to the column scratch when the item is a piece of
  // the matrix); its rows slots' values kept in `pending`, written after the stage's barrier.
  void store_gpu_element(IRBuilder<>& b, const GpuEntry& e, const std::vector<Value*>& values, Value* j,
                         const AxisItem* last_row, const std::vector<llvm::AllocaInst*>& pending,
                         bool tensor_slots = true) {
    int64_t columns_store = 0;
    for (std::size_t k = 0; k < graph_.stores.size(); ++k) {
      const Store& s = graph_.stores[k];
      if (s.kind != StoreKind::Tensor)
        continue;
      const int slot = index_in(plan_.abi.tensor_slots, s.name);
      const Dtype storage = tensor_slot_dtype(slot);
      Value* stored = to_storage(b, values[static_cast<std::size_t>(s.value)], storage);
      const SlotKind kind = graph_.slot(s.name)->kind;
      if (kind == SlotKind::Rows) {
        b.CreateStore(stored, pending[k]);
      } else if (kind == SlotKind::Tensor) {
        if (tensor_slots) // else the caller stores them a vector at a time
          b.CreateAlignedStore(stored, slot_address(b, e.bases, slot, j), llvm::Align(dtype_size(storage)));
      } else if (last_row) {
        Value* kept = b.CreateFPCast(values[static_cast<std::size_t>(s.value)], b.getDoubleTy());
        Value* at = column_pending(b, *last_row, columns_store++, axis_index(SlotKind::Cols));
        emit_if(b, last_row->split, "column.keep", [&] { b.CreateStore(kept, at); });
        emit_if(b, b.CreateNot(last_row->split), "column.store", [&] {
          b.CreateAlignedStore(stored, slot_address(b, e.bases, slot, j), llvm::Align(dtype_size(storage)));
        });
      }
    }
  }

  // The rows of a tensor of `elements` elements and rows of `n` (none when n is 0: no element names a row).
  Value* row_count(IRBuilder<>& b, Value* elements, Value* n) {
    Value* has_columns = b.CreateICmpSGT(n, b.getInt64(0));
    return b.CreateSelect(has_columns, b.CreateSDiv(elements, b.CreateSelect(has_columns, n, b.getInt64(1))),
                          b.getInt64(0));
  }

  // `if (condition) body();`
  void emit_if(IRBuilder<>& b, Value* condition, const std::string& name, const std::function<void()>& body) {
    llvm::Function* fn = b.GetInsertBlock()->getParent();
    auto* then = llvm::BasicBlock::Create(ctx_, name, fn);
    auto* after = llvm::BasicBlock::Create(ctx_, name + ".after", fn);
    b.CreateCondBr(condition, then, after);
    b.SetInsertPoint(then);
    body();
    b.CreateBr(after);
    b.SetInsertPoint(after);
  }

private:
  // The GPU's thread and block registers (%tid.x, %ntid.x, %ctaid.x), its block barrier and its global memory fence;
  // in emulation, calls to the emulator's hooks and a host fence.
  Value* gpu_register(IRBuilder<>& b, llvm::Intrinsic::ID id) {
    if (!emulation_)
      return b.CreateIntrinsic(id, {}, {});
    const auto hook = id == llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x    ? emulation_->thread_index
                      : id == llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x ? emulation_->block_threads
                                                                         : emulation_->block_index;
    return call_hook(b, reinterpret_cast<uintptr_t>(hook), b.getInt32Ty());
  }
  void gpu_barrier(IRBuilder<>& b) {
    if (!emulation_)
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
    else
      call_hook(b, reinterpret_cast<uintptr_t>(emulation_->barrier), b.getVoidTy());
  }
  void gpu_fence(IRBuilder<>& b) {
    if (!emulation_)
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_membar_gl, {}, {});
    else
      b.CreateFence(llvm::AtomicOrdering::SequentiallyConsistent);
  }
  // A call of the host function at `address`, of no arguments.
  Value* call_hook(IRBuilder<>& b, uintptr_t address, llvm::Type* result) {
    auto* type = llvm::FunctionType::get(result, false);
    return b.CreateCall(type, b.CreateIntToPtr(b.getInt64(address), ptr_));
  }

  // Marks `fn` as a kernel entry (nvvm.annotations). No thread count is declared (maxntidx): ptxas then caps no
  // register count, never spills to fit 512 threads, and the launch takes the threads the kernel's registers allow
  // (GpuModule::max_block_threads). `max_registers` > 0 caps them (.maxnreg) all the same (axis kernels).
  void annotate_kernel(llvm::Function* fn, int max_registers) {
    llvm::NamedMDNode* annotations = module_.getOrInsertNamedMetadata("nvvm.annotations");
    auto entry = [&](const char* key, int value) {
      llvm::Metadata* parts[] = {
          llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx_, key),
          llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx_), value))};
      annotations->addOperand(llvm::MDNode::get(ctx_, parts));
    };
    entry("kernel", 1);
    if (max_registers > 0)
      entry("maxnreg", max_registers);
  }

  // `lanes_` elements from index j with one vector load per slot read and one vector store per slot written (128
  // bits for slots stored in the compute dtype); the arithmetic runs lane by lane (device math is scalar).
  void emit_gpu_vector_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor,
                            Value* j, const std::vector<llvm::AllocaInst*>& thread_acc) {
    std::vector<Value*> loaded(bases.size(), nullptr);
    std::vector<Value*> stored(graph_.stores.size(), nullptr);
    for (int lane = 0; lane < lanes_; ++lane) {
      Value* index = b.CreateAdd(j, b.getInt64(lane));
      const std::vector<Value*> values = evaluate_elements(
          b, per_tensor, [&](int slot) { return load_lane(b, bases, loaded, j, lanes_, lane, slot, index); },
          element_type(), index);
      accumulate(b, values, thread_acc); // lane by lane, in element order
      keep_lane(b, stored, values, lanes_, lane);
    }
    store_lanes(b, bases, stored, j, lanes_);
  }

  // Adds the evaluated elements `values` (scalars or vectors) to each reduction's accumulator (of the same lanes, f64).
  void accumulate(IRBuilder<>& b, const std::vector<Value*>& values, const std::vector<llvm::AllocaInst*>& acc) {
    for (std::size_t r = 0; r < acc.size(); ++r) {
      const Node& n = graph_.node(tensor_reductions_[r]);
      Value* v = values[static_cast<std::size_t>(n.inputs[0])];
      Value* wide = b.CreateFPExt(v, with_lanes(b.getDoubleTy(), v->getType()));
      b.CreateStore(combine(b, n.op, b.CreateLoad(acc[r]->getAllocatedType(), acc[r]), wide), acc[r]);
    }
  }

  std::size_t reduction_count() const { return tensor_reductions_.size(); }

  // The current element's row (kind Rows) or column (Cols) in its tensor, as emit_axis_loop counts them.
  Value* axis_index(SlotKind kind) const {
    Value* index = axis_ ? (kind == SlotKind::Rows ? axis_->row : axis_->col) : nullptr;
    OPTJIT_ASSERT(index, "kernel " + plan_.name + " reads rows or columns outside a walk over them");
    return index;
  }

  // `if (condition) *address = value;`
  void store_if(IRBuilder<>& b, Value* condition, Value* value, Value* address, llvm::Align align) {
    emit_if(b, condition, "store", [&] { b.CreateAlignedStore(value, address, align); });
  }
  // The array of carried axis sum `name` (axis[carry index]).
  Value* axis_array(IRBuilder<>& b, Value* arrays, const std::string& name) {
    Value* array =
        b.CreateLoad(ptr_, b.CreateGEP(ptr_, arrays, b.getInt64(static_cast<int64_t>(carry_index(plan_, name)))));
    return arrays->getType() == ptr_ ? array : b.CreateAddrSpaceCast(array, arrays->getType()); // GPU: global
  }
  // The array of carried axis sum `name`, at the current element's row or column.
  Value* axis_array_address(IRBuilder<>& b, const std::string& name, SlotKind kind) {
    Value* array = axis_array(b, axis_->arrays, name);
    Value* base = kind == SlotKind::Rows ? axis_->row_base : axis_->col_base;
    return b.CreateGEP(b.getDoubleTy(), array, b.CreateAdd(base, axis_index(kind)));
  }
  // The carry a reduction of this kernel hands its value on as.
  const std::string& carry_of_reduction(ValueId id) const {
    for (const Store& s : graph_.stores)
      if (s.value == id && s.kind == StoreKind::Carry)
        return s.name;
    OPTJIT_ASSERT(false, "kernel " + plan_.name + ": reduction %" + std::to_string(id) + " is handed on to no kernel");
  }

  // A block's shared memory of `count` doubles (address space 3; host memory in emulation, where blocks run one
  // after another).
  llvm::GlobalVariable* shared_doubles(std::size_t count, const std::string& name) {
    shared_bytes_ += count * sizeof(double);
    if (shared_bytes_ > kGpuStaticSharedBytes)
      throw Error("kernel " + plan_.name + " needs " + std::to_string(shared_bytes_) +
                  " bytes of a GPU block's shared memory (row sums, reductions and the last block's flag), more than "
                  "its " +
                  std::to_string(kGpuStaticSharedBytes) + ": run these params on the CPU");
    auto* array = llvm::ArrayType::get(llvm::Type::getDoubleTy(ctx_), count);
    auto* shared = new llvm::GlobalVariable(module_, array, false, llvm::GlobalValue::InternalLinkage,
                                            llvm::UndefValue::get(array), name, nullptr,
                                            llvm::GlobalValue::NotThreadLocal, emulation_ ? 0 : 3);
    shared->setAlignment(llvm::Align(8));
    return shared;
  }

  // The block's value of each reduction, valid in thread 0: every thread's accumulator in shared memory, then a tree
  // that halves the stride from kGpuMaxBlockThreads / 2 (threads past the block's size take no part), so the order
  // depends only on the block's size. Up to kBlockReductionsAtOnce reductions share one pass of the tree (their
  // shared memory, 4 KB each, counts against the block's 48 KB), more take several passes.
  std::vector<Value*> emit_block_reduction(IRBuilder<>& b, llvm::Function* fn,
                                           const std::vector<llvm::AllocaInst*>& thread_acc, Value* thread,
                                           Value* threads) {
    std::vector<Value*> results;
    if (thread_acc.empty())
      return results;
    const std::size_t at_once = std::min(thread_acc.size(), kBlockReductionsAtOnce);
    llvm::GlobalVariable* shared = shared_doubles(kGpuMaxBlockThreads * at_once, plan_.name + "_reduce");
    const auto cell = [&](std::size_t r, Value* index) {
      Value* at = b.CreateAdd(b.getInt64(static_cast<int64_t>(r % at_once) * kGpuMaxBlockThreads), index);
      return b.CreateGEP(b.getDoubleTy(), shared, at);
    };
    for (std::size_t pass = 0; pass < thread_acc.size(); pass += at_once) {
      const std::size_t end = std::min(thread_acc.size(), pass + at_once);
      if (pass > 0)
        gpu_barrier(b); // every thread has read the last pass's results
      for (std::size_t r = pass; r < end; ++r)
        b.CreateStore(b.CreateLoad(b.getDoubleTy(), thread_acc[r]), cell(r, thread));
      gpu_barrier(b);
      for (int stride = kGpuMaxBlockThreads / 2; stride >= 1; stride /= 2) {
        auto* add = llvm::BasicBlock::Create(ctx_, "reduce.add", fn);
        auto* next = llvm::BasicBlock::Create(ctx_, "reduce.next", fn);
        Value* partner = b.CreateAdd(thread, b.getInt64(stride));
        b.CreateCondBr(b.CreateAnd(b.CreateICmpULT(thread, b.getInt64(stride)), b.CreateICmpULT(partner, threads)), add,
                       next);
        b.SetInsertPoint(add);
        for (std::size_t r = pass; r < end; ++r)
          b.CreateStore(combine(b, reduction_op(r), b.CreateLoad(b.getDoubleTy(), cell(r, thread)),
                                b.CreateLoad(b.getDoubleTy(), cell(r, partner))),
                        cell(r, thread));
        b.CreateBr(next);
        b.SetInsertPoint(next);
        gpu_barrier(b);
      }
      for (std::size_t r = pass; r < end; ++r)
        results.push_back(b.CreateLoad(b.getDoubleTy(), cell(r, b.getInt64(0))));
    }
    return results;
  }

  // Reduction r of the kernel (node reductions_begin + r), its identity, and how two partials combine.
  Op reduction_op(std::size_t r) const { return graph_.node(tensor_reductions_[r]).op; }
  static Value* identity(IRBuilder<>& b, Op op) {
    return llvm::ConstantFP::get(b.getDoubleTy(),
                                 op == Op::reduce_sum ? 0.0 : -std::numeric_limits<double>::infinity());
  }
  static Value* combine(IRBuilder<>& b, Op op, Value* acc, Value* v) {
    OPTJIT_ASSERT(op == Op::reduce_sum || op == Op::reduce_max, "not a reduction: " + std::string(op_name(op)));
    return op == Op::reduce_sum ? b.CreateFAdd(acc, v) : b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, acc, v);
  }
  static llvm::Type* vector_type_of(llvm::Type* element, int lanes) {
    return llvm::FixedVectorType::get(element, static_cast<unsigned>(lanes));
  }

  struct BlockCount {
    Value* items_of_tensor;
    Value* done;
    Value* thread;
  };
  // A kernel that ends with reductions: the block's values (thread 0's) and where partials go.
  struct BlockReductions {
    Value* block;
    std::vector<Value*> values;
    Value* partials;
    Value* first_item;
  };

  // After the block's elements: thread 0 counts the item as done; the block that finishes tensor t's last item
  // (every other block of t has read the old scalar state by then) writes the new one and the carried values, and
  // resets the count. With `last_block`, every thread of that block first runs it (the count is shared with the
  // block through shared memory), having published its own writes before the count.
  void emit_gpu_per_tensor_stores(IRBuilder<>& b, llvm::Function* fn, const std::vector<Value*>& values,
                                  const PerTensorInputs& in, const BlockCount& count_in,
                                  const BlockReductions& reductions, const std::function<void()>& last_block) {
    bool any = false;
    for (const Store& s : graph_.stores)
      any |= s.kind != StoreKind::Tensor;
    if (!any && !last_block)
      return;
    if (last_block)
      gpu_fence(b); // this thread's writes that the last block reads, before thread 0's count
    gpu_barrier(b);
    const auto partial_at = [&](Value* item, std::size_t r) {
      Value* index = b.CreateAdd(b.CreateMul(item, b.getInt64(static_cast<int64_t>(reductions.values.size()))),
                                 b.getInt64(static_cast<int64_t>(r)));
      return b.CreateGEP(b.getDoubleTy(), reductions.partials, index);
    };
    Value* counter = b.CreateGEP(b.getInt32Ty(), count_in.done, in.t);
    // Thread 0: the block's partials, published before the count by the membar; whether it finished the tensor.
    const auto count = [&] {
      for (std::size_t r = 0; r < reductions.values.size(); ++r)
        b.CreateStore(reductions.values[r], partial_at(reductions.block, r));
      gpu_fence(b);
      Value* before = b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, counter, b.getInt32(1), llvm::MaybeAlign(4),
                                        llvm::AtomicOrdering::Monotonic);
      Value* total = b.CreateLoad(i64_, b.CreateGEP(i64_, count_in.items_of_tensor, in.t));
      return b.CreateICmpEQ(b.CreateAdd(b.CreateZExt(before, i64_), b.getInt64(1)), total);
    };
    const auto write = [&] {
      gpu_fence(b);
      emit_per_tensor_stores(b, values, in);
      if (!reductions.values.empty()) {
        // Tensor t's partials, combined in item order, handed on as its carried values.
        std::vector<llvm::AllocaInst*> acc;
        IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin()); // a static slot promotes to a register
        for (std::size_t r = 0; r < reductions.values.size(); ++r) {
          acc.push_back(entry.CreateAlloca(b.getDoubleTy()));
          b.CreateStore(identity(b, reduction_op(r)), acc.back());
        }
        Value* items_begin = b.CreateLoad(i64_, b.CreateGEP(i64_, reductions.first_item, in.t));
        Value* items_end =
            b.CreateLoad(i64_, b.CreateGEP(i64_, reductions.first_item, b.CreateAdd(in.t, b.getInt64(1))));
        emit_loop(b, items_begin, items_end, b.getInt64(1), "partial", [&](Value* item) {
          for (std::size_t r = 0; r < acc.size(); ++r)
            b.CreateStore(combine(b, reduction_op(r), b.CreateLoad(b.getDoubleTy(), acc[r]),
                                  b.CreateLoad(b.getDoubleTy(), partial_at(item, r))),
                          acc[r]);
        });
        for (const Store& s : graph_.stores)
          if (auto r = std::find(tensor_reductions_.begin(), tensor_reductions_.end(), s.value);
              r != tensor_reductions_.end())
            b.CreateStore(b.CreateLoad(b.getDoubleTy(), acc[static_cast<std::size_t>(r - tensor_reductions_.begin())]),
                          carry_address(b, in, s.name));
      }
      b.CreateStore(b.getInt32(0), counter);
    };
    Value* thread_0 = b.CreateICmpEQ(count_in.thread, b.getInt64(0));
    if (!last_block) {
      emit_if(b, thread_0, "count", [&] { emit_if(b, count(), "write_scalar_state", write); });
      return;
    }
    llvm::GlobalVariable* finished = shared_doubles(1, plan_.name + "_last");
    emit_if(b, thread_0, "count", [&] { b.CreateStore(b.CreateUIToFP(count(), b.getDoubleTy()), finished); });
    gpu_barrier(b);
    Value* is_last =
        b.CreateFCmpONE(b.CreateLoad(b.getDoubleTy(), finished), llvm::ConstantFP::get(b.getDoubleTy(), 0));
    emit_if(b, is_last, "last_block", [&] {
      gpu_fence(b);
      last_block();
      emit_if(b, thread_0, "write_scalar_state", write);
    });
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

  // The data pointer of tensor t in slot `slot`: slots[slot * n_tensors + t].
  Value* slot_pointer(IRBuilder<>& b, Value* slots, int slot, Value* n_tensors, Value* t,
                      const llvm::Twine& name = "") {
    Value* index = b.CreateAdd(b.CreateMul(b.getInt64(slot), n_tensors), t);
    return b.CreateLoad(ptr_, b.CreateGEP(ptr_, slots, index), name);
  }

  llvm::Type* scalar_type(Dtype d) {
    switch (d) {
    case Dtype::f32:
      return llvm::Type::getFloatTy(ctx_);
    case Dtype::f64:
      return llvm::Type::getDoubleTy(ctx_);
    case Dtype::bf16:
      return llvm::Type::getInt16Ty(ctx_); // its bits: from_storage and to_storage convert by hand
    case Dtype::f16:
      return llvm::Type::getHalfTy(ctx_);
    case Dtype::c64:
    case Dtype::c128:
      break; // the verifier refuses complex slots: kernels run on real views
    }
    OPTJIT_ASSERT(false, "dtype without an LLVM type");
  }
  // The LLVM type a computed value of `d` is held in: its storage type, except bf16, held as a float (rounded to
  // bf16) since LLVM computes on no bf16 here.
  llvm::Type* value_type(Dtype d) { return d == Dtype::bf16 ? llvm::Type::getFloatTy(ctx_) : scalar_type(d); }
  // The compute type of element values.
  llvm::Type* element_type() { return scalar_type(graph_.dtype); }
  llvm::Type* vector_type(Dtype dtype, int lanes) {
    return lanes == 1 ? scalar_type(dtype)
                      : llvm::FixedVectorType::get(scalar_type(dtype), static_cast<unsigned>(lanes));
  }
  llvm::Type* lane_type(int lanes) { return vector_type(graph_.dtype, lanes); }
  static int lanes_in(llvm::Type* type) {
    auto* vector = llvm::dyn_cast<llvm::FixedVectorType>(type);
    return vector ? static_cast<int>(vector->getNumElements()) : 1;
  }
  // The storage dtype of the kernel's tensor slot `slot` (an index into the ABI's tensor slots), and of a slot by
  // name.
  Dtype tensor_slot_dtype(int slot) { return slot_dtype(plan_.abi.tensor_slots[static_cast<std::size_t>(slot)]); }
  Dtype slot_dtype(const std::string& name) {
    const Slot* slot = graph_.slot(name);
    OPTJIT_ASSERT(slot, "kernel " + plan_.name + " uses undeclared slot '" + name + "'");
    return slot->dtype;
  }
  // `v` as `type` (scalars or vectors of the same length): loads widen storage to compute, stores round back.
  Value* convert(IRBuilder<>& b, Value* v, llvm::Type* type) {
    return v->getType() == type ? v : b.CreateFPCast(v, type);
  }
  // `element`, with as many lanes as `like` has (a scalar when it is one).
  static llvm::Type* with_lanes(llvm::Type* element, llvm::Type* like) {
    if (auto* vector = llvm::dyn_cast<llvm::FixedVectorType>(like))
      return llvm::FixedVectorType::get(element, vector->getNumElements());
    return element;
  }
  // A value loaded from `storage` (scalar or vector), in the compute type `type`. bf16 is kept as its 16 bits and
  // widened by hand (its bits are a float's upper half), so that no target needs a bf16 conversion routine.
  Value* from_storage(IRBuilder<>& b, Value* v, Dtype storage, llvm::Type* type) {
    if (storage == Dtype::bf16) {
      Value* wide = b.CreateShl(b.CreateZExt(v, with_lanes(b.getInt32Ty(), v->getType())), 16);
      v = b.CreateBitCast(wide, with_lanes(b.getFloatTy(), v->getType()));
    }
    return convert(b, v, type);
  }
  // A computed value (scalar or vector) rounded to `storage`, to nearest with ties to even. bf16 by hand (below), or
  // by the CPU's conversion where it has one: that conversion flushes subnormals, so a vector holding one (rare:
  // below 2^-126) branches to the exact rounding.
  Value* to_storage(IRBuilder<>& b, Value* v, Dtype storage) {
    if (storage != Dtype::bf16)
      return convert(b, v, with_lanes(scalar_type(storage), v->getType()));
    v = convert(b, v, with_lanes(b.getFloatTy(), v->getType()));
    if (!native_bf16_)
      return round_to_bf16_bits(b, v);
    llvm::Type* i16 = with_lanes(b.getInt16Ty(), v->getType());
    Value* native = b.CreateBitCast(b.CreateFPTrunc(v, with_lanes(b.getBFloatTy(), v->getType())), i16);
    Value* magnitude = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, v);
    Value* subnormal =
        b.CreateAnd(b.CreateFCmpOLT(magnitude, llvm::ConstantFP::get(v->getType(), std::numeric_limits<float>::min())),
                    b.CreateFCmpONE(magnitude, llvm::Constant::getNullValue(v->getType())));
    Value* any_subnormal = v->getType()->isVectorTy() ? b.CreateOrReduce(subnormal) : subnormal;
    llvm::BasicBlock* fast = b.GetInsertBlock();
    llvm::Function* fn = fast->getParent();
    auto* exact = llvm::BasicBlock::Create(ctx_, "bf16.subnormal", fn);
    auto* join = llvm::BasicBlock::Create(ctx_, "bf16.rounded", fn);
    b.CreateCondBr(any_subnormal, exact, join);
    b.SetInsertPoint(exact);
    Value* exact_bits = round_to_bf16_bits(b, v);
    b.CreateBr(join);
    b.SetInsertPoint(join);
    llvm::PHINode* bits = b.CreatePHI(i16, 2);
    bits->addIncoming(native, fast);
    bits->addIncoming(exact_bits, exact);
    return bits;
  }
  // f32 (scalar or vector) to bf16 bits by integer arithmetic: add 0x7fff plus the lowest kept bit and keep the upper
  // half; NaNs stay quiet NaNs. Exact for every input, subnormals included.
  Value* round_to_bf16_bits(IRBuilder<>& b, Value* v) {
    llvm::Type* i32 = with_lanes(b.getInt32Ty(), v->getType());
    Value* bits = b.CreateBitCast(v, i32);
    Value* upper = b.CreateLShr(bits, 16);
    Value* lowest_kept = b.CreateAnd(upper, llvm::ConstantInt::get(i32, 1));
    Value* rounded = b.CreateLShr(b.CreateAdd(b.CreateAdd(bits, llvm::ConstantInt::get(i32, 0x7fff)), lowest_kept), 16);
    Value* quiet_nan = b.CreateOr(upper, llvm::ConstantInt::get(i32, 0x40));
    Value* result = b.CreateSelect(b.CreateFCmpUNO(v, v), quiet_nan, rounded);
    return b.CreateTrunc(result, with_lanes(b.getInt16Ty(), v->getType()));
  }

  std::vector<Value*> splat_all(IRBuilder<>& b, const std::vector<Value*>& scalars, int lanes) {
    std::vector<Value*> out(scalars.size(), nullptr);
    for (std::size_t id = 0; id < scalars.size(); ++id)
      if (scalars[id])
        out[id] = b.CreateVectorSplat(static_cast<unsigned>(lanes), scalars[id]);
    return out;
  }

  SlotKind tensor_slot_kind(int slot) const {
    return graph_.slot(plan_.abi.tensor_slots[static_cast<std::size_t>(slot)])->kind;
  }
  // Where element j of a tensor slot lives: j itself, or its row or column in a rows or columns slot.
  Value* element_at(int slot, Value* j) {
    const SlotKind kind = tensor_slot_kind(slot);
    return kind == SlotKind::Tensor ? j : axis_index(kind);
  }
  // The address of element j of tensor slot `slot` (`bases`: each slot's data for the current tensor).
  Value* slot_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j) {
    return b.CreateGEP(scalar_type(tensor_slot_dtype(slot)), bases[static_cast<std::size_t>(slot)],
                       element_at(slot, j));
  }
  // `lanes` elements of slot `slot` from element j (a rows slot's one value splat over them), widened to `type`.
  Value* load_slot(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes, llvm::Type* type) {
    const Dtype storage = tensor_slot_dtype(slot);
    Value* v = load_lanes(b, scalar_type(storage), slot_address(b, bases, slot, j), lanes,
                          tensor_slot_kind(slot) == SlotKind::Rows, llvm::Align(dtype_size(storage)),
                          plan_.abi.tensor_slots[slot]);
    return from_storage(b, v, storage, type);
  }
  // `lanes` values from `address` of `element` type: a vector load, or one value splat over the lanes when they
  // share it (a row's value: the lanes of an axis loop's vector share their row).
  Value* load_lanes(IRBuilder<>& b, llvm::Type* element, Value* address, int lanes, bool shared, llvm::Align align,
                    const llvm::Twine& name = "") {
    if (lanes == 1 || shared) {
      Value* v = b.CreateAlignedLoad(element, address, align, name);
      return lanes == 1 ? v : b.CreateVectorSplat(static_cast<unsigned>(lanes), v);
    }
    return b.CreateAlignedLoad(vector_type_of(element, lanes), address, align, name);
  }

  // The element DAG for `lanes` consecutive elements starting at index j: loads, arithmetic, stores.
  void emit_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor, Value* j,
                 int lanes, const std::vector<llvm::AllocaInst*>& accumulators = {}) {
    llvm::Type* type = lane_type(lanes);
    auto load = [&](int slot) { return load_slot(b, bases, slot, j, lanes, type); };
    Value* index = j; // of each lane's element: stochastic rounding draws its bits by element index
    if (lanes > 1) {
      std::vector<llvm::Constant*> offsets;
      for (int lane = 0; lane < lanes; ++lane)
        offsets.push_back(b.getInt64(static_cast<uint64_t>(lane)));
      index = b.CreateAdd(b.CreateVectorSplat(static_cast<unsigned>(lanes), j), llvm::ConstantVector::get(offsets));
    }
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
  std::vector<Value*> evaluate_elements(IRBuilder<>& b, const std::vector<Value*>& per_tensor,
                                        const std::function<Value*(int slot)>& load, llvm::Type* type, Value* index) {
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
  Value* carry_address(IRBuilder<>& b, const PerTensorInputs& in, const std::string& name) {
    Value* index = b.CreateAdd(b.CreateMul(in.t, in.n_carry), b.getInt64(index_in(plan_.carries, name)));
    return b.CreateGEP(i64_, in.carry, index);
  }

  // The per-tensor nodes [0, prologue_size) of tensor t, in double precision (scalar state read in the element
  // type and widened).
  std::vector<Value*> emit_prologue(IRBuilder<>& b, const PerTensorInputs& in) {
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
        v = b.CreateLoad(b.getDoubleTy(), b.CreateGEP(b.getDoubleTy(), in.hyper, index), n.name);
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
  WorkItemValues load_work_item(IRBuilder<>& b, Value* items, Value* index) {
    Value* item = b.CreateGEP(i64_, items, b.CreateMul(index, b.getInt64(3)));
    return {b.CreateLoad(i64_, item, "tensor"), b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(1)), "begin"),
            b.CreateLoad(i64_, b.CreateGEP(i64_, item, b.getInt64(2)), "end")};
  }

  // Tensor t's per-tensor results: its new scalar state (each scalar store, narrowed to the element type, into its
  // slot) and the values it hands to later kernels (into the carry buffer, in their own dtype).
  void emit_per_tensor_stores(IRBuilder<>& b, const std::vector<Value*>& values, const PerTensorInputs& in) {
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

  int scalar_slot(const std::string& name) const {
    return static_cast<int>(plan_.abi.tensor_slots.size()) + index_in(plan_.abi.scalar_slots, name);
  }

  // One op on scalars or vectors of `type`; the meaning follows compiler/op_semantics.h.
  Value* emit_op(IRBuilder<>& b, const Node& n, const std::vector<Value*>& in, llvm::Type* type) {
    auto as_type = [&](Value* v) { return b.CreateUIToFP(v, type); };
    Value* zero = llvm::Constant::getNullValue(type);
    switch (n.op) {
    case Op::cast:
      if (n.dtype == Dtype::bf16) // rounded to bf16, held in a float (value_type)
        return from_storage(b, to_storage(b, in[0], Dtype::bf16), Dtype::bf16, type);
      return b.CreateFPCast(in[0], type);
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

  // runtime/stochastic_rounding.h's rounding_mix, lane by lane.
  Value* rounding_mix(IRBuilder<>& b, Value* x) {
    auto constant = [&](uint64_t v) { return llvm::ConstantInt::get(x->getType(), v); };
    x = b.CreateXor(x, b.CreateLShr(x, constant(30)));
    x = b.CreateMul(x, constant(0xbf58476d1ce4e5b9ull));
    x = b.CreateXor(x, b.CreateLShr(x, constant(27)));
    x = b.CreateMul(x, constant(0x94d049bb133111ebull));
    return b.CreateXor(x, b.CreateLShr(x, constant(31)));
  }

  // sround: in[0] (f32 lanes) rounded to bf16 with runtime/stochastic_rounding.h's bits for counter in[1] and stream
  // in[2] (f64 lanes holding whole numbers) at element `index`; the same operations as stochastic_round_bf16.
  Value* emit_stochastic_round(IRBuilder<>& b, const std::vector<Value*>& in, Value* index) {
    llvm::Type* i64 = with_lanes(b.getInt64Ty(), in[0]->getType());
    llvm::Type* i32 = with_lanes(b.getInt32Ty(), in[0]->getType());
    auto constant = [&](llvm::Type* type, uint64_t v) { return llvm::ConstantInt::get(type, v); };
    Value* counter = b.CreateFPToUI(in[1], i64);
    Value* stream = b.CreateFPToUI(in[2], i64);
    Value* key = rounding_mix(b, b.CreateXor(counter, rounding_mix(b, stream)));
    Value* draw = rounding_mix(b, b.CreateAdd(key, b.CreateMul(index, constant(i64, kRoundingGolden))));
    Value* bits = b.CreateTrunc(b.CreateLShr(draw, constant(i64, 48)), i32);
    Value* u = b.CreateBitCast(in[0], i32);
    Value* magnitude = b.CreateAnd(u, constant(i32, 0x7fffffff));
    Value* rounded = b.CreateAnd(b.CreateAdd(u, bits), constant(i32, 0xffff0000));
    Value* saturates =
        b.CreateAnd(b.CreateICmpEQ(b.CreateAnd(rounded, constant(i32, 0x7fffffff)), constant(i32, 0x7f800000)),
                    b.CreateICmpULT(magnitude, constant(i32, kBf16NearestOverflow)));
    rounded = b.CreateSelect(
        saturates, b.CreateOr(b.CreateAnd(u, constant(i32, 0x80000000)), constant(i32, kBf16LargestFinite)), rounded);
    Value* quiet_nan = b.CreateAnd(b.CreateOr(u, constant(i32, 0x00400000)), constant(i32, 0xffff0000));
    Value* result = b.CreateSelect(b.CreateICmpUGT(magnitude, constant(i32, 0x7f800000)), quiet_nan,
                                   b.CreateSelect(b.CreateICmpEQ(magnitude, constant(i32, 0x7f800000)), u, rounded));
    return b.CreateBitCast(result, in[0]->getType());
  }

  // A device math function (double precision) on scalar operands of `type`.
  Value* call_device_math(IRBuilder<>& b, llvm::Function* fn, const std::vector<Value*>& in, llvm::Type* type) {
    OPTJIT_ASSERT(!type->isVectorTy(), "device math runs on scalars");
    std::vector<Value*> wide;
    for (Value* v : in)
      wide.push_back(b.CreateFPExt(v, b.getDoubleTy()));
    return b.CreateFPTrunc(b.CreateCall(fn, wide), type);
  }

  const KernelPlan& plan_;
  const Graph& graph_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  int lanes_;
  bool native_bf16_;
  const GpuEmulationHooks* emulation_; // GPU kernels run on host threads (gpu_emulation.cpp); null on a GPU
  std::optional<DeviceMath> math_;     // set for targets without libm
  std::vector<ValueId> tensor_reductions_, axis_reductions_; // the kernel's reductions, per tensor and along an axis
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
  std::optional<AxisIndex> axis_;
  std::size_t shared_bytes_ = 0; // of the GPU kernel being emitted (shared_doubles)
  llvm::PointerType* ptr_;
  llvm::Type* i64_;
  llvm::StructType* args_type_;
};

} // namespace

namespace {

void verify(const llvm::Module& module) {
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(module, &os))
    OPTJIT_ASSERT(false, "emitted LLVM IR does not verify: " + problems);
}

} // namespace

EmittedKernel emit_cpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol_prefix, int lanes,
                              bool native_bf16) {
  Emitter emitter(plan, module, lanes, /*device_math=*/false, native_bf16);
  EmittedKernel names{symbol_prefix + "_tensor_phase", symbol_prefix + "_element_phase", ""};
  emitter.emit_tensor_phase(names.tensor_phase);
  emitter.emit_element_phase(names.element_phase);
  if (emitter.has_reductions()) {
    names.finish_phase = symbol_prefix + "_finish_phase";
    emitter.emit_finish_phase(names.finish_phase);
  }
  verify(module);
  return names;
}

void emit_gpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol,
                     const GpuEmulationHooks* emulation) {
  Emitter emitter(plan, module, kGpuVectorBytes / static_cast<int>(dtype_size(plan.graph.dtype)),
                  /*device_math=*/true, /*native_bf16=*/false, emulation);
  if (plan.has_axis)
    emitter.emit_gpu_axis_kernel(symbol);
  else
    emitter.emit_gpu_kernel(symbol);
  verify(module);
}

} // namespace optjit
