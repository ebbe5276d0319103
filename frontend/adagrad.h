// Adagrad (torch.optim.Adagrad) with lr decay, an initial accumulator, weight decay and maximize: options,
// validation with torch's messages, the traced foreach algorithm and the forloop reference. As in torch, every
// param's state (step 0, sum filled with initial_accumulator_value) exists from construction on.
#pragma once

#include "frontend/optimizer.h"

#include <optional>

namespace optjit {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;
  std::optional<bool> foreach;
};

class Adagrad : public Optimizer {
public:
  Adagrad(std::vector<Tensor> params, const AdagradOptions& options = {});
  Adagrad(std::vector<ParamGroupSpec> groups, const AdagradOptions& options = {});

  Structure structure(const ParamGroup& group) const override;
  std::vector<StateSpec> state_specs(const Structure& structure) const override;
  std::vector<std::string> hyper_names() const override;
  void trace(Tracer& tracer, const Structure& structure) const override;
  void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                    ParamState& state) const override;

protected:
  void validate_options(const OptionMap& options) const override;
  double initial_state_value(const ParamGroup& group, const StateSpec& spec) const override;
  bool creates_state_on_add() const override { return true; }
};

} // namespace optjit
