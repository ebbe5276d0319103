#include "frontend/optim/adamax.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"
#include "ir/op_semantics.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_adamax for one param.
template <class T>
void adamax_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
  const double eps = group.get("eps"), weight_decay = group.get("weight_decay");
  const bool maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step");
  const double step = step_t.item() + 1;
  step_t.set_item(0, step);
  const double clr = lr / (1 - std::pow(beta1, step));
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* m = find_state(state, "exp_avg").data_as<T>();
  T* u = find_state(state, "exp_inf").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    m[i] = torch_lerp(m[i], gi, static_cast<T>(1 - beta1));
    // torch.amax over (exp_inf * beta2, |grad| + eps): NaN-propagating.
    u[i] = max_propagating_nan(u[i] * static_cast<T>(beta2), std::fabs(gi) + static_cast<T>(eps));
    p[i] = p[i] + static_cast<T>(-clr) * (m[i] / u[i]);
  }
}

} // namespace

Adamax::Adamax(std::vector<ParamGroupSpec> groups, const AdamaxOptions& o)
    : Optimizer("Adamax", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Adamax::Adamax(std::vector<Tensor> params, const AdamaxOptions& o) : Adamax(one_param_group(std::move(params)), o) {}

void Adamax::validate_options(const OptionMap& o) const { require_adam_options(o); }

void Adamax::check_step_options(const ParamGroup& group, std::size_t index) const {
  if (!group.held_on_device("beta1")) // a tensor's 1.0 divides by 0 in the kernel, as in torch's tensor arithmetic
    require_first_bias_correction(group.get("beta1"), name(), index);
}

Structure Adamax::structure(const ParamGroup& group) const {
  Structure s = maximize_and_weight_decay(group);
  s.set("lr_f32_tensor", group.holds_f32_tensor("lr"));
  return s;
}

std::vector<StateSpec> Adamax::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {"exp_avg"}, {.name = "exp_inf", .signed_values = false}};
}

std::vector<std::string> Adamax::hyper_names() const { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }

// torch's _multi_tensor_adamax.
void Adamax::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  if (s["maximize"])
    grads = -grads;
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  Sym exp_avgs = foreach_lerp(t.tensors("exp_avg"), grads, 1.0 - beta1);
  Sym exp_infs = maximum(t.tensors("exp_inf") * beta2, abs(grads) + eps);
  Sym clr = -1.0 * lr_divided_by(t, s, lr, 1.0 - pow(beta1, step));
  t.store("param", foreach_addcdiv(params, exp_avgs, exp_infs, clr));
  t.store("exp_avg", exp_avgs);
  t.store("exp_inf", exp_infs);
}

void Adamax::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { adamax_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
