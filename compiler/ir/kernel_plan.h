// What fusion decides and what codegen consumes. A FusionPlan says which node goes to which kernel and why; a
// KernelPlan is one kernel ready for codegen: its nodes in phase order (per-tensor prologue first), its ABI
// layout, and the per-tensor values that cross from the tensor phase to the element phase (scratch).
#pragma once

#include "compiler/ir/ir.h"

#include <string>
#include <vector>

namespace optjit {

struct FusionPlan {
  std::vector<int> kernel_of;         // per node: the kernel that computes it
  int kernel_count = 0;
  std::vector<std::string> decisions; // why nodes were grouped (or refused), one line each
};

struct KernelPlan {
  std::string name;
  Graph graph;                   // the kernel's nodes (per-tensor prefix, then element nodes) and stores
  GraphSignature abi;            // slot and hyperparameter order of the kernel's arguments
  std::vector<ValueId> scratch;  // per-tensor values read by the element phase, in scratch order
  int prologue_size = 0;         // nodes [0, prologue_size) are per-tensor
};

struct KernelStats {
  int kernels = 0;               // launches per step after fusion
  int unfused_kernels = 0;       // launches per step op by op (one per element op, as eager foreach)
  int element_ops = 0;           // arithmetic per element
  int per_tensor_ops = 0;        // arithmetic per tensor
  int bytes_per_element = 0;     // tensor bytes read + written per element
};

// The text of a kernel plan, deterministic: a header with the ABI and scratch, then the graph.
std::string print_kernel_plan(const KernelPlan& plan);

} // namespace optjit
