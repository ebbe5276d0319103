// Muon (frontend/optim/muon.h): torch's messages for bad options and params, checked before anything changes; the
// step of a strided (transposed) param equal to its contiguous copy's; state dicts; and the foreach and compiled
// modes refused with the reason. Its trajectories against torch 2.15 are tests/golden/muon (cli.replay_muon_goldens).
#include "compiler/compiled_step.h"
#include "frontend/optim/muon.h"
#include "frontend/optim/registry.h"
#include "helpers.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

using namespace optjit;
using namespace optjit::test;

namespace {

Tensor matrix(int64_t rows, int64_t cols, double scale, Dtype dtype = Dtype::f32) {
  std::vector<double> values;
  for (int64_t i = 0; i < rows * cols; ++i)
    values.push_back(scale * std::sin(0.7 * static_cast<double>(i) + scale));
  return Tensor::from_values({rows, cols}, values, dtype);
}

} // namespace

TEST_CASE("muon: bad options are torch's errors, and 1-D params are refused at construction") {
  const auto make = [](KeywordOptions options, std::vector<Tensor> params = {matrix(3, 4, 1)}) {
    return make_optimizer("Muon", {ParamGroupSpec{std::move(params), {}}}, options);
  };
  check_error([&] { make({{"lr", {-0.1}}}); }, "Learning rate should be >= 0 but is: -0.1");
  check_error([&] { make({{"momentum", {-1}}}); }, "momentum should be >= 0 but is: -1.0");
  check_error([&] { make({{"weight_decay", {-0.5}}}); }, "weight decay should be >= 0 but is: -0.5");
  check_error([&] { make({{"adjust_lr_fn", {7}}}); }, "Adjust learning rate function 7.0 is not supported");
  check_error([&] { make({{"ns_coefficients", {1, 2}}}); }, "Muon option 'ns_coefficients' takes 3 values, got 2");
  check_error(
      [&] {
        make({}, {matrix(3, 4, 1), Tensor::zeros({5}, Dtype::f32)});
      },
      "Muon only supports 2D parameters whereas we found a parameter with size: torch.Size([5])");
  check_error_contains([] { named_option_value("adjust_lr_fn", "rms"); },
                       "it takes one of 'original', 'match_rms_adamw', 'spectral_unclamped'");
  CHECK(named_option_value("adjust_lr_fn", "spectral_unclamped") == 2);
}

TEST_CASE("muon: ns_steps of 100 or more, and a param made 1-D after construction, change nothing") {
  Tensor p = matrix(4, 3, 1);
  const std::vector<double> before = p.to_vector();
  auto opt = make_optimizer("Muon", {ParamGroupSpec{{p}, {}}}, {{"ns_steps", {100}}});
  p.set_grad(matrix(4, 3, 0.5));
  check_error([&] { opt->step(); }, "Number of steps must be less than 100 for computational efficiency");
  CHECK(p.to_vector() == before);
  CHECK(opt->visible_state(p).empty()); // no momentum buffer made
  opt->param_groups()[0].options["ns_steps"] = 2.5;
  check_error_contains([&] { opt->step(); }, "the number of Newton-Schulz steps is an integer");
  opt->param_groups()[0].options["ns_steps"] = 5;
  Tensor flat = Tensor::zeros({6}, Dtype::f32);
  opt->add_param_group(ParamGroupSpec{{flat}, {{"ns_steps", 5}}});
  flat.set_grad(Tensor::zeros({6}, Dtype::f32));
  check_error([&] { opt->step(); }, "Param gradient must be a 2D matrix");
  CHECK(p.to_vector() == before);
  // A matrix without columns: torch's adjust_lr_fn divides its rows by them.
  flat.set_grad(Tensor());
  Tensor empty = Tensor::zeros({3, 0}, Dtype::f32);
  opt->add_param_group(ParamGroupSpec{{empty}, {{"ns_steps", 5}}});
  empty.set_grad(Tensor::zeros({3, 0}, Dtype::f32));
  check_error_contains([&] { opt->step(); }, "has no columns: torch's adjust_lr_fn divides its rows by its columns");
  CHECK(p.to_vector() == before);
}

TEST_CASE("muon: a bad grad or a non-finite hyperparameter is refused before any update") {
  for (int broken = 0; broken < 2; ++broken) {
    Tensor p = matrix(4, 3, 1), q = matrix(3, 5, 2);
    auto opt = make_optimizer("Muon", {ParamGroupSpec{{p, q}, {}}}, {{"lr", {0.02}}});
    p.set_grad(matrix(4, 3, 0.5));
    q.set_grad(matrix(3, 5, 0.5));
    opt->step();
    const std::vector<double> p_before = p.to_vector(), q_before = q.to_vector();
    const std::vector<double> buffer_before = find_state(opt->visible_state(p), "momentum_buffer").to_vector();
    if (broken == 0) {
      q.set_grad(Tensor::zeros({5, 3}, Dtype::f32));
      check_error_contains([&] { opt->step(); }, "a grad must have its param's shape, dtype and device");
    } else {
      opt->param_groups()[0].set("momentum", -INFINITY);
      check_error_contains([&] { opt->step(); }, "of param group 0 is -inf: hyperparameters must be finite");
    }
    CHECK(p.to_vector() == p_before);
    CHECK(q.to_vector() == q_before);
    CHECK(find_state(opt->visible_state(p), "momentum_buffer").to_vector() == buffer_before);
  }
}

TEST_CASE("muon: a transposed param steps as its contiguous copy, and tall and wide matrices both move") {
  Tensor base = matrix(5, 8, 1);
  Tensor transposed = Tensor::from_blob(base.data(), {8, 5}, Dtype::f32, {1, 8}); // base^T: tall, not contiguous
  Tensor copy = transposed.clone();
  auto strided = make_optimizer("Muon", {ParamGroupSpec{{transposed}, {}}}, {{"lr", {0.02}}});
  auto dense = make_optimizer("Muon", {ParamGroupSpec{{copy}, {}}}, {{"lr", {0.02}}});
  const std::vector<double> start = copy.to_vector();
  for (int step = 0; step < 3; ++step) {
    const Tensor g = matrix(8, 5, 0.3 + step);
    transposed.set_grad(g.clone());
    copy.set_grad(g.clone());
    strided->step();
    dense->step();
  }
  CHECK(transposed.clone().to_vector() == copy.to_vector());
  CHECK(copy.to_vector() != start);
}

TEST_CASE("muon: its state dict saves and loads the momentum buffers, and the next steps agree") {
  Tensor a = matrix(6, 4, 1), b = a.clone();
  auto first = make_optimizer("Muon", {ParamGroupSpec{{a}, {}}}, {{"lr", {0.02}}, {"adjust_lr_fn", {1}}});
  a.set_grad(matrix(6, 4, 0.5));
  first->step();
  b.copy_from(a);
  auto second = make_optimizer("Muon", {ParamGroupSpec{{b}, {}}}, {{"lr", {0.02}}, {"adjust_lr_fn", {1}}});
  second->load_state_dict(first->state_dict());
  CHECK(second->param_groups()[0].get("adjust_lr_fn") == 1);
  a.set_grad(matrix(6, 4, 0.25));
  b.set_grad(matrix(6, 4, 0.25));
  first->step();
  second->step();
  CHECK(a.to_vector() == b.to_vector());
}

TEST_CASE(
    "muon: its eager step (the traced graph, interpreted) follows its forloop step, and a compiled one is refused") {
  Tensor tall_f = matrix(7, 3, 1), wide_f = matrix(3, 7, 2), tall_e = tall_f.clone(), wide_e = wide_f.clone();
  auto forloop = make_optimizer("Muon", {ParamGroupSpec{{tall_f, wide_f}, {}}}, {{"lr", {0.03}}});
  auto eager = make_optimizer("Muon", {ParamGroupSpec{{tall_e, wide_e}, {}}}, {{"lr", {0.03}}, {"foreach", {1}}});
  for (int step = 0; step < 4; ++step) {
    for (Tensor* p : {&tall_f, &tall_e})
      p->set_grad(matrix(7, 3, 0.5 + step));
    for (Tensor* p : {&wide_f, &wide_e})
      p->set_grad(matrix(3, 7, 0.25 + step));
    forloop->step();
    eager->step();
  }
  // The same products in the same library; the final update rounds apart by an f32 ulp at most (a fused multiply-add
  // in the forloop step), which the next steps do not amplify (Muon's update depends on the grads alone).
  CHECK(scaled_error(tall_e, tall_f, 1e-6, 1e-7) <= 1);
  CHECK(scaled_error(wide_e, wide_f, 1e-6, 1e-7) <= 1);
  CHECK(find_state(eager->visible_state(tall_e), "momentum_buffer").to_vector() ==
        find_state(forloop->visible_state(tall_f), "momentum_buffer").to_vector());

  // Compiled: kernels around the library's products, the same products as the eager step's.
  Tensor tall_c = matrix(7, 3, 1), wide_c = matrix(3, 7, 2);
  auto compiled = make_optimizer("Muon", {ParamGroupSpec{{tall_c, wide_c}, {}}}, {{"lr", {0.03}}});
  CompiledStep step = compile(*compiled);
  for (int s = 0; s < 4; ++s) {
    tall_c.set_grad(matrix(7, 3, 0.5 + s));
    wide_c.set_grad(matrix(3, 7, 0.25 + s));
    step();
  }
  CHECK(scaled_error(tall_c, tall_e, 1e-6, 1e-7) <= 1);
  CHECK(scaled_error(wide_c, wide_e, 1e-6, 1e-7) <= 1);
  CHECK(step.metrics().compiles == 1);
  CHECK(step.kernel_count() == 6); // per bucket (tall, wide): the norm, the momentum and operand, the update
  CHECK(step.dump(Stage::Fused).find("then \"product") != std::string::npos);
}

TEST_CASE("muon: params of one shape and group run as one batched product, as each alone") {
  // Three wide 5 x 8 params in group 0, two in group 1 (other coefficients: a batch of its own), a tall one.
  const auto params = [] {
    std::vector<Tensor> ps;
    for (int i = 0; i < 5; ++i)
      ps.push_back(matrix(5, 8, 1.0 + 0.1 * i));
    ps.push_back(matrix(9, 4, 3));
    return ps;
  };
  std::vector<Tensor> looped = params(), batched = params();
  const auto groups = [](const std::vector<Tensor>& ps) {
    return std::vector<ParamGroupSpec>{{{ps[0], ps[1], ps[2], ps[5]}, {}},
                                       {{ps[3], ps[4]}, {{"ns_a", 3.0}, {"ns_b", -3.2}, {"ns_c", 1.2}}}};
  };
  auto forloop = make_optimizer("Muon", groups(looped), {{"lr", {0.02}}});
  auto compiled_opt = make_optimizer("Muon", groups(batched), {{"lr", {0.02}}});
  CompiledStep step = compile(*compiled_opt);
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < looped.size(); ++i) {
      const Tensor g = matrix(looped[i].shape()[0], looped[i].shape()[1], 0.3 * static_cast<double>(i + s) + 0.1);
      looped[i].set_grad(g.clone());
      batched[i].set_grad(g.clone());
    }
    forloop->step();
    step();
  }
  for (std::size_t i = 0; i < looped.size(); ++i) {
    INFO("param " << i);
    CHECK(scaled_error(batched[i], looped[i], 1e-6, 1e-7) <= 1);
  }
}

namespace {

Tensor random_matrix(int64_t rows, int64_t cols) {
  std::mt19937 generator(static_cast<unsigned>(rows * 1000 + cols));
  std::normal_distribution<double> normal;
  std::vector<double> values;
  for (int64_t i = 0; i < rows * cols; ++i)
    values.push_back(normal(generator));
  return Tensor::from_values({rows, cols}, values, Dtype::f32);
}

// One Muon step from a zero momentum with momentum 0 and no weight decay, in doubles: p - lr sqrt(max(1, r/c)) X,
// X the Newton-Schulz iterations of g / |g| (on g^T for a tall g), torch's algorithm without its roundings.
std::vector<double> exact_step(const std::vector<double>& p, const std::vector<double>& g, int64_t rows, int64_t cols,
                               double lr) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols; // X is r x c, wide
  std::vector<double> x(static_cast<std::size_t>(r * c));
  double norm = 0;
  for (double v : g)
    norm += v * v;
  norm = std::sqrt(norm);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      x[static_cast<std::size_t>(i * c + j)] =
          g[static_cast<std::size_t>(tall ? j * cols + i : i * cols + j)] / std::max(norm, 1e-7);
  const auto at = [](std::vector<double>& m, int64_t n, int64_t i, int64_t j) -> double& {
    return m[static_cast<std::size_t>(i * n + j)];
  };
  for (int step = 0; step < 5; ++step) {
    std::vector<double> a(static_cast<std::size_t>(r * r), 0.0), b(a.size(), 0.0), next(x.size(), 0.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < c; ++k)
          at(a, r, i, j) += at(x, c, i, k) * at(x, c, j, k);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < r; ++k)
          aa += at(a, r, i, k) * at(a, r, k, j);
        at(b, r, i, j) = -4.7750 * at(a, r, i, j) + 2.0315 * aa;
      }
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < r; ++k)
          bx += at(b, r, i, k) * at(x, c, k, j);
        at(next, c, i, j) = 3.4445 * at(x, c, i, j) + bx;
      }
    x = next;
  }
  const double step_size = lr * std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
  std::vector<double> out = p;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i * cols + j)] -=
          step_size * x[static_cast<std::size_t>(tall ? j * c + i : i * c + j)];
  return out;
}

} // namespace

TEST_CASE("muon: f32_iterations orthogonalizes in f32 (forloop, eager, compiled), bf16 iterations only to bf16") {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{6, 9}, {12, 5}}) {
    INFO(rows << "x" << cols);
    // A full-rank grad (matrix()'s are rank 2): Newton-Schulz acts on every singular value.
    const Tensor p0 = matrix(rows, cols, 1), g = random_matrix(rows, cols);
    const std::vector<double> exact = exact_step(p0.to_vector(), g.to_vector(), rows, cols, 0.1);
    // How far a step lands from the exact one, in units of the update's size (lr 0.1 times elements near 1).
    const auto error = [&](const Tensor& p) {
      double worst = 0;
      const std::vector<double> v = p.to_vector();
      for (std::size_t i = 0; i < v.size(); ++i)
        worst = std::max(worst, std::abs(v[i] - exact[i]) / 0.1);
      return worst;
    };
    const KeywordOptions options = {{"lr", {0.1}}, {"momentum", {0}}, {"nesterov", {0}}, {"weight_decay", {0}}};
    std::vector<double> errors;
    for (const bool f32 : {true, false})
      for (const int mode : {0, 1, 2}) { // forloop, eager, compiled
        Tensor p = p0.clone();
        p.set_grad(g.clone());
        KeywordOptions o = options;
        o["f32_iterations"] = {f32 ? 1.0 : 0.0};
        o["foreach"] = {mode == 1 ? 1.0 : 0.0};
        auto opt = make_optimizer("Muon", {ParamGroupSpec{{p}, {}}}, o);
        if (mode == 2) {
          CompiledStep step = compile(*opt);
          step();
        } else {
          opt->step();
        }
        errors.push_back(error(p));
      }
    for (int mode = 0; mode < 3; ++mode) {
      INFO("mode " << mode);
      CHECK(errors[static_cast<std::size_t>(mode)] < 1e-5);     // f32: a few f32 ulps of the update
      CHECK(errors[static_cast<std::size_t>(mode) + 3] > 1e-4); // bf16: bf16's rounding, 2^-8 of the update
    }
  }
}
