// KernelEmitter: a kernel plan -> LLVM IR functions following runtime/kernel_abi.h. The body emitter (one
// expression DAG over tensor slots and per-tensor scalars) is target-independent; a target only decides how the
// iteration space is split. The CPU split: a tensor-phase loop over tensors, and an element-phase loop over work
// items, each item's range walked with vectors of `lanes` elements and a scalar tail.
#pragma once

#include "codegen/llvm.h"
#include "compiler/kernel_plan.h"

namespace optjit {

struct EmittedKernel {
  std::string tensor_phase; // symbol names in the module
  std::string element_phase;
};

EmittedKernel emit_cpu_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol_prefix,
                              int lanes);

} // namespace optjit
