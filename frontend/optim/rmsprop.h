// RMSprop (torch.optim.RMSprop) with alpha, centering, momentum, weight decay and maximize: options, validation
// with torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class RMSprop : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(RMSprop, RMSpropOptions)

};

} // namespace optjit
