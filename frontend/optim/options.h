// Options declared once. Each optimizer lists its options in one X-macro, one line per option with its C++ type,
// torch's keyword name and its default:
//
//   #define OPTJIT_SGD_OPTIONS(X) X(double, lr, 1e-3) X(double, momentum, 0) ... X(bool, maximize, false)
//   OPTJIT_DEFINE_OPTIONS(SGDOptions, OPTJIT_SGD_OPTIONS)
//
// That makes the options struct users fill ({.lr = 0.1, .momentum = 0.9}: those members with their defaults, plus
// `foreach`) and its field list, from which option_map() builds the optimizer's defaults (the group option map:
// pairs split into their group keys, betas -> beta1, beta2) and the registry reads torch's keyword options. An
// optimizer's validate_options() checks the resulting map with torch's messages; state_dict saves it.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/state_dtype.h"

#include <array>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

namespace optjit {

using OptionPair = std::pair<double, double>;
using OptionTriple = std::array<double, 3>;

// torch's pair options and the two group option names each is split into ("betas" -> "beta1", "beta2"); null for
// an option that is not a pair.
const std::pair<std::string, std::string>* pair_option_keys(const std::string& name);
// torch's three-value options (Muon's ns_coefficients) and the group option names each is split into; null for any
// other option.
const std::array<std::string, 3>* triple_option_keys(const std::string& name);

// A choice option given by name (Muon's adjust_lr_fn: "original", "match_rms_adamw", "spectral_unclamped") as the
// value its group option holds: the name's index among the choices. Throws optjit::Error naming the option and its
// choices for an option that takes no names or a name it does not have.
double named_option_value(const std::string& option, const std::string& name);
// Whether `option` is a choice that named_option_value takes names for.
bool option_takes_names(const std::string& option);

// An option given as None where torch allows it (Adafactor's eps1: the machine epsilon of the param's dtype): held as
// this value, which no such option takes otherwise (they are >= 0). Finite, since hyperparameters are checked to be,
// and far from any value a user gives (it was -1, which made an eps1 of -1 pass as None where torch refuses it).
inline constexpr double kOptionNone = -std::numeric_limits<double>::max();

// One option into a group option map, by type (pairs split, flags as 0 or 1).
void put_option(OptionMap& map, const std::string& name, double value);
void put_option(OptionMap& map, const std::string& name, bool value);
void put_option(OptionMap& map, const std::string& name, const OptionPair& value);
void put_option(OptionMap& map, const std::string& name, const OptionTriple& value);

// An options struct as the group option map its optimizer's groups start from (`foreach` is optimizer-wide and
// not in it).
template <class Options> OptionMap option_map(const Options& options) {
  OptionMap map;
  Options::for_each_option([&](const char* name, auto member) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(options.*member)>, std::optional<bool>>)
      put_option(map, name, options.*member);
  });
  return map;
}

// The options of an options struct that are flags (bool), which group option maps hold as 0 or 1.
template <class Options> std::set<std::string> flag_names(const Options&) {
  std::set<std::string> names;
  Options::for_each_option([&](const char* name, auto member) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(std::declval<Options>().*member)>, bool>)
      names.insert(name);
  });
  return names;
}

} // namespace optjit

#define OPTJIT_OPTION_MEMBER(type, name, ...) type name = __VA_ARGS__;
#define OPTJIT_OPTION_FIELD(type, name, ...) visit(#name, &Self::name);

// The options struct `Struct` of the options in `LIST`, plus the group options every optimizer has beyond torch's
// (master_weights: f32 master copies of bf16 and f16 params, in the state as `master_param`; stochastic_rounding:
// bf16 values stored with counter-based stochastic rounding, runtime/stochastic_rounding.h; state_dtype: moments kept
// block-quantized, and state_block_size their blocks, frontend/optim/state_dtype.h) and `foreach`
// (default: false on the CPU, as torch), and for_each_option(visit): visit(torch's name, member pointer) for each,
// `foreach` last.
#define OPTJIT_DEFINE_OPTIONS(Struct, LIST)                                                                            \
  struct Struct {                                                                                                      \
    using Self = Struct;                                                                                               \
    LIST(OPTJIT_OPTION_MEMBER)                                                                                         \
    bool master_weights = false;                                                                                       \
    bool stochastic_rounding = false;                                                                                  \
    ::optjit::StateDtype state_dtype = ::optjit::StateDtype::plain;                                                    \
    double state_block_size = 0;                                                                                       \
    std::optional<bool> foreach;                                                                                       \
    template <class Visit> static void for_each_option(Visit&& visit) {                                                \
      LIST(OPTJIT_OPTION_FIELD)                                                                                        \
      visit("master_weights", &Self::master_weights);                                                                  \
      visit("stochastic_rounding", &Self::stochastic_rounding);                                                        \
      visit("state_dtype", &Self::state_dtype);                                                                        \
      visit("state_block_size", &Self::state_block_size);                                                              \
      visit("foreach", &Self::foreach);                                                                                \
    }                                                                                                                  \
  };
