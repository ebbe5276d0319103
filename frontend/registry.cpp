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

namespace optjit {
namespace {

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double scalar(const std::string& optimizer, const std::string& key, const std::vector<double>& v) {
  if (v.size() != 1)
    throw Error(optimizer + " option '" + key + "' takes one value, got " + std::to_string(v.size()));
  return v[0];
}

std::pair<double, double> pair_of(const std::string& optimizer, const std::string& key, const std::vector<double>& v) {
  if (v.size() != 2)
    throw Error(optimizer + " option '" + key + "' takes two values, got " + std::to_string(v.size()));
  return {v[0], v[1]};
}

// Group overrides use the optimizer's option names, with pairs split (betas -> beta1, beta2).
OptionMap group_option_map(const std::string& optimizer, const KeywordOptions& options) {
  OptionMap map;
  for (const auto& [key, value] : options) {
    if (key == "betas") {
      auto [b1, b2] = pair_of(optimizer, key, value);
      map["beta1"] = b1;
      map["beta2"] = b2;
    } else if (key == "foreach") {
      throw Error("foreach is an optimizer-wide option, not a param group option");
    } else {
      map[key] = scalar(optimizer, key, value);
    }
  }
  return map;
}

template <class Options, class Setter>
Options parse_options(const std::string& optimizer, const KeywordOptions& options, Setter set) {
  Options o;
  for (const auto& [key, value] : options)
    if (!set(o, key, value))
      throw Error(optimizer + " has no option '" + key + "'");
  return o;
}

template <class O> bool set_adam_like(O& o, const std::string& name, const std::string& key, const std::vector<double>& v) {
  if (key == "lr") o.lr = scalar(name, key, v);
  else if (key == "betas") o.betas = pair_of(name, key, v);
  else if (key == "eps") o.eps = scalar(name, key, v);
  else if (key == "weight_decay") o.weight_decay = scalar(name, key, v);
  else if (key == "amsgrad") o.amsgrad = scalar(name, key, v) != 0;
  else if (key == "maximize") o.maximize = scalar(name, key, v) != 0;
  else if (key == "foreach") o.foreach = scalar(name, key, v) != 0;
  else return false;
  return true;
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

std::vector<std::string> implemented_optimizers() { return {"Adam", "AdamW", "SGD", "Adamax", "RMSprop", "Adadelta", "Adagrad"}; }

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options) {
  const std::string cls = torch_class_name(name);
  if (cls.empty())
    throw Error("unknown optimizer '" + name + "'");
  for (std::size_t g = 0; g < group_options.size() && g < groups.size(); ++g)
    groups[g].options = group_option_map(cls, group_options[g]);
  if (cls == "Adam") {
    auto o = parse_options<AdamOptions>(cls, options, [&](AdamOptions& o, const std::string& k, const std::vector<double>& v) {
      return set_adam_like(o, "Adam", k, v);
    });
    return std::make_unique<Adam>(std::move(groups), o);
  }
  if (cls == "AdamW") {
    auto o = parse_options<AdamWOptions>(cls, options, [&](AdamWOptions& o, const std::string& k, const std::vector<double>& v) {
      return set_adam_like(o, "AdamW", k, v);
    });
    return std::make_unique<AdamW>(std::move(groups), o);
  }
  if (cls == "SGD") {
    auto o = parse_options<SGDOptions>(cls, options, [&](SGDOptions& o, const std::string& k, const std::vector<double>& v) {
      if (k == "lr") o.lr = scalar("SGD", k, v);
      else if (k == "momentum") o.momentum = scalar("SGD", k, v);
      else if (k == "dampening") o.dampening = scalar("SGD", k, v);
      else if (k == "weight_decay") o.weight_decay = scalar("SGD", k, v);
      else if (k == "nesterov") o.nesterov = scalar("SGD", k, v) != 0;
      else if (k == "maximize") o.maximize = scalar("SGD", k, v) != 0;
      else if (k == "foreach") o.foreach = scalar("SGD", k, v) != 0;
      else return false;
      return true;
    });
    return std::make_unique<SGD>(std::move(groups), o);
  }
  if (cls == "Adamax") {
    auto o = parse_options<AdamaxOptions>(cls, options, [&](AdamaxOptions& o, const std::string& k, const std::vector<double>& v) {
      if (k == "lr") o.lr = scalar(cls, k, v);
      else if (k == "betas") o.betas = pair_of(cls, k, v);
      else if (k == "eps") o.eps = scalar(cls, k, v);
      else if (k == "weight_decay") o.weight_decay = scalar(cls, k, v);
      else if (k == "maximize") o.maximize = scalar(cls, k, v) != 0;
      else if (k == "foreach") o.foreach = scalar(cls, k, v) != 0;
      else return false;
      return true;
    });
    return std::make_unique<Adamax>(std::move(groups), o);
  }
  if (cls == "RMSprop") {
    auto o = parse_options<RMSpropOptions>(cls, options, [&](RMSpropOptions& o, const std::string& k, const std::vector<double>& v) {
      if (k == "lr") o.lr = scalar(cls, k, v);
      else if (k == "alpha") o.alpha = scalar(cls, k, v);
      else if (k == "eps") o.eps = scalar(cls, k, v);
      else if (k == "weight_decay") o.weight_decay = scalar(cls, k, v);
      else if (k == "momentum") o.momentum = scalar(cls, k, v);
      else if (k == "centered") o.centered = scalar(cls, k, v) != 0;
      else if (k == "maximize") o.maximize = scalar(cls, k, v) != 0;
      else if (k == "foreach") o.foreach = scalar(cls, k, v) != 0;
      else return false;
      return true;
    });
    return std::make_unique<RMSprop>(std::move(groups), o);
  }
  if (cls == "Adadelta") {
    auto o = parse_options<AdadeltaOptions>(cls, options, [&](AdadeltaOptions& o, const std::string& k, const std::vector<double>& v) {
      if (k == "lr") o.lr = scalar(cls, k, v);
      else if (k == "rho") o.rho = scalar(cls, k, v);
      else if (k == "eps") o.eps = scalar(cls, k, v);
      else if (k == "weight_decay") o.weight_decay = scalar(cls, k, v);
      else if (k == "maximize") o.maximize = scalar(cls, k, v) != 0;
      else if (k == "foreach") o.foreach = scalar(cls, k, v) != 0;
      else return false;
      return true;
    });
    return std::make_unique<Adadelta>(std::move(groups), o);
  }
  if (cls == "Adagrad") {
    auto o = parse_options<AdagradOptions>(cls, options, [&](AdagradOptions& o, const std::string& k, const std::vector<double>& v) {
      if (k == "lr") o.lr = scalar(cls, k, v);
      else if (k == "lr_decay") o.lr_decay = scalar(cls, k, v);
      else if (k == "weight_decay") o.weight_decay = scalar(cls, k, v);
      else if (k == "initial_accumulator_value") o.initial_accumulator_value = scalar(cls, k, v);
      else if (k == "eps") o.eps = scalar(cls, k, v);
      else if (k == "maximize") o.maximize = scalar(cls, k, v) != 0;
      else if (k == "foreach") o.foreach = scalar(cls, k, v) != 0;
      else return false;
      return true;
    });
    return std::make_unique<Adagrad>(std::move(groups), o);
  }
  std::string implemented;
  for (const std::string& name : implemented_optimizers())
    implemented += (implemented.empty() ? "" : ", ") + name;
  throw Error("optimizer " + cls + " is not implemented in optjit yet (implemented: " + implemented + ")");
}

} // namespace optjit
