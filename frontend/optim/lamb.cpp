#include "frontend/optim/lamb.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <cmath>

namespace optjit {
namespace {

// The reference for one param, in T (golden/FORMAT_NEXT.md's LAMBRef): the moments and u per element, then the
// two norms over the whole tensor (p before the update), then the update.
template <class T>
void lamb_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const T lr = static_cast<T>(group.get("lr")), eps = static_cast<T>(group.get("eps"));
  const T beta1 = static_cast<T>(group.get("beta1")), beta2 = static_cast<T>(group.get("beta2"));
  const T weight_decay = static_cast<T>(group.get("weight_decay"));
  const Tensor step_state = find_state(state, "step");
  const double step = step_state.item(0) + 1;
  step_state.set_item(0, step);
  const T bias_correction1 = T(1) - std::pow(beta1, static_cast<T>(step));
  const T bias_correction2 = T(1) - std::pow(beta2, static_cast<T>(step));
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* m = find_state(state, "exp_avg").data_as<T>();
  T* v = find_state(state, "exp_avg_sq").data_as<T>();
  std::vector<T> u(static_cast<std::size_t>(param.numel()));
  double p_sum = 0, u_sum = 0;
  for (int64_t i = 0; i < param.numel(); ++i) {
    m[i] = beta1 * m[i] + (T(1) - beta1) * g[i];
    v[i] = beta2 * v[i] + (T(1) - beta2) * g[i] * g[i];
    const T m_hat = m[i] / bias_correction1, v_hat = v[i] / bias_correction2;
    u[static_cast<std::size_t>(i)] = m_hat / (std::sqrt(v_hat) + eps) + weight_decay * p[i];
    p_sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    u_sum += static_cast<double>(u[static_cast<std::size_t>(i)]) * static_cast<double>(u[static_cast<std::size_t>(i)]);
  }
  const double w_norm = std::sqrt(p_sum), u_norm = std::sqrt(u_sum);
  const T trust = static_cast<T>(w_norm > 0 && u_norm > 0 ? w_norm / u_norm : 1.0);
  for (int64_t i = 0; i < param.numel(); ++i)
    p[i] = p[i] - lr * trust * u[static_cast<std::size_t>(i)];
}

} // namespace

LAMB::LAMB(std::vector<ParamGroupSpec> groups, const LAMBOptions& o)
    : Optimizer("LAMB", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

LAMB::LAMB(std::vector<Tensor> params, const LAMBOptions& o) : LAMB(one_param_group(std::move(params)), o) {}

// Adam's checks, with torch's messages: lr, eps, betas, weight_decay.
void LAMB::validate_options(const OptionMap& o) const { require_adam_options(o); }

Structure LAMB::structure(const ParamGroup& group) const {
  Structure s;
  s.set("weight_decay", group.get("weight_decay") != 0);
  return s;
}

std::vector<StateSpec> LAMB::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {"exp_avg"}, {.name = "exp_avg_sq", .signed_values = false}};
}

std::vector<std::string> LAMB::hyper_names() const { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }

// Over tensor lists: the moments, the bias-corrected ratio u (eps outside the square root) plus decoupled decay,
// then the trust ratio of each tensor from the norms of p (before the update) and u.
void LAMB::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym exp_avgs = t.tensors("exp_avg"), exp_avg_sqs = t.tensors("exp_avg_sq");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  exp_avgs = exp_avgs * beta1 + grads * (1.0 - beta1);
  exp_avg_sqs = exp_avg_sqs * beta2 + grads * grads * (1.0 - beta2);
  Sym bias_correction1 = 1.0 - pow(beta1, step);
  Sym bias_correction2 = 1.0 - pow(beta2, step);
  Sym update = exp_avgs / bias_correction1 / (sqrt(exp_avg_sqs / bias_correction2) + eps);
  if (s["weight_decay"])
    update = foreach_add(update, params, t.hyper("weight_decay"));
  Sym w_norm = foreach_norm(params), u_norm = foreach_norm(update);
  Sym both_positive = greater(w_norm, t.constant(0)) * greater(u_norm, t.constant(0));
  Sym trust = where(both_positive, w_norm / u_norm, t.constant(1));
  t.store("param", params - update * (lr * trust));
  t.store("exp_avg", exp_avgs);
  t.store("exp_avg_sq", exp_avg_sqs);
}

void LAMB::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { lamb_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
