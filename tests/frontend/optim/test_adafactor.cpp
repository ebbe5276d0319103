// Adafactor: four kernels for a factored (rank >= 2) param and two for the others, the three modes in agreement on
// random inputs (a transposed param included, stepped through contiguous copies; rows shorter and longer than a
// vector, batched matrices), state shapes and torch's messages,
// and its state dict round trip.
#include "frontend/optim/adafactor.h"
#include "helpers.h"
#include "runtime/thread_pool.h"

#include <algorithm>
#include <limits>

using namespace optjit;
using optjit::test::make_single_group;

namespace {

std::vector<Tensor> adafactor_params(Dtype dtype, uint64_t seed) {
  std::vector<Tensor> params = random_params({{6, 5}, {7}, {2, 3, 4}, {}, {4, 1}}, dtype, seed);
  // A transposed view: rows and columns of the logical shape, in another memory order.
  static std::vector<Tensor> bases; // the views' memory, alive for the test binary
  bases.push_back(random_params({{5, 3}}, dtype, seed + 1)[0]);
  params.push_back(Tensor::from_blob(bases.back().data(), {3, 5}, dtype, {1, 3}));
  // Rows long enough for the compiled kernels' vector steps: with a tail (37 columns), batched (3 matrices), and
  // ending on a whole vector (64 columns).
  for (Tensor& wide : random_params({{3, 9, 37}, {20, 64}}, dtype, seed + 2))
    params.push_back(wide);
  for (Tensor& p : params)
    p.set_grad(random_params({p.shape()}, dtype, seed + 7)[0]);
  return params;
}

std::vector<double> values_of(const std::vector<Tensor>& params, const Optimizer& opt) {
  std::vector<double> all;
  for (const Tensor& p : params) {
    for (double v : p.to_vector())
      all.push_back(v);
    for (const auto& [key, t] : opt.visible_state(p))
      for (double v : t.to_vector())
        all.push_back(v);
  }
  return all;
}

} // namespace

TEST_CASE("adafactor: factored params take four kernels, the others two, and the three modes agree") {
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    CAPTURE(dtype_name(dtype));
    const KeywordOptions options = {{"lr", {0.5}}, {"weight_decay", {0.1}}, {"maximize", {1}}};
    std::vector<std::vector<double>> runs;
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<Tensor> params = adafactor_params(dtype, 3);
      auto opt = make_single_group("adafactor", params, options, mode != 0);
      std::optional<CompiledStep> step;
      if (mode == 2)
        step.emplace(compile(*opt));
      for (int s = 0; s < 4; ++s)
        step ? (*step)() : opt->step();
      if (step)
        CHECK_KERNELS(*step, 4 + 2); // the factored bucket, then the 1-D and 0-d one
      runs.push_back(values_of(params, *opt));
      const auto state = opt->visible_state(params[0]);
      REQUIRE(state.size() == 3);
      CHECK(state[1].first == "row_var");
      CHECK(state[1].second.shape() == Shape{6, 1});
      CHECK(state[2].second.shape() == Shape{1, 5});
      CHECK(opt->visible_state(params[1])[1].first == "variance");
    }
    const double rtol = dtype == Dtype::f32 ? 1e-5 : 1e-11;
    for (int mode = 1; mode < 3; ++mode)
      for (std::size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(mode);
        CAPTURE(i);
        REQUIRE(runs[static_cast<std::size_t>(mode)][i] == doctest::Approx(runs[0][i]).epsilon(rtol));
      }
  }
}

TEST_CASE("adafactor: row, column and RMS sums are bitwise the same for every thread count, compiled and eager") {
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  for (const bool compiled : {true, false}) {
    CAPTURE(compiled);
    std::vector<std::vector<double>> runs;
    for (int active : {1, 2, threads}) {
      pool.set_active_threads(std::min(active, threads));
      std::vector<Tensor> params = adafactor_params(Dtype::f32, 11);
      params.push_back(random_params({{300, 257}}, Dtype::f32, 12)[0]); // many work items' worth of rows
      auto opt = make_single_group("adafactor", params, {{"lr", {0.5}}, {"weight_decay", {0.1}}}, true);
      std::optional<CompiledStep> step;
      if (compiled)
        step.emplace(compile(*opt));
      for (int s = 0; s < 3; ++s)
        step ? (*step)() : opt->step();
      runs.push_back(values_of(params, *opt));
    }
    pool.set_active_threads(threads);
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
  }
}

TEST_CASE("adafactor: bf16 params take bf16's machine epsilon as eps1 in every mode") {
  std::vector<std::vector<double>> runs;
  for (int mode = 0; mode < 3; ++mode) {
    // Tiny grads, so that eps1 (bf16's 2^-7, squared) bounds the second moment and the modes would part otherwise.
    std::vector<Tensor> params = random_params({{6, 5}, {7}}, Dtype::bf16, 11);
    for (Tensor& p : params)
      p.set_grad(Tensor::full(p.shape(), 1e-4, Dtype::bf16));
    auto opt = make_single_group("adafactor", params, {{"lr", {0.5}}}, mode != 0);
    std::optional<CompiledStep> step;
    if (mode == 2)
      step.emplace(compile(*opt));
    for (int s = 0; s < 3; ++s)
      step ? (*step)() : opt->step();
    runs.push_back(values_of(params, *opt));
  }
  for (int mode = 1; mode < 3; ++mode)
    for (std::size_t i = 0; i < runs[0].size(); ++i)
      REQUIRE(runs[static_cast<std::size_t>(mode)][i] == doctest::Approx(runs[0][i]).epsilon(2e-2));
}

TEST_CASE("adafactor: eps1's default is the machine epsilon of the group's first param with a grad, in every mode") {
  // torch's single-tensor step sets eps1 at the first param it steps and keeps it for the group: here bf16's 2^-7
  // for f32 params too, or f32's once the bf16 param has no grad. Tiny grads, so that eps1 bounds the moments.
  const auto run = [](int mode, const KeywordOptions& options, bool first_has_grad) {
    std::vector<Tensor> params = random_params({{7}, {6, 5}, {4}}, Dtype::bf16, 11);
    params[1] = params[1].to(Dtype::f32);
    params[2] = params[2].to(Dtype::f32);
    for (Tensor& p : params)
      p.set_grad(Tensor::full(p.shape(), 1e-4, p.dtype()));
    if (!first_has_grad)
      params[0].reset_grad();
    auto opt = make_single_group("adafactor", params, options, mode != 0);
    std::optional<CompiledStep> step;
    if (mode == 2)
      step.emplace(compile(*opt));
    for (int s = 0; s < 3; ++s)
      step ? (*step)() : opt->step();
    return values_of({params[1], params[2]}, *opt);
  };
  for (int mode = 0; mode < 3; ++mode) {
    CAPTURE(mode);
    CHECK(run(mode, {{"lr", {0.5}}}, true) == run(mode, {{"lr", {0.5}}, {"eps", {0x1p-7, 1e-3}}}, true));
    CHECK(run(mode, {{"lr", {0.5}}}, false) == run(mode, {{"lr", {0.5}}, {"eps", {0x1p-23, 1e-3}}}, false));
    CHECK(run(mode, {{"lr", {0.5}}}, true) != run(mode, {{"lr", {0.5}}}, false));
  }
}

TEST_CASE(
    "adafactor: row and column state with gaps (views of larger buffers) steps as contiguous state, in every mode") {
  // torch's load_state_dict keeps such views: they are staged through contiguous copies, not indexed densely (which
  // read the wrong rows and wrote into the gaps).
  for (int mode = 0; mode < 3; ++mode) {
    CAPTURE(mode);
    std::vector<std::vector<double>> runs;
    std::vector<float> row_buffer(12 * 2, 7.0f), col_buffer(2 * 10, 7.0f); // gaps hold 7
    for (bool views : {false, true}) {
      std::vector<Tensor> params = random_params({{12, 5}, {2, 1, 5}}, Dtype::f32, 4);
      for (Tensor& p : params)
        p.set_grad(random_params({p.shape()}, Dtype::f32, 8)[0]);
      auto opt = make_single_group("adafactor", params, {{"lr", {0.5}}}, mode != 0);
      std::optional<CompiledStep> step;
      if (mode == 2)
        step.emplace(compile(*opt));
      step ? (*step)() : opt->step();
      if (views) { // the same values, in views with gaps: rows every other float, columns every other one
        const ParamState state = opt->visible_state(params[0]);
        Tensor rows = Tensor::from_blob(row_buffer.data(), {12, 1}, Dtype::f32, {2, 1});
        Tensor cols = Tensor::from_blob(col_buffer.data(), {1, 5}, Dtype::f32, {10, 2});
        rows.copy_from(find_state(state, "row_var"));
        cols.copy_from(find_state(state, "col_var"));
        opt->adopt_state(0, {{"step", find_state(state, "step")}, {"row_var", rows}, {"col_var", cols}},
                         Optimizer::StateOrigin::Loaded);
      }
      for (int s = 0; s < 2; ++s)
        step ? (*step)() : opt->step();
      runs.push_back(values_of(params, *opt));
    }
    CHECK(runs[0] == runs[1]);
    for (std::size_t k = 1; k < row_buffer.size(); k += 2)
      CHECK(row_buffer[k] == 7.0f);
    for (std::size_t k = 1; k < col_buffer.size(); k += 2)
      CHECK(col_buffer[k] == 7.0f);
  }
}

TEST_CASE("adafactor: torch's messages, complex refused at the step, eps1 None by default, state dict round trip") {
  std::vector<Tensor> params = adafactor_params(Dtype::f32, 5);
  test::check_error([&] { Adafactor(params, {.lr = -1}); }, "Learning rate should be >= 0 but is: -1.0");
  test::check_error([&] { Adafactor(params, {.beta2_decay = 0.8}); }, "beta2_decay should be <= 0 but is: 0.8");
  test::check_error([&] { Adafactor(params, {.eps = {-1e-30, 1e-3}}); }, "epsilon1 should be >= 0 but is: -1e-30");
  test::check_error([&] { Adafactor(params, {.d = 0.0}); }, "Clipping threshold d should be >= 1 but is: 0.0");
  Tensor complex = Tensor::zeros({3}, Dtype::c64);
  complex.set_grad(Tensor::zeros({3}, Dtype::c64));
  Adafactor refused({complex});
  test::check_error([&] { refused.step(); }, "Adafactor does not support complex parameters");
  // An empty param: torch raises ZeroDivisionError after stepping the params before it; refused before any steps.
  for (bool compiled : {false, true}) {
    std::vector<Tensor> with_empty = random_params({{4}, {0, 3}}, Dtype::f32, 6);
    randomize_grads(with_empty, 1);
    const std::vector<double> before = with_empty[0].to_vector();
    Adafactor empty(with_empty, {.foreach = compiled});
    std::optional<CompiledStep> compiled_step;
    if (compiled)
      compiled_step.emplace(compile(empty));
    test::check_error_contains([&] { compiled_step ? (*compiled_step)() : empty.step(); },
                               "Adafactor cannot step param 1 of shape [0, 3]: it has no elements");
    CHECK(with_empty[0].to_vector() == before);
    CHECK(empty.visible_state(with_empty[0]).empty());
  }

  Adafactor opt(params, {.lr = 0.1});
  CHECK(opt.param_groups()[0].get("eps1") == kOptionNone);
  CHECK(opt.repr().find("eps: (None, 0.001)") != std::string::npos); // as torch prints it
  CompiledStep step = compile(opt);
  step();
  const StateDict saved = opt.state_dict();
  std::vector<Tensor> copies;
  for (const Tensor& p : params) {
    Tensor c = p.clone();
    c.set_grad(p.grad().clone());
    copies.push_back(c);
  }
  Adafactor resumed(copies, {.lr = 0.1});
  resumed.load_state_dict(saved);
  CompiledStep resumed_step = compile(resumed);
  step();
  resumed_step();
  CHECK(values_of(copies, resumed) == values_of(params, opt));
}
