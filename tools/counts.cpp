// optjit counts: kernels per step for every configuration PyTorch's OptimizerInfo lists (CPU rows, float lr),
// compiled on the 4-param model of PyTorch's compiled-optimizer tests, beside Inductor's CPU counts.
#include "compiler/compiled_step.h"
#include "frontend/optim/state_dtype.h"
#include "tools/commands.h"
#include "tools/count_configs.h"
#include "tools/model.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <limits>
#include <set>

namespace optjit {

std::vector<CountConfig> torch_optim_configs() {
  std::vector<CountConfig> configs;
  for (const char* adam : {"adam", "adamw"})
    for (const KeywordOptions& o : std::vector<KeywordOptions>{{},
                                                               {{"lr", {0.01}}},
                                                               {{"weight_decay", {0.1}}},
                                                               {{"weight_decay", {0.1}}, {"maximize", {1}}},
                                                               {{"weight_decay", {0.1}}, {"amsgrad", {1}}}})
      configs.push_back({adam, o});
  for (const KeywordOptions& o :
       std::vector<KeywordOptions>{{},
                                   {{"lr", {0.01}}},
                                   {{"weight_decay", {0.5}}},
                                   {{"momentum", {0.9}}},
                                   {{"weight_decay", {0.1}}, {"maximize", {1}}},
                                   {{"momentum", {0.9}}, {"dampening", {0.5}}},
                                   {{"momentum", {0.9}}, {"weight_decay", {0.1}}},
                                   {{"momentum", {0.9}}, {"nesterov", {1}}, {"weight_decay", {0.1}}}})
    configs.push_back({"sgd", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{{},
                                                             {{"lr", {0.1}}},
                                                             {{"weight_decay", {0.1}}},
                                                             {{"maximize", {1}}},
                                                             {{"weight_decay", {0.1}}, {"maximize", {1}}}})
    configs.push_back({"adamax", o});
  for (const KeywordOptions& o :
       std::vector<KeywordOptions>{{},
                                   {{"weight_decay", {0.1}}},
                                   {{"weight_decay", {0.1}}, {"maximize", {1}}},
                                   {{"lr", {0.1}}},
                                   {{"initial_accumulator_value", {0.1}}, {"weight_decay", {0.1}}},
                                   {{"lr", {0.1}}, {"lr_decay", {0.5}}, {"weight_decay", {0.1}}}})
    configs.push_back({"adagrad", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{
           {},
           {{"lr", {1e-3}}},
           {{"weight_decay", {0.1}}},
           {{"maximize", {1}}},
           {{"weight_decay", {0.1}}, {"centered", {1}}},
           {{"maximize", {1}}, {"weight_decay", {0.1}}},
           {{"weight_decay", {0.1}}, {"centered", {1}}, {"momentum", {0.1}}},
           {{"weight_decay", {0.1}}, {"centered", {1}}, {"momentum", {0.1}}, {"maximize", {1}}}})
    configs.push_back({"rmsprop", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{{},
                                                             {{"lr", {0.01}}},
                                                             {{"weight_decay", {0.1}}},
                                                             {{"maximize", {1}}},
                                                             {{"weight_decay", {0.1}}, {"maximize", {1}}},
                                                             {{"rho", {0.95}}, {"weight_decay", {0.9}}}})
    configs.push_back({"adadelta", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{
           {},
           {{"lr", {1e-3}}},
           {{"momentum_decay", {6e-3}}},
           {{"weight_decay", {0.1}}},
           {{"weight_decay", {0.1}}, {"momentum_decay", {6e-3}}},
           {{"weight_decay", {0.1}}, {"momentum_decay", {6e-3}}, {"decoupled_weight_decay", {1}}},
           {{"weight_decay", {0.1}}, {"maximize", {1}}}})
    configs.push_back({"nadam", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{{},
                                                             {{"lr", {2e-3}}},
                                                             {{"eps", {1e-6}}},
                                                             {{"weight_decay", {0.1}}},
                                                             {{"weight_decay", {0.1}}, {"decoupled_weight_decay", {1}}},
                                                             {{"weight_decay", {0.1}}, {"maximize", {1}}}})
    configs.push_back({"radam", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{
           {}, {{"lr", {2e-4}}}, {{"etas", {0.5, 1.5}}}, {{"step_sizes", {2e-6, 100}}}, {{"maximize", {1}}}})
    configs.push_back({"rprop", o});
  for (const KeywordOptions& o : std::vector<KeywordOptions>{{},
                                                             {{"lambd", {0.1}}},
                                                             {{"lr", {0.02}}},
                                                             {{"t0", {100}}},
                                                             {{"maximize", {1}}},
                                                             {{"weight_decay", {0.1}}},
                                                             {{"weight_decay", {0.1}}, {"maximize", {1}}}})
    configs.push_back({"asgd", o});
  return configs;
}

std::string config_name(const KeywordOptions& options) {
  std::string name;
  for (const auto& [key, values] : options) {
    name += (name.empty() ? "" : ",") + key;
    if (const std::optional<StateDtype> dtype =
            key == "state_dtype" && values.size() == 1 ? state_dtype_of(values[0]) : std::nullopt)
      name += std::string("=") + state_dtype_name(*dtype); // a choice: its name says which
  }
  return name.empty() ? "default" : name;
}

std::vector<CountConfig> own_optimizer_configs() {
  return {{"lion", {}},
          {"lion", {{"weight_decay", {0.1}}}},
          {"lion", {{"maximize", {1}}, {"weight_decay", {0.1}}}},
          {"lion", {{"betas", {0.95, 0.98}}}}};
}

std::vector<CountConfig> matrix_configs() {
  CountConfig muon{"muon", {}};
  muon.matrices_only = true;
  std::vector<CountConfig> configs{muon};
  for (const KeywordOptions& o : std::vector<KeywordOptions>{{{"nesterov", {0}}}, {{"ns_steps", {1}}}})
    configs.push_back({"muon", o, 0, true});
  return configs;
}

std::vector<CountConfig> reducing_configs() {
  const double inf = std::numeric_limits<double>::infinity();
  return {{"lamb", {}},
          {"lamb", {{"weight_decay", {0.1}}}},
          {"lars", {}},
          {"lars", {{"weight_decay", {0.1}}, {"exclude_1d", {1}}}},
          {"adam", {}, 2.0},
          {"adam", {{"amsgrad", {1}}}, inf},
          {"adamw", {}, 2.0},
          {"sgd", {{"momentum", {0.9}}}, 2.0},
          {"lion", {}, 2.0},
          {"lamb", {}, 2.0},
          // Adafactor: the 10x10 params factored (rows and columns), the 10s not; two buckets.
          {"adafactor", {}},
          {"adafactor", {{"weight_decay", {0.1}}, {"maximize", {1}}}},
          {"adafactor", {}, 2.0}};
}

// Every CPU run is Inductor's "singletensor" case (8 kernels) unless an override row names the configuration.
namespace {

// The optimizers of torch.optim that torch's compiled-optimizer tests count (Adafactor is not one of them).
const std::set<std::string>& counted_torch_optimizers() {
  static const std::set<std::string> names = {"adam",    "adamw",    "sgd",     "nadam", "radam", "adamax",
                                              "adagrad", "adadelta", "rmsprop", "rprop", "asgd"};
  return names;
}

// Why a configuration has no Inductor count: a short label for the table and the reason for the JSON (beside a
// null count). optjit's own optimizers (and plugins') are not in torch.optim; Adafactor is, but torch.compile cannot
// compile its single-tensor step whole (torch 2.15, CPU, measured: a graph break, or Inductor's failure when the
// break is avoided).
struct InductorMissing {
  const char* label;
  std::string reason;
};
InductorMissing inductor_missing(const CountConfig& c) {
  if (c.optimizer == "adafactor")
    return {"- (no one graph)",
            "single-tensor Adafactor does not compile as one graph: torch.compile breaks it at step_t.item(), and "
            "with capture_scalar_outputs=True Inductor fails (GuardOnDataDependentSymNode in lerp's decomposition)"};
  if (c.optimizer == "muon") // torch.optim.Muon is in torch 2.15
    return {"- (not measured)", "not measured"};
  if (!counted_torch_optimizers().count(c.optimizer))
    return {"- (not in torch)", "not in torch.optim"};
  return {"- (not measured)", "not measured"};
}

} // namespace

std::optional<int> inductor_cpu_kernels(const CountConfig& c, bool foreach) {
  if (c.optimizer == "adafactor") {
    // One graph only with capture_scalar_outputs=True, and only with foreach: 50 kernels, 55 clipped first
    // (tools/inductor_clip_counts.py, torch 2.15.0, CPU).
    if (!foreach || (c.clip_norm_type != 0 && c.clip_norm_type != 2.0))
      return std::nullopt;
    return c.clip_norm_type == 2.0 ? 55 : 50;
  }
  if (!counted_torch_optimizers().count(c.optimizer))
    return std::nullopt;
  auto has = [&](const char* key) { return c.options.count(key) > 0; };
  if (c.clip_norm_type != 0) {
    // clip_grad_norm_ then the step, compiled together: tools/inductor_clip_counts.py measured these four on torch
    // 2.15.0 (CPU), each 21 kernels, 17 with foreach. Other clipped configurations are not measured.
    const bool measured = (c.optimizer == "adam" && (c.options.empty() || has("amsgrad"))) ||
                          (c.optimizer == "adamw" && c.options.empty()) ||
                          (c.optimizer == "sgd" && c.options.size() == 1 && has("momentum"));
    if (!measured)
      return std::nullopt;
    return foreach ? 17 : 21;
  }
  if (c.optimizer == "sgd") {
    if (c.options.empty())
      return 4;
    if (c.options.size() == 2 && has("weight_decay") && has("maximize"))
      return 4;
    if (foreach && has("momentum") && has("weight_decay"))
      return 16;
  }
  if (foreach && has("weight_decay") && (c.optimizer == "rmsprop" || c.optimizer == "adadelta"))
    return 12;
  if (foreach && has("weight_decay") && has("momentum_decay") && c.optimizer == "nadam")
    return 20;
  return 8;
}

int run_counts(bool json_output) {
  nlohmann::json rows = nlohmann::json::array();
  if (!json_output)
    std::printf("kernels per step on two Linear(10, 10) (params 10x10, 10, 10x10, 10; Muon the two 10x10), f32, "
                "cpu; matrix products (library calls) apart\n\n%-8s %-50s %-8s %8s %9s %17s\n",
                "optimizer", "config", "foreach", "optjit", "products", "inductor (cpu)");
  std::vector<CountConfig> configs = torch_optim_configs();
  for (const CountConfig& c : own_optimizer_configs())
    configs.push_back(c);
  for (const CountConfig& c : reducing_configs())
    configs.push_back(c);
  for (const CountConfig& c : matrix_configs())
    configs.push_back(c);
  for (const std::string& name : user_optimizers()) // registered by the program or a plugin: their defaults
    configs.push_back({name, {}});
  for (const CountConfig& c : configs) {
    for (bool foreach : {false, true}) {
      std::vector<Tensor> params = random_params(two_linear_shapes(), Dtype::f32, 0);
      if (c.matrices_only)
        std::erase_if(params, [](const Tensor& p) { return p.dim() != 2; });
      KeywordOptions options = c.options;
      options["foreach"] = {foreach ? 1.0 : 0.0};
      auto opt = make_optimizer(c.optimizer, {ParamGroupSpec{params, {}}}, options);
      if (c.clip_norm_type != 0)
        opt->set_grad_clipping(Optimizer::GradClipping{1.0, c.clip_norm_type, false});
      CompiledStep step = compile(*opt);
      const int kernels = step.kernel_count(), products = step.library_call_count();
      const std::optional<int> inductor_count = inductor_cpu_kernels(c, foreach);
      const nlohmann::json inductor = inductor_count ? nlohmann::json(*inductor_count) : nlohmann::json();
      std::string config = config_name(c.options);
      if (c.clip_norm_type != 0)
        config += c.clip_norm_type == 2.0 ? " + clip_grad_norm(2)" : " + clip_grad_norm(inf)";
      rows.push_back({{"optimizer", c.optimizer},
                      {"config", config},
                      {"foreach", foreach},
                      {"kernels", kernels},
                      {"library_calls", products},
                      {"inductor_kernels", inductor}});
      const InductorMissing missing = inductor_missing(c);
      if (!inductor_count)
        rows.back()["inductor_missing"] = missing.reason;
      if (!json_output)
        std::printf("%-9s %-50s %-8s %8d %9d %17s\n", c.optimizer.c_str(), config.c_str(), foreach ? "true" : "false",
                    kernels, products, inductor_count ? inductor.dump().c_str() : missing.label);
    }
  }
  if (json_output)
    std::printf("%s\n", rows.dump(1).c_str());
  return 0;
}

} // namespace optjit
