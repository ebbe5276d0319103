#include "tools/golden_scheduler.h"
#include "frontend/optim/json_text.h"
#include "frontend/schedulers/cyclic_schedulers.h"
#include "runtime/error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace optjit {
namespace {

using json = nlohmann::json;

// A number or a list of numbers, as torch's float-or-list arguments.
std::vector<double> numbers(const json& value) {
  return value.is_array() ? value.get<std::vector<double>>() : std::vector<double>{value.get<double>()};
}

// A scheduler count option as an exact integer (the scheduler's constructor checks its range).
int64_t whole(const json& value, const char* key) {
  return json_integer(value, std::string("scheduler option ") + key, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max());
}

std::vector<int64_t> wholes(const json& value, const char* key) {
  if (!value.is_array())
    throw Error(std::string("scheduler option ") + key + " is " + json_value_text(value) + ", not a list");
  std::vector<int64_t> out;
  for (const json& v : value)
    out.push_back(whole(v, key));
  return out;
}

std::vector<LrLambda> lambdas(const json& value) {
  std::vector<LrLambda> out;
  for (const json& e : value.is_array() ? value : json::array({value}))
    out.push_back(golden_lr_lambda(e.get<std::string>()));
  return out;
}

std::unique_ptr<LRScheduler> make_scheduler(const std::string& name, const json& o, Optimizer& opt) {
  auto num = [&](const char* key, double fallback) { return o.contains(key) ? o[key].get<double>() : fallback; };
  // Counts are exact integers (json_integer: 2.5 or 1e30 is an error naming the option, never truncated); the
  // scheduler's constructor checks their range.
  auto count = [&](const char* key, int64_t fallback) { return o.contains(key) ? whole(o[key], key) : fallback; };
  if (name == "LambdaLR")
    return std::make_unique<LambdaLR>(opt, lambdas(o.at("lr_lambda")));
  if (name == "MultiplicativeLR")
    return std::make_unique<MultiplicativeLR>(opt, lambdas(o.at("lr_lambda")));
  if (name == "StepLR")
    return std::make_unique<StepLR>(opt, whole(o.at("step_size"), "step_size"), num("gamma", 0.1));
  if (name == "MultiStepLR")
    return std::make_unique<MultiStepLR>(opt, wholes(o.at("milestones"), "milestones"), num("gamma", 0.1));
  if (name == "ConstantLR")
    return std::make_unique<ConstantLR>(opt, num("factor", 1.0 / 3), count("total_iters", 5));
  if (name == "LinearLR")
    return std::make_unique<LinearLR>(opt, num("start_factor", 1.0 / 3), num("end_factor", 1.0),
                                      count("total_iters", 5));
  if (name == "ExponentialLR")
    return std::make_unique<ExponentialLR>(opt, o.at("gamma").get<double>());
  if (name == "PolynomialLR")
    return std::make_unique<PolynomialLR>(opt, count("total_iters", 5), num("power", 1.0));
  if (name == "CosineAnnealingLR")
    return std::make_unique<CosineAnnealingLR>(opt, whole(o.at("T_max"), "T_max"), num("eta_min", 0.0));
  if (name == "CosineAnnealingWarmRestarts")
    return std::make_unique<CosineAnnealingWarmRestarts>(opt, whole(o.at("T_0"), "T_0"), count("T_mult", 1),
                                                         num("eta_min", 0.0));
  if (name == "CyclicLR") {
    CyclicLROptions c;
    c.base_lr = numbers(o.at("base_lr"));
    c.max_lr = numbers(o.at("max_lr"));
    c.step_size_up = num("step_size_up", 2000);
    if (o.contains("step_size_down") && !o["step_size_down"].is_null())
      c.step_size_down = o["step_size_down"].get<double>();
    c.mode = o.value("mode", "triangular");
    c.gamma = num("gamma", 1.0);
    c.cycle_momentum = o.value("cycle_momentum", true);
    if (o.contains("base_momentum"))
      c.base_momentum = numbers(o["base_momentum"]);
    if (o.contains("max_momentum"))
      c.max_momentum = numbers(o["max_momentum"]);
    return std::make_unique<CyclicLR>(opt, std::move(c));
  }
  if (name == "OneCycleLR") {
    OneCycleLROptions c;
    c.max_lr = numbers(o.at("max_lr"));
    if (o.contains("total_steps"))
      c.total_steps = whole(o["total_steps"], "total_steps");
    if (o.contains("epochs"))
      c.epochs = whole(o["epochs"], "epochs");
    if (o.contains("steps_per_epoch"))
      c.steps_per_epoch = whole(o["steps_per_epoch"], "steps_per_epoch");
    c.pct_start = num("pct_start", 0.3);
    c.anneal_strategy = o.value("anneal_strategy", "cos");
    c.cycle_momentum = o.value("cycle_momentum", true);
    if (o.contains("base_momentum"))
      c.base_momentum = numbers(o["base_momentum"]);
    if (o.contains("max_momentum"))
      c.max_momentum = numbers(o["max_momentum"]);
    c.div_factor = num("div_factor", 25.0);
    c.final_div_factor = num("final_div_factor", 1e4);
    c.three_phase = o.value("three_phase", false);
    return std::make_unique<OneCycleLR>(opt, std::move(c));
  }
  throw Error("LR scheduler " + name + " is not one optjit's golden replay can build");
}

} // namespace

LrLambda golden_lr_lambda(const std::string& expression) {
  if (expression == "0.95 ** epoch")
    return [](int64_t epoch) { return std::pow(0.95, static_cast<double>(epoch)); };
  if (expression == "1.0 / (epoch + 1)")
    return [](int64_t epoch) { return 1.0 / static_cast<double>(epoch + 1); };
  if (expression == "0.9")
    return [](int64_t) { return 0.9; };
  if (expression == "1.0 if epoch % 2 == 0 else 0.8")
    return [](int64_t epoch) { return epoch % 2 == 0 ? 1.0 : 0.8; };
  throw Error("lr_lambda '" + expression + "' is not one of the expressions optjit's golden replay knows");
}

GoldenScheduler::GoldenScheduler(const json& spec, Optimizer& optimizer) {
  const std::string name = spec.at("name").get<std::string>();
  const json& o = spec.value("options", json::object());
  if (name != "ReduceLROnPlateau") {
    scheduler_ = make_scheduler(name, o, optimizer);
    return;
  }
  ReduceLROnPlateauOptions p;
  p.mode = o.value("mode", "min");
  p.factor = o.value("factor", 0.1);
  p.patience = o.contains("patience") ? whole(o["patience"], "patience") : 10;
  p.threshold = o.value("threshold", 1e-4);
  p.threshold_mode = o.value("threshold_mode", "rel");
  p.cooldown = o.contains("cooldown") ? whole(o["cooldown"], "cooldown") : 0;
  if (o.contains("min_lr"))
    p.min_lr = numbers(o["min_lr"]);
  p.eps = o.value("eps", 1e-8);
  plateau_ = std::make_unique<ReduceLROnPlateau>(optimizer, p);
  metrics_ = spec.at("metrics").get<std::vector<double>>();
}

void GoldenScheduler::step_after(std::size_t optimizer_step) {
  if (scheduler_)
    return scheduler_->step();
  if (optimizer_step >= metrics_.size())
    throw Error("the case has no ReduceLROnPlateau metric for step " + std::to_string(optimizer_step));
  plateau_->step(metrics_[optimizer_step]);
}

} // namespace optjit
