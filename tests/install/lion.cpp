// A user's program with its own optimizer (lion.h): main() checks that it compiles to one kernel and that the
// compiled, eager and forloop steps follow Lion's update. Exit status 0 when every check passes.
#include "lion.h"
#include "compiler/compiled_step.h"

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  failures += ok ? 0 : 1;
}

// Params and grads for one run: the same values every time.
std::vector<optjit::Tensor> make_params() {
  std::vector<optjit::Tensor> params;
  for (int64_t n : {1000, 37}) {
    std::vector<double> values, grads;
    for (int64_t i = 0; i < n; ++i) {
      values.push_back(std::sin(0.1 * static_cast<double>(i + n)));
      grads.push_back(std::cos(0.3 * static_cast<double>(i)) - 0.2);
    }
    optjit::Tensor p = optjit::Tensor::from_values({n}, values, optjit::Dtype::f32);
    p.set_grad(optjit::Tensor::from_values({n}, grads, optjit::Dtype::f32));
    params.push_back(p);
  }
  return params;
}

} // namespace

int main() {
  constexpr int kSteps = 3;
  user::LionOptions options;
  options.lr = 0.01;
  options.betas = {0.9, 0.99};
  options.weight_decay = 0.1;
  std::vector<std::vector<optjit::Tensor>> results;
  for (int mode = 0; mode < 3; ++mode) { // forloop, eager (interpreted foreach graph), compiled
    user::LionOptions o = options;
    o.foreach = mode > 0;
    std::vector<optjit::Tensor> params = make_params();
    user::Lion lion({optjit::ParamGroupSpec{params, {}}}, o);
    if (mode == 2) {
      optjit::CompiledStep step = optjit::compile(lion);
      for (int t = 0; t < kSteps; ++t)
        step();
      check(step.kernel_count() == 1, "Lion compiles to one kernel");
    } else {
      for (int t = 0; t < kSteps; ++t)
        lion.step();
    }
    results.push_back(params);
  }
  // Lion's update in double: the grads stay the same, so m and the sign follow in closed form step by step.
  std::vector<optjit::Tensor> expected = make_params();
  bool close = true;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    std::vector<double> p = expected[i].to_vector(), g = expected[i].grad().to_vector(), m(p.size(), 0.0);
    for (int t = 0; t < kSteps; ++t)
      for (std::size_t k = 0; k < p.size(); ++k) {
        const double c = 0.9 * m[k] + 0.1 * g[k];
        p[k] = p[k] * (1 - 0.01 * 0.1) - 0.01 * static_cast<double>((c > 0) - (c < 0));
        m[k] = 0.99 * m[k] + 0.01 * g[k];
      }
    for (int mode = 0; mode < 3; ++mode) {
      const std::vector<double> got = results[static_cast<std::size_t>(mode)][i].to_vector();
      for (std::size_t k = 0; k < p.size(); ++k)
        close = close && std::fabs(got[k] - p[k]) <= 1e-5 * (1 + std::fabs(p[k]));
    }
  }
  check(close, "forloop, eager and compiled steps follow Lion's update");
  return failures == 0 ? 0 : 1;
}
