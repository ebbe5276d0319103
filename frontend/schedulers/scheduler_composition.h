// Schedulers made of schedulers: SequentialLR hands the schedule from one scheduler to the next at milestones;
// ChainedScheduler steps several chainable schedulers one after another every epoch. Both hold their parts
// (shared, as the user keeps handles to them too).
#pragma once

#include "frontend/schedulers/lr_scheduler.h"

#include <memory>

namespace optjit {

class SequentialLR : public LRScheduler {
public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones, int64_t last_epoch = -1);
  std::string name() const override { return "SequentialLR"; }
  void step() override;

protected:
  std::vector<double> get_lr() override { return group_values("lr"); }
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

class ChainedScheduler : public LRScheduler {
public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  std::string name() const override { return "ChainedScheduler"; }
  void step() override;

protected:
  std::vector<double> get_lr() override { return group_values("lr"); }
  void save_fields(SchedulerState&) const override;
  void check_fields(const SchedulerState&) const override;
  void load_fields(const SchedulerState&) override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

} // namespace optjit
