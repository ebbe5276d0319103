#include "frontend/optim/asgd.h"
#include "frontend/optim/validation.h"

#include <algorithm>
#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_asgd for one param.
// `numbers`: the dtype torch rounds the new eta and mu to (ASGD::trace says why).
template <class T>
void asgd_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state, Dtype numbers) {
  const double lr = group.get("lr"), lambd = group.get("lambd"), alpha = group.get("alpha");
  const double t0 = group.get("t0"), weight_decay = group.get("weight_decay");
  const bool maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step"), eta_t = find_state(state, "eta"), mu_t = find_state(state, "mu");
  step_t.set_item(0, step_t.item() + 1);
  const double step = step_t.item(), eta = eta_t.item(), mu = mu_t.item();
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* ax = find_state(state, "ax").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    p[i] = p[i] * static_cast<T>(1 - lambd * eta);
    p[i] = p[i] + static_cast<T>(-eta) * gi;
    ax[i] = mu != 1 ? ax[i] + (p[i] - ax[i]) * static_cast<T>(mu) : p[i];
  }
  eta_t.set_item(0, round_to_dtype(numbers, lr / std::pow(1 + lambd * lr * step, alpha)));
  mu_t.set_item(0, round_to_dtype(numbers, 1 / std::max(1., step - t0)));
}

} // namespace

ASGD::ASGD(std::vector<ParamGroupSpec> groups, const ASGDOptions& o)
    : Optimizer("ASGD", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

ASGD::ASGD(std::vector<Tensor> params, const ASGDOptions& o) : ASGD(one_param_group(std::move(params)), o) {}

void ASGD::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  require_non_negative(o.at("lambd"), "Invalid lambd value: ");
  require_non_negative(o.at("alpha"), "Invalid alpha value: ");
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
}

double ASGD::initial_state_value(const ParamGroup& group, const StateSpec& spec) const {
  return spec.name == "eta" ? group.get("lr") : spec.initial;
}

Structure ASGD::structure(const ParamGroup& group) const { return maximize_and_weight_decay(group); }

std::vector<StateSpec> ASGD::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {"eta", StateKind::Scalar}, {"mu", StateKind::Scalar, 1.0}, {"ax"}};
}

std::vector<std::string> ASGD::hyper_names() const { return {"lr", "lambd", "alpha", "t0", "weight_decay"}; }

// torch's _single_tensor_asgd order, as one foreach pass. Each tensor uses its own eta and mu (torch 1.13's
// foreach path used the first tensor's eta for all), and the mu == 1 case (ax copies the param) is a per-tensor
// select rather than a re-trace.
void ASGD::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad"), axs = t.tensors("ax");
  Sym lr = t.hyper("lr"), lambd = t.hyper("lambd");
  Sym eta = t.scalar_state("eta"), mu = t.scalar_state("mu");
  if (s["maximize"])
    grads = -grads;
  Sym step = t.store_scalar("step", t.scalar_state("step") + 1.0);
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  params = params * (1.0 - lambd * eta);
  params = foreach_add(params, grads, -eta);
  axs = where(equal(mu, t.constant(1.0)), params, axs + (params - axs) * mu);
  t.store("param", params);
  t.store("ax", axs);
  // torch computes the new eta and mu as Python numbers and copies them in through torch.as_tensor (its default
  // dtype): a loaded f64 eta still takes values rounded to that dtype.
  const Dtype numbers = number_dtype(t.builder().dtype());
  t.store_scalar("eta", t.rounded(numbers, lr / pow(1.0 + lambd * lr * step, t.hyper("alpha"))));
  t.store_scalar("mu", t.rounded(numbers, 1.0 / maximum(t.constant(1.0), step - t.hyper("t0"))));
}

void ASGD::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(),
                      [&]<class T>() { asgd_forloop<T>(group, param, grad, state, number_dtype(param.dtype())); });
}

} // namespace optjit
