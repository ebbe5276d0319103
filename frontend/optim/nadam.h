// NAdam (torch.optim.NAdam): Adam with Nesterov momentum, a momentum schedule (momentum_decay) whose running
// product mu_product is per-param scalar state, and L2 or decoupled weight decay. Options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_NADAM_OPTIONS(X)                                                                                        \
  X(double, lr, 2e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(double, momentum_decay, 4e-3)                                                                                      \
  X(bool, decoupled_weight_decay, false)                                                                               \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(NAdamOptions, OPTJIT_NADAM_OPTIONS)

class NAdam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(NAdam, NAdamOptions)
};

} // namespace optjit
