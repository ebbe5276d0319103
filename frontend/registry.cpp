#include "frontend/registry.h"
#include "frontend/adadelta.h"
#include "frontend/adagrad.h"
#include "frontend/adam.h"
#include "frontend/adamax.h"
#include "frontend/rmsprop.h"
#include "frontend/sgd.h"
#include "runtime/error.h"

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

// Group overrides use the optimizer's option names, with pairs split (betas -> beta1, beta2).
OptionMap group_option_map(const std::string& cls, const KeywordOptions& options) {
  OptionMap map;
  for (const auto& [key, value] : options) {
    if (key == "betas") {
      require_count(cls, key, value, 2);
      map["beta1"] = value[0];
      map["beta2"] = value[1];
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

// torch's class name for `name` in any case; empty when torch.optim has no such optimizer.
std::string torch_class_name(const std::string& name) {
  for (const char* known : {"Adam", "AdamW", "SGD", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop",
                            "Rprop", "ASGD"})
    if (lower(known) == lower(name))
      return known;
  return {};
}

} // namespace

std::vector<std::string> implemented_optimizers() {
  return {"Adam", "AdamW", "SGD", "Adamax", "Adagrad", "RMSprop", "Adadelta"};
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options) {
  const std::string cls = torch_class_name(name);
  if (cls.empty())
    throw Error("unknown optimizer '" + name + "'");
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
  std::string implemented;
  for (const std::string& known : implemented_optimizers())
    implemented += (implemented.empty() ? "" : ", ") + known;
  throw Error("optimizer " + cls + " is not implemented in optjit yet (implemented: " + implemented + ")");
}

} // namespace optjit
