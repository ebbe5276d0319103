#include "frontend/optim/radam.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_radam for one param.
template <class T>
void radam_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
  const double eps = group.get("eps"), weight_decay = group.get("weight_decay");
  const bool maximize = group.get("maximize") != 0, decoupled = group.get("decoupled_weight_decay") != 0;
  Tensor step_t = find_state(state, "step");
  const double step = step_t.item() + 1;
  step_t.set_item(0, step);
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  // The maximum and the current length of the approximated simple moving average.
  const double rho_inf = 2 / (1 - beta2) - 1;
  const double rho_t = rho_inf - 2 * step * std::pow(beta2, step) / bias_correction2;
  const bool rectified = rho_t > 5.;
  const double rect =
      rectified ? std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) : 0;
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
    const T bias_corrected_exp_avg = exp_avg[i] / static_cast<T>(bias_correction1);
    if (rectified) {
      const T adaptive_lr =
          static_cast<T>(std::sqrt(bias_correction2)) / (std::sqrt(exp_avg_sq[i]) + static_cast<T>(eps));
      p[i] = p[i] - bias_corrected_exp_avg * static_cast<T>(lr) * adaptive_lr * static_cast<T>(rect);
    } else {
      p[i] = p[i] - bias_corrected_exp_avg * static_cast<T>(lr);
    }
  }
}

} // namespace

RAdam::RAdam(std::vector<ParamGroupSpec> groups, const RAdamOptions& o)
    : Optimizer("RAdam", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

RAdam::RAdam(std::vector<Tensor> params, const RAdamOptions& o) : RAdam(one_param_group(std::move(params)), o) {}

void RAdam::validate_options(const OptionMap& o) const { require_adam_options(o); }

Structure RAdam::structure(const ParamGroup& group) const { return maximize_and_weight_decay(group); }

std::vector<StateSpec> RAdam::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {"exp_avg"}, {.name = "exp_avg_sq", .signed_values = false}};
}

std::vector<std::string> RAdam::hyper_names() const { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }

// torch's _multi_tensor_radam. Whether a tensor's step is rectified (rho_t > 5) depends on its own step count, so
// the switch is a per-tensor select inside the kernel: one trace serves every step and every tensor.
void RAdam::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  Sym weight_decay = t.hyper("weight_decay");
  if (s["maximize"])
    grads = -grads;
  Sym step = t.store_scalar("step", t.scalar_state("step") + 1.0);
  if (s["decoupled_weight_decay"])
    params = params * (1.0 - lr * weight_decay);
  else if (s["weight_decay"])
    grads = foreach_add(grads, params, weight_decay);
  Sym exp_avgs = foreach_lerp(t.tensors("exp_avg"), grads, 1.0 - beta1);
  Sym exp_avg_sqs = foreach_addcmul(t.tensors("exp_avg_sq") * beta2, grads, grads, 1.0 - beta2);
  Sym bias_correction1 = 1.0 - pow(beta1, step);
  Sym bias_correction2 = 1.0 - pow(beta2, step);
  Sym rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  Sym rho_t = rho_inf - 2.0 * step * pow(beta2, step) / bias_correction2;
  Sym rect = sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t));
  Sym rectified_step_size = sqrt(bias_correction2) * (lr * rect / bias_correction1) * -1.0;
  Sym unrectified_step_size = lr / bias_correction1 * -1.0;
  Sym denom = sqrt(exp_avg_sqs) + eps;
  Sym rectified = foreach_addcdiv(params, exp_avgs, denom, rectified_step_size);
  Sym unrectified = foreach_add(params, exp_avgs, unrectified_step_size);
  t.store("param", where(greater(rho_t, t.constant(5.0)), rectified, unrectified));
  t.store("exp_avg", exp_avgs);
  t.store("exp_avg_sq", exp_avg_sqs);
}

void RAdam::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { radam_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
