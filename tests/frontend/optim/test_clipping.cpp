// Grad-norm clipping fused into the step, and LAMB: the norm is one reduction pass over the grads before the update
// (Adam + clipping: 2 kernels), one norm over every bucket, the grads never written, the same result in every mode
// and for every thread count, and error_if_nonfinite refusing a step before anything changes.
#include "frontend/optim/lamb.h"
#include "helpers.h"
#include "runtime/thread_pool.h"

#include <limits>

using namespace optjit;
using optjit::test::make_single_group;

namespace {

std::vector<Tensor> params_of(Dtype dtype, uint64_t seed) {
  std::vector<Tensor> params;
  int k = 0;
  for (const Shape& shape : std::vector<Shape>{{300, 70}, {7}, {0}, {}}) {
    std::vector<double> p(static_cast<std::size_t>(shape_numel(shape))), g(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] = std::sin(0.01 * static_cast<double>(i + seed) + k);
      g[i] = 3 * std::cos(0.07 * static_cast<double>(i) + k);
    }
    params.push_back(Tensor::from_values(shape, p, dtype));
    params.back().set_grad(Tensor::from_values(shape, g, dtype));
    ++k;
  }
  return params;
}

std::vector<double> flat_values(const std::vector<Tensor>& tensors) {
  std::vector<double> all;
  for (const Tensor& t : tensors)
    for (double v : t.to_vector())
      all.push_back(v);
  return all;
}

enum class Mode { Forloop, Eager, Compiled };

// Three steps of `name` clipped to `max_norm`; returns params and the total norms.
std::pair<std::vector<double>, std::vector<double>> clipped_run(const std::string& name, Mode mode, double norm_type,
                                                                Dtype dtype = Dtype::f64, double max_norm = 2.5) {
  std::vector<Tensor> params = params_of(dtype, 1);
  auto opt = make_single_group(name, params, {{"lr", {0.01}}}, mode != Mode::Forloop);
  opt->set_grad_clipping(Optimizer::GradClipping{max_norm, norm_type, false});
  std::optional<CompiledStep> step;
  if (mode == Mode::Compiled)
    step.emplace(compile(*opt));
  std::vector<double> norms;
  for (int s = 0; s < 3; ++s) {
    step ? (*step)() : opt->step();
    norms.push_back(opt->total_grad_norm());
  }
  return {flat_values(params), norms};
}

} // namespace

TEST_CASE("clipping: the total norm is clip_grad_norm_'s, the grads are not written, and every mode agrees") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double norm_type : {2.0, inf}) {
    CAPTURE(norm_type);
    std::vector<Tensor> params = params_of(Dtype::f64, 1);
    const std::vector<double> grads_before = flat_values({params[0].grad(), params[1].grad()});
    double expected = 0;
    for (const Tensor& p : params)
      for (double g : p.grad().to_vector())
        expected = norm_type == 2.0 ? expected + g * g : std::max(expected, std::fabs(g));
    expected = norm_type == 2.0 ? std::sqrt(expected) : expected;
    auto opt = make_single_group("adam", params, {{"lr", {0.01}}}, true);
    opt->set_grad_clipping(Optimizer::GradClipping{2.5, norm_type, false});
    CompiledStep step = compile(*opt);
    step();
    CHECK(opt->total_grad_norm() == doctest::Approx(expected).epsilon(1e-12));
    CHECK(flat_values({params[0].grad(), params[1].grad()}) == grads_before);
    CHECK_KERNELS(step, 2); // the norm pass, then Adam

    const auto [forloop_params, forloop_norms] = clipped_run("adam", Mode::Forloop, norm_type);
    for (Mode mode : {Mode::Eager, Mode::Compiled}) {
      const auto [values, norms] = clipped_run("adam", mode, norm_type);
      for (std::size_t i = 0; i < norms.size(); ++i)
        CHECK(norms[i] == doctest::Approx(forloop_norms[i]).epsilon(1e-12));
      for (std::size_t i = 0; i < values.size(); ++i)
        REQUIRE(values[i] == doctest::Approx(forloop_params[i]).epsilon(1e-10));
    }
  }
}

TEST_CASE("clipping: an infinite max_norm only measures the norm, a negative one flips the grads, as torch's") {
  // clip_grad_norm_ takes any max_norm: its coefficient max_norm / (norm + 1e-6), clamped to 1, is 1 for inf (so the
  // step is the unclipped one) and negative for a negative max_norm.
  const double inf = std::numeric_limits<double>::infinity();
  const auto [unclipped, unused] = clipped_run("adam", Mode::Forloop, 2.0, Dtype::f64, 1e300);
  for (double norm_type : {2.0, inf})
    for (double max_norm : {inf, -0.5}) {
      CAPTURE(norm_type);
      CAPTURE(max_norm);
      const auto [forloop_params, forloop_norms] = clipped_run("adam", Mode::Forloop, norm_type, Dtype::f64, max_norm);
      if (max_norm == inf)
        CHECK(forloop_params == unclipped);
      for (Mode mode : {Mode::Eager, Mode::Compiled}) {
        const auto [values, norms] = clipped_run("adam", mode, norm_type, Dtype::f64, max_norm);
        for (std::size_t i = 0; i < norms.size(); ++i)
          CHECK(norms[i] == doctest::Approx(forloop_norms[i]).epsilon(1e-12));
        for (std::size_t i = 0; i < values.size(); ++i)
          REQUIRE(values[i] == doctest::Approx(forloop_params[i]).epsilon(1e-10));
      }
    }
}

TEST_CASE("clipping: one norm over every bucket, bitwise the same for every thread count") {
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  std::vector<std::vector<double>> runs;
  for (int active : {1, threads}) {
    pool.set_active_threads(active);
    std::vector<Tensor> f32 = params_of(Dtype::f32, 1), f64 = params_of(Dtype::f64, 2);
    std::vector<Tensor> all = f32;
    all.insert(all.end(), f64.begin(), f64.end());
    auto opt = make_single_group("sgd", all, {{"lr", {0.1}}, {"momentum", {0.9}}}, true);
    opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, false});
    CompiledStep step = compile(*opt);
    step();
    step();
    runs.push_back(flat_values(all));
    runs.back().push_back(opt->total_grad_norm());
    double expected = 0;
    for (const Tensor& p : all)
      for (double g : p.grad().to_vector())
        expected += g * g;
    CHECK(opt->total_grad_norm() == doctest::Approx(std::sqrt(expected)).epsilon(1e-6));
  }
  pool.set_active_threads(threads);
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("clipping: error_if_nonfinite refuses the step before anything changes, in every mode") {
  for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
    CAPTURE(static_cast<int>(mode));
    std::vector<Tensor> params = params_of(Dtype::f32, 1);
    auto opt = make_single_group("adam", params, {{"lr", {0.01}}}, mode != Mode::Forloop);
    opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, true});
    std::optional<CompiledStep> step;
    if (mode == Mode::Compiled)
      step.emplace(compile(*opt));
    step ? (*step)() : opt->step();
    const std::vector<double> before = flat_values(params);
    params[1].grad().set_item(3, std::numeric_limits<double>::infinity());
    test::check_error_contains([&] { step ? (*step)() : opt->step(); },
                               "for gradients from `parameters` is non-finite, so it cannot be clipped");
    CHECK(flat_values(params) == before);
    CHECK(opt->visible_state(params[0]).front().second.item() == 1); // the step counter did not move
  }
  for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) { // a refused first step leaves no state behind
    CAPTURE(static_cast<int>(mode));
    std::vector<Tensor> params = params_of(Dtype::f32, 1);
    params[0].grad().set_item(0, std::numeric_limits<double>::quiet_NaN());
    auto opt = make_single_group("adam", params, {{"lr", {0.01}}}, mode != Mode::Forloop);
    opt->set_grad_clipping(Optimizer::GradClipping{1.0, 2.0, true});
    std::optional<CompiledStep> step;
    if (mode == Mode::Compiled)
      step.emplace(compile(*opt));
    const std::vector<double> before = flat_values(params);
    test::check_error_contains([&] { step ? (*step)() : opt->step(); }, "is non-finite");
    CHECK(flat_values(params) == before);
    for (const Tensor& p : params)
      CHECK(opt->visible_state(p).empty());
    params[0].grad().set_item(0, 0.5); // the next step is the first, and runs
    step ? (*step)() : opt->step();
    CHECK(opt->visible_state(params[0]).front().second.item() == 1);
  }
  std::vector<Tensor> params = params_of(Dtype::f32, 1);
  auto opt = make_single_group("adam", params, {}, true);
  test::check_error(
      [&] {
        opt->set_grad_clipping(Optimizer::GradClipping{1.0, 1.0, false});
      },
      "norm_type is 1.0: fused clipping takes 2 or inf");
}

TEST_CASE("clipping with the in-step inf check: one grad pass does both, and error_if_nonfinite throws first") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double norm_type : {2.0, inf})
    for (Mode mode : {Mode::Forloop, Mode::Eager, Mode::Compiled}) {
      CAPTURE(norm_type);
      CAPTURE(static_cast<int>(mode));
      std::vector<Tensor> params = params_of(Dtype::f32, 1);
      auto opt = make_single_group("adam", params, {{"lr", {0.01}}}, mode != Mode::Forloop);
      opt->set_grad_clipping(Optimizer::GradClipping{2.5, norm_type, false});
      Tensor found_inf = Tensor::zeros({1}, Dtype::f32);
      opt->set_grad_scaling(Tensor(), found_inf, Optimizer::GradsAfterStep::Scaled, Optimizer::InfCheck::InStep);
      std::optional<CompiledStep> step;
      if (mode == Mode::Compiled)
        step.emplace(compile(*opt));
      step ? (*step)() : opt->step();
      CHECK(found_inf.item() == 0);
      if (step)
        CHECK_KERNELS(*step, 2); // the grad pass (norm and check together), then Adam
      // Finite grads whose squares overflow f32 are no inf: the check looks at the elements, not at the norm.
      params[0].grad().set_item(1, 3e38);
      step ? (*step)() : opt->step();
      CHECK(found_inf.item() == 0);
      CHECK(opt->visible_state(params[0]).front().second.item() == 2);
      const std::vector<double> before = flat_values(params);
      params[1].grad().set_item(3, -inf);
      step ? (*step)() : opt->step();
      CHECK(found_inf.item() == 1);
      CHECK(flat_values(params) == before);
      CHECK(opt->visible_state(params[0]).front().second.item() == 2);
      CHECK(std::isinf(opt->total_grad_norm())); // the norm of the skipped step is still reported
      found_inf.fill(0);
      opt->set_grad_clipping(Optimizer::GradClipping{2.5, norm_type, true});
      test::check_error_contains([&] { step ? (*step)() : opt->step(); }, "is non-finite");
      CHECK(found_inf.item() == 1); // clip_grad_norm_ raises between GradScaler's unscale_ (which found it) and step
      CHECK(flat_values(params) == before);
    }
}

TEST_CASE("lamb: two kernels, the three modes agree, and its norms do not depend on the thread count") {
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  std::vector<std::vector<double>> compiled;
  for (int active : {1, threads}) {
    pool.set_active_threads(active);
    std::vector<Tensor> params = params_of(Dtype::f32, 3);
    auto opt = make_single_group("LAMB", params, {{"lr", {0.01}}, {"weight_decay", {0.1}}}, true);
    CompiledStep step = compile(*opt);
    for (int s = 0; s < 3; ++s)
      step();
    CHECK_KERNELS(step, 2);
    compiled.push_back(flat_values(params));
  }
  pool.set_active_threads(threads);
  CHECK(compiled[0] == compiled[1]);
  for (bool foreach : {false, true}) {
    std::vector<Tensor> params = params_of(Dtype::f32, 3);
    auto opt = make_single_group("LAMB", params, {{"lr", {0.01}}, {"weight_decay", {0.1}}}, foreach);
    for (int s = 0; s < 3; ++s)
      opt->step();
    const std::vector<double> values = flat_values(params);
    for (std::size_t i = 0; i < values.size(); ++i)
      REQUIRE(values[i] == doctest::Approx(compiled[0][i]).epsilon(1e-5));
  }
  test::check_error(
      [&] {
        LAMB(params_of(Dtype::f32, 1), {.betas = {1.0, 0.9}});
      },
      "Invalid beta parameter at index 0: 1.0");
}

TEST_CASE("lars: the trust ratio by hand, 1-D params excluded by the group option, two kernels, modes agree") {
  // One step by hand: w = [3, 4] (|w| 5), g = [0.6, 0.8] (|g| 1), lr 0.1, wd 0.01, eta 0.001:
  // trust = 0.001 * 5 / (1 + 0.05) ; v = lr * trust * (g + wd w) ; w -= v.
  Tensor w = Tensor::from_values({1, 2}, std::vector<double>{3, 4}, Dtype::f64);
  w.set_grad(Tensor::from_values({1, 2}, std::vector<double>{0.6, 0.8}, Dtype::f64));
  auto opt = make_single_group("lars", {w}, {{"lr", {0.1}}, {"weight_decay", {0.01}}}, true);
  CompiledStep step = compile(*opt);
  step();
  const double trust = 0.001 * 5 / (1 + 0.01 * 5);
  CHECK(w.item(0) == doctest::Approx(3 - 0.1 * trust * (0.6 + 0.03)).epsilon(1e-14));
  CHECK(w.item(1) == doctest::Approx(4 - 0.1 * trust * (0.8 + 0.04)).epsilon(1e-14));
  CHECK_KERNELS(step, 2);

  std::vector<std::vector<double>> runs;
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<Tensor> params = params_of(Dtype::f32, 9);
    auto o =
        make_single_group("lars", params, {{"lr", {0.5}}, {"weight_decay", {0.1}}, {"exclude_1d", {1}}}, mode != 0);
    std::optional<CompiledStep> s;
    if (mode == 2)
      s.emplace(compile(*o));
    for (int k = 0; k < 3; ++k)
      s ? (*s)() : o->step();
    runs.push_back(flat_values(params));
  }
  for (int mode = 1; mode < 3; ++mode)
    for (std::size_t i = 0; i < runs[0].size(); ++i)
      REQUIRE(runs[static_cast<std::size_t>(mode)][i] == doctest::Approx(runs[0][i]).epsilon(1e-5));
  // An excluded 1-D param steps as plain momentum SGD: v = g, w -= lr g on the first step.
  std::vector<Tensor> one = params_of(Dtype::f64, 9);
  const double before = one[1].item(0), grad = one[1].grad().item(0);
  auto excluded = make_single_group("lars", one, {{"lr", {0.5}}, {"weight_decay", {0.1}}, {"exclude_1d", {1}}}, true);
  excluded->step();
  CHECK(one[1].item(0) == doctest::Approx(before - 0.5 * grad).epsilon(1e-14));
}
