// What every emitted GPU kernel asks of its machine, for NVPTX or for host threads (codegen/cuda/gpu_emulation.cpp):
// its thread and block registers, its block barrier, its global memory fence and its kernel annotation. The plan
// kernels (codegen/cuda/gpu_kernel_emitter.h) and the fixed ones (codegen/cuda/grad_total_kernel.cpp) share them.
// Internal to codegen/: not installed.
#pragma once

#include "codegen/kernel_emitter.h"
#include "codegen/llvm.h"

#include <cstdint>

namespace optjit::emission {

// %tid.x, %ntid.x or %ctaid.x (`id`, an nvvm_read_ptx_sreg intrinsic) as an i32; with `emulation`, a call of its hook.
llvm::Value* gpu_register(llvm::IRBuilder<>& b, llvm::Intrinsic::ID id, const GpuEmulationHooks* emulation);
// bar.sync 0; with `emulation`, a call of its barrier hook.
void gpu_barrier(llvm::IRBuilder<>& b, const GpuEmulationHooks* emulation);
// membar.gl; with `emulation`, a host fence.
void gpu_fence(llvm::IRBuilder<>& b, const GpuEmulationHooks* emulation);
// A call of the host function at `address`, of no arguments.
llvm::Value* call_host_hook(llvm::IRBuilder<>& b, uintptr_t address, llvm::Type* result);
// Marks `fn` as a kernel entry (nvvm.annotations); `max_registers` > 0 caps its registers (.maxnreg).
void annotate_gpu_kernel(llvm::Module& module, llvm::Function* fn, int max_registers);

} // namespace optjit::emission
