// GpuKernelEmitter: the GPU split of a kernel plan (runtime/kernel_abi.h's GPU ABI), for NVPTX or for host threads
// (codegen/cuda/gpu_emulation.cpp): a block per work item, threads striding over its elements, reductions through a
// block's tree in shared memory, and the last block of each tensor writing its scalar state and carried values.
// codegen/cuda/gpu_kernel.cpp defines it and the plain kernel; codegen/cuda/axis_sweeps.cpp derives the kernel of
// plans that read or write rows and columns. Internal to codegen/: not installed.
#pragma once

#include "codegen/kernel_body.h"

namespace optjit::emission {

// The registers a GPU axis kernel may use (.maxnreg): two blocks of 512 threads per SM. Its warps wait on long
// chains per element (a row's and a column's values, several divisions), so warps in flight pay more than the
// registers ptxas would take (124 to 148, one block per SM) and the few spills the cap costs. On an H200, Adafactor's
// f32 kernels over a Transformer encoder's matrices: 347 -> 204 us (update) and 179 -> 139 us (its RMS); 80 or 96
// registers gained less (264, 256 us: still one block per SM).
constexpr int kGpuAxisMaxRegisters = 64;
// The most values a GPU thread buffers while it walks a block (a block of each quantized store, in its local memory:
// 8 KB, which the driver reserves for every thread an SM can hold).
constexpr int64_t kGpuMaxBufferedValues = 2048;
// The static shared memory of a GPU block.
constexpr std::size_t kGpuStaticSharedBytes = 48 * 1024;

class GpuKernelEmitter : public KernelBody {
public:
  GpuKernelEmitter(const KernelPlan& plan, llvm::Module& module, const GpuEmulationHooks* emulation);

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
  GpuEntry begin_gpu_kernel(IRBuilder<>& b, const std::string& symbol);
  // What every GPU kernel ends with: the block's reductions, then the last block of the tensor writes its scalar
  // state and carried values (after `last_block`, which every thread of that block runs, when given).
  void end_gpu_kernel(IRBuilder<>& b, const GpuEntry& e, const std::function<void()>& last_block = {});
  // The GPU kernel (runtime/kernel_abi.h): block = work item, threads stride over its elements `lanes` at a time
  // (128-bit accesses when every slot's address of the item is aligned, scalar ones otherwise), then one at a time
  // over the item's last elements.
  void emit_gpu_kernel(const std::string& symbol);
  // The element walk of a kernel that stores block-quantized state: each thread walks whole blocks of its item.
  void emit_gpu_block_walk(IRBuilder<>& b, GpuEntry& e, int64_t block);
  // The GPU's thread and block registers (%tid.x, %ntid.x, %ctaid.x), its block barrier and its global memory fence;
  // in emulation, calls to the emulator's hooks and a host fence.
  Value* gpu_register(IRBuilder<>& b, llvm::Intrinsic::ID id);
  void gpu_barrier(IRBuilder<>& b);
  void gpu_fence(IRBuilder<>& b);
  // A call of the host function at `address`, of no arguments.
  Value* call_hook(IRBuilder<>& b, uintptr_t address, llvm::Type* result);
  // Marks `fn` as a kernel entry (nvvm.annotations). No thread count is declared (maxntidx): ptxas then caps no
  // register count, never spills to fit 512 threads, and the launch takes the threads the kernel's registers allow
  // (GpuModule::max_block_threads). `max_registers` > 0 caps them (.maxnreg) all the same (axis kernels).
  void annotate_kernel(llvm::Function* fn, int max_registers);
  // `lanes_` elements from index j with one vector load per slot read and one vector store per slot written (128
  // bits for slots stored in the compute dtype); the arithmetic runs lane by lane (device math is scalar).
  void emit_gpu_vector_body(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& per_tensor,
                            Value* j, const std::vector<llvm::AllocaInst*>& thread_acc);
  // A block's shared memory of `count` doubles (address space 3; host memory in emulation, where blocks run one
  // after another).
  llvm::GlobalVariable* shared_doubles(std::size_t count, const std::string& name);
  // The block's value of each reduction, valid in thread 0: every thread's accumulator in shared memory, then a tree
  // that halves the stride from kGpuMaxBlockThreads / 2 (threads past the block's size take no part), so the order
  // depends only on the block's size. Up to kBlockReductionsAtOnce reductions share one pass of the tree (their
  // shared memory, 4 KB each, counts against the block's 48 KB), more take several passes.
  std::vector<Value*> emit_block_reduction(IRBuilder<>& b, llvm::Function* fn,
                                           const std::vector<llvm::AllocaInst*>& thread_acc, Value* thread,
                                           Value* threads);
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
                                  const BlockReductions& reductions, const std::function<void()>& last_block);
  // Tensor slot `slot` at element j, lane `lane` of the `lanes` elements from element `first`: a tensor-shaped slot
  // from one vector load of them (made on first use, kept in `loaded`), a rows or columns slot on its own.
  Value* load_lane(IRBuilder<>& b, const std::vector<Value*>& bases, std::vector<Value*>& loaded, Value* first,
                   int lanes, int lane, int slot, Value* j);
  // Lane `lane` of each store to a tensor-shaped slot, put into that store's vector in `stored` (per store).
  void keep_lane(IRBuilder<>& b, std::vector<Value*>& stored, const std::vector<Value*>& values, int lanes, int lane);
  // Each vector of `stored` (keep_lane's) written from element `first`: one vector store per slot.
  void store_lanes(IRBuilder<>& b, const std::vector<Value*>& bases, const std::vector<Value*>& stored, Value* first,
                   int lanes);
  // Whether every tensor-shaped slot's element `first` is aligned to a vector of lanes_ (rows and columns slots are
  // read one value at a time).
  Value* lanes_aligned(IRBuilder<>& b, const std::vector<Value*>& bases, Value* first);
  Value* lanes_address(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* first);
  llvm::Align lanes_align(int slot, int lanes);

protected:
  const GpuEmulationHooks* emulation_; // GPU kernels run on host threads (gpu_emulation.cpp); null on a GPU
  std::size_t shared_bytes_ = 0;       // of the GPU kernel being emitted (shared_doubles)
};

// The GPU kernel of a plan with rows and columns (codegen/cuda/axis_sweeps.cpp).
void emit_gpu_axis_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol,
                          const GpuEmulationHooks* emulation);

} // namespace optjit::emission
