// forloop vs eager (interpreted foreach graph) vs compiled, on random data, for every option combination of every
// optimizer, over several steps, in f32 and f64, with 0-d, zero-size, multi-chunk tensors and a None grad.
#include "compiler/compiled_step.h"
#include "frontend/optim/registry.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

using namespace optjit;
using optjit::test::check_same_trajectory;

namespace {

// 0-d, zero-size, odd sizes (vector tails), and one tensor of more than one 32768-element work item.
const std::vector<Shape> kShapes = {{3, 5}, {7}, {}, {0}, {2, 0, 3}, {40000}, {17}};

std::string describe(const KeywordOptions& options) {
  std::string s;
  for (const auto& [k, v] : options)
    s += k + "=" + std::to_string(v[0]) + " ";
  return s;
}

void check_parity(const std::string& optimizer, const KeywordOptions& options, int steps = 5) {
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f16}) {
    INFO(optimizer << " " << describe(options) << dtype_name(dtype));
    auto forloop_params = random_params(kShapes, dtype, 3);
    auto eager_params = copy_params(forloop_params), compiled_params = copy_params(forloop_params);
    KeywordOptions forloop_options = options, foreach_options = options;
    forloop_options["foreach"] = {0};
    foreach_options["foreach"] = {1};
    auto forloop = make_optimizer(optimizer, {ParamGroupSpec{forloop_params, {}}}, forloop_options);
    auto eager = make_optimizer(optimizer, {ParamGroupSpec{eager_params, {}}}, foreach_options);
    auto compiled_opt = make_optimizer(optimizer, {ParamGroupSpec{compiled_params, {}}}, foreach_options);
    CompiledStep compiled = compile(*compiled_opt);
    for (int step = 0; step < steps; ++step) {
      for (auto* params : {&forloop_params, &eager_params, &compiled_params}) {
        for (std::size_t i = 0; i < params->size(); ++i)
          if (!(*params)[i].grad().defined())
            (*params)[i].set_grad(Tensor::zeros((*params)[i].shape(), dtype));
        randomize_grads(*params, 100 + static_cast<uint64_t>(step));
        if (step == 2) // a None grad: param 1 is skipped this step
          (*params)[1].reset_grad();
      }
      forloop->step();
      eager->step();
      compiled();
      // bf16 and f16 compute in f32 and round once per step: where the traced ops and the forloop's formula differ
      // in an f32 ulp, a stored value can round to its neighbour (the golden low-precision bound, 4 and 2 ulp).
      const double eps = dtype == Dtype::bf16 ? 0x1p-7 : 0x1p-10;
      const double rtol = dtype == Dtype::f32 ? 2e-6 : dtype == Dtype::f64 ? 1e-13 : 4 * eps;
      const double atol = dtype == Dtype::f32 ? 1e-7 : dtype == Dtype::f64 ? 1e-15 : 2 * eps;
      check_same_trajectory(eager_params, *eager, forloop_params, *forloop, rtol, atol, "eager vs forloop");
      // The compiled kernel evaluates the same ops in the same order as the interpreter.
      check_same_trajectory(compiled_params, *compiled_opt, eager_params, *eager, 0, 0, "compiled vs eager");
    }
    // The None grad step only rebound the work-item table (without param 1, then with it again).
    CHECK(compiled.metrics().recompiles == 0);
    CHECK(compiled.metrics().compiles == 1);
    CHECK(compiled.metrics().rebinds >= 3);
  }
}

} // namespace

TEST_CASE("parity: Adam and AdamW, every combination of amsgrad, maximize and weight decay") {
  for (const char* optimizer : {"adam", "adamw"})
    for (double amsgrad : {0, 1})
      for (double maximize : {0, 1})
        for (double weight_decay : {0.0, 0.1})
          check_parity(optimizer, {{"amsgrad", {amsgrad}},
                                   {"maximize", {maximize}},
                                   {"weight_decay", {weight_decay}},
                                   {"lr", {0.01}},
                                   {"betas", {0.8, 0.95}},
                                   {"eps", {1e-6}}});
}

TEST_CASE("parity: SGD, every combination of momentum, dampening, nesterov, maximize and weight decay") {
  for (double momentum : {0.0, 0.9})
    for (double dampening : {0.0, 0.3})
      for (double nesterov : {0, 1})
        for (double maximize : {0, 1})
          for (double weight_decay : {0.0, 0.1}) {
            if (nesterov != 0 && (momentum <= 0 || dampening != 0))
              continue; // torch rejects it (tested in test_optimizer_errors)
            check_parity("sgd", {{"momentum", {momentum}},
                                 {"dampening", {dampening}},
                                 {"nesterov", {nesterov}},
                                 {"maximize", {maximize}},
                                 {"weight_decay", {weight_decay}},
                                 {"lr", {0.05}}});
          }
}

TEST_CASE("parity: Adamax, every combination of maximize and weight decay") {
  for (double maximize : {0, 1})
    for (double weight_decay : {0.0, 0.3})
      check_parity("adamax", {{"maximize", {maximize}},
                              {"weight_decay", {weight_decay}},
                              {"betas", {0.8, 0.9}},
                              {"eps", {1e-3}},
                              {"lr", {0.02}}});
}

TEST_CASE("parity: Adagrad, every combination of lr decay, initial accumulator, maximize and weight decay") {
  for (double lr_decay : {0.0, 0.1})
    for (double initial : {0.0, 0.2})
      for (double maximize : {0, 1})
        for (double weight_decay : {0.0, 0.1})
          check_parity("adagrad", {{"lr_decay", {lr_decay}},
                                   {"initial_accumulator_value", {initial}},
                                   {"maximize", {maximize}},
                                   {"weight_decay", {weight_decay}},
                                   {"lr", {0.1}}});
}

TEST_CASE("parity: RMSprop, every combination of centered, momentum, maximize and weight decay") {
  for (double centered : {0, 1})
    for (double momentum : {0.0, 0.5})
      for (double maximize : {0, 1})
        for (double weight_decay : {0.0, 0.1})
          check_parity("rmsprop", {{"centered", {centered}},
                                   {"momentum", {momentum}},
                                   {"maximize", {maximize}},
                                   {"weight_decay", {weight_decay}},
                                   {"alpha", {0.9}},
                                   {"lr", {0.01}}});
}

TEST_CASE("parity: Adadelta, every combination of maximize and weight decay") {
  for (double maximize : {0, 1})
    for (double weight_decay : {0.0, 0.1})
      check_parity(
          "adadelta",
          {{"maximize", {maximize}}, {"weight_decay", {weight_decay}}, {"rho", {0.8}}, {"eps", {1e-4}}, {"lr", {0.5}}});
}

TEST_CASE("parity: NAdam, every combination of momentum decay, maximize and L2 or decoupled weight decay") {
  for (double momentum_decay : {4e-3, 0.05})
    for (double maximize : {0, 1})
      for (double weight_decay : {0.0, 0.1})
        for (double decoupled : {0, 1})
          check_parity("nadam", {{"momentum_decay", {momentum_decay}},
                                 {"maximize", {maximize}},
                                 {"weight_decay", {weight_decay}},
                                 {"decoupled_weight_decay", {decoupled}},
                                 {"betas", {0.8, 0.95}},
                                 {"lr", {0.01}}});
}

TEST_CASE("parity: RAdam, every combination of maximize and L2 or decoupled weight decay, across rectification") {
  // rho_t passes 5 at the sixth step: eight steps cover unrectified and rectified steps, and the param whose grad
  // was None at step 2 crosses one step after the others.
  for (double maximize : {0, 1})
    for (double weight_decay : {0.0, 0.1})
      for (double decoupled : {0, 1})
        check_parity("radam",
                     {{"maximize", {maximize}},
                      {"weight_decay", {weight_decay}},
                      {"decoupled_weight_decay", {decoupled}},
                      {"betas", {0.8, 0.95}},
                      {"eps", {1e-6}},
                      {"lr", {0.01}}},
                     8);
}

TEST_CASE("parity: Rprop, every combination of maximize, etas and step size bounds") {
  for (double maximize : {0, 1})
    for (std::vector<double> etas : {std::vector<double>{0.5, 1.2}, {0.3, 1.5}})
      for (std::vector<double> step_sizes : {std::vector<double>{1e-6, 50}, {5e-3, 2e-2}})
        check_parity("rprop", {{"maximize", {maximize}}, {"etas", etas}, {"step_sizes", step_sizes}, {"lr", {0.01}}});
}

TEST_CASE("parity: ASGD, every combination of maximize and weight decay, before and after averaging starts") {
  // t0 = 1: mu leaves 1 after the third step, so both averaging cases run; t0 = 1e6 keeps mu at 1.
  for (double t0 : {1.0, 1e6})
    for (double maximize : {0, 1})
      for (double weight_decay : {0.0, 0.1})
        check_parity("asgd",
                     {{"t0", {t0}},
                      {"maximize", {maximize}},
                      {"weight_decay", {weight_decay}},
                      {"lambd", {0.01}},
                      {"alpha", {0.5}},
                      {"lr", {0.05}}},
                     6);
}

TEST_CASE("parity: param groups with different options and structures share a step") {
  auto make = [](std::vector<Tensor> params, bool foreach) {
    KeywordOptions o{{"foreach", {foreach ? 1.0 : 0.0}}};
    return make_optimizer("adam", {ParamGroupSpec{{params[0], params[1]}, {}}, ParamGroupSpec{{params[2]}, {}}}, o,
                          {{{"lr", {0.1}}}, {{"amsgrad", {1}}, {"weight_decay", {0.2}}, {"lr", {0.02}}}});
  };
  auto a = random_params({{5}, {2, 2}, {9}}, Dtype::f32, 8);
  auto b = copy_params(a);
  auto forloop = make(a, false), compiled_opt = make(b, true);
  CompiledStep compiled = compile(*compiled_opt);
  CHECK_KERNELS(compiled, 2); // two structures (amsgrad on and off): one kernel each
  for (int step = 0; step < 4; ++step) {
    randomize_grads(a, 50 + static_cast<uint64_t>(step));
    randomize_grads(b, 50 + static_cast<uint64_t>(step));
    forloop->step();
    compiled();
  }
  check_same_trajectory(b, *compiled_opt, a, *forloop, 2e-6, 1e-7, "compiled vs forloop");
  CHECK(compiled.metrics().compiles == 1);
}
