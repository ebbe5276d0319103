#include "compiler/target.h"
#include "codegen/codegen.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

namespace optjit {

Target Target::for_device(const Device& device, Execution execution) {
  Target target;
  target.execution = execution;
  target.device = device;
  if (execution == Execution::Interpreted) {
    target.isa = "interpreter";
    return target;
  }
  switch (device.kind) {
  case DeviceKind::cpu:
    target.isa = host_cpu_description();
    break;
  case DeviceKind::cuda: {
    const cuda::DeviceProperties& p = cuda::properties(device.index);
    target.sm = gpu_target_sm(p.major, p.minor);
    target.isa = fmt::format("sm_{}", target.sm);
    break;
  }
  }
  return target;
}

Target Target::cuda_code(int sm) {
  Target target;
  target.device = Device::cuda(0);
  target.sm = sm;
  target.isa = fmt::format("sm_{}", sm);
  return target;
}

std::string Target::cache_key() const { return device.to_string() + "|" + isa; }

} // namespace optjit
