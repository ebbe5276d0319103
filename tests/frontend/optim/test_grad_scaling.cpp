// Gradient scaling (torch's fused-optimizer grad_scale / found_inf): every optimizer, in every mode, stepped on grads
// scaled by a power of two with that grad_scale, follows bit for bit the same optimizer stepped on the unscaled
// grads (dividing by a power of two is exact), and a found_inf step changes nothing and creates no state, whether the
// caller filled found_inf or the step's own inf check did.
#include "compiler/compiled_step.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_same_trajectory;
using optjit::test::every_optimizer;
using optjit::test::Mode;
using optjit::test::Run;
using optjit::test::Snapshot;

namespace {

const std::vector<Shape> kShapes = {{3, 5}, {7}, {}, {0}, {40000}};

// Equal element by element, NaN where NaN is.
bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); });
}

// Grads from `seed` times `scale`; param 1 has no grad before step 2.
void set_grads(std::vector<Tensor>& params, int step, double scale) {
  for (Tensor& p : params)
    if (!p.grad().defined())
      p.set_grad(Tensor::zeros(p.shape(), p.dtype()));
  randomize_grads(params, 100 + static_cast<uint64_t>(step));
  for (Tensor& p : params)
    if (Tensor g = p.grad(); g.defined() && scale != 1) {
      std::vector<double> v = g.to_vector();
      for (double& x : v)
        x *= scale;
      p.set_grad(Tensor::from_values(g.shape(), v, g.dtype()));
    }
  if (step < 2)
    params[1].reset_grad();
}

// `name` stepped on grads scaled by a power of two, with that grad_scale, against the same optimizer on the unscaled
// grads: bit for bit the same. A found_inf step changes nothing, not even the state of a param whose first grad
// arrives in it. The grads after a step are the scaled ones untouched, or exactly the unscaled ones. With the
// in-step check, found_inf is 0 before every step and the overflowed step's grads hold an inf and a NaN: the step
// finds them, writes 1 to found_inf and is skipped.
void check_follows_unscaled_run(const std::string& name, const KeywordOptions& options, Dtype dtype, Mode mode,
                                Optimizer::GradsAfterStep grads_after,
                                Optimizer::InfCheck check = Optimizer::InfCheck::ByCaller,
                                const std::vector<Shape>& shapes = kShapes) {
  INFO(name << " " << dtype_name(dtype) << " mode " << static_cast<int>(mode) << " grads after "
            << static_cast<int>(grads_after) << " check " << static_cast<int>(check));
  const bool in_step = check == Optimizer::InfCheck::InStep;
  // InKernels: the compiled kernels keep every old value when found_inf is not 0; the host never reads it, so the
  // state the skipped step made for param 1 stays (its initial state, as torch's fused step leaves it). Forloop and
  // eager steps decide on the host.
  const bool kernels_decide = check == Optimizer::InfCheck::InKernels && mode == Mode::Compiled;
  const std::vector<Tensor> initial = random_params(shapes, dtype, 7);
  Run plain(name, options, initial, mode), scaled(name, options, initial, mode);
  Tensor grad_scale = Tensor::full({1}, 1024, Dtype::f32), found_inf = Tensor::zeros({1}, Dtype::f32);
  scaled.opt->set_grad_scaling(grad_scale, found_inf, grads_after, check);
  for (int step = 0; step < 6; ++step) {
    // Step 1 overflowed: skipped. Param 1's first grad arrives in it, so it must not get state. From step 4 the
    // scaler has halved its scale: a new value, not a new kernel.
    const bool overflowed = step == 1;
    const double scale = step < 4 ? 1024 : 512;
    grad_scale.fill(scale);
    found_inf.fill(overflowed && !in_step ? 1 : 0);
    set_grads(plain.params, step, 1);
    set_grads(scaled.params, step, scale);
    if (overflowed)
      scaled.params[1].set_grad(Tensor::full(scaled.params[1].shape(), 1e30, dtype));
    if (overflowed && in_step) {
      scaled.params[4].grad().set_item(39999, INFINITY);
      scaled.params[0].grad().set_item(7, NAN);
    }
    std::vector<std::vector<double>> grads_before;
    for (const Tensor& p : scaled.params)
      grads_before.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
    const Snapshot before(scaled.params, *scaled.opt);
    std::vector<Tensor> with_state = scaled.params; // the params whose state the skipped step may not create
    with_state.erase(with_state.begin() + 1);
    const Snapshot before_others(with_state, *scaled.opt);
    const std::vector<double> param1_before = scaled.params[1].to_vector();
    scaled.step();
    CHECK(found_inf.item() == (overflowed ? 1 : 0));
    if (overflowed && kernels_decide) {
      CHECK(Snapshot(with_state, *scaled.opt) == before_others);
      CHECK(same_values(scaled.params[1].to_vector(), param1_before));
      CHECK_FALSE(scaled.opt->visible_state(scaled.params[1]).empty()); // the following steps check its values
      continue;
    }
    if (overflowed) {
      CHECK(Snapshot(scaled.params, *scaled.opt) == before);
      CHECK(scaled.opt->visible_state(scaled.params[1]).empty() == (name != "adagrad"));
    } else {
      plain.step();
    }
    const bool unscaled = !overflowed && grads_after == Optimizer::GradsAfterStep::Unscaled;
    for (std::size_t i = 0; i < grads_before.size(); ++i)
      if (Tensor g = scaled.params[i].grad(); g.defined()) {
        const std::vector<double> expected = unscaled ? plain.params[i].grad().to_vector() : grads_before[i];
        CHECK(same_values(g.to_vector(), expected));
      }
    check_same_trajectory(scaled.params, *scaled.opt, plain.params, *plain.opt, 0, 0, "scaled vs plain");
  }
  if (scaled.compiled) {
    CHECK_KERNELS(*scaled.compiled, plain.compiled->kernel_count() + (in_step ? 1 : 0)); // + the check
    CHECK(scaled.compiled->metrics().compiles == 1);
    CHECK(scaled.compiled->metrics().skipped_steps == (kernels_decide ? 0 : 1)); // the host does not know
    CHECK(scaled.compiled->metrics().steps == 6);
  }
}

} // namespace

TEST_CASE("grad scaling: every optimizer in every mode follows the unscaled run bit for bit, and found_inf skips") {
  for (const auto& [name, options] : every_optimizer())
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
      for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16})
        check_follows_unscaled_run(name, options, dtype, mode, Optimizer::GradsAfterStep::Scaled);
      for (Dtype dtype : {Dtype::f32, Dtype::f16})
        check_follows_unscaled_run(name, options, dtype, mode, Optimizer::GradsAfterStep::Unscaled);
    }
}

TEST_CASE("grad scaling: the step's own inf check fills found_inf and skips, in every optimizer and mode") {
  for (const auto& [name, options] : every_optimizer())
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
      check_follows_unscaled_run(name, options, Dtype::f32, mode, Optimizer::GradsAfterStep::Scaled,
                                 Optimizer::InfCheck::InStep);
      check_follows_unscaled_run(name, options, Dtype::bf16, mode, Optimizer::GradsAfterStep::Unscaled,
                                 Optimizer::InfCheck::InStep);
    }
}

TEST_CASE("grad scaling: found_inf read by the kernels (InfCheck::InKernels) keeps every old value, in every "
          "optimizer and mode") {
  for (const auto& [name, options] : every_optimizer())
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
      check_follows_unscaled_run(name, options, Dtype::f32, mode, Optimizer::GradsAfterStep::Scaled,
                                 Optimizer::InfCheck::InKernels);
      check_follows_unscaled_run(name, options, Dtype::bf16, mode, Optimizer::GradsAfterStep::Unscaled,
                                 Optimizer::InfCheck::InKernels);
    }
  // Rows and columns (Adafactor), norms (LAMB), block-quantized state (its codes and scales kept as they were, not
  // quantized again), master weights.
  const auto state_dtype = [](const char* dtype) {
    return std::vector<double>{named_option_value("state_dtype", dtype)};
  };
  const std::vector<std::pair<std::string, KeywordOptions>> own = {
      {"lion", {{"lr", {0.01}}, {"weight_decay", {0.1}}}},
      {"adafactor", {}},
      {"lamb", {{"lr", {0.01}}, {"weight_decay", {0.1}}}},
      {"adamw", {{"lr", {0.01}}, {"state_dtype", state_dtype("int8")}}},
      {"adam", {{"lr", {0.01}}, {"amsgrad", {1}}, {"state_dtype", state_dtype("int4")}}},
      {"rmsprop", {{"lr", {0.01}}, {"state_dtype", state_dtype("fp8")}}},
      {"adamw", {{"lr", {0.01}}, {"master_weights", {1}}}}};
  for (const auto& [name, options] : own) // Adafactor refuses empty params: matrices instead
    check_follows_unscaled_run(name, options, Dtype::bf16, Mode::Compiled, Optimizer::GradsAfterStep::Unscaled,
                               Optimizer::InfCheck::InKernels, {{3, 5}, {7}, {6, 4}, {20, 30}, {50}});
}

TEST_CASE("grad scaling: switching it on recompiles once and says why, and bad scales are refused before any change") {
  std::vector<Tensor> params = random_params(kShapes, Dtype::f32, 3);
  auto opt = make_optimizer("adam", {ParamGroupSpec{params, {}}}, {{"foreach", {1}}});
  CompiledStep step = compile(*opt);
  step();
  Tensor grad_scale = Tensor::full({1}, 0, Dtype::f32);
  opt->set_grad_scaling(grad_scale, Tensor());
  const Snapshot before(params, *opt);
  check_error([&] { step(); }, "grad_scale is 0.0: a gradient scale must be a positive finite number (grads are "
                               "divided by it)");
  check_error([&] { opt->step(); }, "grad_scale is 0.0: a gradient scale must be a positive finite number (grads "
                                    "are divided by it)");
  grad_scale.fill(INFINITY);
  check_error([&] { step(); }, "grad_scale is inf: a gradient scale must be a positive finite number (grads are "
                               "divided by it)");
  CHECK(Snapshot(params, *opt) == before);
  grad_scale.fill(4);
  step();
  REQUIRE(step.metrics().recompiles == 1);
  CHECK(step.metrics().recompile_reasons[0].find("grad_scale=0") != std::string::npos);
  CHECK(step.dump(Stage::Traced).find("hyper \"grad_scale\"") != std::string::npos);
  opt->set_grad_scaling(Tensor(), Tensor()); // off again: the first variant, from the guard cache
  step();
  CHECK(step.metrics().recompiles == 1);
  CHECK(step.metrics().guard_cache_hits == 1);

  check_error([&] { opt->set_grad_scaling(Tensor::full({2}, 1, Dtype::f32), Tensor()); },
              "grad_scale is f32[2] on cpu: a gradient scaler's grad_scale holds one f32 element");
  check_error([&] { opt->set_grad_scaling(Tensor::full({1}, 1, Dtype::f64), Tensor()); },
              "grad_scale is f64[1] on cpu: a gradient scaler's grad_scale holds one f32 element");
  check_error(
      [&] {
        opt->set_grad_scaling(Tensor(), Tensor::zeros({1, 2}, Dtype::f32));
      },
      "found_inf is f32[1, 2] on cpu: a gradient scaler's found_inf holds one f32 element");
  check_error(
      [&] {
        opt->set_grad_scaling(Tensor(), Tensor(), Optimizer::GradsAfterStep::Scaled, Optimizer::InfCheck::InStep);
      },
      "found_inf is undefined, and an in-step inf check writes what it finds there: pass a found_inf tensor holding "
      "0");
}
