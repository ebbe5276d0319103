#include "codegen/cuda/gpu_intrinsics.h"
#include "codegen/cuda/gpu_kernel_emitter.h"

#include <algorithm>

namespace optjit {
namespace emission {
namespace {

// Reductions that share one pass of a GPU block's reduction tree (emit_block_reduction).
constexpr std::size_t kBlockReductionsAtOnce = 4;

// The elements a GPU thread reads and writes at once: 128 bits of the compute dtype, or one at a time in a kernel
// that touches block-quantized state (its codes are bytes or nibbles, read through a table).
int gpu_lanes(const KernelPlan& plan) {
  return quantized_slots(plan).empty() ? kGpuVectorBytes / static_cast<int>(dtype_size(plan.graph.dtype)) : 1;
}

} // namespace

GpuKernelEmitter::GpuKernelEmitter(const KernelPlan& plan, llvm::Module& module, const GpuEmulationHooks* emulation)
    : KernelBody(plan, module, gpu_lanes(plan), /*device_math=*/true, /*native_bf16=*/false), emulation_(emulation) {}

GpuKernelEmitter::GpuEntry GpuKernelEmitter::begin_gpu_kernel(IRBuilder<>& b, const std::string& symbol) {
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
  // The quantized slots' scales, which the slot table keeps after the scalar slots (compiler/binding.cpp).
  const std::vector<std::string> quantized = quantized_slots(plan_);
  const std::size_t slot_rows = plan_.abi.tensor_slots.size() + plan_.abi.scalar_slots.size();
  for (std::size_t k = 0; k < quantized.size(); ++k)
    e.bases.push_back(
        b.CreateAddrSpaceCast(slot_pointer(b, slots, static_cast<int>(slot_rows + k), n_tensors, e.item.tensor),
                              e.global, scales_slot_name(quantized[k])));
  return e;
}

// What every GPU kernel ends with: the block's reductions, then the last block of the tensor writes its scalar
// state and carried values (after `last_block`, which every thread of that block runs, when given).
void GpuKernelEmitter::end_gpu_kernel(IRBuilder<>& b, const GpuEntry& e, const std::function<void()>& last_block) {
  std::vector<Value*> block_partials = emit_block_reduction(b, e.fn, e.thread_acc, e.thread, e.threads);
  emit_gpu_per_tensor_stores(
      b, e.fn, e.values, e.in, {e.param(GpuParam::items_of_tensor), e.param(GpuParam::done), e.thread},
      {e.block, block_partials, e.param(GpuParam::partials), e.param(GpuParam::first_item)}, last_block);
  b.CreateRetVoid();
}

// The GPU kernel (runtime/kernel_abi.h): block = work item, threads stride over its elements `lanes` at a time
// (128-bit accesses when every slot's address of the item is aligned, scalar ones otherwise), then one at a time
// over the item's last elements.
void GpuKernelEmitter::emit_gpu_kernel(const std::string& symbol) {
  IRBuilder<> b(ctx_);
  GpuEntry e = begin_gpu_kernel(b, symbol);
  if (const std::optional<int64_t> block = stored_block(plan_)) {
    emit_gpu_block_walk(b, e, *block);
    end_gpu_kernel(b, e);
    return;
  }
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

// A kernel that stores block-quantized state: thread k of the block walks the k-th whole block of its item, then
// every `threads`-th one, one element at a time, buffering its quantized stores (in the thread's local memory), and
// ends each block with its scale and codes (quantize_block): the CPU's walk, a block per thread (make_gpu_table
// launches as many threads as an item has blocks). A block's codes depend on its values alone, whatever the thread
// count; a reduction's order, as in the plain kernel, on the shape and the block's thread count.
void GpuKernelEmitter::emit_gpu_block_walk(IRBuilder<>& b, GpuEntry& e, int64_t block) {
  prepare_block_walk(e.fn, block);
  const int64_t buffered = block * static_cast<int64_t>(block_walk_->buffers.size());
  if (buffered > kGpuMaxBufferedValues)
    throw Error("kernel " + plan_.name + " stores " + std::to_string(block_walk_->buffers.size()) +
                " entries of state quantized in blocks of " + std::to_string(block) +
                " values: a GPU thread buffers its block of each in its local memory, up to " +
                std::to_string(kGpuMaxBufferedValues) +
                " values in all; step such state on the CPU, or use smaller blocks");
  const auto [t, first, last] = e.item;
  (void)t;
  Value* stride = b.CreateMul(e.threads, b.getInt64(block));
  emit_loop(b, b.CreateAdd(first, b.CreateMul(e.thread, b.getInt64(block))), last, stride, "qblock", [&](Value* start) {
    block_walk_->start = start;
    block_walk_->index = b.CreateSDiv(start, b.getInt64(block));
    reset_block_maxima(b);
    emit_loop(b, start, b.CreateAdd(start, b.getInt64(block)), b.getInt64(1), "qblock.elem",
              [&](Value* j) { emit_body(b, e.bases, e.values, j, 1, e.thread_acc); });
    quantize_block(b, e.bases);
  });
  block_walk_->start = block_walk_->index = nullptr;
}

// The GPU's thread and block registers (%tid.x, %ntid.x, %ctaid.x), its block barrier and its global memory fence;
// in emulation, calls to the emulator's hooks and a host fence.
Value* GpuKernelEmitter::gpu_register(IRBuilder<>& b, llvm::Intrinsic::ID id) {
  return emission::gpu_register(b, id, emulation_);
}
void GpuKernelEmitter::gpu_barrier(IRBuilder<>& b) { emission::gpu_barrier(b, emulation_); }
void GpuKernelEmitter::gpu_fence(IRBuilder<>& b) { emission::gpu_fence(b, emulation_); }
Value* GpuKernelEmitter::call_hook(IRBuilder<>& b, uintptr_t address, llvm::Type* result) {
  return call_host_hook(b, address, result);
}
void GpuKernelEmitter::annotate_kernel(llvm::Function* fn, int max_registers) {
  annotate_gpu_kernel(module_, fn, max_registers);
}

// `lanes_` elements from index j with one vector load per slot read and one vector store per slot written (128
// bits for slots stored in the compute dtype); the arithmetic runs lane by lane (device math is scalar).
void GpuKernelEmitter::emit_gpu_vector_body(IRBuilder<>& b, const std::vector<Value*>& bases,
                                            const std::vector<Value*>& per_tensor, Value* j,
                                            const std::vector<llvm::AllocaInst*>& thread_acc) {
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

// A block's shared memory of `count` doubles (address space 3; host memory in emulation, where blocks run one
// after another).
llvm::GlobalVariable* GpuKernelEmitter::shared_doubles(std::size_t count, const std::string& name) {
  shared_bytes_ += count * sizeof(double);
  if (shared_bytes_ > kGpuStaticSharedBytes)
    throw Error("kernel " + plan_.name + " needs " + std::to_string(shared_bytes_) +
                " bytes of a GPU block's shared memory (row sums, reductions and the last block's flag), more than "
                "its " +
                std::to_string(kGpuStaticSharedBytes) + ": run these params on the CPU");
  auto* array = llvm::ArrayType::get(llvm::Type::getDoubleTy(ctx_), count);
  auto* shared =
      new llvm::GlobalVariable(module_, array, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(array),
                               name, nullptr, llvm::GlobalValue::NotThreadLocal, emulation_ ? 0 : 3);
  shared->setAlignment(llvm::Align(8));
  return shared;
}

// The block's value of each reduction, valid in thread 0: every thread's accumulator in shared memory, then a tree
// that halves the stride from kGpuMaxBlockThreads / 2 (threads past the block's size take no part), so the order
// depends only on the block's size. Up to kBlockReductionsAtOnce reductions share one pass of the tree (their
// shared memory, 4 KB each, counts against the block's 48 KB), more take several passes.
std::vector<Value*> GpuKernelEmitter::emit_block_reduction(IRBuilder<>& b, llvm::Function* fn,
                                                           const std::vector<llvm::AllocaInst*>& thread_acc,
                                                           Value* thread, Value* threads) {
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

// After the block's elements: thread 0 counts the item as done; the block that finishes tensor t's last item
// (every other block of t has read the old scalar state by then) writes the new one and the carried values, and
// resets the count. With `last_block`, every thread of that block first runs it (the count is shared with the
// block through shared memory), having published its own writes before the count.
void GpuKernelEmitter::emit_gpu_per_tensor_stores(IRBuilder<>& b, llvm::Function* fn, const std::vector<Value*>& values,
                                                  const PerTensorInputs& in, const BlockCount& count_in,
                                                  const BlockReductions& reductions,
                                                  const std::function<void()>& last_block) {
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
      Value* items_end = b.CreateLoad(i64_, b.CreateGEP(i64_, reductions.first_item, b.CreateAdd(in.t, b.getInt64(1))));
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
  Value* is_last = b.CreateFCmpONE(b.CreateLoad(b.getDoubleTy(), finished), llvm::ConstantFP::get(b.getDoubleTy(), 0));
  emit_if(b, is_last, "last_block", [&] {
    gpu_fence(b);
    last_block();
    emit_if(b, thread_0, "write_scalar_state", write);
  });
}

// Tensor slot `slot` at element j, lane `lane` of the `lanes` elements from element `first`: a tensor-shaped slot
// from one vector load of them (made on first use, kept in `loaded`), a rows or columns slot on its own.
Value* GpuKernelEmitter::load_lane(IRBuilder<>& b, const std::vector<Value*>& bases, std::vector<Value*>& loaded,
                                   Value* first, int lanes, int lane, int slot, Value* j) {
  if (lanes == 1 || tensor_slot_kind(slot) != SlotKind::Tensor)
    return load_slot(b, bases, slot, j, 1, element_type());
  const Dtype storage = tensor_slot_dtype(slot);
  Value*& v = loaded[static_cast<std::size_t>(slot)];
  if (!v)
    v = b.CreateAlignedLoad(vector_type(storage, lanes), lanes_address(b, bases, slot, first), lanes_align(slot, lanes),
                            plan_.abi.tensor_slots[slot]);
  return from_storage(b, b.CreateExtractElement(v, static_cast<uint64_t>(lane)), storage, element_type());
}

// Lane `lane` of each store to a tensor-shaped slot, put into that store's vector in `stored` (per store).
void GpuKernelEmitter::keep_lane(IRBuilder<>& b, std::vector<Value*>& stored, const std::vector<Value*>& values,
                                 int lanes, int lane) {
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
void GpuKernelEmitter::store_lanes(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& stored,
                                   Value* first, int lanes) {
  for (std::size_t k = 0; k < graph_.stores.size(); ++k)
    if (stored[k]) {
      const int slot = index_in(plan_.abi.tensor_slots, graph_.stores[k].name);
      b.CreateAlignedStore(stored[k], lanes_address(b, bases, slot, first), lanes_align(slot, lanes));
    }
}

// Whether every tensor-shaped slot's element `first` is aligned to a vector of lanes_ (rows and columns slots are
// read one value at a time).
Value* GpuKernelEmitter::lanes_aligned(IRBuilder<>& b, const std::vector<Value*>& bases, Value* first) {
  Value* misaligned = b.getInt64(0);
  for (int slot = 0; slot < static_cast<int>(bases.size()); ++slot)
    if (tensor_slot_kind(slot) == SlotKind::Tensor) {
      Value* address = b.CreatePtrToInt(lanes_address(b, bases, slot, first), i64_);
      misaligned = b.CreateOr(misaligned, b.CreateAnd(address, b.getInt64(lanes_align(slot, lanes_).value() - 1)));
    }
  return b.CreateICmpEQ(misaligned, b.getInt64(0));
}

Value* GpuKernelEmitter::lanes_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* first) {
  return b.CreateGEP(scalar_type(tensor_slot_dtype(slot)), bases[static_cast<std::size_t>(slot)], first);
}

llvm::Align GpuKernelEmitter::lanes_align(int slot, int lanes) {
  return llvm::Align(static_cast<uint64_t>(lanes) * dtype_size(tensor_slot_dtype(slot)));
}

} // namespace emission

void emit_gpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol,
                     const GpuEmulationHooks* emulation) {
  if (plan.has_axis) {
    emission::emit_gpu_axis_kernel(plan, module, symbol, emulation);
  } else {
    emission::GpuKernelEmitter emitter(plan, module, emulation);
    emitter.emit_gpu_kernel(symbol);
  }
  emission::verify_module(module);
}

} // namespace optjit
