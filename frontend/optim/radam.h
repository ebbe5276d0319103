// RAdam (torch.optim.RAdam): Adam with the variance rectification of Liu et al.; steps whose approximated SMA
// length rho_t is at most 5 take an unrectified momentum step. L2 or decoupled weight decay. Options,
// validation with torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_RADAM_OPTIONS(X)                                                                                        \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, decoupled_weight_decay, false)                                                                               \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(RAdamOptions, OPTJIT_RADAM_OPTIONS)

class RAdam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(RAdam, RAdamOptions)
};

} // namespace optjit
