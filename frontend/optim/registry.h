// Optimizers by name, with options by torch's keyword names: torch.optim's eleven under torch's class names,
// optjit's own (Lion), and those a user registers (register_optimizer), for make_optimizer, the CLI, golden replay
// and state files. The built-ins are made by the same factories (optimizer_factory) a user registers.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"
#include "runtime/error.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace optjit {

// Keyword options as torch takes them: a number, a flag (0 or 1) or a pair (betas, etas, step_sizes).
using KeywordOptions = std::map<std::string, std::vector<double>>;

// Makes an optimizer of one class over `groups`, `options` applying to every group.
using OptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroupSpec> groups, const KeywordOptions& options)>;

// Makes `name` (a registered name, any case) over `groups`, `options` applying to every group and each group's
// own options overriding them. Throws optjit::Error for an unknown optimizer, an unknown option, or an invalid
// value (with torch's message).
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<ParamGroupSpec> groups,
                                          const KeywordOptions& options,
                                          const std::vector<KeywordOptions>& group_options = {});

// The optimizers optjit knows, by name: the built-ins, then the registered ones in the order they were registered.
std::vector<std::string> implemented_optimizers();

// The optimizers registered with register_optimizer (by a program or a CLI plugin), in the order they were.
std::vector<std::string> user_optimizers();

// Registers an optimizer class under `name` (unique in any case), so that make_optimizer, golden replay and state
// files know it as they know the built-ins. Thread-safe. Throws optjit::Error when a known optimizer has the name.
void register_optimizer(const std::string& name, OptimizerFactory factory);

// One keyword's values into an options member, by the member's type: a number, a flag (0 or 1: 0.5 or NaN is
// refused, never coerced), a pair (two values). Throws optjit::Error naming `cls` and `key`.
void keyword_value(double& member, const std::string& cls, const std::string& key, const std::vector<double>& values);
void keyword_value(bool& member, const std::string& cls, const std::string& key, const std::vector<double>& values);
void keyword_value(std::optional<bool>& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values);
void keyword_value(OptionPair& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values);
void keyword_value(OptionTriple& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values);

// An options struct (declared with OPTJIT_DEFINE_OPTIONS) from keyword options, each of which must be one of its
// options.
template <class Options> Options options_from_keywords(const std::string& cls, const KeywordOptions& keywords) {
  Options options;
  for (const auto& [key, values] : keywords) {
    bool known = false;
    Options::for_each_option([&](const char* name, auto member) {
      if (key == name) {
        keyword_value(options.*member, cls, key, values);
        known = true;
      }
    });
    if (!known)
      throw Error(cls + " has no option '" + key + "'");
  }
  return options;
}

// The factory of an optimizer class whose options struct is `Opt::Options` and whose constructor takes (groups,
// options), as every built-in's does.
template <class Opt> OptimizerFactory optimizer_factory(const std::string& name) {
  return [name](std::vector<ParamGroupSpec> groups, const KeywordOptions& options) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Opt>(std::move(groups), options_from_keywords<typename Opt::Options>(name, options));
  };
}

// register_optimizer for such a class: register_optimizer<Lion>("Lion").
template <class Opt> void register_optimizer(const std::string& name) {
  register_optimizer(name, optimizer_factory<Opt>(name));
}

} // namespace optjit
