// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2): Adam's bias-corrected ratio plus
// decoupled weight decay, scaled per param tensor by the trust ratio |p| / |u|. Written on the public API, as a user
// writes an optimizer; the two norms are reductions, so a step is two kernels (the norms' pass, then the update).
// torch.optim has no LAMB; names and defaults follow golden/FORMAT_NEXT.md: lr 1e-3, betas (0.9, 0.999), eps 1e-6,
// weight_decay 0, no maximize; state step, exp_avg, exp_avg_sq.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

namespace optjit {

#define OPTJIT_LAMB_OPTIONS(X)                                                                                         \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-6)                                                                                                 \
  X(double, weight_decay, 0)
OPTJIT_DEFINE_OPTIONS(LAMBOptions, OPTJIT_LAMB_OPTIONS)

class LAMB : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(LAMB, LAMBOptions)
};

} // namespace optjit
