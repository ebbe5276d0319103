// Param groups as torch.optim keeps them: the params and their options by torch's names (a tensor-held option read at
// every step), the spec a constructor takes, and the structure a group's algorithm is traced with.
#pragma once

#include "runtime/tensor.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace optjit {

// A group's options: hyperparameters and flags (flags as 0 or 1), by torch's names (betas as beta1, beta2).
using OptionMap = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params;
  OptionMap options;
  // Options held in a 1-element tensor (torch's Tensor lr): read at every step, so changing the tensor's value
  // changes the next step, compiled or not, without a recompile.
  std::map<std::string, Tensor> tensor_options;
  // torch >= 2.6's "param_names" (params given by name): one per param, or empty. Kept and saved by state_dict().
  std::vector<std::string> param_names = {};

  double get(const std::string& name) const; // the tensor's value when tensor-held; throws for an unknown key
  // Whether option `name` is held in an f32 tensor: torch then computes with it in f32 tensor arithmetic (lr /
  // bias_correction1 is an f32 tensor), which a step that follows torch's rounding traces (structure flag
  // "lr_f32_tensor", with Tracer::rounded).
  bool holds_f32_tensor(const std::string& name) const {
    const auto held = tensor_options.find(name);
    return held != tensor_options.end() && held->second.dtype() == Dtype::f32;
  }
  // Whether option `name` is held in a tensor on a device (not the CPU). Its value is not checked on the host
  // (finite, Adam's beta1 != 1), as torch's tensor arithmetic does not check it, whether the kernels read it on the
  // device or a step reads it back.
  bool held_on_device(const std::string& name) const {
    const auto held = tensor_options.find(name);
    return held != tensor_options.end() && held->second.device().kind != DeviceKind::cpu;
  }
  bool has(const std::string& name) const { return options.count(name) > 0; }
  // Only keys the group has. A tensor-held option is filled in place, as torch's LR schedulers do.
  void set(const std::string& name, double value);
  // Holds an option the group has in `value`, a 1-element tensor ("Tensor lr must be 1-element").
  void set(const std::string& name, const Tensor& value);
  // Sets or adds any key: the entries LR schedulers keep in param groups (initial_lr, max_lr, ...).
  void put(const std::string& name, double value);
  // Keys LR schedulers add to param groups, which state dicts carry along with the optimizer's options.
  static bool is_scheduler_key(const std::string& name);
};

// A param group as given to a constructor: its params and the options it overrides.
struct ParamGroupSpec {
  std::vector<Tensor> params;
  OptionMap options;
  std::vector<std::string> param_names = {}; // optional: a name per param (torch's named_parameters())
};

// The flags a group's algorithm is traced with (amsgrad, maximize, weight_decay != 0, ...).
class Structure {
public:
  void set(const std::string& name, bool value) { flags_.emplace_back(name, value); }
  bool operator[](const std::string& name) const; // an internal error for a flag the structure lacks
  std::string key() const;                        // "amsgrad=1,maximize=0"
  // The same flags, all on: its state specs are every entry the optimizer keeps under any options.
  Structure with_every_flag() const;

private:
  std::vector<std::pair<std::string, bool>> flags_;
};

} // namespace optjit
