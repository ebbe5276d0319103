// LARS (You, Gitman and Ginsburg 2017), with the MLPerf reference's semantics: per param tensor a trust ratio
// eta * |w| / (|g| + weight_decay * |w| + eps) scales the learning rate (1 where either norm is 0), and momentum
// carries the scaled step: v = momentum * v + lr * trust * (g + weight_decay * w); w -= v. A group with
// exclude_1d=true steps its params of rank <= 1 (biases, norm scales) without adaptation and without weight decay,
// as MLPerf's skip list does. Written on the public API; the norms are reductions, so a step is two kernels.
// torch.optim has no LARS; defaults: lr 0.1, momentum 0.9, weight_decay 0, trust_coefficient 0.001, eps 0,
// exclude_1d false. State: momentum_buffer (zeros when created).
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

namespace optjit {

#define OPTJIT_LARS_OPTIONS(X)                                                                                         \
  X(double, lr, 0.1)                                                                                                   \
  X(double, momentum, 0.9)                                                                                             \
  X(double, weight_decay, 0)                                                                                           \
  X(double, trust_coefficient, 1e-3)                                                                                   \
  X(double, eps, 0)                                                                                                    \
  X(bool, exclude_1d, false)
OPTJIT_DEFINE_OPTIONS(LARSOptions, OPTJIT_LARS_OPTIONS)

class LARS : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(LARS, LARSOptions)
  void param_structure(const Tensor& param, Structure& s) const override;
  bool has_param_structure() const override { return true; }
};

} // namespace optjit
