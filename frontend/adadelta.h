// Adadelta (torch.optim.Adadelta): options, validation with torch's messages, the traced foreach algorithm and the
// forloop reference.
#pragma once

#include "frontend/optimizer.h"

#include <optional>

namespace optjit {

struct AdadeltaOptions {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0;
  bool maximize = false;
  std::optional<bool> foreach;
};

class Adadelta : public Optimizer {
public:
  Adadelta(std::vector<Tensor> params, const AdadeltaOptions& options = {});
  Adadelta(std::vector<ParamGroupSpec> groups, const AdadeltaOptions& options = {});

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
