// Group reductions (group_sum, group_max): a per-tensor value combined over the tensors of each param group alone,
// across the step's buckets (dtypes, devices), as a per-group grad norm is. An optimizer that normalizes each
// group's update by its group's grad norm, written on the public API, against the same math by hand, compiled and
// eager, with two dtypes in each group.
#include "compiler/compiled_step.h"
#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"
#include "frontend/trace/foreach.h"
#include "helpers.h"

#include <doctest/doctest.h>

#include <cmath>

using namespace optjit;

namespace {

#define GROUP_NORMALIZED_OPTIONS(X) X(double, lr, 0.1)
OPTJIT_DEFINE_OPTIONS(GroupNormalizedOptions, GROUP_NORMALIZED_OPTIONS)

// p <- p - lr * g / (|g|_group + 1e-12), |g|_group the 2-norm of every grad of p's param group; and each param
// remembers the largest |g| element of its group.
class GroupNormalized : public Optimizer {
public:
  GroupNormalized(std::vector<ParamGroupSpec> groups, const GroupNormalizedOptions& o)
      : Optimizer("GroupNormalized", option_map(o), o.foreach.value_or(false), flag_names(o)) {
    add_param_groups(std::move(groups));
  }
  Structure structure(const ParamGroup&) const override { return {}; }
  std::vector<StateSpec> state_specs(const Structure&) const override {
    return {{.name = "peak", .kind = StateKind::Scalar}};
  }
  std::vector<std::string> hyper_names() const override { return {"lr"}; }
  void trace(Tracer& t, const Structure&) const override {
    const Sym g = t.tensors("grad");
    const Sym norm = sqrt(group_sum(sum(g * g)));
    t.store_scalar("peak", group_max(max_of(abs(g))));
    t.store("param", t.tensors("param") - g * (t.hyper("lr") / (norm + 1e-12)));
  }
  void validate_options(const OptionMap&) const override {}
};

// The step by hand, in f64: each group's norm over its params' grads.
std::vector<std::vector<double>> expected_params(const std::vector<std::vector<Tensor>>& groups, double lr) {
  std::vector<std::vector<double>> out;
  for (const std::vector<Tensor>& group : groups) {
    double squares = 0;
    for (const Tensor& p : group)
      for (double v : p.grad().to_vector())
        squares += v * v;
    const double norm = std::sqrt(squares);
    for (const Tensor& p : group) {
      std::vector<double> values = p.to_vector(), grads = p.grad().to_vector();
      for (std::size_t k = 0; k < values.size(); ++k)
        values[k] -= grads[k] * (lr / (norm + 1e-12));
      out.push_back(values);
    }
  }
  return out;
}

double largest_abs_grad(const std::vector<Tensor>& group) {
  double peak = 0;
  for (const Tensor& p : group)
    for (double v : p.grad().to_vector())
      peak = std::max(peak, std::abs(v));
  return peak;
}

} // namespace

TEST_CASE("group reductions: each param group's norm, over its dtypes, normalizes its own update") {
  for (const bool compiled : {true, false}) {
    INFO(std::string(compiled ? "compiled" : "eager"));
    // Each group has an f32 and an f64 param, so each group spans both buckets; the groups' grads differ in scale.
    std::vector<std::vector<Tensor>> groups = {random_params({{30, 4}}, Dtype::f32, 1),
                                               random_params({{5, 5}}, Dtype::f32, 2)};
    groups[0].push_back(random_params({{7}}, Dtype::f64, 3)[0]);
    groups[1].push_back(random_params({{3}}, Dtype::f64, 4)[0]);
    for (Tensor& p : groups[1]) {
      Tensor scaled = p.grad().clone();
      scaled.copy_from(Tensor::full(p.shape(), 10.0, p.dtype()));
      p.set_grad(scaled);
    }
    const std::vector<std::vector<double>> expected = expected_params(groups, 0.1);
    GroupNormalized opt({ParamGroupSpec{groups[0], {}}, ParamGroupSpec{groups[1], {}}}, {.foreach = true});
    std::optional<CompiledStep> step;
    if (compiled) {
      step.emplace(compile(opt));
      (*step)();
      CHECK_KERNELS(*step, 4); // per bucket: the norms' pass, then the update
      CHECK(step->dump(Stage::Fused).find("(group sum)") != std::string::npos);
    } else {
      opt.step();
    }
    std::size_t k = 0;
    for (const std::vector<Tensor>& group : groups)
      for (const Tensor& p : group) {
        INFO("param " << k);
        const std::vector<double> got = p.to_vector();
        for (std::size_t e = 0; e < got.size(); ++e)
          CHECK(got[e] == doctest::Approx(expected[k][e]).epsilon(1e-6));
        ++k;
      }
    for (const std::vector<Tensor>& group : groups)
      for (const Tensor& p : group)
        CHECK(opt.visible_state(p)[0].second.item() == doctest::Approx(largest_abs_grad(group)).epsilon(1e-6));
  }
}
