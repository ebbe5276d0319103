// The schedulers that cycle: CyclicLR and OneCycleLR (which also cycle momentum, or beta1 for Adam-like
// optimizers, inversely to the lr) and CosineAnnealingWarmRestarts. Not chainable: each computes its lrs from
// its own boundaries rather than from the groups' current lrs.
#pragma once

#include "frontend/schedulers/lr_scheduler.h"

namespace optjit {

struct CyclicLROptions {
  std::vector<double> base_lr; // one value, or one per group
  std::vector<double> max_lr;  // one value, or one per group
  double step_size_up = 2000;
  std::optional<double> step_size_down; // default: step_size_up
  std::string mode = "triangular";      // triangular, triangular2 or exp_range
  double gamma = 1.0;
  std::function<double(double)> scale_fn; // custom scaling; replaces mode
  std::string scale_mode = "cycle";       // cycle or iterations (for a custom scale_fn)
  bool cycle_momentum = true;
  std::vector<double> base_momentum{0.8};
  std::vector<double> max_momentum{0.9};
};

class CyclicLR : public LRScheduler {
public:
  CyclicLR(Optimizer& optimizer, CyclicLROptions options, int64_t last_epoch = -1);
  std::string name() const override { return "CyclicLR"; }

protected:
  std::vector<double> get_lr() override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  double scale(double x) const;

  CyclicLROptions options_;
  std::vector<double> max_lrs_, base_momentums_, max_momentums_;
  double total_size_, step_ratio_;
};

struct OneCycleLROptions {
  std::vector<double> max_lr;         // one value, or one per group
  std::optional<int64_t> total_steps; // or epochs * steps_per_epoch
  std::optional<int64_t> epochs;
  std::optional<int64_t> steps_per_epoch;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos"; // cos or linear
  bool cycle_momentum = true;
  std::vector<double> base_momentum{0.85};
  std::vector<double> max_momentum{0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR : public LRScheduler {
public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options, int64_t last_epoch = -1);
  std::string name() const override { return "OneCycleLR"; }

protected:
  std::vector<double> get_lr() override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;

  struct Phase {
    double end_step;
    std::string start_lr, end_lr, start_momentum, end_momentum; // param group keys
  };
  OneCycleLROptions options_;
  int64_t total_steps_ = 0;
  std::vector<Phase> phases_;
};

class CosineAnnealingWarmRestarts : public LRScheduler {
public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult = 1, double eta_min = 0.0,
                              int64_t last_epoch = -1);
  std::string name() const override { return "CosineAnnealingWarmRestarts"; }
  void step() override;
  // torch's step(epoch) with a fractional epoch (epoch + i / iters within an epoch).
  void step_to_fraction(double epoch);
  void step_to(int64_t epoch) override { step_to_fraction(static_cast<double>(epoch)); }

protected:
  std::vector<double> get_lr() override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  int64_t T_0_, T_i_, T_mult_;
  double eta_min_, T_cur_;
};

} // namespace optjit
