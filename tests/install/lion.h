// Lion (Chen et al. 2023) written as a user writes an optimizer against the installed optjit: options declared once,
// the state it keeps, its algorithm in the foreach vocabulary (traced once, compiled to one kernel) and a forloop
// reference. lion.cpp runs it as a program; lion_plugin.cpp registers it with the optjit CLI.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"
#include "frontend/trace/foreach.h"
#include "runtime/error.h"

#include <vector>

namespace user {

using optjit::OptionMap;
using optjit::OptionPair;

#define USER_LION_OPTIONS(X)                                                                                           \
  X(double, lr, 1e-4)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.99})                                                                          \
  X(double, weight_decay, 0.0)
OPTJIT_DEFINE_OPTIONS(LionOptions, USER_LION_OPTIONS)

class Lion : public optjit::Optimizer {
public:
  using Options = LionOptions; // what optjit::register_optimizer<Lion> makes from keyword options

  Lion(std::vector<optjit::ParamGroupSpec> groups, const LionOptions& o)
      : Optimizer("Lion", optjit::option_map(o), o.foreach.value_or(false), optjit::flag_names(o)) {
    validate_options(defaults());
    add_param_groups(std::move(groups));
  }

  optjit::Structure structure(const optjit::ParamGroup& group) const override {
    optjit::Structure s;
    s.set("weight_decay", group.get("weight_decay") != 0);
    return s;
  }
  std::vector<optjit::StateSpec> state_specs(const optjit::Structure&) const override { return {{"exp_avg"}}; }
  std::vector<std::string> hyper_names() const override { return {"lr", "beta1", "beta2", "weight_decay"}; }

  // c = lerp(m, g, 1 - beta1); p = p (1 - lr wd) - lr sign(c); m = lerp(m, g, 1 - beta2).
  void trace(optjit::Tracer& t, const optjit::Structure& s) const override {
    using namespace optjit;
    Sym params = t.tensors("param"), grads = t.tensors("grad"), exp_avg = t.tensors("exp_avg");
    Sym lr = t.hyper("lr");
    if (s["weight_decay"])
      params = params * (1.0 - lr * t.hyper("weight_decay"));
    Sym update = sign(foreach_lerp(exp_avg, grads, 1.0 - t.hyper("beta1")));
    t.store("param", foreach_add(params, update, -lr));
    t.store("exp_avg", foreach_lerp(exp_avg, grads, 1.0 - t.hyper("beta2")));
  }

  void forloop_step(const optjit::ParamGroup& group, const optjit::Tensor& param, const optjit::Tensor& grad,
                    optjit::ParamState& state) const override {
    const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2");
    const double decay = 1 - lr * group.get("weight_decay");
    float* p = param.data_as<float>();
    const float* g = grad.data_as<float>();
    float* m = optjit::find_state(state, "exp_avg").data_as<float>();
    for (int64_t i = 0; i < param.numel(); ++i) {
      const float c = m[i] + static_cast<float>(1 - beta1) * (g[i] - m[i]);
      p[i] = p[i] * static_cast<float>(decay) - static_cast<float>(lr) * static_cast<float>((c > 0) - (c < 0));
      m[i] = m[i] + static_cast<float>(1 - beta2) * (g[i] - m[i]);
    }
  }

  bool has_forloop_reference() const override { return true; } // forloop_step above is Lion's reference

  void validate_options(const OptionMap& o) const override {
    if (!(o.at("lr") >= 0))
      throw optjit::Error("Invalid learning rate: lr must be >= 0");
    if (!(o.at("beta1") >= 0 && o.at("beta1") < 1 && o.at("beta2") >= 0 && o.at("beta2") < 1))
      throw optjit::Error("Invalid beta: betas must be in [0, 1)");
  }
};

} // namespace user
