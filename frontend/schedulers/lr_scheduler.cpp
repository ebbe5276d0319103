#include "frontend/schedulers/lr_scheduler.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace optjit {
namespace {

// Python's a % b for b > 0 (never negative).
int64_t floor_mod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

} // namespace

std::vector<double> per_group(const Optimizer& optimizer, const std::vector<double>& values, const std::string& what) {
  const std::size_t groups = optimizer.param_groups().size();
  if (values.size() == 1)
    return std::vector<double>(groups, values[0]);
  if (values.size() != groups)
    throw Error(fmt::format("expected {} values for {}, got {}", groups, what, values.size()));
  return values;
}

LRScheduler::LRScheduler(Optimizer& optimizer, int64_t last_epoch) : optimizer_(optimizer), last_epoch_(last_epoch) {
  auto& groups = optimizer_.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (last_epoch == -1) {
      if (!groups[i].has("initial_lr"))
        groups[i].put("initial_lr", groups[i].get("lr"));
    } else if (!groups[i].has("initial_lr")) {
      throw Error(fmt::format("param 'initial_lr' is not specified in param_groups[{}] when resuming an optimizer", i));
    }
  }
  base_lrs_ = group_values("initial_lr");
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  initial_ = true;
  step();
  initial_ = false;
}

std::vector<double> LRScheduler::group_values(const std::string& key) const {
  std::vector<double> values;
  for (const ParamGroup& g : optimizer_.param_groups())
    values.push_back(g.get(key));
  return values;
}

void LRScheduler::write_lrs(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  for (std::size_t i = 0; i < groups.size() && i < lrs.size(); ++i)
    groups[i].set("lr", lrs[i]);
  last_lr_ = group_values("lr");
}

std::vector<double> LRScheduler::from_base_lrs(const std::function<double(double)>& f) const {
  std::vector<double> lrs;
  for (double base : base_lrs_)
    lrs.push_back(f(base));
  return lrs;
}

void LRScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  write_lrs(get_lr());
}

void LRScheduler::step_to(int64_t epoch) {
  ++step_count_;
  last_epoch_ = epoch;
  auto closed = closed_form_lr();
  write_lrs(closed ? *closed : get_lr());
}

SchedulerState LRScheduler::state_dict() const {
  SchedulerState state{{"last_epoch", {static_cast<double>(last_epoch_)}},
                       {"_step_count", {static_cast<double>(step_count_)}},
                       {"base_lrs", base_lrs_},
                       {"_last_lr", last_lr_}};
  save_fields(state);
  return state;
}

void LRScheduler::check_state_dict(const SchedulerState& state) const {
  for (const auto& [key, mine] : state_dict()) {
    auto it = state.find(key);
    if (it == state.end())
      throw Error(fmt::format("{} state dict lacks '{}'", name(), key));
    if (it->second.size() != mine.size())
      throw Error(fmt::format("{} state dict has {} values for '{}', this scheduler keeps {}", name(),
                              it->second.size(), key, mine.size()));
  }
  loaded_count(state, "last_epoch", -1);
  loaded_count(state, "_step_count", 0);
  for (const char* key : {"base_lrs", "_last_lr"})
    for (double lr : state.at(key))
      if (!std::isfinite(lr))
        throw Error(fmt::format("{} state dict has {} {}: learning rates must be finite", name(), key, lr));
  check_fields(state);
}

int64_t LRScheduler::loaded_count(const SchedulerState& state, const std::string& key, int64_t min) const {
  const double v = state.at(key).at(0);
  if (!(v >= static_cast<double>(min) && v <= static_cast<double>(kMaxScheduleCount) && v == std::floor(v)))
    throw Error(fmt::format("{} state dict has {} = {}: it must be a whole number from {} to 2^53 "
                            "(kMaxScheduleCount)",
                            name(), key, v, min));
  return static_cast<int64_t>(v);
}

double LRScheduler::loaded_finite(const SchedulerState& state, const std::string& key) const {
  const double v = state.at(key).at(0);
  if (!std::isfinite(v))
    throw Error(fmt::format("{} state dict has {} = {}: it must be finite", name(), key, v));
  return v;
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  check_state_dict(state); // nothing below throws
  last_epoch_ = static_cast<int64_t>(state.at("last_epoch")[0]);
  step_count_ = static_cast<int64_t>(state.at("_step_count")[0]);
  base_lrs_ = state.at("base_lrs");
  last_lr_ = state.at("_last_lr");
  load_fields(state);
}

LambdaScheduler::LambdaScheduler(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch) {
  const std::size_t groups = optimizer.param_groups().size();
  if (lr_lambdas.size() == 1)
    lr_lambdas.resize(groups, lr_lambdas[0]);
  if (lr_lambdas.size() != groups)
    throw Error(fmt::format("Expected {} lr_lambdas, but got {}", groups, lr_lambdas.size()));
  for (const LrLambda& f : lr_lambdas)
    if (!f)
      throw Error("lr_lambda should be a function, but got an empty one");
  lambdas_ = std::move(lr_lambdas);
}

// The epoch-0 update runs in the most derived constructor, where get_lr() is the class's own.
LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch)
    : LambdaScheduler(optimizer, std::move(lr_lambdas), last_epoch) {
  initial_step();
}

MultiplicativeLR::MultiplicativeLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, int64_t last_epoch)
    : LambdaScheduler(optimizer, std::move(lr_lambdas), last_epoch) {
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> lrs;
  for (std::size_t i = 0; i < base_lrs_.size(); ++i)
    lrs.push_back(base_lrs_[i] * lambdas_[i](last_epoch_));
  return lrs;
}

std::vector<double> MultiplicativeLR::get_lr() {
  std::vector<double> lrs = group_values("lr");
  if (!initial_)
    for (std::size_t i = 0; i < lrs.size(); ++i)
      lrs[i] = lrs[i] * lambdas_[i](last_epoch_);
  return lrs;
}

namespace {

// Multiplies every group's lr by `factor`.
std::vector<double> scaled(std::vector<double> lrs, double factor) {
  for (double& lr : lrs)
    lr = lr * factor;
  return lrs;
}

} // namespace

void require_positive_count(int64_t value, const std::string& what) {
  if (value <= 0)
    throw Error(fmt::format("Expected positive integer {}, but got {}", what, value));
  if (value > kMaxScheduleCount)
    throw Error(fmt::format("{} is {}: a schedule count is at most 2^53 (kMaxScheduleCount)", what, value));
}

void require_increasing(const std::vector<int64_t>& milestones) {
  for (std::size_t i = 1; i < milestones.size(); ++i)
    if (milestones[i] <= milestones[i - 1])
      throw Error(fmt::format("Milestones should be a list of increasing integers. Got {}", milestones));
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), step_size_(step_size), gamma_(gamma) {
  require_positive_count(step_size, "step_size");
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || floor_mod(last_epoch_, step_size_) != 0)
    return group_values("lr");
  return scaled(group_values("lr"), gamma_);
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  return from_base_lrs(
      [&](double base) { return base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)); });
}

void StepLR::save_fields(SchedulerState& s) const {
  s["step_size"] = {static_cast<double>(step_size_)};
  s["gamma"] = {gamma_};
}
void StepLR::check_fields(const SchedulerState& s) const {
  loaded_count(s, "step_size", 1);
  loaded_finite(s, "gamma");
}
void StepLR::load_fields(const SchedulerState& s) {
  step_size_ = static_cast<int64_t>(s.at("step_size")[0]);
  gamma_ = s.at("gamma")[0];
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), milestones_(std::move(milestones)), gamma_(gamma) {
  require_increasing(milestones_);
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  if (std::find(milestones_.begin(), milestones_.end(), last_epoch_) == milestones_.end())
    return group_values("lr");
  return scaled(group_values("lr"), gamma_);
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  return from_base_lrs([&](double base) { return base * std::pow(gamma_, static_cast<double>(passed)); });
}

void MultiStepLR::save_fields(SchedulerState& s) const {
  s["milestones"] = std::vector<double>(milestones_.begin(), milestones_.end());
  s["gamma"] = {gamma_};
}
void MultiStepLR::check_fields(const SchedulerState& s) const {
  std::vector<int64_t> milestones;
  for (std::size_t i = 0; i < s.at("milestones").size(); ++i)
    milestones.push_back(loaded_count({{"milestones", {s.at("milestones")[i]}}}, "milestones", 0));
  require_increasing(milestones);
  loaded_finite(s, "gamma");
}
void MultiStepLR::load_fields(const SchedulerState& s) {
  milestones_.assign(s.at("milestones").begin(), s.at("milestones").end());
  gamma_ = s.at("gamma")[0];
}

namespace {

void require_constant_factor(double factor) {
  if (!(factor <= 1.0 && factor >= 0))
    throw Error("Constant multiplicative factor expected to be between 0 and 1.");
}

void require_linear_factors(double start_factor, double end_factor) {
  if (!(start_factor <= 1.0 && start_factor > 0))
    throw Error("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.");
  if (!(end_factor <= 1.0 && end_factor >= 0))
    throw Error("Ending multiplicative factor expected to be between 0 and 1.");
}

} // namespace

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), factor_(factor), total_iters_(total_iters) {
  require_constant_factor(factor);
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  if (last_epoch_ == 0)
    return scaled(group_values("lr"), factor_);
  if (last_epoch_ != total_iters_)
    return group_values("lr");
  return scaled(group_values("lr"), 1.0 / factor_);
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  return from_base_lrs(
      [&](double base) { return base * (factor_ + (last_epoch_ >= total_iters_ ? 1.0 : 0.0) * (1 - factor_)); });
}

void ConstantLR::save_fields(SchedulerState& s) const {
  s["factor"] = {factor_};
  s["total_iters"] = {static_cast<double>(total_iters_)};
}
void ConstantLR::check_fields(const SchedulerState& s) const {
  require_constant_factor(s.at("factor")[0]);
  loaded_count(s, "total_iters", 0);
}
void ConstantLR::load_fields(const SchedulerState& s) {
  factor_ = s.at("factor")[0];
  total_iters_ = static_cast<int64_t>(s.at("total_iters")[0]);
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters,
                   int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), start_factor_(start_factor), end_factor_(end_factor),
      total_iters_(total_iters) {
  require_linear_factors(start_factor, end_factor);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0)
    return scaled(group_values("lr"), start_factor_);
  if (initial_ || last_epoch_ > total_iters_)
    return group_values("lr");
  const double change = end_factor_ - start_factor_;
  return scaled(group_values("lr"), 1.0 + change / (static_cast<double>(total_iters_) * start_factor_ +
                                                    static_cast<double>(last_epoch_ - 1) * change));
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return from_base_lrs([&](double base) {
    return base * (start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_));
  });
}

void LinearLR::save_fields(SchedulerState& s) const {
  s["start_factor"] = {start_factor_};
  s["end_factor"] = {end_factor_};
  s["total_iters"] = {static_cast<double>(total_iters_)};
}
void LinearLR::check_fields(const SchedulerState& s) const {
  require_linear_factors(s.at("start_factor")[0], s.at("end_factor")[0]);
  loaded_count(s, "total_iters", 0);
}
void LinearLR::load_fields(const SchedulerState& s) {
  start_factor_ = s.at("start_factor")[0];
  end_factor_ = s.at("end_factor")[0];
  total_iters_ = static_cast<int64_t>(s.at("total_iters")[0]);
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), gamma_(gamma) {
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  if (initial_ || last_epoch_ == 0)
    return group_values("lr");
  return scaled(group_values("lr"), gamma_);
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  return from_base_lrs([&](double base) { return base * std::pow(gamma_, static_cast<double>(last_epoch_)); });
}

void ExponentialLR::save_fields(SchedulerState& s) const { s["gamma"] = {gamma_}; }
void ExponentialLR::check_fields(const SchedulerState& s) const { loaded_finite(s, "gamma"); }
void ExponentialLR::load_fields(const SchedulerState& s) { gamma_ = s.at("gamma")[0]; }

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), total_iters_(total_iters), power_(power) {
  require_positive_count(total_iters, "total_iters");
  initial_step();
}

std::vector<double> PolynomialLR::get_lr() {
  if (initial_ || last_epoch_ == 0 || last_epoch_ > total_iters_)
    return group_values("lr");
  const double n = static_cast<double>(total_iters_), t = static_cast<double>(last_epoch_);
  return scaled(group_values("lr"), std::pow((1.0 - t / n) / (1.0 - (t - 1) / n), power_));
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  return from_base_lrs(
      [&](double base) { return base * std::pow(1.0 - done / static_cast<double>(total_iters_), power_); });
}

void PolynomialLR::save_fields(SchedulerState& s) const {
  s["total_iters"] = {static_cast<double>(total_iters_)};
  s["power"] = {power_};
}
void PolynomialLR::check_fields(const SchedulerState& s) const {
  loaded_count(s, "total_iters", 1);
  loaded_finite(s, "power");
}
void PolynomialLR::load_fields(const SchedulerState& s) {
  total_iters_ = static_cast<int64_t>(s.at("total_iters")[0]);
  power_ = s.at("power")[0];
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min, int64_t last_epoch)
    : LRScheduler(optimizer, last_epoch), T_max_(T_max), eta_min_(eta_min) {
  require_positive_count(T_max, "T_max");
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  constexpr double pi = std::numbers::pi;
  const double t = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  std::vector<double> lrs = group_values("lr");
  if (initial_ || last_epoch_ == 0)
    return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) // resumed: start from the closed form
    return *closed_form_lr();
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    if (floor_mod(last_epoch_ - 1 - T_max_, 2 * T_max_) == 0) // at the bottom of the cosine: climb back
      lrs[i] = lrs[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(pi / T)) / 2;
    else
      lrs[i] = (1 + std::cos(pi * t / T)) / (1 + std::cos(pi * (t - 1) / T)) * (lrs[i] - eta_min_) + eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  constexpr double pi = std::numbers::pi;
  return from_base_lrs([&](double base) {
    return eta_min_ +
           (base - eta_min_) * (1 + std::cos(pi * static_cast<double>(last_epoch_) / static_cast<double>(T_max_))) / 2;
  });
}

void CosineAnnealingLR::save_fields(SchedulerState& s) const {
  s["T_max"] = {static_cast<double>(T_max_)};
  s["eta_min"] = {eta_min_};
}
void CosineAnnealingLR::check_fields(const SchedulerState& s) const {
  loaded_count(s, "T_max", 1);
  loaded_finite(s, "eta_min");
}
void CosineAnnealingLR::load_fields(const SchedulerState& s) {
  T_max_ = static_cast<int64_t>(s.at("T_max")[0]);
  eta_min_ = s.at("eta_min")[0];
}

} // namespace optjit
