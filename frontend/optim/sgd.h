// SGD (torch.optim.SGD) with momentum, dampening, nesterov, weight decay and maximize: options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class SGD : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(SGD, SGDOptions)

};

} // namespace optjit
