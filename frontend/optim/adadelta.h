// Adadelta (torch.optim.Adadelta): options, validation with torch's messages, the traced foreach algorithm and the
// forloop reference.
#pragma once

#include "frontend/optim/optimizer.h"

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
  OPTJIT_DECLARE_OPTIMIZER(Adadelta, AdadeltaOptions)

};

} // namespace optjit
