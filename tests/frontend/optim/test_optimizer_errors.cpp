// Constructor validation with torch's exact messages, and step-time errors that leave everything unchanged.
#include "compiler/compiled_step.h"
#include "frontend/optim/adadelta.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/adamax.h"
#include "frontend/optim/asgd.h"
#include "frontend/optim/nadam.h"
#include "frontend/optim/radam.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/rmsprop.h"
#include "frontend/optim/rprop.h"
#include "frontend/optim/sgd.h"
#include "helpers.h"
#include "tools/model.h"
#include <spdlog/fmt/fmt.h>

#include <doctest/doctest.h>

#include <cmath>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;
using optjit::test::Snapshot;

namespace {

std::vector<Tensor> sample_params() { return random_params({{1, 1}, {3}}, Dtype::f32, 5); }

} // namespace

TEST_CASE("errors: Adam and AdamW constructor messages, in torch's order") {
  auto p = sample_params();
  check_error([&] { Adam(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Adam(p, {.lr = std::nan("")}); }, "Invalid learning rate: nan");
  check_error([&] { Adam(p, {.eps = -1e-8}); }, "Invalid epsilon value: -1e-08");
  check_error([&] { Adam(p, {.lr = 1e-2, .betas = {1.0, 0.0}}); }, "Invalid beta parameter at index 0: 1.0");
  check_error([&] { Adam(p, {.betas = {0.9, -0.5}}); }, "Invalid beta parameter at index 1: -0.5");
  check_error([&] { Adam(p, {.lr = 1e-2, .weight_decay = -1}); }, "Invalid weight_decay value: -1.0");
  check_error([&] { AdamW(p, {.lr = 1e-2, .betas = {1.0, 0.0}}); }, "Invalid beta parameter at index 0: 1.0");
  check_error([&] { AdamW(p, {.weight_decay = -0.5}); }, "Invalid weight_decay value: -0.5");
  // lr is checked before eps, eps before betas.
  check_error([&] { Adam(p, {.lr = -1, .betas = {2, 2}, .eps = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Adam(p, {.betas = {2, 2}, .eps = -1}); }, "Invalid epsilon value: -1.0");
}

TEST_CASE("errors: SGD constructor messages, with torch's NaN-passing comparisons") {
  auto p = sample_params();
  check_error([&] { SGD(p, {.lr = -0.1}); }, "Invalid learning rate: -0.1");
  check_error([&] { SGD(p, {.lr = 1e-2, .momentum = -0.5}); }, "Invalid momentum value: -0.5");
  check_error([&] { SGD(p, {.weight_decay = -0.5}); }, "Invalid weight_decay value: -0.5");
  check_error([&] { SGD(p, {.nesterov = true}); }, "Nesterov momentum requires a momentum and zero dampening");
  check_error([&] { SGD(p, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
              "Nesterov momentum requires a momentum and zero dampening");
  CHECK_NOTHROW(SGD(p, {.lr = std::nan("")})); // `lr < 0.0` is false for NaN, as in torch
}

TEST_CASE("errors: Adamax, Adagrad, RMSprop and Adadelta constructor messages, in torch's order") {
  auto p = sample_params();
  check_error([&] { Adamax(p, {.lr = -0.1}); }, "Invalid learning rate: -0.1");
  check_error([&] { Adamax(p, {.eps = -1}); }, "Invalid epsilon value: -1.0");
  check_error([&] { Adamax(p, {.lr = 1e-2, .betas = {0.0, 1.0}}); }, "Invalid beta parameter at index 1: 1.0");
  check_error([&] { Adamax(p, {.betas = {-0.1, 2.0}}); }, "Invalid beta parameter at index 0: -0.1");
  check_error([&] { Adamax(p, {.weight_decay = -1}); }, "Invalid weight_decay value: -1.0");
  check_error([&] { Adagrad(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Adagrad(p, {.lr_decay = -0.5}); }, "Invalid lr_decay value: -0.5");
  check_error([&] { Adagrad(p, {.weight_decay = -0.5}); }, "Invalid weight_decay value: -0.5");
  check_error([&] { Adagrad(p, {.initial_accumulator_value = -0.5}); },
              "Invalid initial_accumulator_value value: -0.5");
  check_error([&] { Adagrad(p, {.eps = -1e-10}); }, "Invalid epsilon value: -1e-10");
  check_error([&] { Adagrad(p, {.lr_decay = -1, .weight_decay = -1}); }, "Invalid lr_decay value: -1.0");
  check_error([&] { RMSprop(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { RMSprop(p, {.eps = -1}); }, "Invalid epsilon value: -1.0");
  check_error([&] { RMSprop(p, {.lr = 1e-2, .momentum = -1.0}); }, "Invalid momentum value: -1.0");
  check_error([&] { RMSprop(p, {.weight_decay = -0.1}); }, "Invalid weight_decay value: -0.1");
  check_error([&] { RMSprop(p, {.alpha = -0.5}); }, "Invalid alpha value: -0.5");
  check_error([&] { RMSprop(p, {.alpha = -0.5, .momentum = -1}); }, "Invalid momentum value: -1.0");
  check_error([&] { Adadelta(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Adadelta(p, {.rho = 1.5}); }, "Invalid rho value: 1.5");
  CHECK_NOTHROW(Adadelta(p, {.rho = 1.0})); // inclusive of 1
  check_error([&] { Adadelta(p, {.eps = -1}); }, "Invalid epsilon value: -1.0");
  check_error([&] { Adadelta(p, {.weight_decay = -1}); }, "Invalid weight_decay value: -1.0");
}

TEST_CASE("errors: NAdam, RAdam, Rprop and ASGD constructor messages, in torch's order") {
  auto p = sample_params();
  check_error([&] { NAdam(p, {.lr = -0.1}); }, "Invalid learning rate: -0.1");
  check_error([&] { NAdam(p, {.eps = -1}); }, "Invalid epsilon value: -1.0");
  check_error([&] { NAdam(p, {.lr = 1e-2, .betas = {1.0, 0.0}}); }, "Invalid beta parameter at index 0: 1.0");
  check_error([&] { NAdam(p, {.betas = {0.9, 1.0}}); }, "Invalid beta parameter at index 1: 1.0");
  check_error([&] { NAdam(p, {.weight_decay = -0.1}); }, "Invalid weight_decay value: -0.1");
  check_error([&] { NAdam(p, {.lr = 1e-2, .momentum_decay = -0.2}); }, "Invalid momentum_decay value: -0.2");
  check_error([&] { NAdam(p, {.weight_decay = -1, .momentum_decay = -1}); }, "Invalid weight_decay value: -1.0");
  check_error([&] { RAdam(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { RAdam(p, {.eps = -1}); }, "Invalid epsilon value: -1.0");
  check_error([&] { RAdam(p, {.lr = 1e-2, .betas = {1.0, 0.0}}); }, "Invalid beta parameter at index 0: 1.0");
  check_error([&] { RAdam(p, {.betas = {0.5, -0.5}}); }, "Invalid beta parameter at index 1: -0.5");
  check_error([&] { RAdam(p, {.lr = 1e-2, .weight_decay = -1}); }, "Invalid weight_decay value: -1.0");
  check_error([&] { Rprop(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Rprop(p, {.lr = 1e-2, .etas = {1.0, 0.5}}); }, "Invalid eta values: 1.0, 0.5");
  check_error([&] { Rprop(p, {.etas = {0.0, 1.2}}); }, "Invalid eta values: 0.0, 1.2");
  check_error([&] { Rprop(p, {.etas = {0.5, 1.0}}); }, "Invalid eta values: 0.5, 1.0");
  check_error([&] { ASGD(p, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { ASGD(p, {.lr = 1e-2, .lambd = -0.5}); }, "Invalid lambd value: -0.5");
  check_error([&] { ASGD(p, {.lr = 1e-2, .alpha = -0.5}); }, "Invalid alpha value: -0.5");
  check_error([&] { ASGD(p, {.lr = 1e-2, .weight_decay = -0.5}); }, "Invalid weight_decay value: -0.5");
  check_error([&] { ASGD(p, {.lambd = -1, .alpha = -1}); }, "Invalid lambd value: -1.0");
  // The same rules through the registry, with torch's keyword names and pairs.
  check_error(
      [&] {
        make_optimizer("rprop", {ParamGroupSpec{p, {}}}, {{"etas", {0.5, 0.9}}});
      },
      "Invalid eta values: 0.5, 0.9");
  check_error(
      [&] {
        make_optimizer("rprop", {ParamGroupSpec{p, {}}}, {}, {{{"etas", {2.0, 3.0}}}});
      },
      "Invalid eta values: 2.0, 3.0");
  check_error_contains(
      [&] {
        make_optimizer("rprop", {ParamGroupSpec{p, {}}}, {{"weight_decay", {0.1}}});
      },
      "Rprop has no option 'weight_decay'");
}

TEST_CASE("errors: param groups: empty, duplicates across groups, group options validated, unknown options") {
  auto p = sample_params();
  check_error([&] { Adam(std::vector<Tensor>{}); }, "optimizer got an empty parameter list");
  check_error(
      [&] {
        Adam(std::vector<ParamGroupSpec>{{{p[0]}, {}}, {{p[0], p[1]}, {}}});
      },
      "some parameters appear in more than one parameter group");
  check_error(
      [&] {
        Adam(std::vector<ParamGroupSpec>{{{p[0]}, {}}, {{p[1]}, {{"lr", -2}}}});
      },
      "Invalid learning rate: -2.0");
  check_error_contains([&] { Adam(std::vector<ParamGroupSpec>{{{p[0]}, {{"momentum", 0.9}}}}); }, "momentum");
  // Within one group a duplicate is a warning (torch's UserWarning) and the param is stepped once.
  Adam dup(std::vector<Tensor>{p[0], p[0], p[1]}, {.foreach = true});
  CHECK(dup.param_count() == 2);
  check_error_contains(
      [&] {
        make_optimizer("adam", {ParamGroupSpec{p, {}}}, {{"momentum", {0.9}}});
      },
      "Adam has no option 'momentum'");
  check_error_contains([&] { make_optimizer("lbfgs", {ParamGroupSpec{p, {}}}, {}); }, "unknown optimizer 'lbfgs'");
}

namespace {

// Runs two good steps of `optimizer`, then `break_it`, then a step on each path that must throw `message` and
// change nothing.
template <class Break>
void check_failed_step_changes_nothing(const std::string& optimizer, KeywordOptions options, Break break_it,
                                       const std::string& message) {
  for (int path = 0; path < 3; ++path) {
    INFO(optimizer << " path " << std::string(path == 0 ? "forloop" : path == 1 ? "eager foreach" : "compiled"));
    auto params = random_params({{4, 3}, {5}, {}}, Dtype::f32, 11);
    options["foreach"] = {path != 0 ? 1.0 : 0.0};
    auto opt = make_optimizer(optimizer, {ParamGroupSpec{params, {}}}, options);
    CompiledStep compiled = compile(*opt);
    auto step = [&] { path == 2 ? compiled() : opt->step(); };
    step();
    step();
    break_it(params, *opt);
    const Snapshot before(params, *opt);
    check_error_contains(step, message);
    CHECK(Snapshot(params, *opt) == before);
  }
}

template <class Break> void check_failed_step_changes_nothing(Break break_it, const std::string& message) {
  check_failed_step_changes_nothing("adam", {{"weight_decay", {0.1}}, {"amsgrad", {1}}}, break_it, message);
}

} // namespace

TEST_CASE("errors: a grad whose shape, dtype or device does not match its param throws before any update") {
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) { params[2].set_grad(Tensor::zeros({2}, Dtype::f32)); },
      "a grad must have its param's shape, dtype and device");
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) { params[1].set_grad(Tensor::zeros({5}, Dtype::f64)); },
      "a grad must have its param's shape, dtype and device");
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) { params[1].set_grad(Tensor::zeros({5}, Dtype::bf16)); },
      "grad of param 1 is bf16[5] on cpu but the param is f32[5] on cpu");
}

TEST_CASE("errors: a param whose data took another shape keeps state of the old one: refused before any update") {
  // torch's `p.data = bigger`: the kernels would read and write past the old state.
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) {
        params[1].set_data(Tensor::zeros({4000}, Dtype::f32));
        params[1].set_grad(Tensor::zeros({4000}, Dtype::f32));
      },
      "state 'exp_avg' of param 1 is f32[5] on cpu, but the param is now f32[4000] on cpu: its data was replaced");
}

TEST_CASE("errors: two params that share memory are refused before any update, in every mode") {
  // Param 1 becomes a view of param 0's first five elements: torch steps one after the other, a step here reads
  // both before it writes either.
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) {
        params[1].set_data(Tensor::from_blob(params[0].data(), {5}, Dtype::f32));
        params[1].set_grad(Tensor::full({5}, 0.25, Dtype::f32));
      },
      "param 0 and param 1 share memory (f32[4, 3] on cpu and f32[5] on cpu)");
}

TEST_CASE("errors: a param that is its own state (exp_avg loaded as the param's memory) is refused, in every mode") {
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer& opt) {
        ParamState state = opt.visible_state(params[0]);
        for (auto& [key, t] : state)
          if (key == "exp_avg")
            t = params[0];
        opt.adopt_state(0, state, Optimizer::StateOrigin::Loaded);
      },
      "param 0 and state 'exp_avg' of param 0 share memory");
}

TEST_CASE("errors: params interleaved in one buffer (every other column each) share no element: they step") {
  static std::vector<float> buffer(6 * 8);
  for (std::size_t k = 0; k < buffer.size(); ++k)
    buffer[k] = 0.01f * static_cast<float>(k);
  std::vector<Tensor> views = {Tensor::from_blob(buffer.data(), {6, 4}, Dtype::f32, {8, 2}),
                               Tensor::from_blob(buffer.data() + 1, {6, 4}, Dtype::f32, {8, 2})};
  std::vector<Tensor> copies = {views[0].clone(), views[1].clone()};
  for (std::size_t i = 0; i < 2; ++i) {
    views[i].set_grad(Tensor::full({6, 4}, 0.5 + static_cast<double>(i), Dtype::f32));
    copies[i].set_grad(views[i].grad().clone());
  }
  auto on_views = make_optimizer("adam", {ParamGroupSpec{views, {}}}, {{"foreach", {1}}});
  auto on_copies = make_optimizer("adam", {ParamGroupSpec{copies, {}}}, {{"foreach", {1}}});
  CompiledStep a = compile(*on_views), b = compile(*on_copies);
  for (int s = 0; s < 2; ++s) {
    a();
    b();
  }
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(views[i].to_vector() == copies[i].to_vector());
}

TEST_CASE("errors: an expanded (overlapping) param, or a grad the step would write, is refused before any update") {
  static std::vector<float> memory(24, 0.5f);
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer&) {
        params[0].set_data(Tensor::from_blob(memory.data(), {4, 3}, Dtype::f32, {1, 1}));
      },
      "param 0 is f32[4, 3] (strides [1, 1]) on cpu: its elements overlap in memory, and an optimizer step writes "
      "each element at an address of its own (pass a copy)");
  // An expanded grad is read through a copy (strided params' tests), unless the step writes the unscaled grads back.
  check_failed_step_changes_nothing(
      [](auto& params, Optimizer& opt) {
        params[0].set_grad(Tensor::from_blob(memory.data(), {4, 3}, Dtype::f32, {0, 1}));
        opt.set_grad_scaling(Tensor::full({1}, 2.0, Dtype::f32), Tensor::zeros({1}, Dtype::f32),
                             Optimizer::GradsAfterStep::Unscaled);
      },
      "grad of param 0 is f32[4, 3] (strides [0, 1]) on cpu: its elements overlap in memory, and this step writes "
      "the grads (the unscaled grads of gradient scaling, or a step function's)");
}

TEST_CASE("errors: a non-finite hyperparameter set at run time throws before any update") {
  check_failed_step_changes_nothing([](auto&, Optimizer& opt) { opt.param_groups()[0].set("lr", INFINITY); },
                                    "hyperparameter lr of param group 0 is inf: hyperparameters must be finite");
  check_failed_step_changes_nothing([](auto&, Optimizer& opt) { opt.param_groups()[0].set("beta2", std::nan("")); },
                                    "hyperparameter beta2 of param group 0 is nan");
}

TEST_CASE("errors: every optimizer refuses a bad grad or a non-finite hyperparameter before any update") {
  for (const std::string& name : implemented_optimizers()) {
    if (name == "Muon")
      continue; // 2-D params only, and a forloop step only: tests/frontend/optim/test_muon.cpp checks the same
    check_failed_step_changes_nothing(
        name, {},
        [](auto& params, Optimizer&) {
          params[0].set_grad(Tensor::zeros({3, 4}, Dtype::f32));
        },
        "a grad must have its param's shape, dtype and device");
    check_failed_step_changes_nothing(
        name, {}, [](auto&, Optimizer& opt) { opt.param_groups()[0].set(opt.hyper_names().back(), -INFINITY); },
        "of param group 0 is -inf: hyperparameters must be finite");
  }
}

TEST_CASE("errors: a tensor lr whose data became empty is refused on every path, with nothing changed (issue 16, 12)") {
  for (bool compiled : {false, true}) {
    auto params = random_params({{4}, {3}}, Dtype::f32, 2);
    Adam opt(params, {.lr = 0.01, .foreach = true});
    CompiledStep step = compile(opt);
    Tensor lr = Tensor::full({1}, 0.01, Dtype::f64);
    opt.param_groups()[0].set("lr", lr);
    lr.set_data(Tensor::empty({0}, Dtype::f64));
    const std::vector<double> before = params[0].to_vector();
    check_error_contains([&] { compiled ? step() : opt.step(); }, "Tensor lr must be 1-element, but holds f64[0]");
    CHECK(params[0].to_vector() == before);
    CHECK(opt.state(params[0])->empty()); // no state was created either
  }
}

TEST_CASE("errors: Rprop refuses a non-finite lr at the step, which seeds its step sizes (issue 16, 8)") {
  for (bool compiled : {false, true}) {
    auto params = random_params({{6}}, Dtype::f64, 4);
    Rprop opt(params, {.foreach = true});
    CompiledStep step = compile(opt);
    opt.param_groups()[0].set("lr", std::nan(""));
    const std::vector<double> before = params[0].to_vector();
    check_error_contains([&] { compiled ? step() : opt.step(); },
                         "hyperparameter lr of param group 0 is nan: hyperparameters must be finite");
    CHECK(params[0].to_vector() == before);
    CHECK(opt.state(params[0])->empty());
  }
}

TEST_CASE("errors: a flag set to 0.5, extra group options and real state for a complex param are refused") {
  std::vector<Tensor> params = random_params({{4}}, Dtype::f32, 1);
  auto opt = make_optimizer("adam", {ParamGroupSpec{params, {}}}, {});
  opt->param_groups()[0].set("amsgrad", 0.5);
  test::check_error_contains([&] { opt->step(); }, "param group 0 of Adam has amsgrad = 0.5: a flag is 0 or 1");
  CHECK(opt->visible_state(params[0]).empty()); // refused before any state was made
  test::check_error_contains(
      [&] {
        make_optimizer("adam", {ParamGroupSpec{params, {}}}, {}, {{{"lr", {0.1}}}, {{"lr", {0.2}}}});
      },
      "2 sets of group options for 1 param group(s)");
  std::vector<Tensor> complex_params = {Tensor::zeros({3}, Dtype::c64)};
  complex_params[0].set_grad(Tensor::zeros({3}, Dtype::c64));
  auto sgd = make_optimizer("sgd", {ParamGroupSpec{complex_params, {}}}, {{"momentum", {0.9}}});
  test::check_error_contains(
      [&] {
        sgd->adopt_state(0, {{"momentum_buffer", Tensor::zeros({3}, Dtype::f32)}}, Optimizer::StateOrigin::Loaded);
      },
      "a complex param keeps complex state, a real param real state");
}

TEST_CASE("errors: a first beta set to 1 after construction is refused at the step, before anything changes") {
  for (const char* name : {"adam", "adamw", "adamax"}) {
    INFO(name);
    std::vector<Tensor> params = random_params({{4}}, Dtype::f32, 1);
    const std::vector<double> before = params[0].to_vector();
    auto opt = make_optimizer(name, {ParamGroupSpec{params, {}}}, {});
    opt->param_groups()[0].set("beta1", 1.0);
    for (const bool compiled : {false, true}) {
      test::check_error_contains(
          [&] {
            if (compiled)
              compile (*opt)();
            else
              opt->step();
          },
          "has betas[0] = 1.0: the bias correction 1 - beta1^step is 0");
      CHECK(params[0].to_vector() == before);
      CHECK(opt->visible_state(params[0]).empty());
    }
  }
}

TEST_CASE("errors: quantized state's code dtypes (u8, e4m3) are never a param's nor plain adopted state") {
  for (const Dtype codes : {Dtype::u8, Dtype::e4m3}) {
    CAPTURE(dtype_name(codes));
    Tensor p = Tensor::zeros({4}, codes);
    p.set_grad(Tensor::zeros({4}, codes));
    auto opt = test::make_single_group("adam", {p}, {{"lr", {0.1}}}, true);
    test::check_error_contains([&] { opt->step(); },
                               "param 0 is " + p.describe() + ": an optimizer steps floating-point or complex params");
    Tensor q = Tensor::zeros({4}, Dtype::f32);
    auto adam = test::make_single_group("adam", {q}, {{"lr", {0.1}}}, true);
    test::check_error_contains(
        [&] {
          adam->adopt_state(0,
                            {{"step", Tensor::zeros({1}, Dtype::f32)},
                             {"exp_avg", Tensor::zeros({4}, codes)},
                             {"exp_avg_sq", Tensor::zeros({4}, Dtype::f32)}},
                            Optimizer::StateOrigin::Loaded);
        },
        fmt::format("{} state 'exp_avg' of param 0: its scales are missing", codes == Dtype::u8 ? "signed8" : "fp8"));
    CHECK(parse_dtype(codes == Dtype::u8 ? "uint8" : "float8_e4m3fn") == codes);
    CHECK(dtype_from_safetensors_code(codes == Dtype::u8 ? "U8" : "F8_E4M3") == codes);
  }
}
