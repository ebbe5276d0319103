#include "compiler/backend.h"
#include "compiler/ir/printer.h"
#include "runtime/error.h"

namespace optjit {

const Backend& backend_for(const Target& target) {
  if (target.execution == Execution::Interpreted)
    return interpreter_backend();
  switch (target.device.kind) {
  case DeviceKind::cpu:
    return cpu_backend();
  case DeviceKind::cuda:
    return gpu_backend();
  }
  OPTJIT_ASSERT(false, "unknown device kind");
}

std::string kernel_cache_key(const KernelPlan& plan, const Target& target) {
  return target.cache_key() + "|" + print_kernel_plan(plan);
}

// A compiled plan pauses after each kernel that stores list reductions, with them in its carried_out order.
std::vector<std::vector<CarryKind>> Backend::list_pauses(const PipelineResult& pipeline) const {
  std::vector<std::vector<CarryKind>> pauses;
  for (const KernelPlan& kernel : pipeline.kernels) {
    std::vector<CarryKind> kinds;
    for (std::size_t c : list_carry_columns(kernel))
      kinds.push_back(kernel.carry_kinds[c]);
    if (!kinds.empty())
      pauses.push_back(std::move(kinds));
  }
  return pauses;
}

} // namespace optjit
