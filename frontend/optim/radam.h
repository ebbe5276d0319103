// RAdam (torch.optim.RAdam): Adam with the variance rectification of Liu et al.; steps whose approximated SMA
// length rho_t is at most 5 take an unrectified momentum step. L2 or decoupled weight decay. Options,
// validation with torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct RAdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled_weight_decay = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class RAdam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(RAdam, RAdamOptions)

};

} // namespace optjit
