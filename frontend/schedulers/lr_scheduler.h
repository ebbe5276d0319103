// torch.optim.lr_scheduler: schedulers that write each param group's lr (and, for the cyclic ones, momentum or
// beta1) between optimizer steps. Every value they write is a runtime argument of the compiled step, so a
// scheduled run compiles once. Semantics follow torch: the constructor performs the epoch-0 update, step()
// advances last_epoch and uses the chainable (recursive) form, step_to(epoch) the closed form where torch has one.
#pragma once

#include "frontend/optim/optimizer.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optjit {

// A scheduler's state_dict(): its fields by name (torch's attribute names), each a list of numbers. Nested
// schedulers (SequentialLR, ChainedScheduler) keep theirs under "_schedulers.<index>.".
using SchedulerState = std::map<std::string, std::vector<double>>;

// The largest count a scheduler takes (epochs, step sizes, periods, milestones), in constructors and loaded state
// alike: 2^53, so every count is exact as a double and the schedules' integer arithmetic cannot overflow int64.
constexpr int64_t kMaxScheduleCount = int64_t{1} << 53;

class LRScheduler {
public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  virtual void step();
  // torch's deprecated step(epoch): jumps to `epoch`, with the closed form where the scheduler has one.
  virtual void step_to(int64_t epoch);
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }
  virtual std::string name() const = 0;

  SchedulerState state_dict() const;
  // Checks that `state` has every field this scheduler saves, each of the same length, each value valid as the
  // constructor would require (counts whole numbers within kMaxScheduleCount, factors finite and in range), then
  // loads it; anything else is an optjit::Error that changes nothing.
  void load_state_dict(const SchedulerState& state);
  void check_state_dict(const SchedulerState& state) const; // the checks alone

protected:
  // last_epoch -1 starts a schedule (each group's initial_lr is its lr); otherwise it resumes one, and every group
  // must have initial_lr.
  LRScheduler(Optimizer& optimizer, int64_t last_epoch);
  // The epoch-0 update, run at the end of the most derived constructor (torch's _initial_step).
  void initial_step();
  // The lrs of the next epoch (last_epoch already advanced), from the groups' current lrs where torch's form is
  // recursive. `initial` is true during the constructor's update.
  virtual std::vector<double> get_lr() = 0;
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  // Fields beyond the base's (last_epoch, _step_count, base_lrs, _last_lr).
  virtual void save_fields(SchedulerState&) const {}
  // check_fields throws for any field load_fields would not take; load_fields then cannot fail.
  virtual void check_fields(const SchedulerState&) const {}
  virtual void load_fields(const SchedulerState&) {}
  // A loaded field's first value as a whole number from `min` to kMaxScheduleCount, or as a finite number; an
  // optjit::Error naming the field otherwise.
  int64_t loaded_count(const SchedulerState& state, const std::string& key, int64_t min) const;
  double loaded_finite(const SchedulerState& state, const std::string& key) const;
  void write_lrs(const std::vector<double>& lrs);
  // f(base_lr) for every group: the closed forms.
  std::vector<double> from_base_lrs(const std::function<double(double)>& f) const;
  std::vector<double> group_values(const std::string& key) const;

  Optimizer& optimizer_;
  int64_t last_epoch_;
  int64_t step_count_ = 0;
  bool initial_ = false;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;

  friend class SequentialLR;
  friend class ChainedScheduler;
};

// Throws "Expected positive integer <what>, but got <value>" (torch's message) unless value > 0.
void require_positive_count(int64_t value, const std::string& what);
// Throws unless every milestone is larger than the one before.
void require_increasing(const std::vector<int64_t>& milestones);

// One number, or one per param group (torch's float-or-list scheduler arguments); `what` names it in errors.
std::vector<double> per_group(const Optimizer& optimizer, const std::vector<double>& values, const std::string& what);

using LrLambda = std::function<double(int64_t epoch)>;

// The lambdas of LambdaLR and MultiplicativeLR: one for every group, or one per group.
class LambdaScheduler : public LRScheduler {
protected:
  LambdaScheduler(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch);
  std::vector<LrLambda> lambdas_;
};

// lr = base_lr * lambda(epoch).
class LambdaLR : public LambdaScheduler {
public:
  LambdaLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch = -1);
  std::string name() const override { return "LambdaLR"; }

protected:
  std::vector<double> get_lr() override;
};

// lr *= lambda(epoch) for every epoch >= 1.
class MultiplicativeLR : public LambdaScheduler {
public:
  MultiplicativeLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch = -1);
  std::string name() const override { return "MultiplicativeLR"; }

protected:
  std::vector<double> get_lr() override;
};

class StepLR : public LRScheduler {
public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1, int64_t last_epoch = -1);
  std::string name() const override { return "StepLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  int64_t step_size_;
  double gamma_;
};

class MultiStepLR : public LRScheduler {
public:
  // Milestones must be increasing (a repeated milestone would decay twice: torch counts repeats).
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1, int64_t last_epoch = -1);
  std::string name() const override { return "MultiStepLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  std::vector<int64_t> milestones_;
  double gamma_;
};

class ConstantLR : public LRScheduler {
public:
  ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5, int64_t last_epoch = -1);
  std::string name() const override { return "ConstantLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  double factor_;
  int64_t total_iters_;
};

class LinearLR : public LRScheduler {
public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5,
           int64_t last_epoch = -1);
  std::string name() const override { return "LinearLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

class ExponentialLR : public LRScheduler {
public:
  ExponentialLR(Optimizer& optimizer, double gamma, int64_t last_epoch = -1);
  std::string name() const override { return "ExponentialLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  double gamma_;
};

class PolynomialLR : public LRScheduler {
public:
  PolynomialLR(Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0, int64_t last_epoch = -1);
  std::string name() const override { return "PolynomialLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  int64_t total_iters_;
  double power_;
};

class CosineAnnealingLR : public LRScheduler {
public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0, int64_t last_epoch = -1);
  std::string name() const override { return "CosineAnnealingLR"; }

protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  int64_t T_max_;
  double eta_min_;
};

} // namespace optjit
