#include "frontend/schedulers/cyclic_schedulers.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <cmath>
#include <numbers>

namespace optjit {
namespace {

// The group key the cycled momentum lives under: beta1 for optimizers with betas, else momentum.
std::string momentum_key(const Optimizer& optimizer) {
  const OptionMap& d = optimizer.defaults();
  if (!d.count("momentum") && !d.count("beta1"))
    throw Error("optimizer must support momentum or beta1 with `cycle_momentum` option enabled");
  return d.count("beta1") ? "beta1" : "momentum";
}

// Starts momentum at its maximum and records the bounds in the groups, as torch does at construction.
void start_momentum_cycle(Optimizer& optimizer, const std::vector<double>& max_momentums,
                          const std::vector<double>& base_momentums) {
  const std::string key = momentum_key(optimizer);
  auto& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    groups[i].set(key, max_momentums[i]);
    groups[i].put("max_momentum", max_momentums[i]);
    groups[i].put("base_momentum", base_momentums[i]);
  }
}

// Starting a schedule, CyclicLR sets every group's lr to its base_lr before the base class records initial_lr.
Optimizer& prepare_cyclic(Optimizer& optimizer, const CyclicLROptions& o, int64_t last_epoch) {
  if (o.cycle_momentum)
    momentum_key(optimizer); // checked before any group changes
  const std::vector<double> base_lrs = per_group(optimizer, o.base_lr, "base_lr");
  if (last_epoch == -1)
    for (std::size_t i = 0; i < base_lrs.size(); ++i)
      optimizer.param_groups()[i].set("lr", base_lrs[i]);
  return optimizer;
}

} // namespace

CyclicLR::CyclicLR(Optimizer& optimizer, CyclicLROptions o, int64_t last_epoch)
    : LRScheduler(prepare_cyclic(optimizer, o, last_epoch), last_epoch), options_(std::move(o)) {
  base_lrs_ = per_group(optimizer, options_.base_lr, "base_lr");
  max_lrs_ = per_group(optimizer, options_.max_lr, "max_lr");
  const double down = options_.step_size_down.value_or(options_.step_size_up);
  total_size_ = options_.step_size_up + down;
  step_ratio_ = options_.step_size_up / total_size_;
  if (options_.mode != "triangular" && options_.mode != "triangular2" && options_.mode != "exp_range" &&
      !options_.scale_fn)
    throw Error("mode is invalid and scale_fn is None");
  if (!options_.scale_fn)
    options_.scale_mode = options_.mode == "exp_range" ? "iterations" : "cycle";
  if (options_.cycle_momentum) {
    base_momentums_ = per_group(optimizer, options_.base_momentum, "base_momentum");
    max_momentums_ = per_group(optimizer, options_.max_momentum, "max_momentum");
    if (last_epoch == -1)
      start_momentum_cycle(optimizer, max_momentums_, base_momentums_);
  }
  initial_step();
}

double CyclicLR::scale(double x) const {
  if (options_.scale_fn)
    return options_.scale_fn(x);
  if (options_.mode == "triangular")
    return 1.0;
  if (options_.mode == "triangular2")
    return 1 / std::pow(2.0, x - 1);
  return std::pow(options_.gamma, x);
}

std::vector<double> CyclicLR::get_lr() {
  const std::vector<double>& base_lrs = base_lrs_;
  const double epoch = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + epoch / total_size_);
  const double x = 1.0 + epoch / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double scaled = scale(options_.scale_mode == "cycle" ? cycle : epoch);
  std::vector<double> lrs;
  for (std::size_t i = 0; i < base_lrs.size(); ++i)
    lrs.push_back(base_lrs[i] + (max_lrs_[i] - base_lrs[i]) * scale_factor * scaled);
  if (options_.cycle_momentum) {
    const std::string key = momentum_key(optimizer_);
    for (std::size_t i = 0; i < max_momentums_.size(); ++i)
      optimizer_.param_groups()[i].set(key, max_momentums_[i] -
                                                (max_momentums_[i] - base_momentums_[i]) * scale_factor * scaled);
  }
  return lrs;
}

void CyclicLR::save_fields(SchedulerState& s) const {
  s["max_lrs"] = max_lrs_;
  s["total_size"] = {total_size_};
  s["step_ratio"] = {step_ratio_};
  s["gamma"] = {options_.gamma};
  if (options_.cycle_momentum) {
    s["base_momentums"] = base_momentums_;
    s["max_momentums"] = max_momentums_;
  }
}

void CyclicLR::check_fields(const SchedulerState& s) const {
  for (const char* key : {"max_lrs", "base_momentums", "max_momentums"})
    if (s.count(key))
      for (double v : s.at(key))
        if (!std::isfinite(v))
          throw Error(fmt::format("{} state dict has {} {}: it must be finite", name(), key, v));
  if (!(loaded_finite(s, "total_size") > 0))
    throw Error(
        fmt::format("{} state dict has total_size = {}: a cycle has a positive length", name(), s.at("total_size")[0]));
  loaded_finite(s, "step_ratio");
  loaded_finite(s, "gamma");
}

void CyclicLR::load_fields(const SchedulerState& s) {
  max_lrs_ = s.at("max_lrs");
  total_size_ = s.at("total_size")[0];
  step_ratio_ = s.at("step_ratio")[0];
  options_.gamma = s.at("gamma")[0];
  if (options_.cycle_momentum) {
    base_momentums_ = s.at("base_momentums");
    max_momentums_ = s.at("max_momentums");
  }
}

namespace {

int64_t one_cycle_total_steps(const OneCycleLROptions& o) {
  if (o.total_steps) {
    require_positive_count(*o.total_steps, "total_steps");
    return *o.total_steps;
  }
  if (o.epochs && o.steps_per_epoch) {
    require_positive_count(*o.epochs, "epochs");
    require_positive_count(*o.steps_per_epoch, "steps_per_epoch");
    if (*o.epochs > kMaxScheduleCount / *o.steps_per_epoch)
      throw Error(fmt::format("epochs {} x steps_per_epoch {} is more steps than 2^53 (kMaxScheduleCount)", *o.epochs,
                              *o.steps_per_epoch));
    return *o.epochs * *o.steps_per_epoch;
  }
  throw Error("You must define either total_steps OR (epochs AND steps_per_epoch)");
}

// Validates OneCycleLR's options and, when starting a schedule, writes the groups' initial_lr, max_lr and min_lr:
// torch does both before the base class reads initial_lr.
Optimizer& prepare_one_cycle(Optimizer& optimizer, const OneCycleLROptions& o, int64_t last_epoch) {
  one_cycle_total_steps(o);
  if (o.pct_start < 0 || o.pct_start > 1)
    throw Error(fmt::format("Expected float between 0 and 1 pct_start, but got {}", o.pct_start));
  if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear")
    throw Error(fmt::format("anneal_strategy must be one of 'cos' or 'linear', instead got {}", o.anneal_strategy));
  const std::vector<double> max_lrs = per_group(optimizer, o.max_lr, "max_lr");
  if (o.cycle_momentum) {
    momentum_key(optimizer); // the optimizer must have one
    per_group(optimizer, o.base_momentum, "base_momentum");
    per_group(optimizer, o.max_momentum, "max_momentum");
  }
  if (last_epoch == -1)
    for (std::size_t i = 0; i < max_lrs.size(); ++i) {
      ParamGroup& g = optimizer.param_groups()[i];
      g.put("initial_lr", max_lrs[i] / o.div_factor);
      g.put("max_lr", max_lrs[i]);
      g.put("min_lr", g.get("initial_lr") / o.final_div_factor);
    }
  return optimizer;
}

} // namespace

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions o, int64_t last_epoch)
    : LRScheduler(prepare_one_cycle(optimizer, o, last_epoch), last_epoch), options_(std::move(o)) {
  total_steps_ = one_cycle_total_steps(options_);
  const double total = static_cast<double>(total_steps_), pct = options_.pct_start;
  if (options_.three_phase)
    phases_ = {{pct * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
               {2 * pct * total - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"},
               {total - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
  else
    phases_ = {{pct * total - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
               {total - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"}};
  if (options_.cycle_momentum && last_epoch == -1)
    start_momentum_cycle(optimizer, per_group(optimizer, options_.max_momentum, "max_momentum"),
                         per_group(optimizer, options_.base_momentum, "base_momentum"));
  initial_step();
}

std::vector<double> OneCycleLR::get_lr() {
  const double step = static_cast<double>(last_epoch_);
  if (last_epoch_ > total_steps_)
    throw Error(
        fmt::format("Tried to step {} times. The specified number of total steps is {}", last_epoch_, total_steps_));
  auto anneal = [&](double start, double end, double pct) {
    if (options_.anneal_strategy == "cos")
      return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
    return (end - start) * pct + start;
  };
  std::vector<double> lrs;
  for (ParamGroup& group : optimizer_.param_groups()) {
    double start_step = 0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& phase = phases_[i];
      if (step <= phase.end_step || i + 1 == phases_.size()) {
        const double pct = (step - start_step) / (phase.end_step - start_step);
        lrs.push_back(anneal(group.get(phase.start_lr), group.get(phase.end_lr), pct));
        if (options_.cycle_momentum)
          group.set(momentum_key(optimizer_),
                    anneal(group.get(phase.start_momentum), group.get(phase.end_momentum), pct));
        break;
      }
      start_step = phase.end_step;
    }
  }
  return lrs;
}

void OneCycleLR::save_fields(SchedulerState& s) const { s["total_steps"] = {static_cast<double>(total_steps_)}; }
void OneCycleLR::check_fields(const SchedulerState& s) const { loaded_count(s, "total_steps", 1); }
void OneCycleLR::load_fields(const SchedulerState& s) { total_steps_ = static_cast<int64_t>(s.at("total_steps")[0]); }

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult,
                                                         double eta_min, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), eta_min_(eta_min),
      T_cur_(static_cast<double>(last_epoch)) {
  require_positive_count(T_0, "T_0");
  if (T_mult < 1)
    throw Error(fmt::format("Expected integer T_mult >= 1, but got {}", T_mult));
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  return from_base_lrs([&](double base) {
    return eta_min_ + (base - eta_min_) * (1 + std::cos(std::numbers::pi * T_cur_ / static_cast<double>(T_i_))) / 2;
  });
}

void CosineAnnealingWarmRestarts::step() {
  if (last_epoch_ < 0)
    return step_to_fraction(0);
  ++step_count_;
  T_cur_ += 1;
  if (T_cur_ >= static_cast<double>(T_i_)) {
    T_cur_ = std::fmod(T_cur_, static_cast<double>(T_i_));
    // A period past 2^53 steps never ends in practice: it saturates there instead of overflowing.
    if (__builtin_mul_overflow(T_i_, T_mult_, &T_i_) || T_i_ > kMaxScheduleCount)
      T_i_ = kMaxScheduleCount;
  }
  ++last_epoch_;
  write_lrs(get_lr());
}

void CosineAnnealingWarmRestarts::step_to_fraction(double epoch) {
  if (epoch < 0)
    throw Error(fmt::format("Expected non-negative epoch, but got {}", epoch));
  ++step_count_;
  const double T0 = static_cast<double>(T_0_);
  if (epoch >= T0) {
    if (T_mult_ == 1) {
      T_cur_ = std::fmod(epoch, T0);
    } else {
      const double mult = static_cast<double>(T_mult_);
      const auto n = static_cast<int64_t>(std::log(epoch / T0 * (mult - 1) + 1) / std::log(mult));
      T_cur_ = epoch - T0 * (std::pow(mult, static_cast<double>(n)) - 1) / (mult - 1);
      T_i_ = T_0_ * static_cast<int64_t>(std::pow(mult, static_cast<double>(n)));
    }
  } else {
    T_i_ = T_0_;
    T_cur_ = epoch;
  }
  last_epoch_ = static_cast<int64_t>(std::floor(epoch));
  write_lrs(get_lr());
}

void CosineAnnealingWarmRestarts::save_fields(SchedulerState& s) const {
  s["T_0"] = {static_cast<double>(T_0_)};
  s["T_i"] = {static_cast<double>(T_i_)};
  s["T_mult"] = {static_cast<double>(T_mult_)};
  s["eta_min"] = {eta_min_};
  s["T_cur"] = {T_cur_};
}

void CosineAnnealingWarmRestarts::check_fields(const SchedulerState& s) const {
  for (const char* key : {"T_0", "T_i", "T_mult"})
    loaded_count(s, key, 1);
  loaded_finite(s, "eta_min");
  if (!(loaded_finite(s, "T_cur") >= 0))
    throw Error(fmt::format("{} state dict has T_cur = {}: it must be >= 0", name(), s.at("T_cur")[0]));
}

void CosineAnnealingWarmRestarts::load_fields(const SchedulerState& s) {
  T_0_ = static_cast<int64_t>(s.at("T_0")[0]);
  T_i_ = static_cast<int64_t>(s.at("T_i")[0]);
  T_mult_ = static_cast<int64_t>(s.at("T_mult")[0]);
  eta_min_ = s.at("eta_min")[0];
  T_cur_ = s.at("T_cur")[0];
}

} // namespace optjit
