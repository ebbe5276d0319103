// compile_step: step functions over tensor lists (PyTorch's foreach_map form) compiled like optimizer steps: an
// Adam and Adafactor's factored step (rows and columns state, row and column means) written as functions equal the
// built-ins bit for bit, hyperparameters never recompile, strided lists run in
// place, and bad lists or a function reading an undeclared list are refused naming the rule.
#include "frontend/optim/adam.h"
#include "frontend/optim/step_function.h"
#include "helpers.h"
#include "tools/model.h"

#include <doctest/doctest.h>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::check_error_contains;

namespace {

// torch's _multi_tensor_adam (no amsgrad, no weight decay), as a foreach_map user writes it.
void adam_function(Tracer& t) {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  Sym exp_avgs = foreach_lerp(t.tensors("exp_avg"), grads, 1.0 - beta1); // as torch.optim.Adam
  Sym exp_avg_sqs = foreach_addcmul(t.tensors("exp_avg_sq") * beta2, grads, grads, 1.0 - beta2);
  Sym step_size = lr / (1.0 - pow(beta1, step)) * -1.0;
  Sym denom = sqrt(exp_avg_sqs) / sqrt(1.0 - pow(beta2, step)) + eps;
  t.store("param", foreach_addcdiv(params, exp_avgs, denom, step_size));
  t.store("exp_avg", exp_avgs);
  t.store("exp_avg_sq", exp_avg_sqs);
}

std::vector<Tensor> zeros_like_each(const std::vector<Tensor>& params, bool scalar = false) {
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    out.push_back(Tensor::zeros(scalar ? Shape{} : p.shape(), p.dtype()));
  return out;
}

// Signed momentum: m = beta m + (1 - beta) g; p -= lr sign(m).
void signum_function(Tracer& t) {
  Sym m = t.tensors("momentum_buffer") * t.hyper("beta") + t.tensors("grad") * (1.0 - t.hyper("beta"));
  t.store("momentum_buffer", m);
  t.store("param", foreach_add(t.tensors("param"), sign(m), -t.hyper("lr")));
}

} // namespace

TEST_CASE("step function: an Adam written as a function equals the built-in Adam, in one kernel") {
  const auto initial = random_params({{300, 7}, {13}, {}}, Dtype::f32, 5);
  std::vector<Tensor> params = copy_params(initial), reference = copy_params(initial);
  const std::vector<Tensor> exp_avg = zeros_like_each(params), exp_avg_sq = zeros_like_each(params);
  const std::vector<Tensor> steps = zeros_like_each(params, /*scalar=*/true);
  StepFunction step = compile_step("adam_function", adam_function,
                                   {.params = params,
                                    .state = {{"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}},
                                    .scalars = {{"step", steps}},
                                    .hypers = {{"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}}});
  Adam adam(reference, {.lr = 1e-3, .foreach = true});
  CompiledStep adam_step = compile(adam);
  for (int t = 0; t < 4; ++t) {
    randomize_grads(params, static_cast<uint64_t>(t));
    randomize_grads(reference, static_cast<uint64_t>(t));
    step();
    adam_step();
  }
  CHECK_KERNELS(step, 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].to_vector() == reference[i].to_vector());
    CHECK(exp_avg[i].to_vector() == find_state(adam.visible_state(reference[i]), "exp_avg").to_vector());
    CHECK(steps[i].item() == 4);
  }
}

TEST_CASE("step function: hyperparameters are arguments, strided lists run in place, and the lists are the "
          "caller's") {
  // .t() views of one buffer (the Shampoo seed's layout), with grads and buffers in the same layout.
  const Tensor buffer = Tensor::zeros({2 * 6 * 4}, Dtype::f32);
  std::vector<Tensor> params, buffers;
  for (int k = 0; k < 2; ++k) {
    Tensor p = Tensor::from_blob(static_cast<float*>(buffer.data()) + k * 24, {4, 6}, Dtype::f32, {1, 4});
    p.copy_from(random_params({{4, 6}}, Dtype::f32, static_cast<uint64_t>(k))[0]);
    Tensor g = Tensor::empty_like(p, Dtype::f32, Device::cpu());
    g.fill(k == 0 ? 0.5 : -0.25);
    p.set_grad(g);
    params.push_back(p);
    buffers.push_back(Tensor::empty_like(p, Dtype::f32, Device::cpu()));
    buffers.back().fill(0);
  }
  const std::vector<double> before = params[0].to_vector();
  StepFunction step = compile_step(
      "signum", signum_function,
      {.params = params, .state = {{"momentum_buffer", buffers}}, .hypers = {{"lr", 0.01}, {"beta", 0.9}}});
  step();
  step.set_hyper("lr", 0.02);
  step();
  CHECK(step.metrics().compiles == 1);
  CHECK(step.metrics().recompiles == 0);
  const std::vector<double> after = params[0].to_vector();
  for (std::size_t k = 0; k < after.size(); ++k) // two steps of sign(+): -0.01, then -0.02
    CHECK(after[k] == doctest::Approx(before[k] - 0.03).epsilon(1e-6));
  CHECK(buffers[1].to_vector()[0] == doctest::Approx(-0.25 * (1 - 0.81)).epsilon(1e-6)); // the caller's buffer
  check_error([&] { step.set_hyper("momentum", 0.5); }, "step function signum has no hyperparameter 'momentum'");
}

TEST_CASE("step function: bad lists, names and hyperparameters are refused naming the rule") {
  auto params = random_params({{3}, {2}}, Dtype::f32, 1);
  auto lists = [&] {
    return StepLists{.params = params,
                     .state = {{"momentum_buffer", zeros_like_each(params)}},
                     .hypers = {{"lr", 0.1}, {"beta", 0.9}}};
  };
  StepLists short_list = lists();
  short_list.state[0].second.pop_back();
  check_error([&] { compile_step("signum", signum_function, short_list); },
              "compile_step signum: list 'momentum_buffer' has 1 tensors for 2 params");
  StepLists misshapen = lists();
  misshapen.state[0].second[0] = Tensor::zeros({4}, Dtype::f32);
  check_error_contains([&] { compile_step("signum", signum_function, misshapen); },
                       "state 'momentum_buffer' of param 0");
  check_error_contains([&] { compile_step("my step", signum_function, lists()); },
                       "graph @my step: a graph's name is an identifier");
  // Any number is a hyperparameter, as torch's ops take it: signum with lr = inf sends every param to -inf * sign.
  StepLists infinite = lists();
  infinite.hypers["lr"] = INFINITY;
  StepFunction infinite_step = compile_step("signum", signum_function, infinite);
  infinite_step();
  for (const Tensor& p : infinite.params)
    for (double v : p.to_vector())
      CHECK(std::isinf(v));
  check_error([&] { compile_step("signum", signum_function, StepLists{}); },
              "compile_step signum: the params list is empty");
  StepLists twice = lists();
  twice.params[1] = twice.params[0];
  check_error([&] { compile_step("signum", signum_function, twice); },
              "compile_step signum: param 1 is listed twice: give each param once");
  StepLists clash = lists();
  clash.state.push_back({"grad", zeros_like_each(params)});
  check_error_contains([&] { compile_step("signum", signum_function, clash); }, "list name 'grad' is taken");
  // A function that writes nothing: nothing to run, said when it is traced (and again at the next call).
  StepFunction writes_nothing = compile_step(
      "signum", [](Tracer& t) { (void)(t.tensors("grad") * 2.0); }, lists());
  check_error_contains([&] { writes_nothing(); }, "signum: the step stores nothing");
  check_error_contains([&] { writes_nothing(); }, "signum: the step stores nothing");
  // A function that reads a list it was not given: refused when it is traced, naming the lists it has.
  StepFunction reads_undeclared = compile_step(
      "signum", [](Tracer& t) { t.store("param", t.tensors("param") + t.tensors("exp_avg")); }, lists());
  check_error_contains([&] { reads_undeclared(); }, "exp_avg");
}

TEST_CASE("step function: SGD clipped by the global norm (list_sum) is two kernels and equals the math by hand") {
  std::vector<Tensor> params = random_params({{300, 7}, {13}, {0}, {}}, Dtype::f32, 7);
  randomize_grads(params, 3);
  std::vector<std::vector<double>> before, grads;
  double squares = 0;
  for (const Tensor& p : params) {
    before.push_back(p.to_vector());
    grads.push_back(p.grad().to_vector());
    for (double g : grads.back())
      squares += g * g;
  }
  // clip_grad_norm_ then SGD: coef = min(max_norm / (|g| + 1e-6), 1) over every grad of the lists.
  StepFunction step = compile_step("clipped_sgd",
                                   [](Tracer& t) {
                                     Sym grads = t.tensors("grad");
                                     Sym total = sqrt(list_sum(sum(grads * grads)));
                                     Sym coef = minimum(t.hyper("max_norm") / (total + 1e-6), t.constant(1.0));
                                     t.store("param", foreach_add(t.tensors("param"), grads * coef, -t.hyper("lr")));
                                   },
                                   {.params = params, .hypers = {{"lr", 0.5}, {"max_norm", 0.25}}});
  step();
  CHECK_KERNELS(step, 2);
  const double coef = std::min(0.25 / (std::sqrt(squares) + 1e-6), 1.0);
  REQUIRE(coef < 1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<double> after = params[i].to_vector();
    for (std::size_t k = 0; k < after.size(); ++k)
      REQUIRE(after[k] == doctest::Approx(before[i][k] - 0.5 * grads[i][k] * coef).epsilon(1e-5));
  }
}

namespace {

// clip_grad_norm_ (2-norm or inf-norm) then SGD, over every param of the lists.
void clipped_sgd_function(Tracer& t, bool inf_norm) {
  Sym grads = t.tensors("grad");
  Sym total = inf_norm ? list_max(max_of(abs(grads))) : sqrt(list_sum(sum(grads * grads)));
  Sym coef = minimum(t.hyper("max_norm") / (total + 1e-6), t.constant(1.0));
  t.store("param", foreach_add(t.tensors("param"), grads * coef, -t.hyper("lr")));
}

} // namespace

TEST_CASE("step function: a list reduction spans every param of the step, whatever its dtype, compiled and eager") {
  // f32, f64 and bf16 params, interleaved: three buckets, one list. The largest grad is in the f64 bucket, so a
  // norm taken per bucket would give the f32 params another coefficient.
  for (const bool inf_norm : {false, true})
    for (const Execution execution : {Execution::Compiled, Execution::Interpreted}) {
      CAPTURE(inf_norm);
      CAPTURE(static_cast<int>(execution));
      std::vector<Tensor> params;
      const Dtype dtypes[] = {Dtype::f32, Dtype::f64, Dtype::bf16, Dtype::f32, Dtype::f64};
      for (int k = 0; k < 5; ++k) {
        params.push_back(random_params({{17 + 5 * k, 3}}, Dtype::f32, static_cast<uint64_t>(k))[0].to(dtypes[k]));
        params.back().set_grad(
            random_params({{17 + 5 * k, 3}}, Dtype::f32, static_cast<uint64_t>(10 + k))[0].to(dtypes[k]));
      }
      params[1].grad().set_item(4, 9.5);
      std::vector<std::vector<double>> before, grads;
      double squares = 0, largest = 0;
      for (const Tensor& p : params) {
        before.push_back(p.to_vector());
        grads.push_back(p.grad().to_vector());
        for (double g : grads.back()) {
          squares += g * g;
          largest = std::max(largest, std::abs(g));
        }
      }
      StepFunction step =
          compile_step("clipped_sgd", [inf_norm](Tracer& t) { clipped_sgd_function(t, inf_norm); },
                       {.params = params, .hypers = {{"lr", 0.5}, {"max_norm", 0.25}}}, {.execution = execution});
      step();
      if (execution == Execution::Compiled)
        CHECK_KERNELS(step, 6); // two per bucket
      const double coef = 0.25 / ((inf_norm ? largest : std::sqrt(squares)) + 1e-6);
      for (std::size_t i = 0; i < params.size(); ++i) {
        CAPTURE(i);
        const double tolerance = dtypes[i] == Dtype::bf16 ? 1e-2 : 1e-6;
        const std::vector<double> after = params[i].to_vector();
        for (std::size_t k = 0; k < after.size(); ++k)
          REQUIRE(after[k] == doctest::Approx(before[i][k] - 0.5 * grads[i][k] * coef).epsilon(tolerance));
      }
    }
}

TEST_CASE("step function: buckets that trace different list reductions are refused before anything runs") {
  // A user optimizer whose groups trace a global norm or not: a list reduction of one group's program could not be
  // combined with the other's.
  struct NormedSgd : Optimizer {
    explicit NormedSgd(std::vector<ParamGroupSpec> groups)
        : Optimizer("NormedSgd", {{"lr", 0.1}, {"normed", 1}, {"master_weights", 0}, {"stochastic_rounding", 0}},
                    /*foreach=*/true, {"master_weights", "stochastic_rounding"}) {
      add_param_groups(std::move(groups));
    }
    Structure structure(const ParamGroup& group) const override {
      Structure s;
      s.set("normed", group.get("normed") != 0);
      return s;
    }
    std::vector<StateSpec> state_specs(const Structure&) const override { return {}; }
    std::vector<std::string> hyper_names() const override { return {"lr"}; }
    void trace(Tracer& t, const Structure& s) const override {
      Sym grads = t.tensors("grad");
      Sym update = s["normed"] ? grads / sqrt(list_sum(sum(grads * grads))) : grads;
      t.store("param", foreach_add(t.tensors("param"), update, -t.hyper("lr")));
    }
    void validate_options(const OptionMap&) const override {}
  };
  std::vector<Tensor> params = random_params({{8}, {9}}, Dtype::f32, 3);
  randomize_grads(params, 4);
  const std::vector<double> before = params[0].to_vector();
  NormedSgd optimizer({ParamGroupSpec{{params[0]}, {}}, ParamGroupSpec{{params[1]}, {{"normed", 0}}}});
  CompiledStep step = compile(optimizer);
  check_error_contains([&] { step(); }, "a list reduction (list_sum, list_max) combines over every param of the step");
  check_error_contains(
      [&] { step(); },
      "the f32 params on cpu with normed=1 reach list_sum and the f32 params on cpu with normed=0 reach none");
  CHECK(params[0].to_vector() == before);
}

TEST_CASE("step function: tensors that share memory are refused, and a refused compile leaves the grads alone") {
  const auto sgd = [](Tracer& t) { t.store("param", t.tensors("param") - t.tensors("grad") * t.hyper("lr")); };
  std::vector<Tensor> params = random_params({{8}, {3}}, Dtype::f32, 1);
  test::check_error_contains(
      [&] {
        compile_step("aliased", sgd,
                     {.params = params,
                      .state = {{"m", {params[0].grad(), Tensor::zeros({3}, Dtype::f32)}}},
                      .hypers = {{"lr", 0.1}}});
      },
      "step function aliased: tensor 0 of list 'grad' and tensor 0 of list 'm' share memory");
  const Tensor buffer = Tensor::zeros({12}, Dtype::f32);
  const std::vector<Tensor> overlapping = {Tensor::from_blob(buffer.data(), {8}, Dtype::f32),
                                           Tensor::from_blob(buffer.data_as<float>() + 4, {8}, Dtype::f32)};
  std::vector<Tensor> fresh = random_params({{8}, {8}}, Dtype::f32, 2);
  test::check_error_contains(
      [&] {
        compile_step("overlap", sgd, {.params = overlapping, .grads = fresh, .hypers = {{"lr", 1}}});
      },
      "share memory");
  // A state list of the wrong shape: refused, and the params keep their own grads.
  const Tensor own_grad = params[0].grad();
  test::check_error_contains(
      [&] {
        compile_step("bad_state", sgd,
                     {.params = params,
                      .grads = {Tensor::zeros({8}, Dtype::f32), Tensor::zeros({3}, Dtype::f32)},
                      .state = {{"m", {Tensor::zeros({5}, Dtype::f32), Tensor::zeros({3}, Dtype::f32)}}},
                      .hypers = {{"lr", 0.1}}});
      },
      "state 'm' of param 0");
  CHECK(params[0].grad().same(own_grad));
}

TEST_CASE("step function: a new grad buffer or a list tensor of another shape rebinds, another dtype recompiles") {
  std::vector<Tensor> params = {Tensor::zeros({8}, Dtype::f32), Tensor::zeros({3, 2}, Dtype::f32)};
  for (const Tensor& p : params)
    p.set_grad(Tensor::full(p.shape(), 1.0, Dtype::f32));
  std::vector<Tensor> buffers = zeros_like_each(params);
  StepFunction step =
      compile_step("signum", signum_function,
                   {.params = params, .state = {{"momentum_buffer", buffers}}, .hypers = {{"lr", 0.5}, {"beta", 0.5}}});
  step();
  params[0].set_grad(Tensor::full({8}, -1.0, Dtype::f32)); // a new buffer: m = 0.5 * 0.5 - 0.5 < 0
  step();
  CHECK(step.metrics().compiles == 1);
  CHECK(step.metrics().rebinds >= 1);
  CHECK(params[0].to_vector() == std::vector<double>(8, 0.0)); // -0.5, then +0.5

  // The second param, its grad and its buffer take another shape in place (torch's `p.data = ...`).
  params[1].set_data(Tensor::zeros({4, 5}, Dtype::f32));
  params[1].set_grad(Tensor::full({4, 5}, 1.0, Dtype::f32));
  buffers[1].set_data(Tensor::zeros({4, 5}, Dtype::f32));
  const int64_t rebinds = step.metrics().rebinds;
  step(); // kernels read shapes from their argument tables: the same kernel, bound again
  CHECK(step.metrics().compiles == 1);
  CHECK(step.metrics().rebinds == rebinds + 1);
  CHECK(params[1].to_vector() == std::vector<double>(20, -0.5));

  // And the first another dtype: its own bucket, compiled for f64.
  params[0].set_data(Tensor::zeros({8}, Dtype::f64));
  params[0].set_grad(Tensor::full({8}, 1.0, Dtype::f64));
  buffers[0].set_data(Tensor::zeros({8}, Dtype::f64));
  step();
  CHECK(step.metrics().compiles == 2);
  CHECK(step.metrics().recompiles == 1);
  CHECK(params[0].to_vector() == std::vector<double>(8, -0.5));
  CHECK_KERNELS(step, 2);
}

TEST_CASE("step function: a function that writes its grads writes them, whatever the params' layout") {
  // The Shampoo seed's layout: .t() views of one buffer, with contiguous grads, so the step runs on staged copies.
  const Tensor buffer = Tensor::zeros({2 * 4 * 6}, Dtype::f32);
  std::vector<Tensor> params;
  for (int k = 0; k < 2; ++k) {
    Tensor p = Tensor::from_blob(static_cast<float*>(buffer.data()) + k * 24, {4, 6}, Dtype::f32, {1, 4});
    p.set_grad(Tensor::full({4, 6}, 1.0 + k, Dtype::f32));
    params.push_back(p);
  }
  StepFunction step = compile_step("decayed",
                                   [](Tracer& t) {
                                     Sym g = t.tensors("grad") *
                                             0.5; // the grads scaled in place, as torch._foreach_mul_(grads, 0.5) does
                                     t.store("grad", g);
                                     t.store("param", foreach_add(t.tensors("param"), g, -t.hyper("lr")));
                                   },
                                   {.params = params, .hypers = {{"lr", 1.0}}});
  step();
  for (int k = 0; k < 2; ++k) {
    CHECK(params[k].grad().to_vector() == std::vector<double>(24, 0.5 * (1.0 + k)));
    CHECK(params[k].to_vector() == std::vector<double>(24, -0.5 * (1.0 + k)));
  }
}

namespace {

// Python's max(a, b): b when b > a, else a.
Sym python_max(Sym a, Sym b) { return where(greater(b, a), b, a); }

// torch.optim.Adafactor's step for params of rank >= 2 (no weight decay, not maximizing), written as a user writes
// it: the factored second moment in rows and columns state, with the public row and column means.
void factored_adafactor(Tracer& t) {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), eps1 = t.hyper("eps1");
  Sym step = t.store_scalar("step", t.scalar_state("step") + 1.0);
  Sym w = pow(step, t.hyper("beta2_decay"));
  Sym rho = minimum(lr, 1.0 / sqrt(step));
  Sym root_numel = sqrt(t.numel());
  Sym alpha = python_max(t.hyper("eps2"), foreach_norm(params) / root_numel) * rho;
  Sym squares = grads * grads;
  Sym row_var = foreach_lerp(t.tensors("row_var"), row_mean(squares), w);
  Sym col_var = foreach_lerp(t.tensors("col_var"), col_mean(squares), w);
  t.store("row_var", row_var);
  t.store("col_var", col_var);
  Sym second_moment = row_var * col_var / maximum(col_mean(row_var), eps1);
  Sym update = grads / sqrt(maximum(second_moment, eps1 * eps1));
  Sym denom = python_max(t.constant(1.0), foreach_norm(update) / (root_numel * t.hyper("d")));
  t.store("param", params + update * (-alpha / denom));
}

std::vector<Tensor> axis_state_like_each(const std::vector<Tensor>& params, int dim) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Shape shape = p.shape();
    shape[shape.size() + static_cast<std::size_t>(dim)] = 1;
    out.push_back(Tensor::zeros(shape, p.dtype()));
  }
  return out;
}

} // namespace

TEST_CASE("step function: Adafactor's factored step written with row and column means equals the built-in") {
  const auto initial = random_params({{40, 30}, {3, 20, 17}, {5, 64}}, Dtype::f32, 11);
  std::vector<Tensor> params = copy_params(initial), reference = copy_params(initial);
  const std::vector<Tensor> row_var = axis_state_like_each(params, -1), col_var = axis_state_like_each(params, -2);
  const std::vector<Tensor> steps = zeros_like_each(params, /*scalar=*/true);
  const double eps1 = std::numeric_limits<float>::epsilon(); // Adafactor's eps1 = None for f32 params
  StepFunction step =
      compile_step("factored_adafactor", factored_adafactor,
                   {.params = params,
                    .scalars = {{"step", steps}},
                    .rows = {{"row_var", row_var}},
                    .cols = {{"col_var", col_var}},
                    .hypers = {{"lr", 0.01}, {"beta2_decay", -0.8}, {"eps1", eps1}, {"eps2", 1e-3}, {"d", 1.0}}});
  auto adafactor = test::make_single_group("adafactor", reference, {{"lr", {0.01}}}, true);
  CompiledStep adafactor_step = compile(*adafactor);
  for (int t = 0; t < 3; ++t) {
    randomize_grads(params, static_cast<uint64_t>(t));
    randomize_grads(reference, static_cast<uint64_t>(t));
    step();
    adafactor_step();
  }
  CHECK_KERNELS(step, 4); // as the built-in's factored params
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].to_vector() == reference[i].to_vector());
    CHECK(row_var[i].to_vector() == find_state(adafactor->visible_state(reference[i]), "row_var").to_vector());
    CHECK(col_var[i].to_vector() == find_state(adafactor->visible_state(reference[i]), "col_var").to_vector());
  }
}

TEST_CASE("step function: rows and columns need a dimension the tensor has, as torch's sums do") {
  const auto with_vector = [] { return random_params({{6, 5}, {7}}, Dtype::f32, 2); };
  // Rows state for a 1-D param: it has no rows.
  std::vector<Tensor> params = with_vector();
  std::vector<Tensor> rows = {Tensor::zeros({6, 1}, Dtype::f32), Tensor::zeros({1}, Dtype::f32)};
  check_error_contains(
      [&] {
        compile_step("rows", [](Tracer& t) { t.store("param", t.tensors("param") + t.tensors("acc")); },
                     {.params = params, .rows = {{"acc", rows}}});
      },
      "a state of rows or columns needs a param of rank 2 or more, not 1");
  // A column sum over a 1-D param: refused when the kernel is bound, before anything is written.
  randomize_grads(params, 1);
  const std::vector<double> before = params[1].to_vector();
  StepFunction by_columns =
      compile_step("by_columns", [](Tracer& t) { t.store("param", t.tensors("param") - col_mean(t.tensors("grad"))); },
                   {.params = params});
  check_error_contains([&] { by_columns(); }, "of shape [7], which has no second-to-last dimension");
  CHECK(params[1].to_vector() == before);
  // A row sum of a 1-D tensor is its sum, as torch's sum(dim=-1, keepdim=True).
  std::vector<Tensor> vector = random_params({{7}}, Dtype::f64, 3);
  randomize_grads(vector, 2);
  const std::vector<double> p = vector[0].to_vector(), g = vector[0].grad().to_vector();
  StepFunction by_rows =
      compile_step("by_rows", [](Tracer& t) { t.store("param", t.tensors("param") - row_sum(t.tensors("grad"))); },
                   {.params = vector});
  by_rows();
  double total = 0;
  for (double x : g)
    total += x;
  for (std::size_t i = 0; i < p.size(); ++i)
    CHECK(vector[0].to_vector()[i] == doctest::Approx(p[i] - total).epsilon(1e-12));
  check_error_contains(
      [&] {
        StepFunction bad = compile_step("bad", [](Tracer& t) { t.store("param", t.tensors("param") * t.size(0)); },
                                        {.params = vector});
        bad();
      },
      "size(0): a traced step reads size(-1) and size(-2) of each tensor");
}
