// Adadelta (torch.optim.Adadelta): options, validation with torch's messages, the traced foreach algorithm and the
// forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_ADADELTA_OPTIONS(X)                                                                                     \
  X(double, lr, 1.0)                                                                                                   \
  X(double, rho, 0.9)                                                                                                  \
  X(double, eps, 1e-6)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(AdadeltaOptions, OPTJIT_ADADELTA_OPTIONS)

class Adadelta : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adadelta, AdadeltaOptions)
};

} // namespace optjit
