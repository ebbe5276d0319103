// The torch.optim API around the step: add_param_group, step hooks (per optimizer and global), step(closure) and
// zero_grad(set_to_none), on the eager and the compiled step; options declared once per optimizer.
#include "compiler/compiled_step.h"
#include "frontend/optim/adadelta.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/adamax.h"
#include "frontend/optim/asgd.h"
#include "frontend/optim/nadam.h"
#include "frontend/optim/radam.h"
#include "frontend/optim/rmsprop.h"
#include "frontend/optim/rprop.h"
#include "frontend/optim/sgd.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

#include <type_traits>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;
using optjit::test::check_same_trajectory;
using optjit::test::Snapshot;

TEST_CASE("api: add_param_group takes the defaults, its own options, and joins eager and compiled steps") {
  auto a = random_params({{4}, {2, 3}, {5}}, Dtype::f32, 12);
  auto b = copy_params(a);
  Adam forloop({a[0]}, {.lr = 0.01}), foreach ({b[0]}, {.lr = 0.01, .foreach = true});
  CompiledStep compiled = compile(foreach);
  forloop.step();
  compiled();
  forloop.add_param_group({{a[1], a[2]}, {{"lr", 0.1}, {"amsgrad", 1}}});
  foreach
    .add_param_group({{b[1], b[2]}, {{"lr", 0.1}, {"amsgrad", 1}}});
  REQUIRE(foreach.param_groups().size() == 2);
  CHECK(foreach.param_groups()[1].get("lr") == 0.1);
  CHECK(foreach.param_groups()[1].get("beta1") == 0.9); // from the defaults
  CHECK(foreach.param_count() == 3);
  for (int s = 0; s < 3; ++s) {
    randomize_grads(a, 30 + static_cast<uint64_t>(s));
    randomize_grads(b, 30 + static_cast<uint64_t>(s));
    forloop.step();
    compiled();
  }
  check_same_trajectory(b, foreach, a, forloop, 2e-6, 1e-7, "compiled vs forloop after add_param_group");
  CHECK_KERNELS(compiled, 2); // the new group's structure (amsgrad) differs: a kernel of its own
  CHECK(find_state(*foreach.state(b[0]), "step").item() == 4);
  CHECK(find_state(*foreach.state(b[1]), "step").item() == 3);
}

TEST_CASE("api: add_param_group refuses a param another group has, or a bad option, and changes nothing") {
  auto p = random_params({{3}, {4}}, Dtype::f32, 13);
  Adam opt({p[0]});
  opt.step();
  const Snapshot before(p, opt);
  check_error(
      [&] {
        opt.add_param_group({{p[1], p[0]}, {}});
      },
      "some parameters appear in more than one parameter group");
  check_error([&] { opt.add_param_group({{p[1]}, {{"lr", -1}}}); }, "Invalid learning rate: -1.0");
  CHECK(opt.param_groups().size() == 1);
  CHECK(opt.param_count() == 1);
  CHECK(Snapshot(p, opt) == before);
}

TEST_CASE("api: Adagrad gives params of an added group their state at once, as at construction") {
  auto p = random_params({{3}, {4}}, Dtype::f64, 14);
  Adagrad opt({p[0]}, {.initial_accumulator_value = 0.5});
  opt.add_param_group({{p[1]}, {{"initial_accumulator_value", 0.25}}});
  REQUIRE(opt.state(p[1]) != nullptr);
  CHECK(find_state(*opt.state(p[1]), "sum").item(3) == 0.25);
  CHECK(find_state(*opt.state(p[1]), "step").item() == 0);
}

TEST_CASE("api: step hooks run global pre, own pre, closure, update, own post, global post, and hooks are removable") {
  for (bool use_compiled : {false, true}) {
    INFO(std::string(use_compiled ? "compiled" : "eager"));
    auto p = random_params({{3}}, Dtype::f32, 15);
    SGD opt(p, {.lr = 0.1, .foreach = true});
    CompiledStep compiled = compile(opt);
    std::vector<std::string> calls;
    HookHandle global_pre = register_optimizer_step_pre_hook([&](Optimizer&) { calls.push_back("global-pre"); });
    HookHandle global_post = register_optimizer_step_post_hook([&](Optimizer&) { calls.push_back("global-post"); });
    HookHandle pre = opt.register_step_pre_hook([&](Optimizer& o) {
      calls.push_back("pre");
      CHECK(&o == &opt);
    });
    opt.register_step_post_hook([&](Optimizer&) { calls.push_back("post"); });
    const double before = p[0].item();
    const double grad = p[0].grad().item();
    auto closure = [&] {
      calls.push_back("closure");
      CHECK(p[0].item() == before); // the closure sees the params before the update
      return 2.5;
    };
    const double loss = use_compiled ? compiled(closure) : opt.step(closure);
    CHECK(loss == 2.5);
    CHECK(calls == std::vector<std::string>{"global-pre", "pre", "closure", "post", "global-post"});
    CHECK(p[0].item() == doctest::Approx(before - 0.1 * grad));
    calls.clear();
    global_pre.remove();
    global_post.remove();
    pre.remove();
    use_compiled ? compiled() : opt.step();
    CHECK(calls == std::vector<std::string>{"post"});
  }
}

TEST_CASE("api: the closure sets the grads the step uses, and a throwing closure changes nothing") {
  auto p = random_params({{4}}, Dtype::f64, 16);
  p[0].reset_grad();
  Adam opt(p, {.lr = 0.1, .foreach = true});
  CompiledStep compiled = compile(opt);
  auto set_grads = [&] {
    p[0].set_grad(Tensor::full({4}, 1.0, Dtype::f64));
    return 7.0;
  };
  CHECK(compiled(set_grads) == 7.0);
  CHECK(p[0].item() != 0);
  CHECK(find_state(*opt.state(p[0]), "step").item() == 1);
  const Snapshot before(p, opt);
  CHECK_THROWS_AS(compiled([]() -> double { throw Error("loss is NaN"); }), Error);
  CHECK(Snapshot(p, opt) == before);
}

TEST_CASE("api: zero_grad(set_to_none=false) zeroes grads in place, and the step then sees zero grads") {
  auto p = random_params({{5}, {2}}, Dtype::f32, 17);
  Adam opt(p, {.lr = 0.1, .foreach = true});
  CompiledStep compiled = compile(opt);
  compiled();
  const Tensor grad_buffer = p[0].grad();
  opt.zero_grad(/*set_to_none=*/false);
  CHECK(p[0].grad().same(grad_buffer)); // same buffer, no rebind needed
  CHECK(p[0].grad().to_vector() == std::vector<double>(5, 0.0));
  const int64_t rebinds = compiled.metrics().rebinds;
  compiled();
  CHECK(compiled.metrics().rebinds == rebinds);
  CHECK(find_state(*opt.state(p[0]), "step").item() == 2); // a zero grad is still a grad: the step advances
  opt.zero_grad();                                         // set_to_none=true, torch's default
  CHECK_FALSE(p[0].grad().defined());
}

namespace {

// Every option the struct declares is a keyword of the registry, and the struct's option map gives the defaults.
template <class Opt> void check_options_declared_once(const std::string& cls) {
  using Options = typename Opt::Options;
  const Options defaults;
  Opt direct(random_params({{4}}, Dtype::f32, 1), defaults);
  for (const auto& [key, value] : option_map(defaults)) { // AdamW adds decoupled_weight_decay = 1 beside them
    INFO(cls << " default " << key);
    REQUIRE(direct.defaults().count(key) == 1);
    CHECK(direct.defaults().at(key) == value);
  }
  int declared = 0;
  Options::for_each_option([&](const char* name, auto member) {
    ++declared;
    INFO(cls << " option " << name);
    KeywordOptions keyword;
    using Member = std::remove_cvref_t<decltype(defaults.*member)>;
    if constexpr (std::is_same_v<Member, OptionPair>)
      keyword[name] = {(defaults.*member).first, (defaults.*member).second};
    else if constexpr (std::is_same_v<Member, std::optional<bool>>)
      keyword[name] = {1.0};
    else
      keyword[name] = {static_cast<double>(defaults.*member)};
    auto made = make_optimizer(cls, {ParamGroupSpec{random_params({{4}}, Dtype::f32, 1), {}}}, keyword);
    CHECK(made->defaults() == direct.defaults());
  });
  CHECK(declared >= 3);
}

} // namespace

TEST_CASE("options are declared once: the struct, the defaults and the registry's keywords agree") {
  check_options_declared_once<Adam>("Adam");
  check_options_declared_once<AdamW>("AdamW");
  check_options_declared_once<SGD>("SGD");
  check_options_declared_once<NAdam>("NAdam");
  check_options_declared_once<RAdam>("RAdam");
  check_options_declared_once<Adamax>("Adamax");
  check_options_declared_once<Adagrad>("Adagrad");
  check_options_declared_once<Adadelta>("Adadelta");
  check_options_declared_once<RMSprop>("RMSprop");
  check_options_declared_once<Rprop>("Rprop");
  check_options_declared_once<ASGD>("ASGD");
  check_error_contains(
      [] {
        make_optimizer("Adam", {ParamGroupSpec{random_params({{4}}, Dtype::f32, 1), {}}}, {{"momentum", {0.9}}});
      },
      "Adam has no option 'momentum'");
}

TEST_CASE("api: an optimizer prints in torch's format, groups in order, keys sorted, pairs joined "
          "(test_optimizer_can_be_printed)") {
  auto params = random_params({{3}, {2}}, Dtype::f32, 1);
  Adam adam({ParamGroupSpec{{params[0]}, {}}, ParamGroupSpec{{params[1]}, {{"lr", 0.5}}}},
            {.lr = 0.1, .amsgrad = true, .foreach = true});
  auto group = [](const std::string& lr) {
    return "    amsgrad: True\n    betas: (0.9, 0.999)\n    decoupled_weight_decay: False\n    eps: 1e-08\n"
           "    foreach: True\n    lr: " +
           lr +
           "\n    master_weights: False\n    maximize: False\n    state_block_size: 0\n    state_dtype: plain\n"
           "    stochastic_rounding: False\n    weight_decay: 0.0\n";
  };
  CHECK(adam.repr() == "Adam (\nParameter Group 0\n" + group("0.1") + "\nParameter Group 1\n" + group("0.5") + ")");

  Rprop rprop(random_params({{2}}, Dtype::f32, 2));
  CHECK(rprop.repr() == "Rprop (\nParameter Group 0\n    etas: (0.5, 1.2)\n    foreach: False\n    lr: 0.01\n"
                        "    master_weights: False\n    maximize: False\n    state_block_size: 0\n"
                        "    state_dtype: plain\n    step_sizes: (1e-06, 50.0)\n    stochastic_rounding: False\n)");
  // A tensor-held lr prints as its tensor, and keys LR schedulers add (initial_lr) are printed as torch prints them.
  rprop.param_groups()[0].set("lr", Tensor::full({}, 0.25, Dtype::f32));
  rprop.param_groups()[0].put("initial_lr", 0.01);
  CHECK(rprop.repr().find("    initial_lr: 0.01\n    lr: tensor(0.25)\n") != std::string::npos);
}

TEST_CASE("api: a deep copy has its own params, groups, defaults and state, and steps as the original "
          "(test_deepcopy_copies_all_public_attrs)") {
  for (const auto& [name, options] : test::every_optimizer())
    for (bool foreach : {false, true}) {
      INFO(name << std::string(foreach ? " foreach" : " forloop"));
      auto params = random_params({{4, 3}, {5}}, Dtype::f32, 3);
      // A transposed param (a view of `buffer`) keeps its layout in the copy.
      const Tensor buffer = Tensor::zeros({12}, Dtype::f32);
      Tensor transposed = Tensor::from_blob(buffer.data(), {4, 3}, Dtype::f32, {1, 4});
      transposed.copy_from(params[0]);
      transposed.set_grad(params[0].grad());
      params[0] = transposed;
      auto opt = test::make_single_group(name, params, options, foreach);
      opt->step();
      opt->param_groups()[0].put("initial_lr", 0.01);
      std::unique_ptr<Optimizer> copy = opt->deep_copy();
      CHECK(copy->name() == opt->name());
      CHECK(copy->repr() == opt->repr());
      CHECK(copy->defaults() == opt->defaults());
      const std::vector<Tensor>& copied = copy->param_groups()[0].params;
      REQUIRE(copied.size() == params.size());
      for (std::size_t i = 0; i < params.size(); ++i) {
        CHECK_FALSE(copied[i].same(params[i]));
        CHECK(copied[i].strides() == params[i].strides());
        CHECK(copied[i].grad().to_vector() == params[i].grad().to_vector());
      }
      check_same_trajectory(params, *opt, copied, *copy, 0, 0, "the copy");
      // Stepping the copy leaves the original as it was; stepping both keeps them equal.
      const Snapshot before(params, *opt);
      copy->step();
      CHECK(Snapshot(params, *opt) == before);
      opt->step();
      check_same_trajectory(params, *opt, copied, *copy, 0, 0, "both stepped");
    }
}
