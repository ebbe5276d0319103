#include "frontend/optim/options.h"
#include "runtime/error.h"

#include <map>
#include <vector>

namespace optjit {

const std::pair<std::string, std::string>* pair_option_keys(const std::string& name) {
  static const std::map<std::string, std::pair<std::string, std::string>> pairs = {
      {"betas", {"beta1", "beta2"}},
      {"etas", {"etaminus", "etaplus"}},
      {"step_sizes", {"step_size_min", "step_size_max"}},
      {"eps", {"eps1", "eps2"}}}; // Adafactor's (eps1, eps2); a single eps (Adam's) is no pair
  auto it = pairs.find(name);
  return it == pairs.end() ? nullptr : &it->second;
}

const std::array<std::string, 3>* triple_option_keys(const std::string& name) {
  static const std::array<std::string, 3> ns_coefficients = {"ns_a", "ns_b", "ns_c"};
  return name == "ns_coefficients" ? &ns_coefficients : nullptr;
}

namespace {

std::vector<std::string> state_dtype_names() { // in StateDtype's order: a name's index is its value
  std::vector<std::string> names;
  for (StateDtype dtype : kStateDtypes)
    names.push_back(state_dtype_name(dtype));
  return names;
}

const std::map<std::string, std::vector<std::string>>& option_choices() {
  static const std::map<std::string, std::vector<std::string>> choices = {
      {"adjust_lr_fn", {"original", "match_rms_adamw", "spectral_unclamped"}}, {"state_dtype", state_dtype_names()}};
  return choices;
}

} // namespace

bool option_takes_names(const std::string& option) { return option_choices().count(option) > 0; }

double named_option_value(const std::string& option, const std::string& name) {
  const auto it = option_choices().find(option);
  if (it == option_choices().end())
    throw Error("option '" + option + "' takes a number, not the name '" + name + "'");
  for (std::size_t i = 0; i < it->second.size(); ++i)
    if (it->second[i] == name)
      return static_cast<double>(i);
  std::string names;
  for (const std::string& choice : it->second)
    names += (names.empty() ? "'" : ", '") + choice + "'";
  throw Error("option '" + option + "' is '" + name + "': it takes one of " + names);
}

void put_option(OptionMap& map, const std::string& name, double value) { map[name] = value; }

void put_option(OptionMap& map, const std::string& name, bool value) { map[name] = value ? 1.0 : 0.0; }

void put_option(OptionMap& map, const std::string& name, const OptionPair& value) {
  const auto* keys = pair_option_keys(name);
  OPTJIT_ASSERT(keys, "option '" + name + "' is a pair without group keys: add it to pair_option_keys");
  map[keys->first] = value.first;
  map[keys->second] = value.second;
}

void put_option(OptionMap& map, const std::string& name, const OptionTriple& value) {
  const auto* keys = triple_option_keys(name);
  OPTJIT_ASSERT(keys, "option '" + name + "' is a triple without group keys: add it to triple_option_keys");
  for (std::size_t i = 0; i < 3; ++i)
    map[(*keys)[i]] = value[i];
}

} // namespace optjit
