// ASGD (torch.optim.ASGD): averaged SGD. Per-param scalar state eta (the decayed learning rate) and mu (the
// averaging weight, 1 until step t0) drive the update and the running average ax. Options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_ASGD_OPTIONS(X)                                                                                         \
  X(double, lr, 1e-2)                                                                                                  \
  X(double, lambd, 1e-4)                                                                                               \
  X(double, alpha, 0.75)                                                                                               \
  X(double, t0, 1e6)                                                                                                   \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(ASGDOptions, OPTJIT_ASGD_OPTIONS)

class ASGD : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(ASGD, ASGDOptions)
  std::string state_dtype_refusal(const ParamGroup&) const override {
    return "its state 'ax' is an average of the param, which 8 or 4 bits would round to no use";
  }

protected:
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
};

} // namespace optjit
