#include "frontend/optim/registry.h"
#include "frontend/optim/adadelta.h"
#include "frontend/optim/adagrad.h"
#include "frontend/optim/adam.h"
#include "frontend/optim/adamax.h"
#include "frontend/optim/asgd.h"
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
#include <functional>

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
    throw Error(optimizer + " option '" + key + "' takes " + (count == 1 ? "one value" : "two values") + ", got " +
                std::to_string(v.size()));
}

// Keyword values into an options struct's members, by member type.
void assign(double& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  member = v[0];
}
// A flag is 0 or 1 (false or true): 0.5, 2 or NaN is refused, never coerced.
bool flag_value(const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  if (v[0] != 0 && v[0] != 1)
    throw Error(fmt::format("{} option '{}' is {}: a flag is 0 or 1 (false or true)", cls, key, v[0]));
  return v[0] != 0;
}
void assign(bool& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  member = flag_value(cls, key, v);
}
void assign(std::optional<bool>& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  member = flag_value(cls, key, v);
}
void assign(std::pair<double, double>& member, const std::string& cls, const std::string& key,
            const std::vector<double>& v) {
  require_count(cls, key, v, 2);
  member = {v[0], v[1]};
}

// Builds optimizer class Opt from keyword options, each of which must be one of its options struct's (declared
// once with the optimizer: frontend/optim/options.h).
template <class Opt, class Options = typename Opt::Options>
std::unique_ptr<Optimizer> build(const std::string& cls, std::vector<ParamGroupSpec> groups,
                                 const KeywordOptions& options) {
  Options o;
  for (const auto& [key, value] : options) {
    bool known = false;
    Options::for_each_option([&](const char* name, auto member) {
      if (key == name) {
        assign(o.*member, cls, key, value);
        known = true;
      }
    });
    if (!known)
      throw Error(cls + " has no option '" + key + "'");
  }
  return std::make_unique<Opt>(std::move(groups), o);
}

// Group overrides use the optimizer's option names, with pairs split (betas -> beta1, beta2).
OptionMap group_option_map(const std::string& cls, const KeywordOptions& options) {
  OptionMap map;
  for (const auto& [key, value] : options) {
    if (const auto* pair = pair_option_keys(key)) {
      require_count(cls, key, value, 2);
      map[pair->first] = value[0];
      map[pair->second] = value[1];
    } else if (key == "foreach") {
      throw Error("foreach is an optimizer-wide option, not a param group option");
    } else {
      require_count(cls, key, value, 1);
      map[key] = value[0];
    }
  }
  return map;
}

// torch's class name for `name` in any case; empty when optjit has no such optimizer.
std::string torch_class_name(const std::string& name) {
  for (const std::string& known : implemented_optimizers())
    if (lower(known) == lower(name))
      return known;
  return {};
}

} // namespace

std::vector<std::string> implemented_optimizers() {
  return {"Adam", "AdamW", "SGD", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD"};
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options) {
  const std::string cls = torch_class_name(name);
  if (cls.empty())
    throw Error(fmt::format("unknown optimizer '{}' (optjit has {})", name, fmt::join(implemented_optimizers(), ", ")));
  for (std::size_t g = 0; g < group_options.size() && g < groups.size(); ++g)
    groups[g].options = group_option_map(cls, group_options[g]);
  if (cls == "Adam")
    return build<Adam>(cls, std::move(groups), options);
  if (cls == "AdamW")
    return build<AdamW>(cls, std::move(groups), options);
  if (cls == "SGD")
    return build<SGD>(cls, std::move(groups), options);
  if (cls == "Adamax")
    return build<Adamax>(cls, std::move(groups), options);
  if (cls == "Adagrad")
    return build<Adagrad>(cls, std::move(groups), options);
  if (cls == "RMSprop")
    return build<RMSprop>(cls, std::move(groups), options);
  if (cls == "Adadelta")
    return build<Adadelta>(cls, std::move(groups), options);
  if (cls == "NAdam")
    return build<NAdam>(cls, std::move(groups), options);
  if (cls == "RAdam")
    return build<RAdam>(cls, std::move(groups), options);
  if (cls == "Rprop")
    return build<Rprop>(cls, std::move(groups), options);
  OPTJIT_ASSERT(cls == "ASGD", "torch_class_name returned an optimizer without a row here: " + cls);
  return build<ASGD>(cls, std::move(groups), options);
}

} // namespace optjit
