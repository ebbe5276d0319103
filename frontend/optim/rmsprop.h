// RMSprop (torch.optim.RMSprop) with alpha, centering, momentum, weight decay and maximize: options, validation
// with torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

#define OPTJIT_RMSPROP_OPTIONS(X)                                                                                      \
  X(double, lr, 1e-2)                                                                                                  \
  X(double, alpha, 0.99)                                                                                               \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(double, momentum, 0)                                                                                               \
  X(bool, centered, false)                                                                                             \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(RMSpropOptions, OPTJIT_RMSPROP_OPTIONS)

class RMSprop : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(RMSprop, RMSpropOptions)
  std::string state_dtype_refusal(const ParamGroup& group) const override {
    return group.get("centered") != 0 ? "centered=True takes the square root of square_avg - grad_avg^2, which two "
                                        "moments rounded apart can make negative (NaN params; bitsandbytes refuses it "
                                        "too)"
                                      : "";
  }
};

} // namespace optjit
