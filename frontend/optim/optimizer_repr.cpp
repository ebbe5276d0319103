// Optimizer::repr(): torch's Optimizer.__repr__, so a printed optjit optimizer reads as the torch one does.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"
#include "frontend/optim/validation.h"

#include <map>
#include <string>

namespace optjit {
namespace {

// An option's value as Python prints the value torch keeps: True/False for flags, None where torch keeps None
// (Adafactor's eps1), floats in repr form.
std::string python_value(const Optimizer& opt, const std::string& key, double value) {
  if (opt.is_flag(key))
    return value != 0 ? "True" : "False";
  if (key == "eps1" && value == kOptionNone)
    return "None";
  if (const std::optional<StateDtype> dtype = key == "state_dtype" ? state_dtype_of(value) : std::nullopt)
    return state_dtype_name(*dtype); // a choice, by name
  if (key == "state_block_size")
    return python_count(value); // a count, given as a Python int
  return python_float(value);
}

} // namespace

std::string Optimizer::repr() const {
  std::string text = name_ + " (";
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    // torch's keys: pairs joined again (beta1, beta2 -> betas), tensor-held options as their tensors.
    std::map<std::string, std::string> shown;
    for (const auto& [key, value] : group.options)
      shown[key] = python_value(*this, key, value);
    for (const auto& [key, tensor] : group.tensor_options)
      shown[key] = "tensor(" + python_float(tensor.item()) + ")";
    for (const char* pair : {"betas", "etas", "step_sizes", "eps"}) {
      const auto* keys = pair_option_keys(pair);
      if (!shown.count(keys->first) || !shown.count(keys->second))
        continue;
      shown[pair] = "(" + shown[keys->first] + ", " + shown[keys->second] + ")";
      shown.erase(keys->first);
      shown.erase(keys->second);
    }
    shown["foreach"] = foreach_ ? "True" : "False";
    if (!group.param_names.empty()) { // a Python list of strings
      std::string names;
      for (const std::string& name : group.param_names)
        names += (names.empty() ? "'" : ", '") + name + "'";
      shown["param_names"] = "[" + names + "]";
    }
    text += "\nParameter Group " + std::to_string(g) + "\n";
    for (const auto& [key, value] : shown)
      text += "    " + key + ": " + value + "\n";
  }
  return text + ")";
}

} // namespace optjit
