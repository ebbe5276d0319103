// Adam and AdamW (torch.optim.Adam / AdamW): options, validation with torch's messages, the traced foreach
// algorithm and the forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

#include <optional>

namespace optjit {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  std::optional<bool> foreach; // default: false on the CPU, as torch
  bool decoupled_weight_decay = false; // AdamW's decay
};

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  std::optional<bool> foreach;
};

class Adam : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Adam, AdamOptions)

protected:
  Adam(std::string name, std::vector<ParamGroupSpec> groups, const AdamOptions& options);
};

class AdamW : public Adam {
public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroupSpec> groups, const AdamWOptions& options = {});
};

} // namespace optjit
