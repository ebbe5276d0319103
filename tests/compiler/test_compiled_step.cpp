// The compiled step's contract: one kernel per group, guards that recompile only on structural change, rebinds
// that keep results right, and hyperparameters that are arguments.
#include "codegen/codegen.h"
#include "compiler/compiled_step.h"
#include "compiler/guards.h"
#include "compiler/kernel_cache.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/sgd.h"
#include "helpers.h"
#include "tools/count_configs.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <map>

using namespace optjit;
using optjit::test::check_same_trajectory;

namespace {

struct Pair {
  std::vector<Tensor> ref_params, params;
  std::unique_ptr<Optimizer> ref, opt;
  CompiledStep step;

  Pair(const std::string& name, KeywordOptions options, Dtype dtype = Dtype::f32)
      : ref_params(random_params(two_linear_shapes(), dtype, 21)), params(copy_params(ref_params)),
        ref(test::make_single_group(name, ref_params, options, false)),
        opt(test::make_single_group(name, params, options, true)), step(compile(*opt)) {}
  void run(int steps, uint64_t seed) {
    for (int s = 0; s < steps; ++s) {
      randomize_grads(ref_params, seed + static_cast<uint64_t>(s));
      randomize_grads(params, seed + static_cast<uint64_t>(s));
      ref->step();
      step();
    }
  }
  void check(const std::string& what) { check_same_trajectory(params, *opt, ref_params, *ref, 2e-6, 1e-7, what); }
};

} // namespace

TEST_CASE("compiled: the issue's example: Adam with amsgrad and weight decay is one kernel, dumpable") {
  auto params = random_params(two_linear_shapes(), Dtype::f32, 1);
  optjit::Adam opt(params, {.lr = 1e-3, .weight_decay = 0.01, .amsgrad = true});
  auto step = optjit::compile(opt);
  step();
  CHECK_KERNELS(step, 1);
  const std::string fused = step.dump(optjit::Stage::Fused);
  CHECK(fused.find("1 kernel(s) per step") != std::string::npos);
  CHECK(fused.find("store \"max_exp_avg_sq\"") != std::string::npos);
  CHECK(step.dump(Stage::Traced).find("graph @adam f32") != std::string::npos);
  CHECK(step.dump(Stage::LLVM).find("define void @adam_k0_element_phase") != std::string::npos);
}

TEST_CASE("compiled: steps with reductions plan into their kernel counts, and print the plan when they do not") {
  // Over two Linear(10, 10) (10x10 and 10 params), per (dtype, structure) bucket: each reduction's pass, then the
  // kernels that read its result.
  const std::map<std::string, int> expected = {
      {"lamb default", 2},
      {"lamb weight_decay", 2},
      {"lars default", 2},
      {"lars exclude_1d,weight_decay", 3}, // the 1-D params step by momentum alone: one kernel; the others two
      {"adam default clip 2", 2},
      {"adam amsgrad clip inf", 2},
      {"adamw default clip 2", 2},
      {"sgd momentum clip 2", 2},
      {"lion default clip 2", 2},
      {"lamb default clip 2", 3}, // the grad norm, then LAMB's norms of the clipped update, then the update
      {"adafactor default", 6},   // the factored 10x10s: 4 kernels; the 10s (a full variance): 2
      {"adafactor maximize,weight_decay", 6},
      {"adafactor default clip 2", 8}}; // each bucket's grad norm pass first
  for (const CountConfig& c : reducing_configs())
    for (bool foreach : {false, true}) {
      const std::string key = c.optimizer + " " + config_name(c.options) +
                              (c.clip_norm_type == 0     ? ""
                               : c.clip_norm_type == 2.0 ? " clip 2"
                                                         : " clip inf");
      INFO(key << std::string(foreach ? ", foreach" : ""));
      REQUIRE(expected.count(key) == 1);
      KeywordOptions options = c.options;
      options["foreach"] = {foreach ? 1.0 : 0.0};
      auto opt =
          make_optimizer(c.optimizer, {ParamGroupSpec{random_params(two_linear_shapes(), Dtype::f32, 4), {}}}, options);
      if (c.clip_norm_type != 0)
        opt->set_grad_clipping(Optimizer::GradClipping{1.0, c.clip_norm_type, false});
      CompiledStep step = compile(*opt);
      step();
      CHECK_KERNELS(step, expected.at(key));
    }
}

TEST_CASE("compiled: every optimizer configuration is one kernel per (device, dtype) group") {
  std::vector<CountConfig> configs = torch_optim_configs();
  CHECK(configs.size() >= 60);
  for (const CountConfig& c : own_optimizer_configs()) // Lion
    configs.push_back(c);
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f16})
    for (const CountConfig& c : configs) {
      INFO(c.optimizer << " " << config_name(c.options) << " " << dtype_name(dtype));
      Pair p(c.optimizer, c.options, dtype);
      CHECK_KERNELS(p.step, 1);
    }
  // Two dtypes in one optimizer: one kernel each.
  std::vector<Tensor> mixed = random_params({{4}}, Dtype::f32, 2);
  for (const Tensor& t : random_params({{4}}, Dtype::f64, 3))
    mixed.push_back(t);
  Adam both(mixed);
  CHECK_KERNELS(compile(both), 2);
  // torch's test_mixed_device_dtype: every storage dtype in one optimizer, one kernel each.
  for (Dtype low : {Dtype::bf16, Dtype::f16})
    for (const Tensor& t : random_params({{5}, {3}}, low, 4))
      mixed.push_back(t);
  Adam four(mixed);
  CHECK_KERNELS(compile(four), 4);
}

TEST_CASE("compiled: steady state and lr or any hyperparameter changes never recompile") {
  Pair p("adam", {{"amsgrad", {1}}, {"weight_decay", {0.1}}});
  p.run(3, 1);
  for (int s = 0; s < 6; ++s) {
    for (auto* o : {p.ref.get(), p.opt.get()}) {
      o->param_groups()[0].set("lr", 1e-3 * (s + 1));
      o->param_groups()[0].set("beta1", 0.8 + 0.01 * s);
      o->param_groups()[0].set("eps", 1e-8 * (s + 1));
      o->param_groups()[0].set("weight_decay", 0.05 * (s + 1)); // stays non-zero: same structure
    }
    p.run(1, 10 + static_cast<uint64_t>(s));
  }
  p.check("after hyperparameter changes");
  const StepMetrics& m = p.step.metrics();
  CHECK(m.steps == 9);
  CHECK(m.compiles == 1);
  CHECK(m.recompiles == 0);
  CHECK(m.rebinds == 1);
}

TEST_CASE("compiled: replacing a state tensor or a grad buffer rebinds without recompiling and stays correct") {
  Pair p("adam", {{"amsgrad", {1}}});
  p.run(2, 1);
  // Replace exp_avg with a copy holding different values, on both sides.
  for (auto [params, opt] : {std::pair{&p.ref_params, p.ref.get()}, std::pair{&p.params, p.opt.get()}}) {
    Tensor replacement = find_state(*opt->state((*params)[0]), "exp_avg").clone();
    replacement.fill(0.25);
    opt->set_state((*params)[0], "exp_avg", replacement);
  }
  p.run(2, 5);
  p.check("after set_state");
  CHECK(p.step.metrics().rebinds == 2);
  // New grad tensors every step (as autograd allocates them).
  for (int s = 0; s < 3; ++s) {
    for (auto* params : {&p.ref_params, &p.params})
      for (Tensor& t : *params)
        t.set_grad(Tensor::zeros(t.shape(), t.dtype()));
    p.run(1, 20 + static_cast<uint64_t>(s));
  }
  p.check("after new grad buffers");
  const StepMetrics& m = p.step.metrics();
  CHECK(m.compiles == 1);
  CHECK(m.recompiles == 0);
  CHECK(m.rebinds == 5);
}

TEST_CASE("compiled: param.data replaced (set_data) rebinds and updates the new storage") {
  Pair p("sgd", {{"momentum", {0.9}}});
  p.run(2, 1);
  for (auto* params : {&p.ref_params, &p.params})
    (*params)[2].set_data((*params)[2].clone());
  p.run(2, 7);
  p.check("after set_data");
  CHECK(p.step.metrics().recompiles == 0);
  CHECK(p.step.metrics().rebinds == 2);
}

TEST_CASE(
    "compiled: a None grad rebinds, and a dtype change or a structural option change recompiles, with the reason") {
  Pair p("adam", {});
  p.run(2, 1);
  // A grad becomes None: that param is skipped, and only the work-item table changes.
  const int64_t rebinds = p.step.metrics().rebinds;
  for (auto* params : {&p.ref_params, &p.params})
    (*params)[1].reset_grad();
  p.ref->step();
  p.step();
  p.check("after a None grad");
  CHECK(p.step.metrics().recompiles == 0);
  CHECK(p.step.metrics().rebinds == rebinds + 1);
  // Every grad None: nothing runs, nothing changes.
  test::Snapshot before(p.params, *p.opt);
  for (Tensor& t : p.params)
    t.reset_grad();
  CHECK_KERNELS(p.step, 0);
  p.step();
  CHECK(test::Snapshot(p.params, *p.opt) == before);
  for (Tensor& t : p.ref_params)
    t.reset_grad();
  p.ref->step();
  // Back to all grads: the same compiled code, rebound.
  for (auto* params : {&p.ref_params, &p.params})
    for (Tensor& t : *params)
      t.set_grad(Tensor::zeros(t.shape(), Dtype::f32));
  p.run(1, 3);
  p.check("after the grads came back");
  CHECK(p.step.metrics().compiles == 1);
  CHECK(p.step.metrics().rebinds == rebinds + 3);
  // A structural option: maximize turned on.
  for (auto* o : {p.ref.get(), p.opt.get()})
    o->param_groups()[0].set("maximize", 1);
  p.run(2, 4);
  p.check("after maximize on");
  CHECK(p.step.metrics().recompiles == 1);
  CHECK(p.step.metrics().recompile_reasons.back().find("maximize") != std::string::npos);
  // A dtype change through param.data (and a matching grad).
  for (auto* params : {&p.ref_params, &p.params}) {
    Tensor& t = (*params)[3];
    std::vector<double> values = t.to_vector();
    t.set_data(Tensor::from_values(t.shape(), values, Dtype::f64));
    t.set_grad(Tensor::zeros(t.shape(), Dtype::f64));
  }
  CHECK_KERNELS(p.step, 2); // f32 and f64 groups now
  CHECK(p.step.metrics().recompiles == 2);
  CHECK(p.step.metrics().recompile_reasons.back().find("dtype") != std::string::npos);
}

TEST_CASE("compiled: optimizers of the same structure share kernels through the process-wide cache") {
  KernelCache<CpuKernel>::global().clear();
  auto a = random_params({{10}}, Dtype::f32, 1), b = random_params({{3}, {4, 4}}, Dtype::f32, 2);
  Adam first(a, {.lr = 0.1}), second(b, {.lr = 0.5});
  CompiledStep s1 = compile(first), s2 = compile(second);
  s1();
  s2();
  CHECK(s1.metrics().kernels_generated == 1);
  CHECK(s2.metrics().kernels_generated == 0);
  CHECK(s2.metrics().cache_hits == 1);
}

TEST_CASE("compiled: Adagrad's state exists from construction, and a param without a grad keeps step 0") {
  auto params = random_params({{3}, {2}}, Dtype::f32, 9);
  Adagrad opt(params, {.initial_accumulator_value = 0.25, .foreach = true});
  for (const Tensor& p : params) {
    ParamState s = opt.visible_state(p);
    REQUIRE(s.size() == 2);
    CHECK(s[0].first == "step");
    CHECK(s[0].second.item() == 0);
    CHECK(s[1].second.to_vector() == std::vector<double>(static_cast<std::size_t>(p.numel()), 0.25));
  }
  params[1].reset_grad();
  CompiledStep step = compile(opt);
  step();
  step();
  CHECK(find_state(*opt.state(params[0]), "step").item() == 2);
  CHECK(find_state(*opt.state(params[1]), "step").item() == 0);
  CHECK(find_state(*opt.state(params[1]), "sum").item(0) == 0.25f);
}

TEST_CASE("compiled: zero_grad(set_to_none) makes the next step skip every param, without touching anything") {
  auto params = random_params({{6}, {2}}, Dtype::f64, 4);
  SGD opt(params, {.lr = 0.1, .momentum = 0.5});
  CompiledStep step = compile(opt);
  step();
  const std::vector<double> before = params[0].to_vector();
  opt.zero_grad();
  CHECK_FALSE(params[0].grad().defined());
  step();
  CHECK(params[0].to_vector() == before);
  CHECK_KERNELS(step, 0);
}

TEST_CASE("compiled: guard facts name what changed: dtype, device kind and device index") {
  Tensor f32 = Tensor::zeros({2}, Dtype::f32), f64 = Tensor::zeros({2}, Dtype::f64);
  GuardFacts before{{param_fact(*f32.impl())}, {1}, {"amsgrad=0"}}, now = before;
  CHECK(explain_guard_failure(before, now) == "no difference");
  now.state_dtypes[0] = 2;
  CHECK(explain_guard_failure(before, now) ==
        "param 0: the dtypes its state is stored in changed (state loaded or replaced)");
  now.state_dtypes[0] = 1;
  now.params[0] = param_fact(*f64.impl());
  CHECK(explain_guard_failure(before, now) == "param 0: dtype changed from f32 to f64");
  TensorImpl on_gpu = *f32.impl();
  on_gpu.device = Device::cuda(0);
  TensorImpl on_second_gpu = on_gpu;
  on_second_gpu.device = Device::cuda(1);
  now.params[0] = param_fact(on_gpu);
  CHECK(explain_guard_failure(before, now) == "param 0: device changed from cpu to cuda:0");
  before.params[0] = param_fact(on_gpu);
  now.params[0] = param_fact(on_second_gpu);
  CHECK(explain_guard_failure(before, now) == "param 0: device changed from cuda:0 to cuda:1");
  now = before;
  now.groups[0] = "amsgrad=1";
  CHECK(explain_guard_failure(before, now) == "group 0: structure changed from {amsgrad=0} to {amsgrad=1}");
}

TEST_CASE("compiled: a step whose optimizer was destroyed, or a moved-from step, refuses to run with a clear error") {
  auto params = random_params({{5}, {3}}, Dtype::f32, 3);
  auto opt = test::make_single_group("adam", params, {}, true);
  CompiledStep step = compile(*opt);
  step();
  CompiledStep moved = std::move(step);
  test::check_error_contains([&] { step(); }, "this compiled step was moved from");
  test::check_error_contains([&] { (void)step.metrics(); }, "moved from");
  moved();
  CHECK(moved.metrics().steps == 2);
  const std::vector<double> before = params[0].to_vector();
  opt.reset();
  test::check_error_contains([&] { moved(); }, "the optimizer this step was compiled from (Adam) has been destroyed");
  test::check_error_contains([&] { moved.kernel_count(); }, "has been destroyed");
  test::check_error_contains([&] { moved.dump(Stage::Fused); }, "has been destroyed");
  CHECK(moved.metrics().steps == 2); // what happened stays readable
  CHECK(params[0].to_vector() == before);
}
