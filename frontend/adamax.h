// Adamax (torch.optim.Adamax): Adam with an infinity-norm second moment. Options, validation with torch's
// messages, the traced foreach algorithm and the forloop reference.
#pragma once

#include "frontend/optimizer.h"

#include <optional>

namespace optjit {

struct AdamaxOptions {
  double lr = 2e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool maximize = false;
  std::optional<bool> foreach;
};

class Adamax : public Optimizer {
public:
  Adamax(std::vector<Tensor> params, const AdamaxOptions& options = {});
  Adamax(std::vector<ParamGroupSpec> groups, const AdamaxOptions& options = {});

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
