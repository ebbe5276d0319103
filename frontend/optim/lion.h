// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2: decoupled weight decay):
// the sign of an interpolated momentum as the update. A built-in written on the public API only, as a user writes an
// optimizer (options declared once, registered by name with register_optimizer), which is the API's first test.
// torch.optim has no Lion; names and defaults follow golden/FORMAT_NEXT.md: lr 1e-4, betas (0.9, 0.99),
// weight_decay 0, maximize false; state exp_avg only (no step).
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

namespace optjit {

#define OPTJIT_LION_OPTIONS(X)                                                                                         \
  X(double, lr, 1e-4)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.99})                                                                          \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(LionOptions, OPTJIT_LION_OPTIONS)

class Lion : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Lion, LionOptions)
};

} // namespace optjit
