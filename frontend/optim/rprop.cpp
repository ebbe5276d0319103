#include "frontend/optim/rprop.h"
#include "frontend/optim/validation.h"
#include "ir/op_semantics.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_rprop for one param.
template <class T>
void rprop_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const T etaminus = static_cast<T>(group.get("etaminus")), etaplus = static_cast<T>(group.get("etaplus"));
  const T step_size_min = static_cast<T>(group.get("step_size_min"));
  const T step_size_max = static_cast<T>(group.get("step_size_max"));
  const bool maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step");
  step_t.set_item(0, step_t.item() + 1);
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* prev = find_state(state, "prev").data_as<T>();
  T* step_size = find_state(state, "step_size").data_as<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    const T agreement = sign_of(gi * prev[i]);
    const T factor = agreement > 0 ? etaplus : agreement < 0 ? etaminus : T(1);
    step_size[i] = min_propagating_nan(max_propagating_nan(step_size[i] * factor, step_size_min), step_size_max);
    // After a sign flip the element does not move, and the next step treats its gradient as zero.
    if (agreement < 0)
      gi = 0;
    p[i] = p[i] + T(-1) * sign_of(gi) * step_size[i];
    prev[i] = gi;
  }
}

} // namespace

Rprop::Rprop(std::vector<ParamGroupSpec> groups, const RpropOptions& o)
    : Optimizer("Rprop", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Rprop::Rprop(std::vector<Tensor> params, const RpropOptions& o) : Rprop(one_param_group(std::move(params)), o) {}

void Rprop::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  const double etaminus = o.at("etaminus"), etaplus = o.at("etaplus");
  if (!(0.0 < etaminus && etaminus < 1.0 && 1.0 < etaplus))
    throw Error("Invalid eta values: " + python_float(etaminus) + ", " + python_float(etaplus));
}

double Rprop::initial_state_value(const ParamGroup& group, const StateSpec& spec) const {
  return spec.name == "step_size" ? group.get("lr") : spec.initial;
}

Structure Rprop::structure(const ParamGroup& group) const {
  Structure s;
  s.set("maximize", group.get("maximize") != 0);
  return s;
}

std::vector<StateSpec> Rprop::state_specs(const Structure&) const {
  return {{"step", StateKind::Scalar}, {"prev"}, {.name = "step_size", .signed_values = false}};
}

std::vector<std::string> Rprop::step_options() const {
  std::vector<std::string> names = hyper_names();
  names.push_back("lr");
  return names;
}

std::vector<std::string> Rprop::hyper_names() const {
  return {"etaminus", "etaplus", "step_size_min", "step_size_max"};
}

// torch's _multi_tensor_rprop. The three sign cases are element selects, so one kernel handles every element
// whatever its history.
void Rprop::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad"), prevs = t.tensors("prev");
  Sym etaminus = t.hyper("etaminus"), etaplus = t.hyper("etaplus");
  Sym zero = t.constant(0.0), one = t.constant(1.0);
  if (s["maximize"])
    grads = -grads;
  t.store_scalar("step", t.scalar_state("step") + 1.0);
  Sym agreement = sign(grads * prevs);
  Sym factor = where(greater(agreement, zero), etaplus, where(less(agreement, zero), etaminus, one));
  Sym step_sizes =
      minimum(maximum(t.tensors("step_size") * factor, t.hyper("step_size_min")), t.hyper("step_size_max"));
  grads = where(less(agreement, zero), zero, grads);
  params = foreach_addcmul(params, sign(grads), step_sizes, -1.0 * one);
  t.store("param", params);
  t.store("prev", grads);
  t.store("step_size", step_sizes);
}

void Rprop::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { rprop_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
