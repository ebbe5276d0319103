// The Optimizer object as torch.optim has it: param groups and their options, structures, construction, the step hooks
// and zero_grad. Its other concerns: optimizer_state.cpp (state), optimizer_checks.cpp (step-time checks),
// optimizer_grad_pass.cpp (grad scaling and clipping), optimizer_step_source.cpp (what the compiler sees),
// optimizer_eager.cpp (the eager steps).
#include "frontend/optim/optimizer.h"
#include "frontend/optim/validation.h"
#include "ir/builder.h"
#include "runtime/error.h"

#include <set>
#include <spdlog/spdlog.h>
#include <utility>

namespace optjit {

Structure maximize_and_weight_decay(const ParamGroup& group) {
  const bool weight_decay = group.get("weight_decay") != 0;
  Structure s;
  s.set("maximize", group.get("maximize") != 0);
  s.set("weight_decay", weight_decay);
  if (group.options.count("decoupled_weight_decay"))
    s.set("decoupled_weight_decay", weight_decay && group.get("decoupled_weight_decay") != 0);
  return s;
}

Sym decoupled_decay_factor(Tracer& t, const Structure& s, Sym lr, Sym weight_decay) {
  if (!s["lr_f32_tensor"])
    return 1.0 - lr * weight_decay;
  return t.rounded(Dtype::f32, 1.0 - t.rounded(Dtype::f32, lr * t.rounded(Dtype::f32, weight_decay)));
}

Sym lr_divided_by(Tracer& t, const Structure& s, Sym lr, Sym divisor) {
  if (!s["lr_f32_tensor"])
    return lr / divisor;
  return t.rounded(Dtype::f32, lr / t.rounded(Dtype::f32, divisor));
}

std::vector<ParamGroupSpec> one_param_group(std::vector<Tensor> params) {
  if (params.empty())
    throw Error("optimizer got an empty parameter list");
  return {ParamGroupSpec{std::move(params), {}}};
}

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(std::string name, OptionMap defaults, bool foreach, std::set<std::string> flags)
    : name_(std::move(name)), defaults_(std::move(defaults)), foreach_(foreach), flags_(std::move(flags)) {
  check_graph_name(name_); // it names the traced graphs and the kernels' symbols
  check_flags(defaults_, "the defaults");
}

void Optimizer::check_flags(const OptionMap& options, const std::string& where) const {
  for (const std::string& flag : flags_)
    if (const auto it = options.find(flag); it != options.end() && it->second != 0 && it->second != 1)
      throw Error(fmt::format("{} of {} has {} = {}: a flag is 0 or 1 (false or true)", where, name_, flag,
                              python_float(it->second)));
}

namespace {

HookList<StepHook>& global_step_pre_hooks() {
  static HookList<StepHook> hooks;
  return hooks;
}

HookList<StepHook>& global_step_post_hooks() {
  static HookList<StepHook> hooks;
  return hooks;
}

} // namespace

HookHandle register_optimizer_step_pre_hook(StepHook hook) { return global_step_pre_hooks().add(std::move(hook)); }

HookHandle register_optimizer_step_post_hook(StepHook hook) { return global_step_post_hooks().add(std::move(hook)); }

void Optimizer::add_param_group(ParamGroupSpec group) {
  std::vector<ParamGroupSpec> one;
  one.push_back(std::move(group));
  add_param_groups(std::move(one));
  if (creates_state_on_add())
    create_state_for_every_param();
}

void Optimizer::add_param_groups(std::vector<ParamGroupSpec> specs) {
  if (specs.empty())
    throw Error("optimizer got an empty parameter list");
  // Every group is checked before any is added, so a rejected group leaves the optimizer as it was.
  std::set<uint64_t> seen_in_other_groups;
  for (const Tensor& p : flat_params_)
    seen_in_other_groups.insert(p.uid());
  std::vector<ParamGroup> added;
  for (std::size_t index = 0; index < specs.size(); ++index) {
    const std::size_t g = groups_.size() + index; // the group's index once added
    const ParamGroupSpec& spec = specs[index];
    ParamGroup group;
    group.options = defaults_;
    for (const auto& [key, value] : spec.options) {
      if (!defaults_.count(key))
        throw Error(name_ + " has no option '" + key + "' (param group " + std::to_string(g) + ")");
      group.options[key] = value;
    }
    check_flags(group.options, "param group " + std::to_string(g));
    validate_options(group.options);
    if (!spec.param_names.empty() && spec.param_names.size() != spec.params.size())
      throw Error(fmt::format("param group {} has {} param names for {} params: give one name per param, or none", g,
                              spec.param_names.size(), spec.params.size()));
    std::set<uint64_t> seen_here;
    bool warned = false;
    for (std::size_t k = 0; k < spec.params.size(); ++k) {
      const Tensor& p = spec.params[k];
      if (!p.defined())
        throw Error("params argument given to the optimizer should be an iterable of Tensors or dicts, but got "
                    "an undefined tensor in param group " +
                    std::to_string(g));
      if (seen_in_other_groups.count(p.uid()))
        throw Error("some parameters appear in more than one parameter group");
      if (!seen_here.insert(p.uid()).second) {
        if (!warned)
          spdlog::warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                       "cause an error; see github.com/pytorch/pytorch/issues/40967 for more information "
                       "(optjit keeps the first occurrence)");
        warned = true;
        continue;
      }
      group.params.push_back(p);
      if (!spec.param_names.empty())
        group.param_names.push_back(spec.param_names[k]);
    }
    seen_in_other_groups.insert(seen_here.begin(), seen_here.end());
    check_state_dtype(group, g);
    added.push_back(std::move(group));
  }
  for (ParamGroup& group : added) {
    const int g = static_cast<int>(groups_.size());
    for (const Tensor& p : group.params) {
      flat_index_of_uid_[p.uid()] = static_cast<int64_t>(flat_params_.size());
      flat_params_.push_back(p);
      flat_group_.push_back(g);
      states_.emplace_back();
    }
    groups_.push_back(std::move(group));
  }
  ++state_version_;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : flat_params_) {
    if (set_to_none) {
      p.reset_grad();
    } else if (Tensor g = p.grad(); g.defined()) {
      g.real_view().fill(0);
    }
  }
}

double Optimizer::run_with_step_hooks(const std::function<void()>& update, const Closure& closure) {
  global_step_pre_hooks().run(*this);
  step_pre_hooks_.run(*this);
  const double loss = closure ? closure() : 0.0;
  update();
  step_post_hooks_.run(*this);
  global_step_post_hooks().run(*this);
  return loss;
}

} // namespace optjit
