// The one LLVM optimization pipeline of both targets: O3, tuned for the target machine's CPU and features (the host
// for CPU kernels, sm_XX for PTX). Internal to codegen/: not installed.
#pragma once

#include "codegen/llvm.h"

namespace llvm {
class TargetMachine;
}

namespace optjit {

// Runs LLVM's O3 module pipeline over `module` for `machine`: every defined function gets the machine's target-cpu
// and target-features, so that the vectorizer and instruction selection see the target. The module's data layout
// and triple are the caller's (the CPU sets them after emission, NVPTX before).
void optimize_for_target(llvm::Module& module, llvm::TargetMachine& machine);

} // namespace optjit
