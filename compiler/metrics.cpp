#include "compiler/metrics.h"

namespace optjit {

std::string StepMetrics::summary() const {
  return "compiles=" + std::to_string(compiles) + " recompiles=" + std::to_string(recompiles) +
         " rebinds=" + std::to_string(rebinds) + " kernels=" + std::to_string(kernels_generated + cache_hits);
}

} // namespace optjit
