#include "codegen/cuda/gpu_intrinsics.h"

namespace optjit::emission {

llvm::Value* gpu_register(llvm::IRBuilder<>& b, llvm::Intrinsic::ID id, const GpuEmulationHooks* emulation) {
  if (!emulation)
    return b.CreateIntrinsic(id, {}, {});
  const auto hook = id == llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x    ? emulation->thread_index
                    : id == llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x ? emulation->block_threads
                                                                       : emulation->block_index;
  return call_host_hook(b, reinterpret_cast<uintptr_t>(hook), b.getInt32Ty());
}

void gpu_barrier(llvm::IRBuilder<>& b, const GpuEmulationHooks* emulation) {
  if (!emulation)
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  else
    call_host_hook(b, reinterpret_cast<uintptr_t>(emulation->barrier), b.getVoidTy());
}

void gpu_fence(llvm::IRBuilder<>& b, const GpuEmulationHooks* emulation) {
  if (!emulation)
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_membar_gl, {}, {});
  else
    b.CreateFence(llvm::AtomicOrdering::SequentiallyConsistent);
}

llvm::Value* call_host_hook(llvm::IRBuilder<>& b, uintptr_t address, llvm::Type* result) {
  auto* type = llvm::FunctionType::get(result, false);
  return b.CreateCall(type, b.CreateIntToPtr(b.getInt64(address), b.getPtrTy()));
}

// No thread count is declared (maxntidx): ptxas then caps no register count, never spills to fit 512 threads, and
// the launch takes the threads the kernel's registers allow (GpuModule::max_block_threads).
void annotate_gpu_kernel(llvm::Module& module, llvm::Function* fn, int max_registers) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::NamedMDNode* annotations = module.getOrInsertNamedMetadata("nvvm.annotations");
  auto entry = [&](const char* key, int value) {
    llvm::Metadata* parts[] = {
        llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx, key),
        llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), value))};
    annotations->addOperand(llvm::MDNode::get(ctx, parts));
  };
  entry("kernel", 1);
  if (max_registers > 0)
    entry("maxnreg", max_registers);
}

} // namespace optjit::emission
