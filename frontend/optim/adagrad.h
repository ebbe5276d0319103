// Adagrad (torch.optim.Adagrad) with lr decay, an initial accumulator, weight decay and maximize: options,
// validation with torch's messages, the traced foreach algorithm and the forloop reference. As in torch, every
// param's state (step 0, sum filled with initial_accumulator_value) exists from construction on.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_ADAGRAD_OPTIONS(X)                                                                                      \
  X(double, lr, 1e-2)                                                                                                  \
  X(double, lr_decay, 0)                                                                                               \
  X(double, weight_decay, 0)                                                                                           \
  X(double, initial_accumulator_value, 0)                                                                              \
  X(double, eps, 1e-10)                                                                                                \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(AdagradOptions, OPTJIT_ADAGRAD_OPTIONS)

class Adagrad : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adagrad, AdagradOptions)

protected:
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
  bool creates_state_on_add() const override { return true; }
};

} // namespace optjit
