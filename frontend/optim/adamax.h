// Adamax (torch.optim.Adamax): Adam with an infinity-norm second moment. Options, validation with torch's
// messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_ADAMAX_OPTIONS(X)                                                                                       \
  X(double, lr, 2e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(AdamaxOptions, OPTJIT_ADAMAX_OPTIONS)

class Adamax : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adamax, AdamaxOptions)

protected:
  void check_step_options(const ParamGroup& group, std::size_t index) const override;
};

} // namespace optjit
