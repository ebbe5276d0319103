#include "frontend/optim/param_group.h"
#include "runtime/error.h"

namespace optjit {

double ParamGroup::get(const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end())
    throw Error("param group has no option '" + name + "'");
  if (!tensor_options.empty())
    if (auto held = tensor_options.find(name); held != tensor_options.end()) {
      if (held->second.numel() != 1) // its data may have been replaced since it was set
        throw Error("Tensor " + name + " must be 1-element, but holds " + held->second.describe());
      return held->second.item();
    }
  return it->second;
}

void ParamGroup::set(const std::string& name, double value) {
  if (!has(name))
    throw Error("param group has no option '" + name + "'");
  put(name, value);
}

void ParamGroup::set(const std::string& name, const Tensor& value) {
  auto it = options.find(name);
  if (it == options.end())
    throw Error("param group has no option '" + name + "'");
  if (!value.defined() || value.numel() != 1)
    throw Error("Tensor " + name + " must be 1-element");
  // Read again at every step (get()); on a GPU that read is a synchronous copy to the host.
  it->second = value.item();
  tensor_options[name] = value;
}

void ParamGroup::put(const std::string& name, double value) {
  options[name] = value;
  if (auto held = tensor_options.find(name); held != tensor_options.end())
    held->second.fill(value);
}

bool ParamGroup::is_scheduler_key(const std::string& name) {
  return name == "initial_lr" || name == "max_lr" || name == "min_lr" || name == "max_momentum" ||
         name == "base_momentum";
}

bool Structure::operator[](const std::string& name) const {
  for (const auto& [flag, value] : flags_)
    if (flag == name)
      return value;
  OPTJIT_ASSERT(false, "structure has no flag " + name);
}

Structure Structure::with_every_flag() const {
  Structure every;
  for (const auto& [flag, value] : flags_)
    every.set(flag, true);
  return every;
}

std::string Structure::key() const {
  std::string key;
  for (const auto& [flag, value] : flags_)
    key += (key.empty() ? "" : ",") + flag + "=" + (value ? "1" : "0");
  return key;
}

} // namespace optjit
