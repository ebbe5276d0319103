#include "compiler/backend.h"
#include "ir/printer.h"
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

// A compiled plan pauses after each kernel that stores list reductions (or, over shards, per-tensor reductions), with
// them in its carried_out order.
std::vector<std::vector<PausedCarry>> Backend::pauses(const PipelineResult& pipeline, Executable::Pauses pauses) const {
  std::vector<std::vector<PausedCarry>> all;
  for (const KernelPlan& kernel : pipeline.kernels)
    if (std::vector<PausedCarry> paused = paused_carries(kernel, pauses == Executable::Pauses::ShardReductionsToo);
        !paused.empty())
      all.push_back(std::move(paused));
  return all;
}

} // namespace optjit
