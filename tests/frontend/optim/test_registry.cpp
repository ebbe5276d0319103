// Optimizers by name: the built-ins, and an optimizer a user writes and registers (register_optimizer), which then
// works where the built-ins do: make_optimizer, compiled and eager steps, state files. Its forloop reference is
// optional: without one, a forloop step says so and changes nothing.
#include "compiler/compiled_step.h"
#include "frontend/optim/lion.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/state_file.h"
#include "frontend/trace/foreach.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <filesystem>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;
using optjit::test::check_same_trajectory;
using optjit::test::Snapshot;

namespace {

// Signed SGD with momentum, as a user writes it: no forloop reference.
#define SIGNUM_OPTIONS(X)                                                                                              \
  X(double, lr, 1e-2)                                                                                                  \
  X(double, momentum, 0.9)
OPTJIT_DEFINE_OPTIONS(SignumOptions, SIGNUM_OPTIONS)

class Signum : public Optimizer {
public:
  using Options = SignumOptions;
  Signum(std::vector<ParamGroupSpec> groups, const SignumOptions& o)
      : Optimizer("Signum", option_map(o), o.foreach.value_or(false), flag_names(o)) {
    validate_options(defaults());
    add_param_groups(std::move(groups));
  }
  Structure structure(const ParamGroup&) const override { return {}; }
  std::vector<StateSpec> state_specs(const Structure&) const override { return {{"momentum_buffer"}}; }
  std::vector<std::string> hyper_names() const override { return {"lr", "momentum"}; }
  void trace(Tracer& t, const Structure&) const override {
    Sym momentum = t.hyper("momentum");
    Sym buffer = t.tensors("momentum_buffer") * momentum + t.tensors("grad") * (1.0 - momentum);
    t.store("momentum_buffer", buffer);
    t.store("param", foreach_add(t.tensors("param"), sign(buffer), -t.hyper("lr")));
  }
  void validate_options(const OptionMap& o) const override {
    if (!(o.at("lr") >= 0))
      throw Error("Invalid learning rate: " + std::to_string(o.at("lr")));
  }
};

void register_signum_once() {
  static const bool registered = [] {
    register_optimizer<Signum>("Signum");
    return true;
  }();
  (void)registered;
}

} // namespace

TEST_CASE("registry: a user's optimizer registers by name and compiles, steps eagerly and saves like a built-in") {
  register_signum_once();
  const std::vector<std::string> names = implemented_optimizers();
  CHECK(std::find(names.begin(), names.end(), "Signum") != names.end());
  CHECK(std::find(names.begin(), names.end(), "Lion") != names.end());

  const auto initial = random_params({{40, 3}, {7}}, Dtype::f32, 4);
  std::vector<Tensor> compiled_params = copy_params(initial), eager_params = copy_params(initial);
  auto compiled_opt =
      make_optimizer("signum", {ParamGroupSpec{compiled_params, {}}}, {{"lr", {0.1}}, {"foreach", {1}}});
  auto eager_opt = make_optimizer("SIGNUM", {ParamGroupSpec{eager_params, {}}}, {{"lr", {0.1}}, {"foreach", {1}}});
  CHECK(compiled_opt->name() == "Signum");
  CompiledStep step = compile(*compiled_opt);
  for (int t = 0; t < 3; ++t) {
    randomize_grads(compiled_params, static_cast<uint64_t>(t));
    randomize_grads(eager_params, static_cast<uint64_t>(t));
    step();
    eager_opt->step();
  }
  CHECK_KERNELS(step, 1);
  check_same_trajectory(compiled_params, *compiled_opt, eager_params, *eager_opt, 1e-6, 1e-7, "compiled vs eager");

  // Its state goes through a state file and into a fresh optimizer made by name.
  const std::filesystem::path file = test::temp_path("signum.safetensors");
  save_state_dict(compiled_opt->state_dict(), file);
  std::vector<Tensor> resumed_params = copy_params(compiled_params);
  auto resumed = make_optimizer("Signum", {ParamGroupSpec{resumed_params, {}}}, {{"foreach", {1}}});
  resumed->load_state_dict(load_state_dict_file(file));
  std::filesystem::remove(file);
  check_same_trajectory(compiled_params, *compiled_opt, resumed_params, *resumed, 0, 0, "after the state file");

  check_error_contains(
      [&] {
        make_optimizer("Signum", {ParamGroupSpec{eager_params, {}}}, {{"betas", {0.9, 0.9}}});
      },
      "Signum has no option 'betas'");
  check_error([] { register_optimizer<Signum>("signum"); },
              "register_optimizer: optjit already has an optimizer named Signum");
  check_error([] { register_optimizer<Signum>("adam"); },
              "register_optimizer: optjit already has an optimizer named Adam");
}

TEST_CASE("registry: a user's optimizer is guarded and dumped like a built-in") {
  register_signum_once();
  std::vector<Tensor> params = random_params({{40, 3}, {7}}, Dtype::f32, 6);
  auto opt = make_optimizer("Signum", {ParamGroupSpec{params, {}}}, {{"lr", {0.1}}, {"foreach", {1}}});
  CompiledStep step = compile(*opt);
  step();
  CHECK(step.dump(Stage::Traced).find("graph @signum f32") != std::string::npos);
  CHECK(step.dump(Stage::Fused).find("1 kernel(s) per step") != std::string::npos);
  CHECK(step.dump(Stage::LLVM).find("define void @signum_k0") != std::string::npos);
  opt->param_groups()[0].set("lr", 0.05); // a value: no recompile
  step();
  CHECK(step.metrics().recompiles == 0);
  // A group of f64 params: a structure the step has not compiled, which it compiles and says why.
  std::vector<Tensor> more = random_params({{5}}, Dtype::f64, 7);
  opt->add_param_group(ParamGroupSpec{more, {}});
  step();
  CHECK(step.metrics().recompiles == 1);
  REQUIRE(step.metrics().recompile_reasons.size() == 1);
  CHECK(!step.metrics().recompile_reasons[0].empty());
  CHECK_KERNELS(step, 2);
  CHECK(more[0].to_vector() != random_params({{5}}, Dtype::f64, 7)[0].to_vector()); // stepped
}

TEST_CASE("registry: an optimizer without a forloop reference says so in forloop mode and changes nothing") {
  register_signum_once();
  auto params = random_params({{5}}, Dtype::f32, 1);
  auto opt = make_optimizer("Signum", {ParamGroupSpec{params, {}}}, {{"foreach", {0}}});
  const Snapshot before(params, *opt);
  check_error([&] { opt->step(); },
              "Signum has no forloop reference (foreach=false): step it with foreach=true or compile it");
  CHECK(Snapshot(params, *opt) == before);
  CHECK(opt->visible_state(params[0]).empty()); // no state was created either
  compile (*opt)();                             // compiled, the same optimizer steps
  CHECK_FALSE(opt->visible_state(params[0]).empty());
}

TEST_CASE("lion: one kernel, its options checked, and the three modes agree") {
  for (const auto& options : std::vector<KeywordOptions>{{}, {{"weight_decay", {0.1}}, {"maximize", {1}}}}) {
    const auto initial = random_params({{64, 5}, {3}}, Dtype::f32, 2);
    std::vector<std::vector<Tensor>> runs;
    std::vector<std::unique_ptr<Optimizer>> opts;
    for (int mode = 0; mode < 3; ++mode) {
      runs.push_back(copy_params(initial));
      KeywordOptions o = options;
      o["lr"] = {0.01};
      o["foreach"] = {mode == 0 ? 0.0 : 1.0};
      opts.push_back(make_optimizer("lion", {ParamGroupSpec{runs.back(), {}}}, o));
    }
    CompiledStep step = compile(*opts[2]);
    for (int t = 0; t < 3; ++t) {
      for (auto& params : runs)
        randomize_grads(params, static_cast<uint64_t>(t));
      opts[0]->step();
      opts[1]->step();
      step();
    }
    CHECK_KERNELS(step, 1);
    check_same_trajectory(runs[1], *opts[1], runs[0], *opts[0], 1e-6, 1e-7, "eager vs forloop");
    check_same_trajectory(runs[2], *opts[2], runs[0], *opts[0], 1e-6, 1e-7, "compiled vs forloop");
  }
  auto params = random_params({{3}}, Dtype::f32, 0);
  check_error([&] { Lion(params, {.lr = -1}); }, "Invalid learning rate: -1.0");
  check_error([&] { Lion(params, {.betas = {1.0, 0.99}}); }, "Invalid beta parameter at index 0: 1.0");
  check_error([&] { Lion(params, {.betas = {0.9, -0.1}}); }, "Invalid beta parameter at index 1: -0.1");
  check_error([&] { Lion(params, {.weight_decay = -0.5}); }, "Invalid weight_decay value: -0.5");
}
