#include "frontend/optim/adadelta.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_adadelta for one param.
template <class T>
void adadelta_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), rho = group.get("rho"), eps = group.get("eps");
  const double weight_decay = group.get("weight_decay");
  const bool maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step");
  step_t.set_item(0, step_t.item() + 1);
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* square_avg = find_state(state, "square_avg").data_as<T>();
  T* acc_delta = find_state(state, "acc_delta").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    square_avg[i] = square_avg[i] * static_cast<T>(rho) + static_cast<T>(1 - rho) * gi * gi;
    const T std_dev = std::sqrt(square_avg[i] + static_cast<T>(eps));
    const T delta = std::sqrt(acc_delta[i] + static_cast<T>(eps)) / std_dev * gi;
    acc_delta[i] = acc_delta[i] * static_cast<T>(rho) + static_cast<T>(1 - rho) * delta * delta;
    p[i] = p[i] + static_cast<T>(-lr) * delta;
  }
}

} // namespace

Adadelta::Adadelta(std::vector<ParamGroupSpec> groups, const AdadeltaOptions& o)
    : Optimizer("Adadelta", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Adadelta::Adadelta(std::vector<Tensor> params, const AdadeltaOptions& o)
    : Adadelta(one_param_group(std::move(params)), o) {}

void Adadelta::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  if (!(0.0 <= o.at("rho") && o.at("rho") <= 1.0)) // inclusive of 1, unlike betas
    throw Error("Invalid rho value: " + python_float(o.at("rho")));
  require_non_negative(o.at("eps"), "Invalid epsilon value: ");
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
}

Structure Adadelta::structure(const ParamGroup& group) const { return maximize_and_weight_decay(group); }

std::vector<StateSpec> Adadelta::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar},
          {.name = "square_avg", .signed_values = false},
          {.name = "acc_delta", .signed_values = false}};
}

std::vector<std::string> Adadelta::hyper_names() const { return {"lr", "rho", "eps", "weight_decay"}; }

// torch's _multi_tensor_adadelta.
void Adadelta::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), rho = t.hyper("rho"), eps = t.hyper("eps");
  if (s["maximize"])
    grads = -grads;
  t.store_scalar("step", t.scalar_state("step") + 1.0);
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  Sym square_avgs = foreach_addcmul(t.tensors("square_avg") * rho, grads, grads, 1.0 - rho);
  Sym std_devs = sqrt(square_avgs + eps);
  Sym acc_deltas = t.tensors("acc_delta");
  Sym deltas = sqrt(acc_deltas + eps) / std_devs * grads;
  t.store("param", foreach_add(params, deltas, -lr));
  t.store("square_avg", square_avgs);
  t.store("acc_delta", foreach_addcmul(acc_deltas * rho, deltas, deltas, 1.0 - rho));
}

void Adadelta::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { adadelta_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
