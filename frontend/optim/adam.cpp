#include "frontend/optim/adam.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <cmath>
#include <string_view>
#include <type_traits>

namespace optjit {
namespace {

// AdamW's options as Adam's with decoupled weight decay: every option AdamW has, by name (a copy field by field
// dropped each option later added to every optimizer).
AdamOptions from_adamw(const AdamWOptions& w) {
  AdamOptions o;
  AdamWOptions::for_each_option([&](const char* name, auto AdamWOptions::*from) {
    bool copied = false;
    AdamOptions::for_each_option([&](const char* to_name, auto AdamOptions::*to) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(w.*from)>, std::remove_cvref_t<decltype(o.*to)>>)
        if (std::string_view(name) == to_name) {
          o.*to = w.*from;
          copied = true;
        }
    });
    OPTJIT_ASSERT(copied, std::string("AdamW's option ") + name + " has no Adam option of its name and type");
  });
  o.decoupled_weight_decay = true;
  return o;
}

// torch's _single_tensor_adam for one param, elementwise in T with Python-float scalars rounded to T where they
// meet tensor values.
template <class T>
void adam_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
  const double eps = group.get("eps"), weight_decay = group.get("weight_decay");
  const bool amsgrad = group.get("amsgrad") != 0, maximize = group.get("maximize") != 0;
  const bool decoupled = group.get("decoupled_weight_decay") != 0;
  Tensor step_t = find_state(state, "step");
  const double step = step_t.item() + 1;
  step_t.set_item(0, step);
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* m = find_state(state, "exp_avg").data_as<T>();
  T* v = find_state(state, "exp_avg_sq").data_as<T>();
  T* v_max = amsgrad ? find_state(state, "max_exp_avg_sq").data_as<T>() : nullptr;
  for (int64_t i = 0; i < param.numel(); ++i) {
    T gi = maximize ? -g[i] : g[i];
    if (decoupled)
      p[i] = p[i] * static_cast<T>(1 - lr * weight_decay);
    else if (weight_decay != 0)
      gi = gi + static_cast<T>(weight_decay) * p[i];
    m[i] = torch_lerp(m[i], gi, static_cast<T>(1 - beta1));
    v[i] = v[i] * static_cast<T>(beta2) + static_cast<T>(1 - beta2) * gi * gi;
    T second = v[i];
    if (amsgrad) {
      v_max[i] = std::isnan(v_max[i]) || std::isnan(v[i]) ? v_max[i] + v[i] : std::max(v_max[i], v[i]);
      second = v_max[i];
    }
    const T denom = std::sqrt(second) / bias_correction2_sqrt + static_cast<T>(eps);
    p[i] = p[i] + static_cast<T>(-step_size) * (m[i] / denom);
  }
}

} // namespace

Adam::Adam(std::string name, std::vector<ParamGroupSpec> groups, const AdamOptions& options)
    : Optimizer(std::move(name), option_map(options), options.foreach.value_or(false), flag_names(options)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam("Adam", one_param_group(std::move(params)), options) {}
Adam::Adam(std::vector<ParamGroupSpec> groups, const AdamOptions& options) : Adam("Adam", std::move(groups), options) {}
AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Adam("AdamW", one_param_group(std::move(params)), from_adamw(options)) {}
AdamW::AdamW(std::vector<ParamGroupSpec> groups, const AdamWOptions& options)
    : Adam("AdamW", std::move(groups), from_adamw(options)) {}

void Adam::validate_options(const OptionMap& o) const { require_adam_options(o); }

void Adam::check_step_options(const ParamGroup& group, std::size_t index) const {
  if (!group.held_on_device("beta1")) // a tensor's 1.0 divides by 0 in the kernel, as in torch's tensor arithmetic
    require_first_bias_correction(group.get("beta1"), name(), index);
}

bool Adam::loads_state_of(const std::string& saved) const { return saved == "Adam" || saved == "AdamW"; }

void AdamW::adjust_loaded_options(OptionMap& options) const { options["decoupled_weight_decay"] = 1; }

Structure Adam::structure(const ParamGroup& group) const {
  Structure s;
  s.set("amsgrad", group.get("amsgrad") != 0);
  s.set("maximize", group.get("maximize") != 0);
  s.set("decoupled_weight_decay", group.get("decoupled_weight_decay") != 0);
  s.set("weight_decay", group.get("weight_decay") != 0);
  s.set("lr_f32_tensor", group.holds_f32_tensor("lr"));
  return s;
}

std::vector<StateSpec> Adam::state_specs(const Structure& s) const {
  std::vector<StateSpec> specs = {
      {"step", StateKind::Scalar}, {"exp_avg"}, {.name = "exp_avg_sq", .signed_values = false}};
  if (s["amsgrad"])
    specs.push_back({.name = "max_exp_avg_sq", .signed_values = false});
  return specs;
}

std::vector<std::string> Adam::hyper_names() const { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }

// torch's _multi_tensor_adam, one foreach op per line.
void Adam::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym exp_avgs = t.tensors("exp_avg"), exp_avg_sqs = t.tensors("exp_avg_sq");
  Sym lr = t.hyper("lr"), beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2"), eps = t.hyper("eps");
  Sym weight_decay = t.hyper("weight_decay");
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  if (s["maximize"])
    grads = -grads;
  if (s["decoupled_weight_decay"])
    params = params * decoupled_decay_factor(t, s, lr, weight_decay);
  else if (s["weight_decay"])
    grads = foreach_add(grads, params, weight_decay);
  exp_avgs = foreach_lerp(exp_avgs, grads, 1.0 - beta1);
  exp_avg_sqs = foreach_addcmul(exp_avg_sqs * beta2, grads, grads, 1.0 - beta2);
  Sym bias_correction1 = 1.0 - pow(beta1, step);
  Sym bias_correction2 = 1.0 - pow(beta2, step);
  Sym step_size = lr_divided_by(t, s, lr, bias_correction1) * -1.0;
  Sym bias_correction2_sqrt = sqrt(bias_correction2);
  Sym second_moment = exp_avg_sqs;
  if (s["amsgrad"]) {
    second_moment = maximum(t.tensors("max_exp_avg_sq"), exp_avg_sqs);
    t.store("max_exp_avg_sq", second_moment);
  }
  Sym denom = sqrt(second_moment) / bias_correction2_sqrt + eps;
  params = foreach_addcdiv(params, exp_avgs, denom, step_size);
  t.store("param", params);
  t.store("exp_avg", exp_avgs);
  t.store("exp_avg_sq", exp_avg_sqs);
}

void Adam::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { adam_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
