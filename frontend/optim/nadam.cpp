#include "frontend/optim/nadam.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"

#include <cmath>

namespace optjit {
namespace {

// The momentum coefficient of step t: beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)).
double nadam_mu(double beta1, double momentum_decay, double step) {
  return beta1 * (1. - 0.5 * std::pow(0.96, step * momentum_decay));
}

// torch's _single_tensor_nadam for one param.
template <class T>
void nadam_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
  const double eps = group.get("eps"), weight_decay = group.get("weight_decay");
  const double momentum_decay = group.get("momentum_decay");
  const bool maximize = group.get("maximize") != 0, decoupled = group.get("decoupled_weight_decay") != 0;
  Tensor step_t = find_state(state, "step"), mu_product_t = find_state(state, "mu_product");
  const double step = step_t.item() + 1;
  step_t.set_item(0, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double mu = nadam_mu(beta1, momentum_decay, step);
  const double mu_next = nadam_mu(beta1, momentum_decay, step + 1);
  // torch's `mu_product *= mu`: a multiply in the state's dtype, then read back.
  mu_product_t.set_item(0, mu_product_t.item() * round_to_dtype(mu_product_t.dtype(), mu));
  const double mu_product = mu_product_t.item();
  const double mu_product_next = mu_product * mu_next;
  const T grad_coefficient = static_cast<T>(-lr * (1. - mu) / (1. - mu_product));
  const T exp_avg_coefficient = static_cast<T>((-lr * mu_next) / (1. - mu_product_next));
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* exp_avg = find_state(state, "exp_avg").data_as<T>();
  T* exp_avg_sq = find_state(state, "exp_avg_sq").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0) {
      if (decoupled)
        p[i] = p[i] * static_cast<T>(1 - lr * weight_decay);
      else
        gi = gi + static_cast<T>(weight_decay) * p[i];
    }
    exp_avg[i] = torch_lerp(exp_avg[i], gi, static_cast<T>(1 - beta1));
    exp_avg_sq[i] = exp_avg_sq[i] * static_cast<T>(beta2) + static_cast<T>(1 - beta2) * gi * gi;
    const T denom = std::sqrt(exp_avg_sq[i] / static_cast<T>(bias_correction2)) + static_cast<T>(eps);
    p[i] = p[i] + grad_coefficient * (gi / denom);
    p[i] = p[i] + exp_avg_coefficient * (exp_avg[i] / denom);
  }
}

} // namespace

NAdam::NAdam(std::vector<ParamGroupSpec> groups, const NAdamOptions& o)
    : Optimizer("NAdam", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

NAdam::NAdam(std::vector<Tensor> params, const NAdamOptions& o) : NAdam(one_param_group(std::move(params)), o) {}

void NAdam::validate_options(const OptionMap& o) const {
  require_adam_options(o);
  require_non_negative(o.at("momentum_decay"), "Invalid momentum_decay value: ");
}

Structure NAdam::structure(const ParamGroup& group) const {
  Structure s = maximize_and_weight_decay(group);
  s.set("lr_f32_tensor", group.holds_f32_tensor("lr"));
  return s;
}

std::vector<StateSpec> NAdam::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar},
          {"mu_product", StateKind::Scalar, 1.0},
          {"exp_avg"},
          {.name = "exp_avg_sq", .signed_values = false}};
}

std::vector<std::string> NAdam::hyper_names() const {
  return {"lr", "beta1", "beta2", "eps", "weight_decay", "momentum_decay"};
}

// torch's _multi_tensor_nadam. mu, mu_next and the step sizes are per-tensor scalars computed in the kernel from
// the tensor's own step and mu_product, so params whose state started on different steps share one kernel.
void NAdam::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  Sym weight_decay = t.hyper("weight_decay"), momentum_decay = t.hyper("momentum_decay");
  if (s["maximize"])
    grads = -grads;
  Sym step = t.store_scalar("step", t.scalar_state("step") + 1.0);
  if (s["decoupled_weight_decay"])
    params = params * decoupled_decay_factor(t, s, lr, weight_decay);
  else if (s["weight_decay"])
    grads = foreach_add(grads, params, weight_decay);
  Sym bias_correction2 = 1.0 - pow(beta2, step);
  Sym mu = beta1 * (1.0 - 0.5 * pow(t.constant(0.96), step * momentum_decay));
  Sym mu_next = beta1 * (1.0 - 0.5 * pow(t.constant(0.96), (step + 1.0) * momentum_decay));
  // In place in the state's dtype, as torch's `mu_product *= mu`: the product of two values of that dtype is exact
  // in f64, and the store rounds it once, as the multiply in that dtype does.
  Sym mu_product = t.store_scalar("mu_product", t.scalar_state("mu_product") * t.as_stored("mu_product", mu));
  Sym exp_avgs = foreach_lerp(t.tensors("exp_avg"), grads, 1.0 - beta1);
  Sym exp_avg_sqs = foreach_addcmul(t.tensors("exp_avg_sq") * beta2, grads, grads, 1.0 - beta2);
  Sym denom = sqrt(exp_avg_sqs) / sqrt(bias_correction2) + eps;
  Sym step_size_grads = lr * (1.0 - mu) / (1.0 - mu_product) * -1.0;
  Sym step_size_exp_avg = lr * mu_next / (1.0 - mu_product * mu_next) * -1.0;
  if (s["lr_f32_tensor"]) { // torch's -lr * (1 - mu) / (1 - mu_product) and its twin are f32 tensor arithmetic then
    const auto f32 = [&](Sym value) { return t.rounded(Dtype::f32, value); };
    step_size_grads = f32(f32(lr * -1.0 * f32(1.0 - mu)) / f32(1.0 - mu_product));
    step_size_exp_avg = f32(f32(lr * -1.0 * f32(mu_next)) / f32(1.0 - mu_product * mu_next));
  }
  params = foreach_addcdiv(params, grads, denom, step_size_grads);
  params = foreach_addcdiv(params, exp_avgs, denom, step_size_exp_avg);
  t.store("param", params);
  t.store("exp_avg", exp_avgs);
  t.store("exp_avg_sq", exp_avg_sqs);
}

void NAdam::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { nadam_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
