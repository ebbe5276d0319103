// Adafactor as torch.optim.Adafactor (torch 2.15; golden/FORMAT_NEXT.md): a second moment factored into row and
// column means for params of rank >= 2 (state row_var [..., m, 1] and col_var [..., 1, n]), a full one (variance)
// for the others, a relative step size alpha = max(eps2, RMS(p)) * min(lr, 1/sqrt(t)), and the update clipped by
// its own RMS (d). Written on the public API; its means and norms are reductions, so a factored step is four
// kernels (the grads' row and column means with |p|; the new row variances' mean; |U|; the update) and a step of
// the others two (|p| and |U|; the update).
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

namespace optjit {

// eps's first element given as None (torch's default): the machine epsilon of the param's dtype, at every step.
#define OPTJIT_ADAFACTOR_OPTIONS(X)                                                                                    \
  X(double, lr, 1e-2)                                                                                                  \
  X(double, beta2_decay, -0.8)                                                                                         \
  X(OptionPair, eps, OptionPair{kOptionNone, 1e-3})                                                                    \
  X(double, d, 1.0)                                                                                                    \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(AdafactorOptions, OPTJIT_ADAFACTOR_OPTIONS)

class Adafactor : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adafactor, AdafactorOptions)
  void param_structure(const Tensor& param, Structure& s) const override;
  bool has_param_structure() const override { return true; }
  void check_grad(int64_t flat) const override;
  double hyper_value(const ParamGroup& group, const std::string& name) const override;
  std::string state_dtype_refusal(const ParamGroup&) const override {
    return "its second moment is already factored into a row and a column vector per matrix";
  }
};

} // namespace optjit
