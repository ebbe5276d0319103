#include "frontend/schedulers/scheduler_composition.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

namespace optjit {
namespace {

// Every part must exist and drive `optimizer`.
void check_parts(const std::string& who, const Optimizer& optimizer,
                 const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  if (schedulers.empty())
    throw Error(fmt::format("{} expects at least one scheduler, but got no scheduler.", who));
  for (std::size_t i = 0; i < schedulers.size(); ++i) {
    if (!schedulers[i])
      throw Error(fmt::format("{} got no scheduler at index {}", who, i));
    if (&schedulers[i]->optimizer() != &optimizer)
      throw Error(fmt::format("{} expects all schedulers to belong to the same optimizer, but got scheduler {} at "
                              "index {} that drives another {} optimizer.",
                              who, schedulers[i]->name(), i, schedulers[i]->optimizer().name()));
  }
}

// A part's state under "_schedulers.<index>." in its parent's state.
void save_parts(SchedulerState& s, const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i)
    for (auto& [key, value] : parts[i]->state_dict())
      s[fmt::format("_schedulers.{}.{}", i, key)] = value;
}

SchedulerState part_state(const SchedulerState& s, std::size_t i) {
  const std::string prefix = fmt::format("_schedulers.{}.", i);
  SchedulerState part;
  for (const auto& [key, value] : s)
    if (key.rfind(prefix, 0) == 0)
      part[key.substr(prefix.size())] = value;
  return part;
}

// Every part's state checked before any part loads: a bad last part leaves the first unchanged too.
void check_parts_state(const SchedulerState& s, const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i)
    parts[i]->check_state_dict(part_state(s, i));
}

void load_parts(const SchedulerState& s, const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i)
    parts[i]->load_state_dict(part_state(s, i));
}

} // namespace

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones, int64_t last_epoch)
    : LRScheduler(optimizer, /*last_epoch=*/0), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  check_parts("SequentialLR", optimizer, schedulers_);
  if (milestones_.size() != schedulers_.size() - 1)
    throw Error(fmt::format("Sequential Schedulers expects number of schedulers provided to be one more than the "
                            "number of milestone points, but got number of schedulers {} and the number of "
                            "milestones to be equal to {}",
                            schedulers_.size(), milestones_.size()));
  require_increasing(milestones_);
  last_epoch_ = last_epoch + 1;
  // Back to the initial lrs, undoing the parts' own epoch-0 updates; then only the first part starts.
  for (ParamGroup& g : optimizer.param_groups())
    g.set("lr", g.get("initial_lr"));
  for (auto& s : schedulers_)
    s->last_epoch_ -= 1;
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto index = static_cast<std::size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) -
                                              milestones_.begin());
  LRScheduler& scheduler = *schedulers_[index];
  if (index > 0 && milestones_[index - 1] == last_epoch_)
    scheduler.step_to(0); // the next part starts its schedule from its beginning
  else
    scheduler.step();
  last_lr_ = scheduler.get_last_lr();
}

void SequentialLR::save_fields(SchedulerState& s) const {
  s["_milestones"] = std::vector<double>(milestones_.begin(), milestones_.end());
  save_parts(s, schedulers_);
}

void SequentialLR::check_fields(const SchedulerState& s) const {
  std::vector<int64_t> milestones;
  for (double m : s.at("_milestones"))
    milestones.push_back(loaded_count({{"_milestones", {m}}}, "_milestones", 0));
  require_increasing(milestones);
  check_parts_state(s, schedulers_);
}

void SequentialLR::load_fields(const SchedulerState& s) {
  milestones_.assign(s.at("_milestones").begin(), s.at("_milestones").end());
  load_parts(s, schedulers_);
}

namespace {

// The optimizer a chain drives: its first part's, which every part must share.
Optimizer& chained_optimizer(const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  if (schedulers.empty() || !schedulers[0])
    throw Error("ChainedScheduler expects at least one scheduler to be chained, but got no scheduler.");
  check_parts("ChainedScheduler", schedulers[0]->optimizer(), schedulers);
  return schedulers[0]->optimizer();
}

} // namespace

ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(chained_optimizer(schedulers), /*last_epoch=*/0), schedulers_(std::move(schedulers)) {
  last_lr_ = group_values("lr");
}

void ChainedScheduler::step() {
  for (auto& s : schedulers_)
    s->step();
  last_lr_ = group_values("lr");
}

void ChainedScheduler::save_fields(SchedulerState& s) const { save_parts(s, schedulers_); }
void ChainedScheduler::check_fields(const SchedulerState& s) const { check_parts_state(s, schedulers_); }
void ChainedScheduler::load_fields(const SchedulerState& s) { load_parts(s, schedulers_); }

} // namespace optjit
