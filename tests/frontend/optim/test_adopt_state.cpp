// State that lives in someone else's tensors (torch's, in the Python package): scalar state in a dtype of its own,
// state adopted per param, and compiled steps that follow the adopted tensors' dtypes.
#include "compiler/compiled_step.h"
#include "helpers.h"

namespace optjit::test {
namespace {

std::vector<Tensor> two_params(Dtype dtype) {
  return {Tensor::from_values({3}, std::vector<double>{0.5, -1.25, 2}, dtype),
          Tensor::from_values({2}, std::vector<double>{1, -3}, dtype)};
}

void set_grads(const std::vector<Tensor>& params, double scale) {
  for (const Tensor& p : params) {
    std::vector<double> g;
    for (int64_t i = 0; i < p.numel(); ++i)
      g.push_back(scale * (0.25 + 0.5 * static_cast<double>(i)) - 0.3);
    p.set_grad(Tensor::from_values(p.shape(), g, p.dtype()));
  }
}

} // namespace

TEST_CASE("adopt state: scalar state in f32 beside f64 params, compiled equal to the forloop reference") {
  std::vector<Tensor> a = two_params(Dtype::f64), b = two_params(Dtype::f64);
  auto compiled = make_single_group("ASGD", a, {{"lr", {0.1}}, {"t0", {1}}}, true);
  auto reference = make_single_group("ASGD", b, {{"lr", {0.1}}, {"t0", {1}}}, false);
  compiled->set_scalar_state_dtype(Dtype::f32);
  reference->set_scalar_state_dtype(Dtype::f32);
  CompiledStep step = compile(*compiled);
  for (int t = 0; t < 4; ++t) {
    set_grads(a, 1 + t);
    set_grads(b, 1 + t);
    step();
    reference->step();
  }
  check_same_trajectory(a, *compiled, b, *reference, 1e-14, 1e-15, "ASGD f64 with f32 scalar state");
  CHECK(find_state(*compiled->state(a[0]), "eta").dtype() == Dtype::f32);
  CHECK(find_state(*compiled->state(a[0]), "ax").dtype() == Dtype::f64);
  CHECK(step.metrics().compiles == 1);
}

TEST_CASE("adopt state: a loaded f64 eta recompiles for its dtype, and continues as the reference does") {
  std::vector<Tensor> a = two_params(Dtype::f64), b = two_params(Dtype::f64);
  auto compiled = make_single_group("ASGD", a, {{"lr", {0.1}}}, true);
  auto reference = make_single_group("ASGD", b, {{"lr", {0.1}}}, false);
  compiled->set_scalar_state_dtype(Dtype::f32);
  reference->set_scalar_state_dtype(Dtype::f32); // torch rounds new etas to f32 even when the loaded eta is f64
  CompiledStep step = compile(*compiled);
  set_grads(a, 1);
  step();
  // torch's load_state_dict casts every state entry but 'step' to the param's dtype.
  for (int64_t i = 0; i < 2; ++i) {
    ParamState loaded;
    for (const auto& [key, t] : compiled->visible_state(a[static_cast<std::size_t>(i)]))
      loaded.emplace_back(key, key == "step" ? t.clone() : Tensor::from_values(t.shape(), t.to_vector(), Dtype::f64));
    ParamState copy;
    for (const auto& [key, t] : loaded)
      copy.emplace_back(key, t.clone());
    compiled->adopt_state(i, loaded, Optimizer::StateOrigin::Loaded);
    reference->adopt_state(i, copy, Optimizer::StateOrigin::Loaded);
    b[static_cast<std::size_t>(i)].set_data(a[static_cast<std::size_t>(i)].clone());
  }
  set_grads(a, 2);
  set_grads(b, 2);
  step();
  reference->step();
  check_same_trajectory(a, *compiled, b, *reference, 1e-15, 1e-15, "ASGD after a load");
  REQUIRE(step.metrics().recompiles == 1);
  CHECK(step.metrics().recompile_reasons.back() ==
        "param 0: the dtypes its state is stored in changed (state loaded or replaced)");
}

TEST_CASE("adopt state: SGD's momentum buffer starts from the grad when fresh, continues when loaded") {
  for (bool loaded : {false, true}) {
    INFO("loaded " << loaded);
    std::vector<Tensor> params = {Tensor::from_values({2}, std::vector<double>{1, 2}, Dtype::f32)};
    auto opt = make_single_group("SGD", params, {{"lr", {0.5}}, {"momentum", {0.9}}, {"dampening", {0.5}}}, true);
    CompiledStep step = compile(*opt);
    const Tensor buffer = Tensor::from_values({2}, std::vector<double>{4, 8}, Dtype::f32);
    opt->adopt_state(0, {{"momentum_buffer", buffer}},
                     loaded ? Optimizer::StateOrigin::Loaded : Optimizer::StateOrigin::Fresh);
    params[0].set_grad(Tensor::from_values({2}, std::vector<double>{1, -1}, Dtype::f32));
    step();
    // fresh: buf = grad; loaded: buf = 0.9 buf + (1 - 0.5) grad. The adopted tensor itself is updated.
    const std::vector<double> expected_buffer =
        loaded ? std::vector<double>{0.9 * 4 + 0.5, 0.9 * 8 - 0.5} : std::vector<double>{1, -1};
    CHECK(scaled_error(buffer, Tensor::from_values({2}, expected_buffer, Dtype::f32), 1e-6, 1e-7) <= 1);
    CHECK(params[0].item(0) == doctest::Approx(1 - 0.5 * expected_buffer[0]));
  }
}

TEST_CASE("adopt state: wrong keys, shapes or layouts are refused, and nothing changes") {
  std::vector<Tensor> params = two_params(Dtype::f32);
  auto opt = make_single_group("Adam", params, {}, true);
  const Tensor zeros3 = Tensor::zeros({3}, Dtype::f32), step = Tensor::zeros({}, Dtype::f32);
  check_error(
      [&] {
        opt->adopt_state(0, {{"exp_avg", zeros3}, {"step", step}}, Optimizer::StateOrigin::Fresh);
      },
      "state of param 0 has keys {\"exp_avg\", \"step\"}, but Adam with these options keeps {\"exp_avg\", "
      "\"exp_avg_sq\", \"step\"}");
  check_error(
      [&] {
        opt->adopt_state(0, {{"step", step}, {"exp_avg", zeros3}, {"exp_avg_sq", Tensor::zeros({2}, Dtype::f32)}},
                         Optimizer::StateOrigin::Fresh);
      },
      "state 'exp_avg_sq' of param 0 is f32[2] on cpu, but the param is f32[3] on cpu");
  check_error([&] { opt->adopt_state(5, {}, Optimizer::StateOrigin::Fresh); },
              "adopt_state: param 5 is not one of the 2 params");
  CHECK(opt->state(params[0])->empty());
  opt->adopt_state(0, {{"step", step}, {"exp_avg", zeros3}, {"exp_avg_sq", zeros3.clone()}},
                   Optimizer::StateOrigin::Fresh);
  CHECK(opt->state(params[0])->size() == 3);
  opt->adopt_state(0, {}, Optimizer::StateOrigin::Fresh); // an empty list drops the state
  CHECK(opt->state(params[0])->empty());
}

} // namespace optjit::test
