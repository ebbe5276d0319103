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
void assign(bool& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  member = v[0] != 0;
}
void assign(std::optional<bool>& member, const std::string& cls, const std::string& key, const std::vector<double>& v) {
  require_count(cls, key, v, 1);
  member = v[0] != 0;
}
void assign(std::pair<double, double>& member, const std::string& cls, const std::string& key,
            const std::vector<double>& v) {
  require_count(cls, key, v, 2);
  member = {v[0], v[1]};
}

// One keyword option of an optimizer: torch's name and the member of the options struct it sets.
template <class Options> struct Field {
  std::string name;
  std::function<void(Options&, const std::string& cls, const std::vector<double>&)> set;
};

template <class Options, class Member> Field<Options> field(std::string name, Member Options::*member) {
  return {name, [member, name](Options& o, const std::string& cls, const std::vector<double>& v) {
            assign(o.*member, cls, name, v);
          }};
}

// Builds optimizer class Opt from keyword options, each of which must be one of `fields`.
template <class Opt, class Options>
std::unique_ptr<Optimizer> build(const std::string& cls, std::vector<ParamGroupSpec> groups,
                                 const KeywordOptions& options, const std::vector<Field<Options>>& fields) {
  Options o;
  for (const auto& [key, value] : options) {
    auto it = std::find_if(fields.begin(), fields.end(), [&](const Field<Options>& f) { return f.name == key; });
    if (it == fields.end())
      throw Error(cls + " has no option '" + key + "'");
    it->set(o, cls, value);
  }
  return std::make_unique<Opt>(std::move(groups), o);
}

// torch's pair options and the two group option names each is split into.
const std::map<std::string, std::pair<std::string, std::string>>& pair_options() {
  static const std::map<std::string, std::pair<std::string, std::string>> pairs = {
      {"betas", {"beta1", "beta2"}},
      {"etas", {"etaminus", "etaplus"}},
      {"step_sizes", {"step_size_min", "step_size_max"}}};
  return pairs;
}

// Group overrides use the optimizer's option names, with pairs split (betas -> beta1, beta2).
OptionMap group_option_map(const std::string& cls, const KeywordOptions& options) {
  OptionMap map;
  for (const auto& [key, value] : options) {
    if (auto pair = pair_options().find(key); pair != pair_options().end()) {
      require_count(cls, key, value, 2);
      map[pair->second.first] = value[0];
      map[pair->second.second] = value[1];
    } else if (key == "foreach") {
      throw Error("foreach is an optimizer-wide option, not a param group option");
    } else {
      require_count(cls, key, value, 1);
      map[key] = value[0];
    }
  }
  return map;
}

template <class Options> std::vector<Field<Options>> adam_fields() {
  return {field("lr", &Options::lr),           field("betas", &Options::betas),       field("eps", &Options::eps),
          field("weight_decay", &Options::weight_decay), field("amsgrad", &Options::amsgrad),
          field("maximize", &Options::maximize), field("foreach", &Options::foreach)};
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
  if (cls == "Adam") {
    auto fields = adam_fields<AdamOptions>();
    fields.push_back(field("decoupled_weight_decay", &AdamOptions::decoupled_weight_decay));
    return build<Adam>(cls, std::move(groups), options, fields);
  }
  if (cls == "AdamW")
    return build<AdamW>(cls, std::move(groups), options, adam_fields<AdamWOptions>());
  if (cls == "SGD")
    return build<SGD, SGDOptions>(
        cls, std::move(groups), options,
        {field("lr", &SGDOptions::lr), field("momentum", &SGDOptions::momentum),
         field("dampening", &SGDOptions::dampening), field("weight_decay", &SGDOptions::weight_decay),
         field("nesterov", &SGDOptions::nesterov), field("maximize", &SGDOptions::maximize),
         field("foreach", &SGDOptions::foreach)});
  if (cls == "Adamax")
    return build<Adamax, AdamaxOptions>(
        cls, std::move(groups), options,
        {field("lr", &AdamaxOptions::lr), field("betas", &AdamaxOptions::betas), field("eps", &AdamaxOptions::eps),
         field("weight_decay", &AdamaxOptions::weight_decay), field("maximize", &AdamaxOptions::maximize),
         field("foreach", &AdamaxOptions::foreach)});
  if (cls == "Adagrad")
    return build<Adagrad, AdagradOptions>(
        cls, std::move(groups), options,
        {field("lr", &AdagradOptions::lr), field("lr_decay", &AdagradOptions::lr_decay),
         field("weight_decay", &AdagradOptions::weight_decay),
         field("initial_accumulator_value", &AdagradOptions::initial_accumulator_value),
         field("eps", &AdagradOptions::eps), field("maximize", &AdagradOptions::maximize),
         field("foreach", &AdagradOptions::foreach)});
  if (cls == "RMSprop")
    return build<RMSprop, RMSpropOptions>(
        cls, std::move(groups), options,
        {field("lr", &RMSpropOptions::lr), field("alpha", &RMSpropOptions::alpha), field("eps", &RMSpropOptions::eps),
         field("weight_decay", &RMSpropOptions::weight_decay), field("momentum", &RMSpropOptions::momentum),
         field("centered", &RMSpropOptions::centered), field("maximize", &RMSpropOptions::maximize),
         field("foreach", &RMSpropOptions::foreach)});
  if (cls == "Adadelta")
    return build<Adadelta, AdadeltaOptions>(
        cls, std::move(groups), options,
        {field("lr", &AdadeltaOptions::lr), field("rho", &AdadeltaOptions::rho), field("eps", &AdadeltaOptions::eps),
         field("weight_decay", &AdadeltaOptions::weight_decay), field("maximize", &AdadeltaOptions::maximize),
         field("foreach", &AdadeltaOptions::foreach)});
  if (cls == "NAdam")
    return build<NAdam, NAdamOptions>(
        cls, std::move(groups), options,
        {field("lr", &NAdamOptions::lr), field("betas", &NAdamOptions::betas), field("eps", &NAdamOptions::eps),
         field("weight_decay", &NAdamOptions::weight_decay), field("momentum_decay", &NAdamOptions::momentum_decay),
         field("decoupled_weight_decay", &NAdamOptions::decoupled_weight_decay),
         field("maximize", &NAdamOptions::maximize), field("foreach", &NAdamOptions::foreach)});
  if (cls == "RAdam")
    return build<RAdam, RAdamOptions>(
        cls, std::move(groups), options,
        {field("lr", &RAdamOptions::lr), field("betas", &RAdamOptions::betas), field("eps", &RAdamOptions::eps),
         field("weight_decay", &RAdamOptions::weight_decay),
         field("decoupled_weight_decay", &RAdamOptions::decoupled_weight_decay),
         field("maximize", &RAdamOptions::maximize), field("foreach", &RAdamOptions::foreach)});
  if (cls == "Rprop")
    return build<Rprop, RpropOptions>(
        cls, std::move(groups), options,
        {field("lr", &RpropOptions::lr), field("etas", &RpropOptions::etas),
         field("step_sizes", &RpropOptions::step_sizes), field("maximize", &RpropOptions::maximize),
         field("foreach", &RpropOptions::foreach)});
  OPTJIT_ASSERT(cls == "ASGD", "torch_class_name returned an optimizer without a row here: " + cls);
  return build<ASGD, ASGDOptions>(
      cls, std::move(groups), options,
      {field("lr", &ASGDOptions::lr), field("lambd", &ASGDOptions::lambd), field("alpha", &ASGDOptions::alpha),
       field("t0", &ASGDOptions::t0), field("weight_decay", &ASGDOptions::weight_decay),
       field("maximize", &ASGDOptions::maximize), field("foreach", &ASGDOptions::foreach)});
}

} // namespace optjit
