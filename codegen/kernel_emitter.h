// The kernel emitters: a kernel plan -> LLVM IR functions following runtime/kernel_abi.h. Every target shares the
// body (codegen/kernel_body.h: one expression DAG over tensor slots and per-tensor scalars); a target decides how the
// iteration space is split. The CPU split (codegen/cpu_kernel.cpp): a tensor-phase loop over tensors, and an
// element-phase loop over work items, each item's range walked with vectors of `lanes` elements and a scalar tail.
// The GPU split: codegen/cuda/gpu_kernel.cpp and codegen/cuda/axis_sweeps.cpp.
#pragma once

#include "codegen/llvm.h"
#include "ir/kernel_plan.h"
#include "runtime/kernel_abi.h"

#include <cstdint>

namespace optjit {

struct EmittedKernel {
  std::string tensor_phase; // symbol names in the module
  std::string element_phase;
  std::string finish_phase; // empty when the kernel ends with no reduction
};

// `native_bf16`: the CPU converts f32 to bf16 in one instruction (AVX512-BF16's vcvtneps2bf16, which flushes
// subnormals): stores to bf16 use it, and take the exact integer rounding only for vectors holding a subnormal.
EmittedKernel emit_cpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol_prefix, int lanes,
                              bool native_bf16 = false);

// What a GPU kernel run on host threads calls for its thread and block registers and its block barrier
// (codegen/cuda/gpu_emulation.cpp); its global and shared memory are host memory.
struct GpuEmulationHooks {
  uint32_t (*thread_index)();  // %tid.x
  uint32_t (*block_threads)(); // %ntid.x
  uint32_t (*block_index)();   // %ctaid.x
  void (*barrier)();           // bar.sync 0
};

// The GPU split (runtime/kernel_abi.h): one kernel entry `symbol`, a block per work item, 128-bit accesses where
// aligned, scalar state written by the last block of each tensor; exp, log and pow from codegen/cuda/device_math.h.
// With `emulation`, the same kernel for the host CPU, calling the hooks (an ordinary C function of the GPU
// parameters).
void emit_gpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol,
                     const GpuEmulationHooks* emulation = nullptr);

// The grad total kernel (runtime/kernel_abi.h's GpuGradTotalHeader) of `form` as entry `symbol`(descriptor); with
// `emulation`, for the host CPU.
void emit_grad_total_kernel(llvm::Module& module, const std::string& symbol, GpuGradTotalForm form,
                            const GpuEmulationHooks* emulation = nullptr);

} // namespace optjit
