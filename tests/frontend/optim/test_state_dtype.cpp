// The group option state_dtype (frontend/optim/state_dtype.h): every built-in optimizer whose state is per-element
// moments keeps them block-quantized in 8 bits, 4 bits or FP8. Checked here: the compiled step equals the
// interpreted foreach step bit for bit (codes and scales included) and the forloop reference within a code; the
// quantized run follows the plain run within what the format rounds; which entries are quantized, with which map;
// starting values other than 0; mixed groups, clipping, grad scaling and master weights in the same pass; state dicts;
// refusals.
#include "compiler/compiled_step.h"
#include "frontend/optim/optimizer_parts.h"
#include "frontend/optim/registry.h"
#include "helpers.h"
#include "ir/block_slots.h"
#include "tools/model.h"

#include <doctest/doctest.h>
#include <spdlog/fmt/fmt.h>

#include <cmath>

#include <tuple>

using namespace optjit;
using test::Mode;

namespace {

// A quantized param (64 x 128: 32 blocks of 256), a small one (plain state: under 4096 values) and one whose count
// is not a multiple of the block (plain too).
const std::vector<Shape> kShapes = {{64, 128}, {1000}, {4100}};

// Optimizers that take state_dtype, with options that reach most of their state: each optimizer's kept entries.
const std::vector<std::pair<std::string, KeywordOptions>>& quantizable_optimizers() {
  static const std::vector<std::pair<std::string, KeywordOptions>> options = [] {
    std::vector<std::pair<std::string, KeywordOptions>> list;
    for (const auto& [name, o] : test::every_optimizer())
      if (name != "asgd" && name != "rmsprop") // ASGD refuses; this RMSprop is centered, which refuses
        list.emplace_back(name, o);
    list.push_back({"rmsprop", {{"lr", {0.01}}, {"momentum", {0.5}}, {"weight_decay", {0.1}}}});
    list.push_back({"lion", {{"lr", {0.001}}, {"weight_decay", {0.1}}}});
    list.push_back({"lamb", {{"lr", {0.01}}, {"weight_decay", {0.1}}}});
    list.push_back({"lars", {{"lr", {0.1}}, {"momentum", {0.9}}, {"weight_decay", {0.01}}}});
    list.push_back({"sgd", {{"lr", {0.1}}, {"momentum", {0.9}}, {"dampening", {0.1}}}});
    return list;
  }();
  return options;
}

double state_dtype_code(const char* name) { return named_option_value("state_dtype", name); }

// check(name, options) for each quantizable optimizer in each format (its options with state_dtype set).
template <class Check> void for_each_optimizer_and_format(Check&& check) {
  for (const auto& [name, options] : quantizable_optimizers())
    for (const std::string dtype : {"int8", "int4", "fp8"}) {
      CAPTURE(name);
      CAPTURE(dtype);
      KeywordOptions o = options;
      o["state_dtype"] = {state_dtype_code(dtype.c_str())};
      check(name, o);
    }
}

// Every byte of every param and state entry, in order.
std::vector<std::vector<double>> snapshot(const Optimizer& opt) {
  std::vector<std::vector<double>> all;
  for (int64_t i = 0; i < opt.param_count(); ++i) {
    all.push_back(opt.flat_param(i).real_view().to_vector());
    for (const auto& [key, t] : opt.flat_state(i))
      all.push_back(is_code_dtype(t.dtype()) ? Tensor(t).to(Dtype::f64).to_vector() // e4m3 codes as their values
                                             : t.real_view().to_vector());
  }
  return all;
}

// State entry `name` of param `flat` as values: dequantized where it is quantized.
std::vector<double> state_values(const Optimizer& opt, int64_t flat, const std::string& name) {
  const Tensor held = find_state(opt.flat_state(flat), name);
  REQUIRE(held.defined());
  if (!is_code_dtype(held.dtype()))
    return held.real_view().to_vector();
  const std::vector<StateSpec> specs = opt.param_state_specs(flat);
  const auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == name; });
  REQUIRE(spec != specs.end());
  const std::optional<SlotBlocks> blocks = opt.state_blocks(flat, *spec);
  REQUIRE(blocks);
  const Tensor scales = find_state(opt.flat_state(flat), scales_slot_name(name));
  const int64_t numel = opt.flat_param(flat).numel();
  std::vector<float> values(static_cast<std::size_t>(numel));
  dequantize_blocks(blocks->format, static_cast<const uint8_t*>(held.data()), scales.data_as<float>(), numel,
                    blocks->block, values.data());
  return {values.begin(), values.end()};
}

std::unique_ptr<Optimizer> make(const std::string& name, KeywordOptions options, const std::vector<Tensor>& params,
                                Mode mode) {
  options["foreach"] = {mode == Mode::Forloop ? 0.0 : 1.0};
  return make_optimizer(name, {ParamGroupSpec{params, {}}}, options);
}

void step_all(std::vector<Tensor>& params, int step, Optimizer& opt, std::optional<CompiledStep>& compiled) {
  randomize_grads(params, 100 + static_cast<uint64_t>(step));
  compiled ? (*compiled)() : opt.step();
}

// max |a - b| over max |b|: the error relative to the entry's scale, which is what quantization bounds.
double relative_to_largest(const std::vector<double>& a, const std::vector<double>& b) {
  double error = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    error = std::max(error, std::fabs(a[i] - b[i]));
    largest = std::max(largest, std::fabs(b[i]));
  }
  return largest > 0 ? error / largest : error;
}

} // namespace

TEST_CASE("state_dtype: every optimizer's compiled step equals its foreach step bit for bit, codes and scales too") {
  for_each_optimizer_and_format([](const std::string& name, const KeywordOptions& o) {
    std::vector<Tensor> eager_params = random_params(kShapes, Dtype::f32, 3);
    std::vector<Tensor> compiled_params = copy_params(eager_params);
    auto eager = make(name, o, eager_params, Mode::Eager);
    auto compiled_opt = make(name, o, compiled_params, Mode::Compiled);
    std::optional<CompiledStep> none, compiled(compile(*compiled_opt));
    for (int step = 0; step < 4; ++step) {
      step_all(eager_params, step, *eager, none);
      step_all(compiled_params, step, *compiled_opt, compiled);
      CHECK(snapshot(*compiled_opt) == snapshot(*eager));
    }
    CHECK(compiled->metrics().compiles == 1);
    // The big param's tensor state is codes and scales; the small params' is plain f32.
    bool any_quantized = false;
    for (const auto& [key, t] : compiled_opt->flat_state(0))
      any_quantized = any_quantized || is_code_dtype(t.dtype());
    CHECK(any_quantized);
    for (int64_t flat : {1, 2})
      for (const auto& [key, t] : compiled_opt->flat_state(flat))
        CHECK(!is_code_dtype(t.dtype()));
  });
}

TEST_CASE("state_dtype: the forloop reference steps on dequantized state and follows the compiled step") {
  for_each_optimizer_and_format([](const std::string& name, const KeywordOptions& o) {
    std::vector<Tensor> forloop_params = random_params(kShapes, Dtype::f32, 5);
    std::vector<Tensor> compiled_params = copy_params(forloop_params);
    auto forloop = make(name, o, forloop_params, Mode::Forloop);
    auto compiled_opt = make(name, o, compiled_params, Mode::Compiled);
    std::optional<CompiledStep> none, compiled(compile(*compiled_opt));
    for (int step = 0; step < 3; ++step) {
      step_all(forloop_params, step, *forloop, none);
      step_all(compiled_params, step, *compiled_opt, compiled);
    }
    // The two compute the same formulas in different orders: an f32 ulp can move a value across a code's boundary,
    // so entries agree within a code or two of their block (8-bit codes are at most 1/64 of the block apart).
    for (int64_t flat = 0; flat < 3; ++flat) {
      CAPTURE(flat);
      CHECK(relative_to_largest(compiled_params[static_cast<std::size_t>(flat)].to_vector(),
                                forloop_params[static_cast<std::size_t>(flat)].to_vector()) < 1e-3);
      for (const StateSpec& spec : compiled_opt->param_state_specs(flat))
        if (spec.kind == StateKind::Tensor && spec.visible) {
          CAPTURE(spec.name);
          CHECK(relative_to_largest(state_values(*compiled_opt, flat, spec.name),
                                    state_values(*forloop, flat, spec.name)) < 0.04);
        }
    }
  });
}

TEST_CASE("state_dtype: quantized state follows plain state within what each format rounds") {
  // AdamW over 20 steps of pure noise (grads with no mean: the hardest case, every update is the moments' ratio): the
  // quantized runs move the params as the plain run within the format's rounding (measured: 1.6% for 8 bits, 3.7%
  // for FP8, 22% for 4 bits, whose first moment has 16 levels). A wrong map or scale moves them by 100% and more.
  const std::vector<std::pair<std::string, double>> bounds = {{"int8", 0.03}, {"fp8", 0.06}, {"int4", 0.3}};
  for (const auto& [dtype, bound] : bounds) {
    CAPTURE(dtype);
    std::vector<Tensor> plain_params = random_params({{64, 128}}, Dtype::f32, 7);
    std::vector<Tensor> low_params = copy_params(plain_params);
    const std::vector<Tensor> start = copy_params(plain_params);
    auto plain = make("adamw", {{"lr", {0.01}}}, plain_params, Mode::Compiled);
    auto low =
        make("adamw", {{"lr", {0.01}}, {"state_dtype", {state_dtype_code(dtype.c_str())}}}, low_params, Mode::Compiled);
    std::optional<CompiledStep> plain_step(compile(*plain)), low_step(compile(*low));
    for (int step = 0; step < 20; ++step) {
      step_all(plain_params, step, *plain, plain_step);
      step_all(low_params, step, *low, low_step);
    }
    // Compared as the distance moved (about 20 lr for every value), in the 2-norm over the whole param.
    const std::vector<double> initial = start[0].to_vector(), plain_now = plain_params[0].to_vector(),
                              low_now = low_params[0].to_vector();
    double error = 0, moved = 0;
    for (std::size_t i = 0; i < initial.size(); ++i) {
      error += (low_now[i] - plain_now[i]) * (low_now[i] - plain_now[i]);
      moved += (plain_now[i] - initial[i]) * (plain_now[i] - initial[i]);
    }
    error = std::sqrt(error / moved);
    INFO(dtype << ": the update's error relative to the update (2-norms) " << error);
    CHECK(error < bound);
    CHECK(error > 0); // it is quantized
    CHECK(state_values(*low, 0, "exp_avg_sq").size() == 8192);
  }
}

TEST_CASE("state_dtype: first moments take the signed map, second moments the unsigned one") {
  std::vector<Tensor> params = random_params({{64, 128}}, Dtype::f32, 9);
  auto opt = make("adam", {{"lr", {0.01}}, {"amsgrad", {1}}, {"state_dtype", {state_dtype_code("int8")}}}, params,
                  Mode::Eager);
  std::optional<CompiledStep> none;
  step_all(params, 0, *opt, none);
  for (const auto& [entry, format] :
       std::vector<std::pair<const char*, BlockFormat>>{{"exp_avg", BlockFormat::Signed8},
                                                        {"exp_avg_sq", BlockFormat::Unsigned8},
                                                        {"max_exp_avg_sq", BlockFormat::Unsigned8}}) {
    CAPTURE(entry);
    const std::vector<StateSpec> specs = opt->param_state_specs(0);
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == entry; });
    REQUIRE(spec != specs.end());
    CHECK(opt->state_blocks(0, *spec) == SlotBlocks{format, 256});
    CHECK(find_state(opt->flat_state(0), scales_slot_name(entry)).numel() == 32);
  }
  // After one step exp_avg is (1 - beta1) g and exp_avg_sq (1 - beta2) g^2: their signs and magnitudes survive.
  const std::vector<double> grads = params[0].grad().to_vector(), m = state_values(*opt, 0, "exp_avg"),
                            v = state_values(*opt, 0, "exp_avg_sq");
  double m_error = 0, m_largest = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    m_error = std::max(m_error, std::fabs(m[i] - 0.1 * grads[i]));
    m_largest = std::max(m_largest, std::fabs(0.1 * grads[i]));
    CHECK(v[i] >= 0);
  }
  CHECK(m_error / m_largest < 0.02);
}

TEST_CASE("state_dtype: state that starts away from zero starts at its value's code") {
  // Adagrad makes its state in its constructor (sum = initial_accumulator_value); Rprop's step_size starts at lr.
  // Every value of a block is the block's maximum, whose code is the map's 1.0 (FP8's 448): exact but for the scale.
  for (const char* dtype : {"int8", "int4", "fp8"}) {
    CAPTURE(dtype);
    std::vector<Tensor> params = random_params({{64, 128}}, Dtype::f32, 11);
    auto adagrad = make("adagrad", {{"initial_accumulator_value", {0.3}}, {"state_dtype", {state_dtype_code(dtype)}}},
                        params, Mode::Compiled);
    for (double v : state_values(*adagrad, 0, "sum"))
      CHECK(v == doctest::Approx(0.3).epsilon(1e-6));
    std::vector<Tensor> rprop_params = random_params({{64, 128}}, Dtype::f32, 11);
    auto rprop =
        make("rprop", {{"lr", {0.02}}, {"state_dtype", {state_dtype_code(dtype)}}}, rprop_params, Mode::Compiled);
    std::optional<CompiledStep> step(compile(*rprop));
    rprop_params[0].set_grad(Tensor::zeros({64, 128}, Dtype::f32)); // a zero grad leaves each step size as it was
    (*step)();
    for (double v : state_values(*rprop, 0, "step_size"))
      CHECK(v == doctest::Approx(0.02).epsilon(1e-6));
  }
}

TEST_CASE("state_dtype: groups of every format, clipping, grad scaling and master weights in one compiled step") {
  for (const Dtype param_dtype : {Dtype::f32, Dtype::bf16}) {
    CAPTURE(dtype_name(param_dtype));
    std::vector<std::vector<double>> runs;
    for (const Mode mode : {Mode::Eager, Mode::Compiled}) {
      std::vector<Tensor> params = random_params({{64, 128}, {4096}, {32, 256}, {300}}, param_dtype, 13);
      std::vector<ParamGroupSpec> groups = {{{params[0], params[3]}, {{"state_dtype", state_dtype_code("int8")}}},
                                            {{params[1]}, {{"state_dtype", state_dtype_code("int4")}}},
                                            {{params[2]}, {{"state_dtype", state_dtype_code("fp8")}}}};
      if (param_dtype == Dtype::bf16)
        for (ParamGroupSpec& g : groups)
          g.options["master_weights"] = 1;
      auto opt = make_optimizer("adamw", std::move(groups), {{"lr", {0.01}}, {"foreach", {1}}});
      opt->set_grad_clipping(Optimizer::GradClipping{0.5, 2.0, false});
      const Tensor scale = Tensor::full({1}, 64.0, Dtype::f32), found_inf = Tensor::zeros({1}, Dtype::f32);
      opt->set_grad_scaling(scale, found_inf);
      std::optional<CompiledStep> compiled;
      if (mode == Mode::Compiled)
        compiled.emplace(compile(*opt));
      for (int step = 0; step < 3; ++step)
        step_all(params, step, *opt, compiled);
      std::vector<double> all;
      for (const std::vector<double>& values : snapshot(*opt))
        all.insert(all.end(), values.begin(), values.end());
      runs.push_back(std::move(all));
      // Flat order is group order: params 0 and 3 (int8; 3 is small, plain), 1 (int4), 2 (fp8).
      CHECK(find_state(opt->flat_state(0), "exp_avg").dtype() == Dtype::u8);
      CHECK(find_state(opt->flat_state(1), "exp_avg").dtype() == param_dtype);
      CHECK(find_state(opt->flat_state(2), "exp_avg").numel() == 2048); // 4 bits: two codes a byte
      CHECK(find_state(opt->flat_state(3), "exp_avg").dtype() == Dtype::e4m3);
      if (param_dtype == Dtype::bf16)
        CHECK(find_state(opt->flat_state(0), "master_param").dtype() == Dtype::f32); // masters stay plain
    }
    CHECK(runs[1] == runs[0]);
  }
}

TEST_CASE("state_dtype: quantized state saves and loads, and the loaded run steps on as the saved one") {
  std::vector<Tensor> params = random_params(kShapes, Dtype::f32, 15);
  const KeywordOptions o = {{"lr", {0.01}}, {"state_dtype", {state_dtype_code("int4")}}};
  auto opt = make("adam", o, params, Mode::Compiled);
  std::optional<CompiledStep> step(compile(*opt));
  for (int s = 0; s < 2; ++s)
    step_all(params, s, *opt, step);
  const StateDict saved = opt->state_dict();
  CHECK(saved.param_groups.at(0).options.at("state_dtype") == state_dtype_code("int4"));
  std::vector<Tensor> copies = copy_params(params);
  auto loaded = make("adam", {{"lr", {0.01}}}, copies, Mode::Compiled); // plain: the loaded state keeps its format
  loaded->load_state_dict(saved);
  std::optional<CompiledStep> loaded_step(compile(*loaded));
  for (int s = 2; s < 4; ++s) {
    step_all(params, s, *opt, step);
    step_all(copies, s, *loaded, loaded_step);
  }
  CHECK(snapshot(*loaded) == snapshot(*opt));
}

TEST_CASE("state_dtype: state_block_size sets the blocks, and the compiled step still equals the foreach step") {
  for (const auto& [dtype, block] :
       std::vector<std::pair<const char*, double>>{{"int8", 64}, {"int4", 32}, {"fp8", 1024}}) {
    CAPTURE(dtype);
    const KeywordOptions options = {
        {"lr", {0.01}}, {"state_dtype", {state_dtype_code(dtype)}}, {"state_block_size", {block}}};
    std::vector<Tensor> eager_params = random_params(kShapes, Dtype::f32, 4);
    std::vector<Tensor> compiled_params = copy_params(eager_params);
    auto eager = make("adamw", options, eager_params, Mode::Eager);
    auto compiled_opt = make("adamw", options, compiled_params, Mode::Compiled);
    std::optional<CompiledStep> none, compiled(compile(*compiled_opt));
    for (int step = 0; step < 3; ++step) {
      step_all(eager_params, step, *eager, none);
      step_all(compiled_params, step, *compiled_opt, compiled);
    }
    CHECK(snapshot(*compiled_opt) == snapshot(*eager));
    const std::vector<StateSpec> specs = compiled_opt->param_state_specs(0);
    const auto spec = std::find_if(specs.begin(), specs.end(), [](const StateSpec& s) { return s.name == "exp_avg"; });
    REQUIRE(spec != specs.end());
    CHECK(compiled_opt->state_blocks(0, *spec)->block == static_cast<int64_t>(block));
    CHECK(find_state(compiled_opt->flat_state(0), "exp_avg.scale").numel() == 64 * 128 / static_cast<int64_t>(block));
  }
  for (const auto& [dtype, block, rule] : std::vector<std::tuple<const char*, double, const char*>>{
           {"int8", 0.5, "quantized state keeps whole blocks of 1 to 16384 values"},
           {"int8", 32768, "quantized state keeps whole blocks of 1 to 16384 values"},
           {"int4", 33, "an even number for int4 (two codes share a byte)"}}) {
    CAPTURE(block);
    test::check_error_contains(
        [&] {
          make("adam", {{"state_dtype", {state_dtype_code(dtype)}}, {"state_block_size", {block}}},
               random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
        },
        rule);
  }
}

TEST_CASE("state_dtype: refusals name the option, the optimizer and the rule, and change nothing") {
  const double int8 = state_dtype_code("int8");
  test::check_error(
      [&] {
        make("adafactor", {{"state_dtype", {int8}}}, random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
      },
      "param group 0 has state_dtype='int8', which Adafactor cannot keep: its second moment is already factored "
      "into a row and a column vector per matrix");
  test::check_error(
      [&] {
        make("asgd", {{"state_dtype", {int8}}}, random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
      },
      "param group 0 has state_dtype='int8', which ASGD cannot keep: its state 'ax' is an average of the param, "
      "which 8 or 4 bits would round to no use");
  test::check_error(
      [&] {
        make("muon", {{"state_dtype", {int8}}}, random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
      },
      "param group 0 has state_dtype='int8', which Muon cannot keep: its momentum buffer feeds matrix products, "
      "which take plain tensors");
  test::check_error(
      [&] {
        make("AdamW8bit", {{"state_dtype", {int8}}}, random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
      },
      "param group 0 has state_dtype='int8', which AdamW8bit cannot keep: its class sets its state's format "
      "(block_size sets its blocks)");
  test::check_error(
      [&] {
        make("AdamW8bit", {{"state_block_size", {64}}}, random_params({{64, 128}}, Dtype::f32, 1), Mode::Eager);
      },
      "param group 0 has state_block_size=64, which AdamW8bit cannot keep: its class sets its state's format "
      "(block_size sets its blocks)");
  test::check_error(
      [&] {
        make("adam", {{"state_dtype", {int8}}}, {Tensor::zeros({64, 64}, Dtype::c64), Tensor::zeros({3}, Dtype::f32)},
             Mode::Eager);
      },
      "param group 0 has state_dtype='int8' and a complex param (c64[64, 64] on cpu): block-quantized state holds "
      "real values; put complex params in a group of their own with plain state");
  test::check_error(
      [&] {
        make("rmsprop", {{"centered", {1}}, {"state_dtype", {int8}}}, random_params({{64, 128}}, Dtype::f32, 1),
             Mode::Eager);
      },
      "param group 0 has state_dtype='int8', which RMSprop cannot keep: centered=True takes the square root of "
      "square_avg - grad_avg^2, which two moments rounded apart can make negative (NaN params; bitsandbytes refuses "
      "it too)");
  test::check_error(
      [&] {
        make("adam", {{"state_dtype", {7}}}, random_params({{8}}, Dtype::f32, 1), Mode::Eager);
      },
      "Adam option 'state_dtype' is 7.0: it takes 'plain', 'int8', 'int4' or 'fp8'");
  test::check_error_contains([] { named_option_value("state_dtype", "int2"); },
                             "option 'state_dtype' is 'int2': it takes one of 'plain', 'int8', 'int4', 'fp8'");
  // Set on a group after construction (as Python's param groups are), a wrong value is refused at the step, before
  // anything changes.
  std::vector<Tensor> params = random_params({{64, 128}}, Dtype::f32, 1);
  auto opt = make("adam", {}, params, Mode::Eager);
  std::optional<CompiledStep> none;
  step_all(params, 0, *opt, none);
  const test::Snapshot before(params, *opt);
  opt->param_groups()[0].set("state_dtype", 9);
  test::check_error([&] { opt->step(); },
                    "option state_dtype of param group 0 is 9.0: it takes 'plain', 'int8', 'int4' or 'fp8'");
  opt->param_groups()[0].set("state_dtype", 0);
  CHECK(test::Snapshot(params, *opt) == before);
}

TEST_CASE("state_dtype: turned on after the state exists, it applies to new state, and held state keeps its format") {
  std::vector<Tensor> params = random_params({{64, 128}, {64, 128}}, Dtype::f32, 17);
  auto opt = make("adam", {}, params, Mode::Compiled);
  std::optional<CompiledStep> step(compile(*opt));
  params[1].reset_grad(); // param 1 has no state yet
  randomize_grads(params, 1);
  (*step)();
  opt->param_groups()[0].set("state_dtype", state_dtype_code("int8"));
  params[1].set_grad(Tensor::zeros({64, 128}, Dtype::f32));
  step_all(params, 2, *opt, step);
  CHECK(find_state(opt->flat_state(0), "exp_avg").dtype() == Dtype::f32);
  CHECK(find_state(opt->flat_state(1), "exp_avg").dtype() == Dtype::u8);
}
