// Rprop (torch.optim.Rprop): resilient backpropagation. Each element keeps its own step size, grown by etaplus
// while its gradient keeps its sign and shrunk by etaminus when the sign flips, clamped to step_sizes; lr is
// only the step size a param starts with. Options, validation with torch's messages, the traced foreach algorithm
// and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_RPROP_OPTIONS(X)                                                                                        \
  X(double, lr, 1e-2)                                                                                                  \
  X(OptionPair, etas, OptionPair{0.5, 1.2})                                                                            \
  X(OptionPair, step_sizes, OptionPair{1e-6, 50})                                                                      \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(RpropOptions, OPTJIT_RPROP_OPTIONS)

class Rprop : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Rprop, RpropOptions)

protected:
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
  // lr is no hyperparameter of the kernel, but it seeds each new param's step sizes: checked at every step too.
  std::vector<std::string> step_options() const override;
};

} // namespace optjit
