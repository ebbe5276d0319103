// Optimizer::deep_copy(): torch's copy.deepcopy(opt), which copies what Optimizer.__getstate__ returns (defaults,
// state and param groups, params included) and nothing else.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/registry.h"

#include <spdlog/fmt/fmt.h>

#include <typeinfo>

namespace optjit {
namespace {

// A copy of `t` in its layout (torch's deepcopy keeps strides), on its device.
Tensor copy_of(const Tensor& t) {
  Tensor copy = Tensor::empty_like(t, t.dtype(), t.device());
  copy.copy_from(t);
  return copy;
}

} // namespace

std::unique_ptr<Optimizer> Optimizer::deep_copy() const {
  std::vector<ParamGroupSpec> groups;
  for (const ParamGroup& group : groups_) {
    ParamGroupSpec spec;
    for (const Tensor& p : group.params) {
      Tensor copy = copy_of(p);
      if (const Tensor grad = p.grad(); grad.defined())
        copy.set_grad(copy_of(grad));
      spec.params.push_back(copy);
    }
    groups.push_back(std::move(spec));
  }
  // The class's constructor makes the groups and checks nothing new: every value below is this optimizer's, which
  // passed the same checks.
  std::unique_ptr<Optimizer> copy = make_optimizer(name_, std::move(groups), {{"foreach", {foreach_ ? 1.0 : 0.0}}});
  const Optimizer& made = *copy;
  if (typeid(made) != typeid(*this)) // a class registered under another class's name
    throw Error(fmt::format("deep_copy: the optimizer registered as {} is another class than this one; register this "
                            "class (register_optimizer) to copy it",
                            name_));
  copy->defaults_ = defaults_;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    copy->groups_[g].options = groups_[g].options;
    copy->groups_[g].param_names = groups_[g].param_names;
    copy->groups_[g].tensor_options.clear();
    for (const auto& [name, tensor] : groups_[g].tensor_options)
      copy->groups_[g].tensor_options.emplace(name, copy_of(tensor));
  }
  for (std::size_t i = 0; i < states_.size(); ++i) {
    ParamState state;
    for (const auto& [key, tensor] : states_[i])
      state.emplace_back(key, copy_of(tensor));
    copy->states_[i] = std::move(state);
  }
  copy->scalar_state_dtype_ = scalar_state_dtype_;
  copy->rounding_seed_ = rounding_seed_;
  copy->rounding_steps_ = rounding_steps_;
  ++copy->state_version_;
  return copy;
}

} // namespace optjit
