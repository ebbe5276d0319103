#include "frontend/optim/lars.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <cmath>

namespace optjit {
namespace {

// The reference for one param, in T, norms in f64: the trust ratio, then momentum over the scaled step.
template <class T>
void lars_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state, bool adapt) {
  const double lr = group.get("lr"), momentum = group.get("momentum");
  const double weight_decay = adapt ? group.get("weight_decay") : 0.0;
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* v = find_state(state, "momentum_buffer").data_as<T>();
  double w_sum = 0, g_sum = 0;
  for (int64_t i = 0; i < param.numel(); ++i) {
    w_sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    g_sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  }
  const double w_norm = std::sqrt(w_sum), g_norm = std::sqrt(g_sum);
  double trust = 1.0;
  if (adapt && w_norm > 0 && g_norm > 0)
    trust = group.get("trust_coefficient") * w_norm / (g_norm + weight_decay * w_norm + group.get("eps"));
  const T scaled_lr = static_cast<T>(lr * trust), decay = static_cast<T>(weight_decay);
  for (int64_t i = 0; i < param.numel(); ++i) {
    v[i] = static_cast<T>(momentum) * v[i] + scaled_lr * (g[i] + decay * p[i]);
    p[i] = p[i] - v[i];
  }
}

} // namespace

LARS::LARS(std::vector<ParamGroupSpec> groups, const LARSOptions& o)
    : Optimizer("LARS", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

LARS::LARS(std::vector<Tensor> params, const LARSOptions& o) : LARS(one_param_group(std::move(params)), o) {}

void LARS::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  require_non_negative(o.at("momentum"), "Invalid momentum value: ");
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
  require_non_negative(o.at("trust_coefficient"), "Invalid trust_coefficient value: ");
  require_non_negative(o.at("eps"), "Invalid epsilon value: ");
}

Structure LARS::structure(const ParamGroup& group) const {
  Structure s;
  s.set("weight_decay", group.get("weight_decay") != 0);
  s.set("exclude_1d", group.get("exclude_1d") != 0);
  return s;
}

// With exclude_1d, a param of rank <= 1 is neither adapted nor decayed.
void LARS::param_structure(const Tensor& param, Structure& s) const {
  s.set("adapt", !(s["exclude_1d"] && param.dim() <= 1));
}

std::vector<StateSpec> LARS::state_specs(const Structure&) const { return {{"momentum_buffer"}}; }

std::vector<std::string> LARS::hyper_names() const {
  return {"lr", "momentum", "weight_decay", "trust_coefficient", "eps"};
}

// Over tensor lists: the two norms (a pass over w and g), then the momentum step with the trust-scaled lr.
void LARS::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad"), buffers = t.tensors("momentum_buffer");
  Sym lr = t.hyper("lr");
  Sym step = grads;
  if (s["adapt"]) {
    Sym weight_decay = t.hyper("weight_decay");
    Sym w_norm = foreach_norm(params), g_norm = foreach_norm(grads);
    Sym both_positive = greater(w_norm, t.constant(0)) * greater(g_norm, t.constant(0));
    Sym trust =
        where(both_positive, t.hyper("trust_coefficient") * w_norm / (g_norm + weight_decay * w_norm + t.hyper("eps")),
              t.constant(1));
    lr = lr * trust;
    if (s["weight_decay"])
      step = foreach_add(grads, params, weight_decay);
  }
  buffers = foreach_add(buffers * t.hyper("momentum"), step, lr);
  t.store("momentum_buffer", buffers);
  t.store("param", params - buffers);
}

void LARS::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  const bool adapt = !(group.get("exclude_1d") != 0 && param.dim() <= 1);
  visit_compute_dtype(param.dtype(), [&]<class T>() { lars_forloop<T>(group, param, grad, state, adapt); });
}

} // namespace optjit
