// NAdam (torch.optim.NAdam): Adam with Nesterov momentum, a momentum schedule (momentum_decay) whose running
// product mu_product is per-param scalar state, and L2 or decoupled weight decay. Options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct NAdamOptions {
  double lr = 2e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class NAdam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(NAdam, NAdamOptions)

};

} // namespace optjit
