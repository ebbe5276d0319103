#include "compiler/backend.h"
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

} // namespace optjit
