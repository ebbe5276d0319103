// compile_step: the step function runs as an optimizer whose algorithm is the function, whose options are the
// hyperparameters and whose state is the caller's lists, adopted in place (Optimizer::adopt_state). The driver,
// guards, bindings and kernel cache are the optimizers' own.
#include "frontend/optim/step_function.h"
#include "ir/builder.h"
#include "runtime/error.h"
#include "runtime/shared_memory.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <tuple>

namespace optjit {
namespace {

// The group options every optimizer's structure reads, off for a step function.
const std::set<std::string> kFlags = {"master_weights", "stochastic_rounding"};

class FunctionOptimizer : public Optimizer {
public:
  FunctionOptimizer(std::string name, StepFunctionBody body, const StepLists& lists, OptionMap defaults)
      : Optimizer(std::move(name), std::move(defaults), /*foreach=*/true, kFlags), body_(std::move(body)) {
    for (const auto& [key, value] : lists.hypers)
      hypers_.push_back(key);
    for (const auto& [key, tensors] : lists.state)
      specs_.push_back({.name = key});
    for (const auto& [key, tensors] : lists.scalars)
      specs_.push_back({.name = key, .kind = StateKind::Scalar});
    for (const auto& [key, tensors] : lists.rows)
      specs_.push_back({.name = key, .kind = StateKind::Rows});
    for (const auto& [key, tensors] : lists.cols)
      specs_.push_back({.name = key, .kind = StateKind::Cols});
    has_axis_state_ = !lists.rows.empty() || !lists.cols.empty();
    add_param_groups({ParamGroupSpec{lists.params, {}}});
  }

  Structure structure(const ParamGroup&) const override { return {}; }
  std::vector<StateSpec> state_specs(const Structure&) const override { return specs_; }
  std::vector<std::string> hyper_names() const override { return hypers_; }
  void trace(Tracer& tracer, const Structure&) const override {
    body_(tracer);
    stores_grads_ = stores_grads_ || tracer.builder().stores_to("grad");
    for (ValueId id = 0; id < tracer.builder().size(); ++id)
      if (const Op op = tracer.builder().node(id).op; op == Op::row_sum || op == Op::col_sum)
        sums_axes_ = true;
  }
  // Rows and columns state, or a trace that sums along rows or columns (known once the step is compiled, before it
  // binds): element order decides which row an element is in.
  bool walks_rows_and_columns(int64_t) const override { return has_axis_state_ || sums_axes_; }
  void validate_options(const OptionMap&) const override {}
  bool requires_finite_hyperparameters() const override { return false; } // any number, as torch's ops take
  bool writes_grads() const override { return Optimizer::writes_grads() || stores_grads_; }

private:
  StepFunctionBody body_;
  mutable bool stores_grads_ = false; // a trace stored to the grad list (known once the step is compiled)
  mutable bool sums_axes_ = false;    // a trace summed along rows or columns (likewise)
  bool has_axis_state_ = false;       // rows or columns state lists
  std::vector<std::string> hypers_;
  std::vector<StateSpec> specs_;
};

using NamedLists = std::vector<std::pair<std::string, std::vector<Tensor>>>;

// The state lists of every kind, in the order their specs are declared: tensors, scalars, rows, columns.
std::array<const NamedLists*, 4> state_lists(const StepLists& lists) {
  return {&lists.state, &lists.scalars, &lists.rows, &lists.cols};
}

void check_lists(const std::string& name, const StepLists& lists) {
  check_graph_name(name);
  const std::size_t n = lists.params.size();
  if (n == 0)
    throw Error(fmt::format("compile_step {}: the params list is empty", name));
  if (!lists.grads.empty() && lists.grads.size() != n)
    throw Error(fmt::format("compile_step {}: {} grads for {} params (give one per param, or none to use the "
                            "params' own)",
                            name, lists.grads.size(), n));
  std::set<uint64_t> params_seen;
  for (std::size_t i = 0; i < n; ++i)
    if (!lists.params[i].defined() || !params_seen.insert(lists.params[i].uid()).second)
      throw Error(fmt::format("compile_step {}: param {} is {}: give each param once", name, i,
                              lists.params[i].defined() ? "listed twice" : "undefined"));
  std::set<std::string> names = {"param", "grad"};
  auto check_list = [&](const std::string& list, std::size_t count) {
    if (list.empty() || list[0] == '_' || !names.insert(list).second)
      throw Error(fmt::format("compile_step {}: list name '{}' is taken (param, grad, another list) or reserved "
                              "(empty, or starting with _)",
                              name, list));
    if (count != n)
      throw Error(fmt::format("compile_step {}: list '{}' has {} tensors for {} params", name, list, count, n));
  };
  for (const auto& kind_lists : state_lists(lists))
    for (const auto& [key, tensors] : *kind_lists)
      check_list(key, tensors.size());
  check_distinct_memory(name, lists);
  for (const auto& [key, value] : lists.hypers) {
    if (kFlags.count(key) || key == "param" || key == "grad")
      throw Error(fmt::format("compile_step {}: '{}' is a name optjit keeps for itself", name, key));
  }
}

} // namespace

struct StepFunction::State {
  std::unique_ptr<FunctionOptimizer> optimizer;
  std::optional<CompiledStep> step;
};

StepFunction::StepFunction(std::unique_ptr<State> state) : state_(std::move(state)) {}
StepFunction::StepFunction(StepFunction&&) noexcept = default;
StepFunction& StepFunction::operator=(StepFunction&&) noexcept = default;
StepFunction::~StepFunction() = default;

StepFunction::State& StepFunction::live() const {
  if (!state_)
    throw Error("this step function was moved from: call the StepFunction it was moved to");
  return *state_;
}

void StepFunction::operator()() { (*live().step)(); }

void StepFunction::set_hyper(const std::string& name, double value) {
  ParamGroup& group = live().optimizer->param_groups()[0];
  if (!group.has(name) || kFlags.count(name))
    throw Error(fmt::format("step function {} has no hyperparameter '{}'", state_->optimizer->name(), name));
  group.set(name, value);
}

int StepFunction::kernel_count() { return live().step->kernel_count(); }
int StepFunction::library_call_count() { return live().step->library_call_count(); }

std::string StepFunction::dump(Stage stage, int gpu_sm) { return live().step->dump(stage, gpu_sm); }

const StepMetrics& StepFunction::metrics() const { return live().step->metrics(); }

StepFunction compile_step(std::string name, StepFunctionBody body, StepLists lists, CompileOptions options) {
  check_lists(name, lists);
  if (!body)
    throw Error(fmt::format("compile_step {}: no step function given", name));
  OptionMap defaults(lists.hypers.begin(), lists.hypers.end());
  for (const std::string& flag : kFlags)
    defaults[flag] = 0;
  auto state = std::make_unique<StepFunction::State>();
  state->optimizer = std::make_unique<FunctionOptimizer>(name, std::move(body), lists, std::move(defaults));
  for (std::size_t i = 0; i < lists.params.size(); ++i) {
    ParamState adopted;
    for (const auto& kind_lists : state_lists(lists))
      for (const auto& [key, tensors] : *kind_lists)
        adopted.emplace_back(key, tensors[i]);
    if (!adopted.empty())
      state->optimizer->adopt_state(static_cast<int64_t>(i), adopted, Optimizer::StateOrigin::Loaded);
  }
  // Checked: only now are the caller's params given the grads.
  for (std::size_t i = 0; i < lists.grads.size(); ++i)
    lists.params[i].set_grad(lists.grads[i]);
  state->step.emplace(compile(*state->optimizer, std::move(options)));
  return StepFunction(std::move(state));
}

void check_distinct_memory(const std::string& name, const StepLists& lists) {
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, std::size_t>> labels; // (list, index in it) of each tensor
  const auto add = [&](const std::string& list, const std::vector<Tensor>& of_list) {
    for (std::size_t i = 0; i < of_list.size(); ++i) {
      tensors.push_back(of_list[i]);
      labels.emplace_back(list, i);
    }
  };
  add("param", lists.params);
  if (lists.grads.empty()) { // the params' own grads
    std::vector<Tensor> own;
    for (const Tensor& p : lists.params)
      own.push_back(p.defined() ? p.grad() : Tensor());
    add("grad", own);
  } else {
    add("grad", lists.grads);
  }
  for (const auto& kind_lists : state_lists(lists))
    for (const auto& [key, of_list] : *kind_lists)
      add(key, of_list);
  if (const auto pair = first_shared_memory(tensors)) {
    const auto& [a_list, a] = labels[pair->first];
    const auto& [b_list, b] = labels[pair->second];
    throw Error(fmt::format("step function {}: tensor {} of list '{}' and tensor {} of list '{}' share memory: give "
                            "each list tensors of its own",
                            name, a, a_list, b, b_list));
  }
}

} // namespace optjit
