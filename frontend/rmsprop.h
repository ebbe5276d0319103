// RMSprop (torch.optim.RMSprop) with alpha, centering, momentum, weight decay and maximize: options, validation
// with torch's messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optimizer.h"

#include <optional>

namespace optjit {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class RMSprop : public Optimizer {
public:
  RMSprop(std::vector<Tensor> params, const RMSpropOptions& options = {});
  RMSprop(std::vector<ParamGroupSpec> groups, const RMSpropOptions& options = {});

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
