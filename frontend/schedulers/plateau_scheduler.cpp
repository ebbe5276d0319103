#include "frontend/schedulers/plateau_scheduler.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

namespace optjit {

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(optimizer), options_(std::move(options)) {
  if (options_.factor >= 1.0)
    throw Error("Factor should be < 1.0.");
  const std::size_t groups = optimizer.param_groups().size();
  if (options_.min_lr.size() != 1 && options_.min_lr.size() != groups)
    throw Error(fmt::format("expected {} min_lrs, got {}", groups, options_.min_lr.size()));
  min_lrs_ = per_group(optimizer, options_.min_lr, "min_lr");
  if (options_.mode != "min" && options_.mode != "max")
    throw Error("mode " + options_.mode + " is unknown!");
  if (options_.threshold_mode != "rel" && options_.threshold_mode != "abs")
    throw Error("threshold mode " + options_.threshold_mode + " is unknown!");
  best_ = options_.mode == "min" ? INFINITY : -INFINITY;
  for (const ParamGroup& g : optimizer.param_groups())
    last_lr_.push_back(g.get("lr"));
}

bool ReduceLROnPlateau::is_better(double a) const {
  const double t = options_.threshold;
  if (options_.mode == "min")
    return options_.threshold_mode == "rel" ? a < best_ * (1.0 - t) : a < best_ - t;
  return options_.threshold_mode == "rel" ? a > best_ * (t + 1.0) : a > best_ + t;
}

void ReduceLROnPlateau::step(double metric) {
  last_epoch_ += 1;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0; // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    auto& groups = optimizer_.param_groups();
    if (groups.size() != min_lrs_.size()) {
      if (options_.min_lr.size() != 1)
        throw Error(fmt::format("The number of param groups in the `optimizer` ({}) differs from when "
                                "`ReduceLROnPlateau` was initialized ({}), usually due to a new param group being "
                                "added to the optimizer. Please modify the `min_lrs` field to match the length of "
                                "the `optimizer` param groups.",
                                groups.size(), min_lrs_.size()));
      min_lrs_.assign(groups.size(), options_.min_lr[0]);
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double old_lr = groups[i].get("lr");
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[i]);
      if (old_lr - new_lr > options_.eps)
        groups[i].set("lr", new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_.clear();
  for (const ParamGroup& g : optimizer_.param_groups())
    last_lr_.push_back(g.get("lr"));
}

SchedulerState ReduceLROnPlateau::state_dict() const {
  return {{"last_epoch", {static_cast<double>(last_epoch_)}},
          {"best", {best_}},
          {"num_bad_epochs", {static_cast<double>(num_bad_epochs_)}},
          {"cooldown_counter", {static_cast<double>(cooldown_counter_)}},
          {"min_lrs", min_lrs_},
          {"_last_lr", last_lr_},
          {"factor", {options_.factor}},
          {"patience", {static_cast<double>(options_.patience)}},
          {"threshold", {options_.threshold}},
          {"cooldown", {static_cast<double>(options_.cooldown)}},
          {"eps", {options_.eps}}};
}

void ReduceLROnPlateau::load_state_dict(const SchedulerState& state) {
  for (const auto& [key, mine] : state_dict())
    if (!state.count(key) || (key != "min_lrs" && key != "_last_lr" && state.at(key).size() != mine.size()))
      throw Error(fmt::format("ReduceLROnPlateau state dict lacks '{}' or has the wrong number of values", key));
  last_epoch_ = static_cast<int64_t>(state.at("last_epoch")[0]);
  best_ = state.at("best")[0];
  num_bad_epochs_ = static_cast<int64_t>(state.at("num_bad_epochs")[0]);
  cooldown_counter_ = static_cast<int64_t>(state.at("cooldown_counter")[0]);
  min_lrs_ = state.at("min_lrs");
  last_lr_ = state.at("_last_lr");
  options_.factor = state.at("factor")[0];
  options_.patience = static_cast<int64_t>(state.at("patience")[0]);
  options_.threshold = state.at("threshold")[0];
  options_.cooldown = static_cast<int64_t>(state.at("cooldown")[0]);
  options_.eps = state.at("eps")[0];
}

} // namespace optjit
