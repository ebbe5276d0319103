// Optimizer::state_dict() and load_state_dict(): torch's semantics, with every check done before anything of the
// optimizer changes.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <set>

namespace optjit {
namespace {

// A copy of saved state `t` for `param`: in the state's `dtype` (converted as torch's .to(dtype) does), on the param's
// device (torch's load_state_dict moves state to its param's device), and in its layout, so kernels walk both flat.
Tensor copy_as(const Tensor& t, const Tensor& param, Dtype dtype) {
  const Tensor converted = t.to(dtype);       // complex converts only to complex: an optjit::Error otherwise
  if (param.device().kind != DeviceKind::cpu) // device tensors are contiguous; never share the saved tensor
    return (converted.same(t) ? t.clone() : converted).to(param.device());
  // Rows and columns (Adafactor's factored state) have shapes of their own: contiguous.
  Tensor copy = t.shape() == param.shape() ? Tensor::empty_like(param, dtype, Device::cpu())
                                           : Tensor::empty(t.shape(), dtype, Device::cpu());
  copy.copy_from(converted.to(Device::cpu()));
  return copy;
}

std::string shape_text(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

} // namespace

bool Optimizer::loads_state_of(const std::string& saved) const { return saved == name_; }

StateDict Optimizer::state_dict() {
  state_dict_pre_hooks_.run(*this);
  StateDict dict;
  dict.optimizer = name_;
  int64_t index = 0;
  for (const ParamGroup& group : groups_) {
    StateDict::Group saved{group.options, {}, group.param_names};
    for (const auto& [name, tensor] : group.tensor_options)
      saved.options[name] = tensor.item();
    for (std::size_t k = 0; k < group.params.size(); ++k)
      saved.params.push_back(index++);
    dict.param_groups.push_back(std::move(saved));
  }
  for (int64_t i = 0; i < param_count(); ++i) {
    ParamState copy;
    for (const auto& [key, tensor] : visible_state(flat_param(i)))
      copy.emplace_back(key, tensor.clone());
    if (!copy.empty())
      dict.state.emplace(i, std::move(copy));
  }
  state_dict_post_hooks_.run(*this, dict);
  return dict;
}

std::vector<ParamState> Optimizer::checked_loaded_state(const StateDict& loaded) const {
  if (!loads_state_of(loaded.optimizer))
    throw Error(fmt::format("loaded state dict is for {}, this optimizer is {}", loaded.optimizer, name_));
  if (loaded.param_groups.size() != groups_.size())
    throw Error(fmt::format("loaded state dict has a different number of parameter groups ({} saved, {} here)",
                            loaded.param_groups.size(), groups_.size()));
  // Saved param ids map to this optimizer's params by position, as torch's id_map does.
  std::map<int64_t, int64_t> flat_of_id;
  std::vector<Structure> structures;
  int64_t flat = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const StateDict::Group& saved = loaded.param_groups[g];
    if (saved.params.size() != groups_[g].params.size())
      throw Error(fmt::format("loaded state dict contains a parameter group that doesn't match the size of "
                              "optimizer's group (group {}: {} params saved, {} here)",
                              g, saved.params.size(), groups_[g].params.size()));
    if (!saved.param_names.empty() && saved.param_names.size() != saved.params.size())
      throw Error(fmt::format("loaded param group {} has {} param names for {} params", g, saved.param_names.size(),
                              saved.params.size()));
    for (const auto& [key, value] : saved.options)
      if (!defaults_.count(key) && !ParamGroup::is_scheduler_key(key))
        throw Error(fmt::format("loaded param group {} has option '{}', which {} does not have", g, key, name_));
    check_flags(saved.options, fmt::format("loaded param group {}", g));
    validate_options(saved.options);
    ParamGroup as_loaded{{}, saved.options, {}};
    structures.push_back(traced_structure(as_loaded));
    for (int64_t id : saved.params)
      flat_of_id[id] = flat++;
  }
  std::vector<ParamState> states(static_cast<std::size_t>(param_count()));
  for (const auto& [id, saved_state] : loaded.state) {
    auto it = flat_of_id.find(id);
    if (it == flat_of_id.end())
      throw Error(fmt::format("loaded state dict has state for param {}, which no parameter group lists", id));
    const int64_t i = it->second;
    const Tensor& param = flat_param(i);
    const auto g = static_cast<std::size_t>(group_of_flat(i));
    states[static_cast<std::size_t>(i)] = state_from_entries(
        param,
        [&] { // the loaded group's structure, with this param's own flags
          Structure s = structures[g];
          param_structure(param, s);
          return step_state_specs(s);
        }(),
        saved_state, id, i, /*loaded=*/true,
        [&](const StateSpec& spec, const Tensor& saved) {
          const bool scalar = spec.kind == StateKind::Scalar;
          if (is_code_dtype(saved.dtype())) { // block-quantized codes: their scales come beside them
            if (!optimizer_detail::state_fits(spec, saved, param))
              throw Error(fmt::format("state '{}' of param {} holds {} codes of shape {}, but the param has shape {}",
                                      spec.name, id, dtype_name(saved.dtype()), shape_text(saved.shape()),
                                      shape_text(param.shape())));
            return saved.clone().to(param.device());
          }
          if (scalar ? saved.numel() != 1 : saved.shape() != state_shape(spec.kind, param.shape()))
            throw Error(fmt::format("state '{}' of param {} has shape {}, {}", spec.name, id, shape_text(saved.shape()),
                                    scalar ? std::string("a scalar state needs one element")
                                    : spec.kind == StateKind::Tensor
                                        ? "the param has shape " + shape_text(param.shape())
                                        : "its rows or columns have shape " +
                                              shape_text(state_shape(spec.kind, param.shape()))));
          if (!scalar && is_complex(saved.dtype()) != is_complex(param.dtype()))
            throw Error(fmt::format("state '{}' of param {} is {}, but the param is {}: a complex param keeps complex "
                                    "state, a real param real state",
                                    spec.name, id, saved.describe(), param.describe()));
          return scalar ? Tensor::from_values({}, std::vector<double>{saved.item()}, new_state_dtype(param, spec))
                              .to(param.device())
                        : copy_as(saved, param, new_state_dtype(param, spec));
        });
  }
  return states;
}

void Optimizer::load_state_dict(StateDict loaded) {
  load_state_dict_pre_hooks_.run(*this, loaded);
  // A state dict from before an option existed (torch's test_can_load_older_state_dict, or one saved without
  // master_weights) takes the optimizer's default for it, as torch's __setstate__ does.
  for (StateDict::Group& group : loaded.param_groups) {
    for (const auto& [key, value] : defaults_)
      group.options.try_emplace(key, value);
    adjust_loaded_options(group.options);
  }
  std::vector<ParamState> states = checked_loaded_state(loaded);
  // Nothing below throws: the optimizer changes all at once.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].options = loaded.param_groups[g].options;
    if (!loaded.param_groups[g].param_names.empty()) // an unnamed dict keeps this optimizer's names, as torch's does
      groups_[g].param_names = loaded.param_groups[g].param_names;
    for (auto& [name, tensor] : groups_[g].tensor_options) // a tensor-held option keeps its tensor
      tensor.fill(groups_[g].options.at(name));
  }
  states_ = std::move(states);
  ++state_version_;
  load_state_dict_post_hooks_.run(*this);
}

} // namespace optjit
