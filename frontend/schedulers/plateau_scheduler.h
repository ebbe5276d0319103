// ReduceLROnPlateau: lowers each group's lr by `factor` when a metric passed to step(metric) has not improved
// for `patience` epochs, then waits `cooldown` epochs. Not chainable: it reads no schedule, only the metric.
#pragma once

#include "frontend/schedulers/lr_scheduler.h"

namespace optjit {

struct ReduceLROnPlateauOptions {
  std::string mode = "min"; // min or max
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  std::string threshold_mode = "rel"; // rel or abs
  int64_t cooldown = 0;
  std::vector<double> min_lr{0.0}; // one value, or one per group
  double eps = 1e-8;
};

class ReduceLROnPlateau {
public:
  ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  void step(double metric);
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  std::string name() const { return "ReduceLROnPlateau"; }
  SchedulerState state_dict() const;
  void load_state_dict(const SchedulerState& state); // a missing field is an error that changes nothing

private:
  bool is_better(double value) const;
  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_, last_lr_;
  int64_t last_epoch_ = 0, cooldown_counter_ = 0, num_bad_epochs_ = 0;
  double best_;
};

} // namespace optjit
