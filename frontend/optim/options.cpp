#include "frontend/optim/options.h"
#include "runtime/error.h"

#include <map>

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

void put_option(OptionMap& map, const std::string& name, double value) { map[name] = value; }

void put_option(OptionMap& map, const std::string& name, bool value) { map[name] = value ? 1.0 : 0.0; }

void put_option(OptionMap& map, const std::string& name, const OptionPair& value) {
  const auto* keys = pair_option_keys(name);
  OPTJIT_ASSERT(keys, "option '" + name + "' is a pair without group keys: add it to pair_option_keys");
  map[keys->first] = value.first;
  map[keys->second] = value.second;
}

} // namespace optjit
