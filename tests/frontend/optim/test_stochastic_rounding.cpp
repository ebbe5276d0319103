// Stochastic rounding (group option stochastic_rounding, bf16): unbiased over 1M elements, bit-reproducible, the same
// bits in every mode (forloop reference, interpreter, CPU kernel) and for any thread count; every optimizer runs it.
#include "helpers.h"
#include "runtime/stochastic_rounding.h"
#include "runtime/thread_pool.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace optjit;
using optjit::test::check_error;
using optjit::test::every_optimizer;
using optjit::test::Mode;
using optjit::test::Run;
using optjit::test::scaled_error;

namespace {

constexpr int64_t kElements = int64_t{1} << 20;
constexpr double kUlpAtOne = 1.0 / 128; // bf16 keeps 7 fraction bits
// SGD with lr 1 on params at 1.0 and grads of -d: the exact result 1 + d lies 0.325 ulp above 1.0 (both operands
// and the f32 sum are exact), so rounding to nearest would give 1.0 everywhere.
constexpr double kD = 1.0 / 512 + 1.0 / 2048; // 0.325 ulp at 1.0, a bf16 value

// One SGD step over kElements bf16 params in `mode`, rounding stochastically with `seed`; returns the params.
std::vector<double> sgd_step(Mode mode, uint64_t seed) {
  std::vector<Tensor> params = {Tensor::full({kElements}, 1.0, Dtype::bf16)};
  params[0].set_grad(Tensor::full({kElements}, -kD, Dtype::bf16));
  Run run("sgd", {{"lr", {1}}, {"stochastic_rounding", {1}}}, mode, params);
  run.opt->set_stochastic_rounding(seed);
  run.step();
  CHECK(run.opt->stochastic_rounding_steps() == 1);
  return params[0].to_vector();
}

} // namespace

TEST_CASE("stochastic rounding: unbiased over 1M elements, the same bits in every mode, and seeded") {
  const std::vector<double> compiled = sgd_step(Mode::Compiled, 7);
  double error = 0;
  int64_t up = 0;
  for (double v : compiled) {
    REQUIRE((v == 1.0 || v == 1.0 + kUlpAtOne)); // one of the two neighbours
    error += v - (1.0 + kD);
    up += v > 1.0;
  }
  const double p = kD / kUlpAtOne, n = static_cast<double>(kElements);
  const double sigma_of_mean = kUlpAtOne * std::sqrt(p * (1 - p) / n);
  INFO("mean error " << error / n << ", 3 sigma " << 3 * sigma_of_mean << ", rounded up " << up);
  CHECK(std::fabs(error / n) < 3 * sigma_of_mean);
  CHECK(std::fabs(static_cast<double>(up) / n - p) < 3 * std::sqrt(p * (1 - p) / n));

  CHECK(sgd_step(Mode::Eager, 7) == compiled);   // the interpreter draws the same bits
  CHECK(sgd_step(Mode::Forloop, 7) == compiled); // and so does the forloop reference
  CHECK(sgd_step(Mode::Compiled, 7) == compiled);
  CHECK(sgd_step(Mode::Compiled, 8) != compiled); // another seed, other bits
}

TEST_CASE("stochastic rounding: one thread or two give the same bits, and each step draws new ones") {
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.active_threads();
  pool.set_active_threads(1);
  const std::vector<double> one = sgd_step(Mode::Compiled, 3);
  pool.set_active_threads(std::min(2, pool.size()));
  const std::vector<double> two = sgd_step(Mode::Compiled, 3);
  pool.set_active_threads(threads);
  CHECK(one == two);

  std::vector<Tensor> params = {Tensor::full({4096}, 1.0, Dtype::bf16)};
  params[0].set_grad(Tensor::full({4096}, -kD, Dtype::bf16));
  Run run("sgd", {{"lr", {1}}, {"stochastic_rounding", {1}}}, Mode::Compiled, params);
  run.step();
  const std::vector<double> first = params[0].to_vector();
  params[0].fill(1.0);
  run.step();
  CHECK(params[0].to_vector() != first); // step 2's counter draws other bits
}

TEST_CASE("stochastic rounding: every optimizer in every mode, close to the reference, with state rounded too") {
  for (const auto& [name, options] : every_optimizer()) {
    KeywordOptions o = options;
    o["stochastic_rounding"] = {1};
    const std::vector<Tensor> initial = random_params({{64, 33}, {7}, {}, {0}}, Dtype::bf16, 21);
    Run forloop(name, o, initial, Mode::Forloop), eager(name, o, initial, Mode::Eager),
        compiled(name, o, initial, Mode::Compiled), nearest(name, options, initial, Mode::Compiled);
    int64_t differing = 0, counted = 0;
    for (int step = 0; step < 4; ++step) {
      INFO(name << " step " << step);
      randomize_grads(forloop.params, 40 + static_cast<uint64_t>(step));
      for (Run* run : {&eager, &compiled, &nearest})
        for (std::size_t i = 0; i < initial.size(); ++i)
          run->params[i].set_grad(forloop.params[i].grad().clone());
      for (Run* run : {&forloop, &eager, &compiled, &nearest})
        run->step();
      for (std::size_t i = 0; i < initial.size(); ++i) {
        // The modes differ only where the f32 results differ in their last bits and a draw falls between them.
        for (const Run* run : {&eager, &compiled})
          CHECK(scaled_error(run->params[i], forloop.params[i], 2.0 / 128, 2.0 / 128) <= 1);
        const std::vector<double> a = compiled.params[i].to_vector(), b = forloop.params[i].to_vector(),
                                  c = nearest.params[i].to_vector();
        for (std::size_t k = 0; k < a.size(); ++k) {
          differing += a[k] != b[k];
          counted += 1;
        }
        if (i == 0 && step == 3)
          CHECK(a != c); // not rounded to nearest
      }
    }
    INFO(name << ": " << differing << " of " << counted << " values differ between compiled and forloop");
    CHECK(differing * 100 <= counted);
    CHECK_KERNELS(*compiled.compiled, 1);
  }
}

TEST_CASE("stochastic rounding: a group of f32 params with it is refused before any change") {
  std::vector<Tensor> params = random_params({{4}}, Dtype::f32, 1);
  auto opt = make_optimizer("adam", {ParamGroupSpec{params, {}}}, {{"stochastic_rounding", {1}}});
  check_error([&] { opt->step(); }, "param 0 is f32[4] on cpu, in a group with stochastic_rounding=true: stochastic "
                                    "rounding stores bf16 params and state");
}

TEST_CASE("stochastic rounding: a fraction of an ulp above the largest bf16 saturates, in every mode, never to inf") {
  const double largest = 0x1.fep127; // the largest finite bf16
  for (Mode mode : {Mode::Compiled, Mode::Eager, Mode::Forloop}) {
    std::vector<Tensor> params = {Tensor::full({4096}, largest, Dtype::bf16),
                                  Tensor::full({4096}, -largest, Dtype::bf16)};
    params[0].set_grad(Tensor::full({4096}, -0x1p118, Dtype::bf16)); // + 0.25 ulp (2^120): nearest keeps it
    params[1].set_grad(Tensor::full({4096}, 0x1p118, Dtype::bf16));
    Run run("sgd", {{"lr", {1}}, {"stochastic_rounding", {1}}}, mode, params);
    run.step();
    for (double v : params[0].to_vector())
      REQUIRE(v == largest);
    for (double v : params[1].to_vector())
      REQUIRE(v == -largest);
  }
  CHECK(stochastic_round_bf16(std::numeric_limits<float>::max(), 0xffff) == std::numeric_limits<float>::infinity());
}
