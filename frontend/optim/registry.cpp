#include "frontend/optim/registry.h"
#include "frontend/optim/adadelta.h"
#include "frontend/optim/adafactor.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/adamax.h"
#include "frontend/optim/asgd.h"
#include "frontend/optim/lamb.h"
#include "frontend/optim/lars.h"
#include "frontend/optim/lion.h"
#include "frontend/optim/lowbit_adam.h"
#include "frontend/optim/muon.h"
#include "frontend/optim/nadam.h"
#include "frontend/optim/radam.h"
#include "frontend/optim/rmsprop.h"
#include "frontend/optim/rprop.h"
#include "frontend/optim/sgd.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <tuple>

namespace optjit {
namespace {

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void require_count(const std::string& optimizer, const std::string& key, const std::vector<double>& v,
                   std::size_t count) {
  if (v.size() != count)
    throw Error(fmt::format("{} option '{}' takes {}, got {}", optimizer, key,
                            count == 1 ? "one value" : fmt::format("{} values", count), v.size()));
}

// A flag is 0 or 1 (false or true): 0.5, 2 or NaN is refused, never coerced.
bool flag_value(const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  if (v[0] != 0 && v[0] != 1)
    throw Error(fmt::format("{} option '{}' is {}: a flag is 0 or 1 (false or true)", cls, key, v[0]));
  return v[0] != 0;
}

// The registered optimizers by name, in order: the built-ins first, registered as a user registers one.
struct Registry {
  std::mutex mutex;
  std::vector<std::pair<std::string, OptimizerFactory>> entries;
  std::size_t builtins = 0; // entries[0, builtins) are optjit's own
};

Registry& registry() {
  static Registry* table = [] {
    auto* r = new Registry; // lives for the process: optimizers may be made during static destruction
    r->entries = {{"Adam", optimizer_factory<Adam>("Adam")},
                  {"AdamW", optimizer_factory<AdamW>("AdamW")},
                  {"SGD", optimizer_factory<SGD>("SGD")},
                  {"NAdam", optimizer_factory<NAdam>("NAdam")},
                  {"RAdam", optimizer_factory<RAdam>("RAdam")},
                  {"Adamax", optimizer_factory<Adamax>("Adamax")},
                  {"Adagrad", optimizer_factory<Adagrad>("Adagrad")},
                  {"Adadelta", optimizer_factory<Adadelta>("Adadelta")},
                  {"RMSprop", optimizer_factory<RMSprop>("RMSprop")},
                  {"Rprop", optimizer_factory<Rprop>("Rprop")},
                  {"ASGD", optimizer_factory<ASGD>("ASGD")},
                  {"Lion", optimizer_factory<Lion>("Lion")},
                  {"LAMB", optimizer_factory<LAMB>("LAMB")},
                  {"Adafactor", optimizer_factory<Adafactor>("Adafactor")},
                  {"LARS", optimizer_factory<LARS>("LARS")},
                  {"Muon", optimizer_factory<Muon>("Muon")},
                  {"Adam8bit", optimizer_factory<Adam8bit>("Adam8bit")},
                  {"AdamW8bit", optimizer_factory<AdamW8bit>("AdamW8bit")},
                  {"Adam4bit", optimizer_factory<Adam4bit>("Adam4bit")},
                  {"AdamW4bit", optimizer_factory<AdamW4bit>("AdamW4bit")},
                  {"AdamFp8", optimizer_factory<AdamFp8>("AdamFp8")},
                  {"AdamWFp8", optimizer_factory<AdamWFp8>("AdamWFp8")}};
    r->builtins = r->entries.size();
    return r;
  }();
  return *table;
}

// The entry registered as `name` in any case, or null; the caller holds the registry's mutex.
const std::pair<std::string, OptimizerFactory>* find_entry(const Registry& r, const std::string& name) {
  for (const auto& entry : r.entries)
    if (lower(entry.first) == lower(name))
      return &entry;
  return nullptr;
}

// Group overrides use the optimizer's option names, with pairs split (betas -> beta1, beta2).
OptionMap group_option_map(const std::string& cls, const KeywordOptions& options) {
  OptionMap map;
  for (const auto& [key, value] : options) {
    if (const auto* pair = pair_option_keys(key); pair && !(key == "eps" && value.size() == 1)) {
      require_count(cls, key, value, 2);
      map[pair->first] = value[0];
      map[pair->second] = value[1];
    } else if (const auto* triple = triple_option_keys(key)) {
      require_count(cls, key, value, 3);
      for (std::size_t i = 0; i < 3; ++i)
        map[(*triple)[i]] = value[i];
    } else if (key == "foreach") {
      throw Error("foreach is an optimizer-wide option, not a param group option");
    } else {
      require_count(cls, key, value, 1);
      map[key] = value[0];
    }
  }
  return map;
}

} // namespace

void keyword_value(double& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  member = v[0];
}
void keyword_value(bool& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  member = flag_value(cls, key, v);
}
void keyword_value(std::optional<bool>& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& v) {
  member = flag_value(cls, key, v);
}
void keyword_value(OptionPair& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 2);
  member = {v[0], v[1]};
}
void keyword_value(OptionTriple& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 3);
  member = {v[0], v[1], v[2]};
}

std::vector<std::string> implemented_optimizers() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.entries)
    names.push_back(name);
  return names;
}

std::vector<std::string> user_optimizers() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (std::size_t k = r.builtins; k < r.entries.size(); ++k)
    names.push_back(r.entries[k].first);
  return names;
}

void register_optimizer(const std::string& name, OptimizerFactory factory) {
  if (name.empty() || !factory)
    throw Error("register_optimizer: give a name and a factory");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (const auto* known = find_entry(r, name))
    throw Error(fmt::format("register_optimizer: optjit already has an optimizer named {}", known->first));
  r.entries.emplace_back(name, std::move(factory));
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options) {
  std::string cls;
  OptimizerFactory factory;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (const auto* known = find_entry(r, name))
      std::tie(cls, factory) = *known;
  }
  if (!factory)
    throw Error(fmt::format("unknown optimizer '{}' (optjit has {})", name, fmt::join(implemented_optimizers(), ", ")));
  if (group_options.size() > groups.size())
    throw Error(fmt::format("{}: {} sets of group options for {} param group(s): give at most one per group", cls,
                            group_options.size(), groups.size()));
  for (std::size_t g = 0; g < group_options.size(); ++g)
    groups[g].options = group_option_map(cls, group_options[g]);
  return factory(std::move(groups), options);
}

} // namespace optjit
