// ASGD (torch.optim.ASGD): averaged SGD. Per-param scalar state eta (the decayed learning rate) and mu (the
// averaging weight, 1 until step t0) drive the update and the running average ax. Options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct ASGDOptions {
  double lr = 1e-2;
  double lambd = 1e-4;
  double alpha = 0.75;
  double t0 = 1e6;
  double weight_decay = 0;
  bool maximize = false;
  std::optional<bool> foreach;
};

class ASGD : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(ASGD, ASGDOptions)

protected:
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
};

} // namespace optjit
