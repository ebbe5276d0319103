// Adam and AdamW (torch.optim.Adam / AdamW): options, validation with torch's messages, the traced foreach
// algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>

namespace optjit {

// decoupled_weight_decay: the decay AdamW applies (torch 2.x Adam takes it too)
#define OPTJIT_ADAM_OPTIONS(X)                                                                                         \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, amsgrad, false)                                                                                              \
  X(bool, maximize, false)                                                                                             \
  X(bool, decoupled_weight_decay, false)
OPTJIT_DEFINE_OPTIONS(AdamOptions, OPTJIT_ADAM_OPTIONS)

#define OPTJIT_ADAMW_OPTIONS(X)                                                                                        \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 1e-2)                                                                                        \
  X(bool, amsgrad, false)                                                                                              \
  X(bool, maximize, false)
OPTJIT_DEFINE_OPTIONS(AdamWOptions, OPTJIT_ADAMW_OPTIONS)

class Adam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adam, AdamOptions)

protected:
  Adam(std::string name, std::vector<ParamGroupSpec> groups, const AdamOptions& options);
  bool loads_state_of(const std::string& saved) const override; // Adam's and AdamW's (torch's test_adamw_serialization)
  void check_step_options(const ParamGroup& group, std::size_t index) const override;
};

class AdamW : public Adam {
public:
  using Options = AdamWOptions;
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroupSpec> groups, const AdamWOptions& options = {});

protected:
  void adjust_loaded_options(OptionMap& options) const override; // decoupled_weight_decay stays true
};

} // namespace optjit
