// Adamax (torch.optim.Adamax): Adam with an infinity-norm second moment. Options, validation with torch's
// messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct AdamaxOptions {
  double lr = 2e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool maximize = false;
  std::optional<bool> foreach;
};

class Adamax : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adamax, AdamaxOptions)

};

} // namespace optjit
