#include "frontend/optim/rmsprop.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"

#include <cmath>

namespace optjit {
namespace {

// torch's _single_tensor_rmsprop for one param.
template <class T>
void rmsprop_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), alpha = group.get("alpha"), eps = group.get("eps");
  const double weight_decay = group.get("weight_decay"), momentum = group.get("momentum");
  const bool centered = group.get("centered") != 0, maximize = group.get("maximize") != 0;
  Tensor step_t = find_state(state, "step");
  step_t.set_item(0, step_t.item() + 1);
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* square_avg = find_state(state, "square_avg").data_as<T>();
  T* grad_avg = centered ? find_state(state, "grad_avg").data_as<T>() : nullptr;
  T* buf = momentum > 0 ? find_state(state, "momentum_buffer").data_as<T>() : nullptr;
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    square_avg[i] = square_avg[i] * static_cast<T>(alpha) + static_cast<T>(1 - alpha) * gi * gi;
    T avg;
    if (centered) {
      grad_avg[i] = torch_lerp(grad_avg[i], gi, static_cast<T>(1 - alpha));
      avg = std::sqrt(square_avg[i] + T(-1) * grad_avg[i] * grad_avg[i]);
    } else {
      avg = std::sqrt(square_avg[i]);
    }
    avg = avg + static_cast<T>(eps);
    if (momentum > 0) {
      buf[i] = buf[i] * static_cast<T>(momentum) + gi / avg;
      p[i] = p[i] + static_cast<T>(-lr) * buf[i];
    } else {
      p[i] = p[i] + static_cast<T>(-lr) * (gi / avg);
    }
  }
}

} // namespace

RMSprop::RMSprop(std::vector<ParamGroupSpec> groups, const RMSpropOptions& o)
    : Optimizer("RMSprop", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropOptions& o)
    : RMSprop(one_param_group(std::move(params)), o) {}

void RMSprop::validate_options(const OptionMap& o) const {
  require_non_negative(o.at("lr"), "Invalid learning rate: ");
  require_non_negative(o.at("eps"), "Invalid epsilon value: ");
  require_non_negative(o.at("momentum"), "Invalid momentum value: ");
  require_non_negative(o.at("weight_decay"), "Invalid weight_decay value: ");
  require_non_negative(o.at("alpha"), "Invalid alpha value: ");
}

Structure RMSprop::structure(const ParamGroup& group) const {
  Structure s;
  s.set("centered", group.get("centered") != 0);
  s.set("momentum", group.get("momentum") > 0);
  s.set("maximize", group.get("maximize") != 0);
  s.set("weight_decay", group.get("weight_decay") != 0);
  return s;
}

std::vector<StateSpec> RMSprop::state_specs(const Structure& s) const {
  std::vector<StateSpec> specs = {{"step", StateKind::Scalar}, {.name = "square_avg", .signed_values = false}};
  if (s["momentum"])
    specs.push_back({"momentum_buffer"});
  if (s["centered"])
    specs.push_back({"grad_avg"});
  return specs;
}

std::vector<std::string> RMSprop::hyper_names() const { return {"lr", "alpha", "eps", "weight_decay", "momentum"}; }

// torch's _multi_tensor_rmsprop.
void RMSprop::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr"), alpha = t.hyper("alpha"), eps = t.hyper("eps");
  if (s["maximize"])
    grads = -grads;
  t.store_scalar("step", t.scalar_state("step") + 1.0);
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  Sym square_avgs = foreach_addcmul(t.tensors("square_avg") * alpha, grads, grads, 1.0 - alpha);
  t.store("square_avg", square_avgs);
  Sym avg = sqrt(square_avgs);
  if (s["centered"]) {
    Sym grad_avgs = foreach_lerp(t.tensors("grad_avg"), grads, 1.0 - alpha);
    t.store("grad_avg", grad_avgs);
    avg = sqrt(foreach_addcmul(square_avgs, grad_avgs, grad_avgs, t.constant(-1.0)));
  }
  avg = avg + eps;
  if (s["momentum"]) {
    Sym bufs = foreach_addcdiv(t.tensors("momentum_buffer") * t.hyper("momentum"), grads, avg, t.constant(1.0));
    t.store("momentum_buffer", bufs);
    t.store("param", foreach_add(params, bufs, -lr));
  } else {
    t.store("param", foreach_addcdiv(params, grads, avg, -lr));
  }
}

void RMSprop::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { rmsprop_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
