// SGD (torch.optim.SGD) with momentum, dampening, nesterov, weight decay and maximize: options, validation with
// torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optimizer.h"

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
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroupSpec> groups, const SGDOptions& options = {});

  Structure structure(const ParamGroup& group) const override;
  std::vector<StateSpec> state_specs(const Structure& structure) const override;
  std::vector<std::string> hyper_names() const override;
  void trace(Tracer& tracer, const Structure& structure) const override;
  void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                    ParamState& state) const override;

protected:
  void validate_options(const OptionMap& options) const override;
};

} // namespace optjit
