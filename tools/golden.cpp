#include "tools/golden.h"
#include "compiler/compiled_step.h"
#include "frontend/optim/json_text.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "runtime/error.h"
#include "tools/golden_scheduler.h"
#include "tools/text_file.h"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace optjit {
namespace {

using json = nlohmann::json;

KeywordOptions keyword_options(const json& object) {
  KeywordOptions options;
  for (const auto& [key, value] : object.items()) {
    if (value.is_null())
      continue;
    if (value.is_boolean())
      options[key] = {value.get<bool>() ? 1.0 : 0.0};
    else if (value.is_number())
      options[key] = {value.get<double>()};
    else if (value.is_string()) // a choice by name (Muon's adjust_lr_fn)
      options[key] = {named_option_value(key, value.get<std::string>())};
    else if (value.is_array()) { // a None element (Adafactor's eps1) is kOptionNone
      std::vector<double>& values = options[key];
      for (const json& element : value)
        values.push_back(element.is_null() ? kOptionNone : element.get<double>());
    } else
      throw Error("option '" + key + "' has a value optjit cannot read: " + json_value_text(value));
  }
  return options;
}

std::string format(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

struct Checker {
  double rtol, atol;
  std::string failure;
  // Low-precision cases also bound how many stored values differ at all (FORMAT_NEXT's mismatch budget): counted
  // over params and per-element state at every step.
  int64_t counted = 0, mismatched = 0;

  // values(), also counting the values that are not exactly the expected ones.
  bool stored_values(const std::string& where, const std::vector<double>& got, const json& expected) {
    if (!values(where, got, expected))
      return false;
    for (std::size_t i = 0; i < got.size(); ++i)
      mismatched += got[i] != expected[i].get<double>() ? 1 : 0;
    counted += static_cast<int64_t>(got.size());
    return true;
  }

  bool close(double got, double expected) const {
    return std::fabs(got - expected) <= atol + rtol * std::fabs(expected);
  }

  bool values(const std::string& where, const std::vector<double>& got, const json& expected) {
    if (got.size() != expected.size()) {
      failure = where + ": got " + std::to_string(got.size()) + " values, expected " + std::to_string(expected.size());
      return false;
    }
    for (std::size_t i = 0; i < got.size(); ++i) {
      double e = expected[i].get<double>();
      if (!close(got[i], e)) {
        failure = where + ", index " + std::to_string(i) + ", got " + format(got[i]) + ", expected " + format(e);
        return false;
      }
    }
    return true;
  }
};

} // namespace

ReplayMode parse_replay_mode(const std::string& text) {
  if (text == "forloop")
    return ReplayMode::Forloop;
  if (text == "eager")
    return ReplayMode::Eager;
  if (text == "compiled")
    return ReplayMode::Compiled;
  throw Error("unknown replay mode '" + text + "': expected forloop, eager, compiled or all");
}

std::string replay_mode_name(ReplayMode mode) {
  return mode == ReplayMode::Forloop ? "forloop" : mode == ReplayMode::Eager ? "eager" : "compiled";
}

std::vector<std::filesystem::path> collect_golden_files(const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> files;
  // std::filesystem's errors (a directory that cannot be read) become optjit's here, through error codes.
  for (const std::string& p : paths) {
    std::error_code error;
    if (std::filesystem::is_directory(p, error)) {
      for (auto it = std::filesystem::directory_iterator(p, error);
           !error && it != std::filesystem::directory_iterator(); it.increment(error))
        if (it->path().extension() == ".json")
          files.push_back(it->path());
      if (error)
        throw Error(fmt::format("cannot list the golden cases in {}: {}", p, error.message()));
    } else if (std::filesystem::exists(p, error)) {
      files.emplace_back(p);
    } else {
      throw Error("no golden case or directory at " + p + (error ? ": " + error.message() : ""));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A case's tensor of `shape` from its flat data; a complex one's data is its interleaved (re, im) pairs
// (FORMAT_NEXT: torch's view_as_real, flattened).
static Tensor case_tensor(const Shape& shape, const std::vector<double>& data, Dtype dtype) {
  if (!is_complex(dtype))
    return Tensor::from_values(shape, data, dtype);
  Shape components = shape;
  components.push_back(2);
  const Tensor values = Tensor::from_values(components, data, component_dtype(dtype)); // counts before allocating
  Tensor t = Tensor::empty(shape, dtype);
  t.view_as_real().copy_from(values);
  return t;
}

ReplayResult replay_golden_file(const std::filesystem::path& file, ReplayMode mode, Device device) {
  std::string text;
  try {
    text = read_text_file(file, "golden case", kMaxGoldenCaseBytes, "kMaxGoldenCaseBytes");
  } catch (const Error& e) {
    return ReplayResult{file.stem().string(), false, e.what(), {}};
  }
  return replay_golden_text(text, file.stem().string(), mode, device);
}

ReplayResult replay_golden_text(std::string_view text, const std::string& name, ReplayMode mode, Device device) {
  ReplayResult result;
  result.name = name;
  try {
    json c = json::parse(text);
    result.name = c.at("name").get<std::string>();
    const Dtype dtype = parse_dtype(c.at("dtype").get<std::string>());
    std::vector<Tensor> params;
    for (const json& p : c.at("params"))
      params.push_back(
          case_tensor(json_shape(p.at("shape"), "a param's shape"), p.at("data").get<std::vector<double>>(), dtype)
              .to(device));

    std::vector<ParamGroupSpec> groups;
    std::vector<KeywordOptions> group_options;
    if (c.contains("param_groups") && !c["param_groups"].is_null()) {
      for (const json& g : c["param_groups"]) {
        ParamGroupSpec spec;
        const json& indices = g.at("params");
        if (!indices.is_array())
          throw Error("a param group's params is " + json_value_text(indices) + ", not an array of param indices");
        for (const json& index : indices)
          spec.params.push_back(params[static_cast<std::size_t>(
              json_integer(index, "a param group's param index", 0, static_cast<int64_t>(params.size()) - 1))]);
        groups.push_back(std::move(spec));
        group_options.push_back(keyword_options(g.value("options", json::object())));
      }
    } else {
      groups = one_param_group(params); // torch's Adam(params): an empty list is its error
    }
    KeywordOptions options = keyword_options(c.at("options"));
    options["foreach"] = {mode == ReplayMode::Forloop ? 0.0 : 1.0};
    auto opt = make_optimizer(c.at("optimizer").get<std::string>(), std::move(groups), options, group_options);
    std::optional<CompiledStep> compiled;
    std::optional<GoldenScheduler> scheduler; // right after the optimizer, as the case was recorded
    if (!c.at("scheduler").is_null())
      scheduler.emplace(c["scheduler"], *opt);
    // Gradient scaling (FORMAT_NEXT): the grads are scaled by grad_scale, and a step whose found_inf is 1 is skipped.
    Tensor found_inf;
    if (c.contains("grad_scale")) {
      found_inf = Tensor::zeros({1}, Dtype::f32, device);
      opt->set_grad_scaling(Tensor::full({1}, c["grad_scale"].get<double>(), Dtype::f32, device), found_inf);
    }
    // Grad-norm clipping (FORMAT_NEXT): clip_grad_norm_(params, max_norm, norm_type) before every step, fused.
    if (c.contains("clip_grad_norm")) {
      const json& clip = c["clip_grad_norm"];
      const json& norm_type = clip.at("norm_type");
      if (!(norm_type.is_number() || norm_type == "inf"))
        throw Error("clip_grad_norm's norm_type is " + json_value_text(norm_type) + ", not a number or \"inf\"");
      opt->set_grad_clipping(Optimizer::GradClipping{
          clip.at("max_norm").get<double>(),
          norm_type.is_number() ? norm_type.get<double>() : std::numeric_limits<double>::infinity(), false});
    }
    if (mode == ReplayMode::Compiled)
      compiled.emplace(compile(*opt));

    Checker check{c.at("rtol").get<double>(), c.at("atol").get<double>(), {}};
    if (!(check.rtol >= 0) || !(check.atol >= 0))
      throw Error(fmt::format("the case's tolerances are rtol {} and atol {}: tolerances are numbers >= 0", check.rtol,
                              check.atol));
    // A case may check its state more tightly than its params (Muon's: the momentum does not depend on the bf16
    // iterations, the params do): state_rtol and state_atol, the case's own when absent.
    Checker state_tolerances{c.value("state_rtol", check.rtol), c.value("state_atol", check.atol), {}};
    if (!(state_tolerances.rtol >= 0) || !(state_tolerances.atol >= 0))
      throw Error(fmt::format("the case's state tolerances are rtol {} and atol {}: tolerances are numbers >= 0",
                              state_tolerances.rtol, state_tolerances.atol));
    const bool own_state_tolerances = c.contains("state_rtol") || c.contains("state_atol");
    Checker& state_check = own_state_tolerances ? state_tolerances : check;
    const json& steps = c.at("steps");
    if (!steps.is_array() || steps.empty())
      throw Error("the case has no steps: it would check nothing");
    for (std::size_t t = 0; t < steps.size(); ++t) {
      const json& rec = steps[t];
      const std::string at_step = "step " + std::to_string(t);
      for (const char* list : {"grads", "expect_params", "expect_state"})
        if (!rec.at(list).is_array() || rec.at(list).size() != params.size())
          throw Error(fmt::format("{}: '{}' has {} entries for {} params", at_step, list,
                                  rec.at(list).is_array() ? rec.at(list).size() : 0, params.size()));
      std::vector<double> lrs;
      for (const ParamGroup& g : opt->param_groups())
        lrs.push_back(g.get("lr"));
      if (!check.values(at_step + ", lr", lrs, rec.at("lr")))
        throw Error(check.failure);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const json& g = rec.at("grads")[i];
        if (g.is_null())
          params[i].reset_grad();
        else
          params[i].set_grad(case_tensor(params[i].shape(), g.get<std::vector<double>>(), dtype).to(device));
      }
      if (found_inf.defined())
        found_inf.fill(rec.at("found_inf").get<double>());
      if (compiled)
        (*compiled)();
      else
        opt->step();
      if (opt->grad_clipping() &&
          !check.values(at_step + ", total_norm", {opt->total_grad_norm()}, json::array({rec.at("total_norm")})))
        throw Error(check.failure);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const std::string where = at_step + ", param " + std::to_string(i);
        if (!check.stored_values(where, params[i].real_view().to_vector(), rec.at("expect_params")[i]))
          throw Error(check.failure);
        const json& expected_state = rec.at("expect_state")[i];
        ParamState state = opt->visible_state(params[i]);
        std::set<std::string> got_keys, expected_keys;
        for (const auto& entry : state)
          got_keys.insert(entry.first);
        for (const auto& [key, value] : expected_state.items())
          expected_keys.insert(key);
        if (got_keys != expected_keys) {
          std::string got_list, expected_list;
          for (const auto& k : got_keys)
            got_list += " " + k;
          for (const auto& k : expected_keys)
            expected_list += " " + k;
          throw Error(where + ": state keys {" + got_list + " } expected {" + expected_list + " }");
        }
        for (const auto& [key, tensor] : state) {
          const json& e = expected_state.at(key);
          if (key == "step") {
            if (tensor.item() != e.get<double>())
              throw Error(where + " step: got " + format(tensor.item()) + ", expected " + format(e.get<double>()));
          } else if (e.is_number()) {
            if (!state_check.values(where + " " + key, {tensor.item()}, json::array({e})))
              throw Error(state_check.failure);
          } else if (!state_check.stored_values(where + " " + key, tensor.real_view().to_vector(), e)) {
            throw Error(state_check.failure);
          }
        }
      }
      if (scheduler)
        scheduler->step_after(t);
    }
    if (c.contains("max_mismatch_fraction")) {
      const double allowed = c["max_mismatch_fraction"].get<double>();
      if (static_cast<double>(check.mismatched) > allowed * static_cast<double>(check.counted))
        throw Error(fmt::format("{} of {} stored values differ from the expected ones, more than the case's "
                                "max_mismatch_fraction {}",
                                check.mismatched, check.counted, allowed));
    }
    if (compiled)
      result.metrics = compiled->metrics();
    result.passed = true;
  } catch (const json::exception& e) { // nlohmann's errors name the JSON rule; say that the case broke the format
    result.passed = false;
    result.failure = std::string("the case does not follow the golden format (tests/golden/README.md): ") + e.what();
  } catch (const std::exception& e) {
    result.passed = false;
    result.failure = e.what();
  }
  return result;
}

} // namespace optjit
