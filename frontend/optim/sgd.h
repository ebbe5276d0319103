// SGD (torch.optim.SGD) with momentum, dampening, nesterov, weight decay and maximize: options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_SGD_OPTIONS(X)                                                                                          \
  X(double, lr, 1e-3)                                                                                                  \
  X(double, momentum, 0)                                                                                               \
  X(double, dampening, 0)                                                                                              \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, nesterov, false)                                                                                             \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(SGDOptions, OPTJIT_SGD_OPTIONS)

class SGD : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(SGD, SGDOptions)
};

} // namespace optjit
