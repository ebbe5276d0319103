// Shared helpers for the tests: random params, comparing params and state, message checks.
#pragma once

#include "compiler/compiled_step.h"
#include "frontend/optim/optimizer.h"
#include "frontend/optim/registry.h"
#include "runtime/error.h"
#include "skip.h"
#include "tools/model.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

// CHECKs that `step` (a CompiledStep or a compiled step function) launches `expected` kernels, and prints its fused
// plan when it does not: a wrong count is read from the plan.
#define CHECK_KERNELS(step, expected)                                                                                  \
  do {                                                                                                                 \
    auto&& checked_step_ = (step);                                                                                     \
    const int expected_kernels_ = (expected);                                                                          \
    if (checked_step_.kernel_count() != expected_kernels_)                                                             \
      MESSAGE(checked_step_.dump(::optjit::Stage::Fused));                                                             \
    CHECK(checked_step_.kernel_count() == expected_kernels_);                                                          \
  } while (0)

namespace optjit::test {

// A path in the temp directory for a file named `name`, of this process alone: another suite (a sanitizer build
// beside the plain one) may run the same test at the same time on the machine.
inline std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("optjit_" + std::to_string(getpid()) + "_" + name);
}

// Optimizer `name` (torch's name) over one param group, on its foreach (eager or compiled) or forloop path.
inline std::unique_ptr<Optimizer> make_single_group(const std::string& name, std::vector<Tensor> params,
                                                    KeywordOptions options, bool foreach) {
  options["foreach"] = {foreach ? 1.0 : 0.0};
  return make_optimizer(name, {ParamGroupSpec{std::move(params), {}}}, options);
}

// One option set per optimizer, with maximize and weight decay where it has them, torch's names and keywords.
inline const std::vector<std::pair<std::string, KeywordOptions>>& every_optimizer() {
  static const std::vector<std::pair<std::string, KeywordOptions>> options = {
      {"adam", {{"lr", {0.01}}, {"amsgrad", {1}}, {"maximize", {1}}, {"weight_decay", {0.1}}}},
      {"adamw", {{"lr", {0.01}}, {"weight_decay", {0.1}}}},
      {"sgd", {{"lr", {0.1}}, {"momentum", {0.9}}, {"nesterov", {1}}, {"weight_decay", {0.1}}, {"maximize", {1}}}},
      {"adagrad", {{"lr", {0.1}}, {"lr_decay", {0.01}}, {"initial_accumulator_value", {0.1}}, {"weight_decay", {0.1}}}},
      {"adadelta", {{"lr", {0.5}}, {"weight_decay", {0.1}}, {"maximize", {1}}}},
      {"adamax", {{"lr", {0.01}}, {"weight_decay", {0.1}}}},
      {"nadam", {{"lr", {0.01}}, {"weight_decay", {0.1}}, {"decoupled_weight_decay", {1}}}},
      {"radam", {{"lr", {0.01}}, {"weight_decay", {0.1}}}},
      {"rmsprop", {{"lr", {0.01}}, {"centered", {1}}, {"momentum", {0.5}}, {"weight_decay", {0.1}}}},
      {"rprop", {{"lr", {0.01}}, {"maximize", {1}}}},
      {"asgd", {{"lr", {0.01}}, {"t0", {2}}, {"weight_decay", {0.1}}}},
  };
  return options;
}

enum class Mode { Forloop, Eager, Compiled };

// An optimizer over its own copies of some params, stepped in one mode.
struct Run {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
  std::optional<CompiledStep> compiled;

  // Over copies of `initial`.
  Run(const std::string& name, const KeywordOptions& options, const std::vector<Tensor>& initial, Mode mode)
      : Run(name, options, mode, copy_params(initial)) {}
  // Over `params` themselves (their layouts and memory kept).
  Run(const std::string& name, const KeywordOptions& options, Mode mode, std::vector<Tensor> params_in_place)
      : params(std::move(params_in_place)) {
    KeywordOptions o = options;
    o["foreach"] = {mode == Mode::Forloop ? 0.0 : 1.0};
    opt = make_optimizer(name, {ParamGroupSpec{params, {}}}, o);
    if (mode == Mode::Compiled)
      compiled.emplace(compile(*opt));
  }
  void step() {
    if (compiled)
      (*compiled)();
    else
      opt->step();
  }
};

// Largest |a - b| / (atol + rtol |b|) over two tensors' elements (<= 1 passes); NaNs must match.
inline double scaled_error(const Tensor& a, const Tensor& b, double rtol, double atol) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0;
  const std::vector<double> u = a.real_view().to_vector(), w = b.real_view().to_vector();
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (std::isnan(u[i]) || std::isnan(w[i])) {
      worst = std::max(worst, std::isnan(u[i]) && std::isnan(w[i]) ? 0.0 : INFINITY);
      continue;
    }
    worst = std::max(worst, std::fabs(u[i] - w[i]) / (atol + rtol * std::fabs(w[i])));
  }
  return worst;
}

// Params and every visible state entry of two optimizers agree within (rtol, atol), and the state keys match.
inline void check_same_trajectory(const std::vector<Tensor>& a, const Optimizer& oa, const std::vector<Tensor>& b,
                                  const Optimizer& ob, double rtol, double atol, const std::string& what) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(what << ", param " << i);
    CHECK(scaled_error(a[i], b[i], rtol, atol) <= 1.0);
    ParamState sa = oa.visible_state(a[i]), sb = ob.visible_state(b[i]);
    REQUIRE(sa.size() == sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k) {
      INFO("state " << sa[k].first);
      CHECK(sa[k].first == sb[k].first);
      CHECK(scaled_error(sa[k].second, sb[k].second, rtol, atol) <= 1.0);
    }
  }
}

// Every value of params, their state (keys included) and the groups' options, bit for bit (NaN equals NaN), to
// check that nothing changed.
struct Snapshot {
  std::vector<std::vector<uint64_t>> bits;
  std::vector<std::string> keys;
  Snapshot(const std::vector<Tensor>& params, const Optimizer& opt) {
    auto add = [&](const std::vector<double>& values) {
      std::vector<uint64_t>& out = bits.emplace_back();
      for (double v : values)
        out.push_back(std::bit_cast<uint64_t>(v));
    };
    for (const Tensor& p : params) {
      add(p.real_view().to_vector());
      for (const auto& [key, t] : opt.visible_state(p)) {
        keys.push_back(key);
        add(t.real_view().to_vector());
      }
    }
    for (const ParamGroup& g : opt.param_groups())
      for (const auto& [name, value] : g.options) {
        keys.push_back(name);
        add({value});
      }
  }
  bool operator==(const Snapshot&) const = default;
};

// Runs `fn`, which must throw optjit::Error whose message is exactly `message`.
template <class Fn> void check_error(Fn&& fn, const std::string& message) {
  try {
    fn();
    FAIL("no error, expected: " << message);
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == message);
  }
}

// Runs `fn`, which must throw optjit::Error whose message contains `part`.
template <class Fn> void check_error_contains(Fn&& fn, const std::string& part) {
  try {
    fn();
    FAIL("no error, expected one containing: " << part);
  } catch (const Error& e) {
    const std::string message = e.what();
    INFO("message: " << message);
    CHECK(message.find(part) != std::string::npos);
  }
}

} // namespace optjit::test
