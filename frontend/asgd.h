// ASGD (torch.optim.ASGD): averaged SGD. Per-param scalar state eta (the decayed learning rate) and mu (the
// averaging weight, 1 until step t0) drive the update and the running average ax. Options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optimizer.h"

#include <optional>

namespace optjit {

struct ASGDOptions {
  double lr = 1e-2;
  double lambd = 1e-4;
  double alpha = 0.75;
  double t0 = 1e6;
  double weight_decay = 0;
  bool maximize = false;
  std::optional<bool> foreach;
};

class ASGD : public Optimizer {
public:
  ASGD(std::vector<Tensor> params, const ASGDOptions& options = {});
  ASGD(std::vector<ParamGroupSpec> groups, const ASGDOptions& options = {});

  Structure structure(const ParamGroup& group) const override;
  std::vector<StateSpec> state_specs(const Structure& structure) const override;
  std::vector<std::string> hyper_names() const override;
  void trace(Tracer& tracer, const Structure& structure) const override;
  void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                    ParamState& state) const override;

protected:
  void validate_options(const OptionMap& options) const override;
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
};

} // namespace optjit
