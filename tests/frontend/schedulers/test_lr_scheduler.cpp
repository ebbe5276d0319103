// LR schedulers: every scheduler against its closed form over 36 epochs with a state_dict round trip in the
// middle of the schedule, 100 compiled steps per scheduler with one compile, tensor lr, torch's messages.
#include "compiler/compiled_step.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/sgd.h"
#include "frontend/schedulers/cyclic_schedulers.h"
#include "frontend/schedulers/plateau_scheduler.h"
#include "frontend/schedulers/scheduler_composition.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_same_trajectory;

namespace {

constexpr double kPi = std::numbers::pi;
const std::vector<double> kBaseLrs = {0.1, 0.05};

using Factory = std::function<std::shared_ptr<LRScheduler>(Optimizer&)>;
using Expected = std::function<double(int64_t epoch, double base_lr)>;

// SGD with momentum over two groups (lr 0.1 and 0.05).
std::unique_ptr<SGD> two_group_sgd(const std::vector<Tensor>& p) {
  return std::make_unique<SGD>(std::vector<ParamGroupSpec>{{{p[0]}, {{"lr", 0.1}}}, {{p[1]}, {{"lr", 0.05}}}},
                               SGDOptions{.lr = 0.1, .momentum = 0.9, .foreach = true});
}

// Steps the scheduler 36 epochs, checking every lr against `expected`; at epoch 15 a second optimizer and
// scheduler load both state dicts and must follow the same schedule to the end.
void check_schedule(const Factory& make, const Expected& expected, double rtol = 1e-12) {
  auto params = random_params({{3}, {2}}, Dtype::f64, 1);
  auto opt = two_group_sgd(params);
  auto sched = make(*opt);
  std::unique_ptr<SGD> resumed_opt;
  std::shared_ptr<LRScheduler> resumed;
  for (int64_t epoch = 0; epoch <= 36; ++epoch) {
    for (std::size_t g = 0; g < 2; ++g) {
      INFO(sched->name() << " epoch " << epoch << " group " << g);
      const double want = expected(epoch, kBaseLrs[g]);
      CHECK(sched->get_last_lr()[g] == doctest::Approx(want).epsilon(rtol).scale(1e-3));
      CHECK(opt->param_groups()[g].get("lr") == sched->get_last_lr()[g]);
      if (resumed)
        CHECK(resumed->get_last_lr()[g] == sched->get_last_lr()[g]);
    }
    if (epoch == 15) {
      auto copies = copy_params(params);
      resumed_opt = two_group_sgd(copies);
      resumed = make(*resumed_opt);
      resumed_opt->load_state_dict(opt->state_dict());
      resumed->load_state_dict(sched->state_dict());
      CHECK(resumed->last_epoch() == sched->last_epoch());
    }
    sched->step();
    if (resumed)
      resumed->step();
  }
}

template <class S, class... Args> Factory make(Args... args) {
  return [=](Optimizer& o) { return std::make_shared<S>(o, args...); };
}

} // namespace

TEST_CASE("schedulers: the chainable schedulers follow their closed forms, and resume from a state dict") {
  check_schedule(make<LambdaLR>(std::vector<LrLambda>{[](int64_t e) { return std::pow(0.95, e); }}),
                 [](int64_t e, double b) { return b * std::pow(0.95, e); });
  check_schedule(make<MultiplicativeLR>(std::vector<LrLambda>{[](int64_t) { return 0.9; }}),
                 [](int64_t e, double b) { return b * std::pow(0.9, e); });
  check_schedule(make<StepLR>(int64_t{7}, 0.5), [](int64_t e, double b) { return b * std::pow(0.5, e / 7); });
  check_schedule(make<MultiStepLR>(std::vector<int64_t>{5, 12, 20}, 0.3),
                 [](int64_t e, double b) { return b * std::pow(0.3, (e >= 5) + (e >= 12) + (e >= 20)); });
  check_schedule(make<ConstantLR>(0.25, int64_t{6}), [](int64_t e, double b) { return b * (e < 6 ? 0.25 : 1.0); });
  check_schedule(make<LinearLR>(0.2, 0.9, int64_t{10}), [](int64_t e, double b) {
    return b * (0.2 + 0.7 * static_cast<double>(std::min<int64_t>(e, 10)) / 10);
  });
  check_schedule(make<ExponentialLR>(0.93), [](int64_t e, double b) { return b * std::pow(0.93, e); });
  check_schedule(make<PolynomialLR>(int64_t{20}, 2.0), [](int64_t e, double b) {
    return b * std::pow(1.0 - static_cast<double>(std::min<int64_t>(e, 20)) / 20, 2.0);
  });
  // The recursive cosine drifts from the closed form in the last bits only.
  check_schedule(
      make<CosineAnnealingLR>(int64_t{10}, 0.001),
      [](int64_t e, double b) { return 0.001 + (b - 0.001) * (1 + std::cos(kPi * static_cast<double>(e) / 10)) / 2; },
      1e-9);
}

TEST_CASE("schedulers: warm restarts, cyclic and one-cycle schedules follow their closed forms") {
  check_schedule(make<CosineAnnealingWarmRestarts>(int64_t{4}, int64_t{2}, 0.001), [](int64_t e, double b) {
    int64_t start = 0, period = 4; // cycles of 4, 8, 16, 32 epochs
    while (e >= start + period) {
      start += period;
      period *= 2;
    }
    return 0.001 + (b - 0.001) * (1 + std::cos(kPi * static_cast<double>(e - start) / static_cast<double>(period))) / 2;
  });
  for (const std::string mode : {"triangular", "triangular2", "exp_range"}) {
    INFO(mode);
    CyclicLROptions o{.base_lr = {0.01}, .max_lr = {0.1, 0.2}, .step_size_up = 4, .step_size_down = 6};
    o.mode = mode;
    o.gamma = 0.99;
    check_schedule([o](Optimizer& opt) { return std::make_shared<CyclicLR>(opt, o); },
                   [mode](int64_t e, double b) {
                     const double max_lr = b == 0.1 ? 0.1 : 0.2, t = static_cast<double>(e);
                     const double cycle = std::floor(1 + t / 10), x = 1 + t / 10 - cycle;
                     const double scale = x <= 0.4 ? x / 0.4 : (x - 1) / (0.4 - 1);
                     const double amplitude = mode == "triangular"    ? 1.0
                                              : mode == "triangular2" ? 1 / std::pow(2.0, cycle - 1)
                                                                      : std::pow(0.99, t);
                     return 0.01 + (max_lr - 0.01) * scale * amplitude;
                   },
                   1e-10);
  }
  for (const std::string anneal : {"cos", "linear"})
    for (bool three_phase : {false, true}) {
      INFO(anneal << " three_phase=" << three_phase);
      OneCycleLROptions o{.max_lr = {0.4}, .total_steps = 40};
      o.anneal_strategy = anneal;
      o.three_phase = three_phase;
      check_schedule([o](Optimizer& opt) { return std::make_shared<OneCycleLR>(opt, o); },
                     [=](int64_t e, double) {
                       const double initial = 0.4 / 25, min_lr = initial / 1e4, t = static_cast<double>(e);
                       auto f = [&](double a, double b, double pct) {
                         return anneal == "cos" ? b + (a - b) / 2 * (std::cos(kPi * pct) + 1) : (b - a) * pct + a;
                       };
                       const double up = 0.3 * 40 - 1;
                       if (t <= up)
                         return f(initial, 0.4, t / up);
                       if (!three_phase)
                         return f(0.4, min_lr, (t - up) / (39 - up));
                       const double down = 2 * 0.3 * 40 - 2;
                       if (t <= down)
                         return f(0.4, initial, (t - up) / (down - up));
                       return f(initial, min_lr, (t - down) / (39 - down));
                     },
                     1e-10);
    }
}

TEST_CASE("schedulers: CyclicLR and OneCycleLR cycle momentum, or beta1 for Adam, inversely to the lr") {
  auto p = random_params({{3}}, Dtype::f64, 2);
  SGD sgd(p, {.lr = 0.1, .momentum = 0.5});
  CyclicLR cyclic(sgd, {.base_lr = {0.01}, .max_lr = {0.1}, .step_size_up = 4});
  CHECK(sgd.param_groups()[0].get("momentum") == 0.9); // starts at max_momentum
  for (int i = 0; i < 4; ++i)
    cyclic.step();
  CHECK(sgd.param_groups()[0].get("lr") == doctest::Approx(0.1));
  CHECK(sgd.param_groups()[0].get("momentum") == doctest::Approx(0.8)); // lr at its peak, momentum at its base
  Adam adam(p);
  OneCycleLR one(adam, {.max_lr = {0.01}, .total_steps = 10});
  CHECK(adam.param_groups()[0].get("beta1") == 0.95);
  CHECK(adam.param_groups()[0].get("max_lr") == 0.01);
  for (int i = 0; i < 2; ++i)
    one.step();
  CHECK(adam.param_groups()[0].get("beta1") == doctest::Approx(0.85)); // the peak, at pct_start
  Adagrad adagrad(p);
  check_error([&] { CyclicLR(adagrad, {.base_lr = {0.01}, .max_lr = {0.1}}); },
              "optimizer must support momentum or beta1 with `cycle_momentum` option enabled");
  CHECK(adagrad.param_groups()[0].get("lr") == 0.01); // refused before any group changed
  CHECK_NOTHROW(CyclicLR(adagrad, {.base_lr = {0.01}, .max_lr = {0.1}, .cycle_momentum = false}));
}

TEST_CASE("schedulers: ReduceLROnPlateau: modes, thresholds, cooldown, per-group min_lr, state dict") {
  auto p = random_params({{3}, {2}}, Dtype::f64, 4);
  auto opt = two_group_sgd(p);
  ReduceLROnPlateau plateau(*opt, {.mode = "min", .factor = 0.5, .patience = 1, .cooldown = 1, .min_lr = {0.03, 0.0}});
  // Bad epochs: 2 (reduce), cooldown swallows 1, then 2 more (reduce again, group 0 stops at its min_lr).
  const std::vector<double> metrics = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
  std::vector<std::vector<double>> lrs;
  for (double m : metrics) {
    plateau.step(m);
    lrs.push_back(plateau.get_last_lr());
  }
  CHECK(lrs[0] == std::vector<double>{0.1, 0.05});
  CHECK(lrs[2] == std::vector<double>{0.05, 0.025});
  CHECK(lrs[3] == std::vector<double>{0.05, 0.025});  // cooldown
  CHECK(lrs[5] == std::vector<double>{0.03, 0.0125}); // min_lr of group 0
  ReduceLROnPlateau copy(*opt, {.mode = "min", .factor = 0.5, .patience = 1, .cooldown = 1});
  copy.load_state_dict(plateau.state_dict());
  CHECK(copy.state_dict() == plateau.state_dict());
  // max mode with an absolute threshold: 0.95 is no improvement on 1.0 by more than 0.1.
  auto q = random_params({{3}}, Dtype::f64, 5);
  SGD single(q, {.lr = 1.0});
  ReduceLROnPlateau up(single,
                       {.mode = "max", .factor = 0.1, .patience = 0, .threshold = 0.1, .threshold_mode = "abs"});
  up.step(1.0);
  up.step(1.05);
  CHECK(up.get_last_lr()[0] == doctest::Approx(0.1));
}

TEST_CASE("schedulers: SequentialLR and ChainedScheduler compose, and resume from a state dict") {
  check_schedule(
      [](Optimizer& o) {
        std::vector<std::shared_ptr<LRScheduler>> parts = {std::make_shared<ConstantLR>(o, 0.5, int64_t{3}),
                                                           std::make_shared<ExponentialLR>(o, 0.9)};
        return std::make_shared<SequentialLR>(o, parts, std::vector<int64_t>{5});
      },
      [](int64_t e, double b) { return e < 5 ? b * (e < 3 ? 0.5 : 1.0) : b * std::pow(0.9, e - 5); });
  check_schedule(
      [](Optimizer& o) {
        std::vector<std::shared_ptr<LRScheduler>> parts = {std::make_shared<ConstantLR>(o, 0.5, int64_t{3}),
                                                           std::make_shared<ExponentialLR>(o, 0.9)};
        return std::make_shared<ChainedScheduler>(parts);
      },
      [](int64_t e, double b) { return b * std::pow(0.9, e) * (e < 3 ? 0.5 : 1.0); }, 1e-10);
}

TEST_CASE("schedulers: step_to(epoch) uses the closed form") {
  auto p = random_params({{3}, {2}}, Dtype::f64, 6);
  auto opt = two_group_sgd(p);
  StepLR step(*opt, 3, 0.5);
  step.step_to(10);
  CHECK(step.get_last_lr()[0] == doctest::Approx(0.1 * 0.125));
  CosineAnnealingWarmRestarts warm(*opt, 4, 1, 0.0);
  warm.step_to_fraction(5.5); // T_cur = 1.5 of 4
  CHECK(warm.get_last_lr()[1] == doctest::Approx(0.05 * (1 + std::cos(kPi * 1.5 / 4)) / 2));
}

TEST_CASE("schedulers: constructor errors carry torch's messages") {
  auto p = random_params({{3}, {2}}, Dtype::f64, 7);
  auto opt = two_group_sgd(p);
  check_error([&] { ConstantLR(*opt, 1.5); }, "Constant multiplicative factor expected to be between 0 and 1.");
  check_error([&] { LinearLR(*opt, 0.0); },
              "Starting multiplicative factor expected to be greater than 0 and less or equal to 1.");
  check_error([&] { LinearLR(*opt, 0.5, 1.5); }, "Ending multiplicative factor expected to be between 0 and 1.");
  check_error([&] { MultiStepLR(*opt, {5, 3}); }, "Milestones should be a list of increasing integers. Got [5, 3]");
  check_error([&] { CosineAnnealingWarmRestarts(*opt, 0); }, "Expected positive integer T_0, but got 0");
  check_error([&] { CosineAnnealingWarmRestarts(*opt, 2, 0); }, "Expected integer T_mult >= 1, but got 0");
  check_error([&] { OneCycleLR(*opt, {.max_lr = {0.1}}); },
              "You must define either total_steps OR (epochs AND steps_per_epoch)");
  check_error([&] { OneCycleLR(*opt, {.max_lr = {0.1}, .total_steps = 0}); },
              "Expected positive integer total_steps, but got 0");
  check_error([&] { OneCycleLR(*opt, {.max_lr = {0.1}, .total_steps = 5, .pct_start = 1.5}); },
              "Expected float between 0 and 1 pct_start, but got 1.5");
  check_error([&] { CyclicLR(*opt, {.base_lr = {0.1}, .max_lr = {0.2}, .mode = "square"}); },
              "mode is invalid and scale_fn is None");
  check_error([&] { ReduceLROnPlateau(*opt, {.factor = 1.0}); }, "Factor should be < 1.0.");
  check_error([&] { ReduceLROnPlateau(*opt, {.mode = "avg"}); }, "mode avg is unknown!");
  check_error([&] { ReduceLROnPlateau(*opt, {.min_lr = {0.1, 0.2, 0.3}}); }, "expected 2 min_lrs, got 3");
  check_error(
      [&] {
        LambdaLR(*opt, {[](int64_t) { return 1.0; }, [](int64_t) { return 1.0; }, nullptr});
      },
      "Expected 2 lr_lambdas, but got 3");
  check_error([&] { SequentialLR(*opt, {std::make_shared<ExponentialLR>(*opt, 0.9)}, {3}); },
              "Sequential Schedulers expects number of schedulers provided to be one more than the number of "
              "milestone points, but got number of schedulers 1 and the number of milestones to be equal to 1");
  auto q = random_params({{3}}, Dtype::f64, 8);
  Adam adam(q);
  check_error([&] { StepLR(adam, 3, 0.1, /*last_epoch=*/4); },
              "param 'initial_lr' is not specified in param_groups[0] when resuming an optimizer");
}

namespace {

// 100 compiled steps under `make`'s scheduler, beside an eager forloop run under an identical scheduler: the
// same trajectory, one compile, no recompile.
void check_scheduled_run(const std::string& optimizer, const Factory& make) {
  auto eager_params = random_params({{40}, {7, 3}, {}}, Dtype::f32, 9);
  auto compiled_params = copy_params(eager_params);
  auto build = [&](std::vector<Tensor> p, bool foreach) -> std::unique_ptr<Optimizer> {
    if (optimizer == "adam")
      return std::make_unique<Adam>(p, AdamOptions{.lr = 0.01, .foreach = foreach});
    return std::make_unique<SGD>(p, SGDOptions{.lr = 0.01, .momentum = 0.5, .foreach = foreach});
  };
  auto eager = build(eager_params, false), compiled_opt = build(compiled_params, true);
  auto eager_sched = make(*eager), compiled_sched = make(*compiled_opt);
  CompiledStep step = compile(*compiled_opt);
  for (int s = 0; s < 100; ++s) {
    randomize_grads(eager_params, 40 + static_cast<uint64_t>(s));
    randomize_grads(compiled_params, 40 + static_cast<uint64_t>(s));
    eager->step();
    step();
    eager_sched->step();
    compiled_sched->step();
  }
  INFO(compiled_sched->name());
  check_same_trajectory(compiled_params, *compiled_opt, eager_params, *eager, 2e-5, 1e-6, "compiled vs forloop");
  CHECK(step.metrics().compiles == 1);
  CHECK(step.metrics().recompiles == 0);
  CHECK(step.metrics().steps == 100);
}

} // namespace

TEST_CASE("schedulers: 100 compiled steps under every scheduler compile once and match the eager run") {
  for (const std::string optimizer : {"sgd", "adam"}) {
    check_scheduled_run(optimizer, make<LambdaLR>(std::vector<LrLambda>{[](int64_t e) { return 1.0 / (e + 1); }}));
    check_scheduled_run(optimizer, make<MultiplicativeLR>(std::vector<LrLambda>{[](int64_t) { return 0.98; }}));
    check_scheduled_run(optimizer, make<StepLR>(int64_t{10}, 0.7));
    check_scheduled_run(optimizer, make<MultiStepLR>(std::vector<int64_t>{20, 50}, 0.5));
    check_scheduled_run(optimizer, make<ConstantLR>(0.3, int64_t{10}));
    check_scheduled_run(optimizer, make<LinearLR>(0.1, 1.0, int64_t{30}));
    check_scheduled_run(optimizer, make<ExponentialLR>(0.97));
    check_scheduled_run(optimizer, make<PolynomialLR>(int64_t{80}, 1.5));
    check_scheduled_run(optimizer, make<CosineAnnealingLR>(int64_t{25}, 1e-4));
    check_scheduled_run(optimizer, make<CosineAnnealingWarmRestarts>(int64_t{10}, int64_t{2}, 1e-4));
    check_scheduled_run(optimizer, [](Optimizer& o) {
      return std::make_shared<CyclicLR>(o, CyclicLROptions{.base_lr = {0.001}, .max_lr = {0.01}, .step_size_up = 15});
    });
    check_scheduled_run(optimizer, [](Optimizer& o) {
      return std::make_shared<OneCycleLR>(o, OneCycleLROptions{.max_lr = {0.02}, .total_steps = 101});
    });
    check_scheduled_run(optimizer, [](Optimizer& o) {
      std::vector<std::shared_ptr<LRScheduler>> parts = {std::make_shared<LinearLR>(o, 0.1, 1.0, int64_t{10}),
                                                         std::make_shared<CosineAnnealingLR>(o, int64_t{90})};
      return std::make_shared<SequentialLR>(o, parts, std::vector<int64_t>{10});
    });
    check_scheduled_run(optimizer, [](Optimizer& o) {
      std::vector<std::shared_ptr<LRScheduler>> parts = {std::make_shared<ConstantLR>(o, 0.5, int64_t{5}),
                                                         std::make_shared<ExponentialLR>(o, 0.99)};
      return std::make_shared<ChainedScheduler>(parts);
    });
  }
}

TEST_CASE("schedulers: ReduceLROnPlateau over 100 compiled steps compiles once") {
  auto params = random_params({{16}}, Dtype::f32, 10);
  SGD opt(params, {.lr = 0.1, .foreach = true});
  ReduceLROnPlateau plateau(opt, {.patience = 2});
  CompiledStep step = compile(opt);
  for (int s = 0; s < 100; ++s) {
    randomize_grads(params, static_cast<uint64_t>(s));
    step();
    plateau.step(1.0); // never improves: the lr keeps falling
  }
  CHECK(opt.param_groups()[0].get("lr") < 1e-7); // torch stops once a reduction is below eps (1e-8)
  CHECK(step.metrics().compiles == 1);
  CHECK(step.metrics().recompiles == 0);
}

TEST_CASE("schedulers: a tensor lr drives eager and compiled steps alike, filled in place by the scheduler") {
  auto float_params = random_params({{30}, {4}}, Dtype::f32, 11);
  auto tensor_params = copy_params(float_params);
  Adam float_lr(float_params, {.lr = 0.01});
  Adam tensor_lr(tensor_params, {.lr = 0.01, .foreach = true});
  const Tensor lr = Tensor::full({}, 0.01, Dtype::f64);
  tensor_lr.param_groups()[0].set("lr", lr);
  CompiledStep step = compile(tensor_lr);
  ExponentialLR float_sched(float_lr, 0.95), tensor_sched(tensor_lr, 0.95);
  for (int s = 0; s < 30; ++s) {
    randomize_grads(float_params, 70 + static_cast<uint64_t>(s));
    randomize_grads(tensor_params, 70 + static_cast<uint64_t>(s));
    float_lr.step();
    step();
    float_sched.step();
    tensor_sched.step();
  }
  CHECK(lr.item() == doctest::Approx(0.01 * std::pow(0.95, 30)));
  CHECK(tensor_lr.param_groups()[0].get("lr") == lr.item());
  check_same_trajectory(tensor_params, tensor_lr, float_params, float_lr, 2e-5, 1e-6, "tensor lr vs float lr");
  CHECK(step.metrics().compiles == 1);
  lr.fill(0.0); // the user's own write to the tensor reaches the next step too
  const std::vector<double> before = tensor_params[0].to_vector();
  randomize_grads(tensor_params, 1);
  step();
  CHECK(tensor_params[0].to_vector() == before);
  check_error([&] { tensor_lr.param_groups()[0].set("lr", Tensor::full({2}, 0.1, Dtype::f64)); },
              "Tensor lr must be 1-element");
}

TEST_CASE("schedulers: a loaded state dict is checked as the constructor checks, and a refused one changes nothing "
          "(issue 16, 6)") {
  auto p = random_params({{3}, {2}}, Dtype::f64, 9);
  auto opt = two_group_sgd(p);
  // Each scheduler, one field made invalid: it is refused naming the field, the scheduler and its optimizer's lrs
  // are unchanged, and stepping goes on (no division by zero, no overflow).
  auto check_refused = [&](LRScheduler& s, const std::string& key, double value, const std::string& message) {
    INFO(s.name() << " " << key << " = " << value);
    SchedulerState bad = s.state_dict();
    bad.at(key).at(0) = value;
    const SchedulerState before = s.state_dict();
    const std::vector<double> lrs = {opt->param_groups()[0].get("lr"), opt->param_groups()[1].get("lr")};
    check_error([&] { s.load_state_dict(bad); }, message);
    CHECK(s.state_dict() == before);
    CHECK(opt->param_groups()[0].get("lr") == lrs[0]);
    s.step();
  };
  StepLR step(*opt, 3, 0.5);
  check_refused(step, "step_size", 0,
                "StepLR state dict has step_size = 0: it must be a whole number from 1 to 2^53 (kMaxScheduleCount)");
  check_refused(
      step, "last_epoch", std::nan(""),
      "StepLR state dict has last_epoch = nan: it must be a whole number from -1 to 2^53 (kMaxScheduleCount)");
  check_refused(step, "gamma", INFINITY, "StepLR state dict has gamma = inf: it must be finite");
  CosineAnnealingLR cosine(*opt, 10);
  check_refused(cosine, "T_max", 0,
                "CosineAnnealingLR state dict has T_max = 0: it must be a whole number from 1 to 2^53 "
                "(kMaxScheduleCount)");
  check_refused(cosine, "T_max", 9.2e18,
                "CosineAnnealingLR state dict has T_max = 9.2e+18: it must be a whole number from 1 to 2^53 "
                "(kMaxScheduleCount)");
  check_refused(cosine, "_step_count", 2.5,
                "CosineAnnealingLR state dict has _step_count = 2.5: it must be a whole number from 0 to 2^53 "
                "(kMaxScheduleCount)");
  ConstantLR constant(*opt, 0.5, int64_t{4});
  check_refused(constant, "factor", 2, "Constant multiplicative factor expected to be between 0 and 1.");
  CosineAnnealingWarmRestarts warm(*opt, 4, 2);
  check_refused(warm, "T_mult", 0,
                "CosineAnnealingWarmRestarts state dict has T_mult = 0: it must be a whole number from 1 to 2^53 "
                "(kMaxScheduleCount)");

  // A composition checks every part before any part loads.
  std::vector<std::shared_ptr<LRScheduler>> parts = {std::make_shared<ConstantLR>(*opt, 0.5, int64_t{3}),
                                                     std::make_shared<StepLR>(*opt, 2, 0.9)};
  SequentialLR sequence(*opt, parts, {5});
  for (int i = 0; i < 3; ++i)
    sequence.step();
  SchedulerState bad = sequence.state_dict();
  bad.at("_schedulers.0.last_epoch").at(0) = 0; // a valid change to the first part
  bad.at("_schedulers.1.step_size").at(0) = 0;  // an invalid one to the second
  const SchedulerState first_before = parts[0]->state_dict();
  check_error([&] { sequence.load_state_dict(bad); },
              "StepLR state dict has step_size = 0: it must be a whole number from 1 to 2^53 (kMaxScheduleCount)");
  CHECK(parts[0]->state_dict() == first_before);

  // Constructors refuse counts past the limit, and products that would overflow.
  check_error([&] { CosineAnnealingLR(*opt, INT64_MAX); },
              "T_max is 9223372036854775807: a schedule count is at most 2^53 (kMaxScheduleCount)");
  check_error([&] { OneCycleLR(*opt, {.max_lr = {0.1}, .epochs = int64_t{1} << 40, .steps_per_epoch = 1 << 20}); },
              "epochs 1099511627776 x steps_per_epoch 1048576 is more steps than 2^53 (kMaxScheduleCount)");
}
