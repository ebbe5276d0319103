#include "frontend/optim/lion.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

namespace optjit {
namespace {

// The reference for one param, per element in T (golden/FORMAT_NEXT.md's LionRef):
//   c = beta1 m + (1 - beta1) g;  p = p - lr (sign(c) + wd p);  m = beta2 m + (1 - beta2) g.
template <class T>
void lion_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const T lr = static_cast<T>(group.get("lr")), weight_decay = static_cast<T>(group.get("weight_decay"));
  const T beta1 = static_cast<T>(group.get("beta1")), beta2 = static_cast<T>(group.get("beta2"));
  const bool maximize = group.get("maximize") != 0;
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* m = find_state(state, "exp_avg").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    const T d = maximize ? -g[i] : g[i];
    const T c = beta1 * m[i] + (T(1) - beta1) * d;
    const T sign = static_cast<T>((c > T(0)) - (c < T(0)));
    p[i] = p[i] - lr * (sign + weight_decay * p[i]);
    m[i] = beta2 * m[i] + (T(1) - beta2) * d;
  }
}

} // namespace

Lion::Lion(std::vector<ParamGroupSpec> groups, const LionOptions& o)
    : Optimizer("Lion", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Lion::Lion(std::vector<Tensor> params, const LionOptions& o) : Lion(one_param_group(std::move(params)), o) {}

void Lion::validate_options(const OptionMap& o) const {
  if (!(o.at("lr") >= 0.0))
    throw Error("Invalid learning rate: " + python_float(o.at("lr")));
  for (int index : {0, 1}) {
    const double beta = o.at(index == 0 ? "beta1" : "beta2");
    if (!(beta >= 0.0 && beta < 1.0))
      throw Error("Invalid beta parameter at index " + std::to_string(index) + ": " + python_float(beta));
  }
  if (!(o.at("weight_decay") >= 0.0))
    throw Error("Invalid weight_decay value: " + python_float(o.at("weight_decay")));
}

Structure Lion::structure(const ParamGroup& group) const { return maximize_and_weight_decay(group); }

std::vector<StateSpec> Lion::state_specs(const Structure&) const { return {{"exp_avg"}}; }

std::vector<std::string> Lion::hyper_names() const { return {"lr", "beta1", "beta2", "weight_decay"}; }

// The same update over tensor lists: the interpolated momentum's sign, decoupled decay, then the new momentum.
void Lion::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad"), exp_avg = t.tensors("exp_avg");
  Sym lr = t.hyper("lr");
  if (s["maximize"])
    grads = -grads;
  Sym beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2");
  Sym update = sign(exp_avg * beta1 + grads * (1.0 - beta1));
  if (s["weight_decay"])
    update = foreach_add(update, params, t.hyper("weight_decay"));
  t.store("param", foreach_add(params, update, -lr));
  t.store("exp_avg", exp_avg * beta2 + grads * (1.0 - beta2));
}

void Lion::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { lion_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
