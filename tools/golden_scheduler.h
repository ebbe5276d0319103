// The LR scheduler of a golden case, built from its name and torch keyword options, stepped as the case's
// replay procedure says (ReduceLROnPlateau with the recorded metric).
#pragma once

#include "frontend/schedulers/lr_scheduler.h"
#include "frontend/schedulers/plateau_scheduler.h"

#include <nlohmann/json.hpp>

#include <memory>

namespace optjit {

class GoldenScheduler {
public:
  // `spec` is the case's "scheduler" object: {"name", "options", "metrics"?}. Throws optjit::Error for a scheduler
  // or lr_lambda expression optjit's replay does not know.
  GoldenScheduler(const nlohmann::json& spec, Optimizer& optimizer);
  void step_after(std::size_t optimizer_step); // scheduler.step(), or step(metrics[t])

private:
  std::unique_ptr<LRScheduler> scheduler_;
  std::unique_ptr<ReduceLROnPlateau> plateau_;
  std::vector<double> metrics_;
};

// The lr_lambda expressions of the golden cases ("0.95 ** epoch", ...) as C++ callables.
LrLambda golden_lr_lambda(const std::string& expression);

} // namespace optjit
