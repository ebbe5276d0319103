#include "frontend/optim/adagrad.h"
#include "frontend/optim/validation.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_adagrad for one param.
template <class T>
void adagrad_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), lr_decay = group.get("lr_decay"), eps = group.get("eps");
  const double weight_decay = group.get("weight_decay");
  const bool maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step");
  const double step = step_t.item() + 1;
  step_t.set_item(0, step);
  const double clr = lr / (1 + (step - 1) * lr_decay);
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* sum = find_state(state, "sum").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    sum[i] = sum[i] + gi * gi;
    const T std_dev = std::sqrt(sum[i]) + static_cast<T>(eps);
    p[i] = p[i] + static_cast<T>(-clr) * (gi / std_dev);
  }
}

} // namespace

Adagrad::Adagrad(std::vector<ParamGroupSpec> groups, const AdagradOptions& o)
    : Optimizer("Adagrad", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
  create_state_for_every_param();
}

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradOptions& o)
    : Adagrad(one_param_group(std::move(params)), o) {}

void Adagrad::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  require_non_negative(o.at("lr_decay"), "Invalid lr_decay value: ");
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
  require_non_negative(o.at("initial_accumulator_value"), "Invalid initial_accumulator_value value: ");
  require_non_negative(o.at("eps"), "Invalid epsilon value: ");
}

double Adagrad::initial_state_value(const ParamGroup& group, const StateSpec& spec) const {
  return spec.name == "sum" ? group.get("initial_accumulator_value") : spec.initial;
}

Structure Adagrad::structure(const ParamGroup& group) const { return maximize_and_weight_decay(group); }

std::vector<StateSpec> Adagrad::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {.name = "sum", .signed_values = false}};
}

std::vector<std::string> Adagrad::hyper_names() const { return {"lr", "lr_decay", "weight_decay", "eps"}; }

// torch's _multi_tensor_adagrad.
void Adagrad::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  if (s["maximize"])
    grads = -grads;
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  Sym minus_clr = -t.hyper("lr") / (1.0 + (step - 1.0) * t.hyper("lr_decay"));
  Sym sums = foreach_addcmul(t.tensors("sum"), grads, grads, t.constant(1.0));
  Sym std_devs = sqrt(sums) + t.hyper("eps");
  t.store("param", foreach_addcdiv(params, grads, std_devs, minus_clr));
  t.store("sum", sums);
}

void Adagrad::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { adagrad_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
