// KernelEmitter: a kernel plan -> LLVM IR functions following runtime/kernel_abi.h. The body emitter (one
// expression DAG over tensor slots and per-tensor scalars) is target-independent; a target only decides how the
// iteration space is split. The CPU split: a tensor-phase loop over tensors, and an element-phase loop over work
// items, each item's range walked with vectors of `lanes` elements and a scalar tail.
#pragma once

#include "codegen/llvm.h"
#include "compiler/ir/kernel_plan.h"

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

// The GPU split (runtime/kernel_abi.h): one kernel entry `symbol`, a block per work item, 128-bit accesses where
// aligned, scalar state written by the last block of each tensor; exp, log and pow from codegen/device_math.h.
void emit_gpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol);

} // namespace optjit
