#include "torch_step.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <functional>

namespace optjit::python {
namespace {

const char* state_kind_name(StateKind kind) {
  switch (kind) {
  case StateKind::Tensor:
    return "tensor";
  case StateKind::Scalar:
    return "scalar";
  case StateKind::Rows:
    return "rows";
  case StateKind::Cols:
    return "cols";
  }
  __builtin_unreachable();
}

// Python callable `callable` as a C++ function for the step, which runs without the GIL: each call takes it. Empty
// for None. `callable` must outlive the function (the TorchStep holds it).
template <class Result, class... Args> std::function<Result(Args...)> with_gil(const nb::object& callable) {
  if (callable.is_none())
    return {};
  return [&callable](Args... args) {
    nb::gil_scoped_acquire gil;
    return nb::cast<Result>(callable(args...));
  };
}

} // namespace

TorchStep::TorchStep(const std::string& name, nb::list param_groups, const Keywords& defaults,
                     const std::vector<Keywords>& group_options, nb::handle scalar_dtype)
    : param_groups_(std::move(param_groups)) {
  std::vector<ParamGroupSpec> groups;
  for (nb::handle group : param_groups_) {
    ParamGroupSpec spec;
    for (nb::handle param : nb::handle(group)[nb::str("params")]) {
      BoundParam bound;
      bound.param = nb::borrow(param);
      bound.name = "param " + std::to_string(params_.size());
      nb::object local = torch_.local(param);
      bound.view = torch_.view(local, bound.name);
      bound.data = torch_.data_ptr(local);
      spec.params.push_back(bound.view);
      flat_of_param_.emplace(param.ptr(), params_.size());
      params_.push_back(std::move(bound));
    }
    groups.push_back(std::move(spec));
  }
  optimizer_ = make_optimizer(name, std::move(groups), defaults, group_options);
  optimizer_->set_scalar_state_dtype(torch_.dtype_of(scalar_dtype, "torch's scalar state dtype"));
  optimizer_->clear_state(); // torch's state is adopted from the Python side (Adagrad's included)
  optimizer_->set_refuse_incomplete_state(true);

  // Each option of each C++ group is read back from torch's group dict under its torch name.
  for (std::size_t g = 0; g < optimizer_->param_groups().size(); ++g) {
    nb::dict torch_group = nb::cast<nb::dict>(param_groups_[g]);
    std::vector<OptionSource> sources;
    for (const auto& [option, value] : optimizer_->param_groups()[g].options) {
      OptionSource source{option, option, -1, nb::none()};
      for (auto [key, unused] : torch_group) {
        const std::string torch_key = nb::cast<std::string>(key);
        if (const auto* pair = pair_option_keys(torch_key); pair && (pair->first == option || pair->second == option))
          source = {option, torch_key, pair->first == option ? 0 : 1, nb::none()};
      }
      if (source.element < 0 && !torch_group.contains(option.c_str()))
        continue; // an option torch's group does not carry: it keeps its value
      sources.push_back(std::move(source));
    }
    options_.push_back(std::move(sources));
  }
  OPTJIT_ASSERT(options_.size() == static_cast<std::size_t>(nb::len(param_groups_)), "one option list per group");
  step_.emplace(compile(*optimizer_));
}

void TorchStep::sync_options(std::size_t g, nb::handle none_values) {
  ParamGroup& group = optimizer_->param_groups()[g];
  nb::handle torch_group = param_groups_[g];
  for (OptionSource& source : options_[g]) {
    nb::object value = torch_group[source.torch_key.c_str()];
    if (source.element >= 0)
      value = value[source.element];
    if (torch_.is_tensor(value)) {
      const uintptr_t data = torch_.data_ptr(value);
      if (!value.is(source.tensor) || data != source.tensor_data) {
        group.set(source.name,
                  torch_.view(value, "option " + source.torch_key + " of param group " + std::to_string(g)));
        source.tensor = value;
        source.tensor_data = data;
      }
      continue;
    }
    if (!source.tensor.is_none()) { // a tensor option became a number again
      group.tensor_options.erase(source.name);
      source.tensor = nb::none();
    }
    if (value.is_none() && source.element >= 0) { // torch's None in a pair (Adafactor's eps1): its default
      if (!none_values.is_none() && nb::cast<nb::dict>(none_values).contains(source.name.c_str())) {
        value = none_values[source.name.c_str()];
      } else {
        group.set(source.name, kOptionNone);
        continue;
      }
    }
    const double number = PyFloat_AsDouble(value.ptr());
    if (number == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw Error("option " + source.torch_key + " of param group " + std::to_string(g) + " is " +
                  std::string(nb::repr(value).c_str()) + ", not a number");
    }
    group.set(source.name, number);
  }
}

void TorchStep::sync_param(BoundParam& p) {
  nb::object local = torch_.local(p.param);
  if (const uintptr_t data = torch_.data_ptr(local); data != p.data) { // `p.data = ...` since the last step
    p.view.set_data(torch_.view(local, p.name));
    p.data = data;
  }
  nb::object grad = torch_.grad(p.param);
  if (grad.is_none()) {
    if (p.has_grad) {
      p.view.reset_grad();
      p.grad = nb::none();
      p.has_grad = false;
      params_with_grads_.reset();
    }
    return;
  }
  if (!p.has_grad)
    params_with_grads_.reset();
  // The same grad tensor over the same memory (zero_grad(set_to_none=False) keeps both): its view still holds.
  if (p.has_grad && p.grad().is(grad) && torch_.data_ptr(torch_.local(grad)) == p.grad_data)
    return;
  Tensor view = torch_.view(grad, "the grad of " + p.name);
  // `p.data = p.data.reshape(...)` (or .t()) keeps the memory, so the data pointer did not tell: a grad of another
  // shape is the sign to look at the param again, whose new shape the checks then compare with its grad and state.
  if (view.shape() != p.view.shape())
    p.view.set_data(torch_.view(local, p.name));
  p.view.set_grad(view);
  p.grad = nb::weakref(grad);
  p.has_grad = true;
  p.grad_data = reinterpret_cast<uintptr_t>(view.data());
}

bool TorchStep::binds(nb::list param_groups) const {
  std::size_t flat = 0;
  for (nb::handle group : param_groups)
    for (nb::handle param : nb::handle(group)[nb::str("params")])
      if (flat >= params_.size() || !param.is(params_[flat++].param))
        return false;
  return flat == params_.size();
}

void TorchStep::sync(nb::list param_groups, nb::object none_values) {
  param_groups_ = std::move(param_groups);
  if (static_cast<std::size_t>(nb::len(param_groups_)) != options_.size())
    throw Error("the optimizer's param groups changed since it was compiled");
  for (std::size_t g = 0; g < options_.size(); ++g)
    sync_options(g, none_values.is_none() ? nb::handle(none_values) : nb::handle(none_values[g]));
  for (BoundParam& p : params_)
    sync_param(p);
}

const Tensor& TorchStep::hold(HeldTensor& held, nb::object tensor, const std::string& what) {
  if (tensor.is_none()) {
    held = HeldTensor{};
    return held.view;
  }
  if (!torch_.is_tensor(tensor))
    throw Error(what + " is " + text(nb::type_name(tensor.type())) + ", not a tensor");
  const uintptr_t data = torch_.data_ptr(tensor);
  if (!tensor.is(held.tensor) || data != held.data)
    held = HeldTensor{tensor, data, torch_.view(tensor, what)};
  return held.view;
}

void TorchStep::sync_grad_scaling(nb::object grad_scale, nb::object found_inf, bool check_in_step) {
  const Tensor& scale = hold(grad_scale_, std::move(grad_scale), "optimizer.grad_scale");
  const Tensor& inf = hold(found_inf_, std::move(found_inf), "optimizer.found_inf");
  optimizer_->set_grad_scaling(scale, inf, Optimizer::GradsAfterStep::Unscaled, // as torch's fused kernels leave them
                               check_in_step ? Optimizer::InfCheck::InStep : Optimizer::InfCheck::ByCaller);
}

void TorchStep::set_grad_clipping(std::optional<double> max_norm, double norm_type, bool error_if_nonfinite) {
  if (!max_norm)
    optimizer_->set_grad_clipping(std::nullopt);
  else
    optimizer_->set_grad_clipping(Optimizer::GradClipping{*max_norm, norm_type, error_if_nonfinite});
}

void TorchStep::set_grad_norm_reducer(nb::object reducer) {
  grad_norm_reducer_ = std::move(reducer);
  optimizer_->set_grad_norm_reducer(with_gil<double, double, bool>(grad_norm_reducer_));
}

void TorchStep::set_inf_check_reducer(nb::object reducer) {
  inf_check_reducer_ = std::move(reducer);
  optimizer_->set_inf_check_reducer(with_gil<bool, bool>(inf_check_reducer_));
}

std::vector<int64_t> TorchStep::params_without_state() const {
  std::vector<int64_t> missing;
  int64_t flat = 0;
  for (const ParamGroup& group : optimizer_->param_groups()) {
    // Master weights turned on for state made without them: the Python side adds master_param, as torch's state.
    const bool master = group.has("master_weights") && group.get("master_weights") != 0;
    for (std::size_t k = 0; k < group.params.size(); ++k, ++flat) {
      if (!optimizer_->flat_param(flat).grad().defined())
        continue;
      const ParamState& state = optimizer_->flat_state(flat);
      if (master && !find_state(state, kMasterParam).defined())
        missing.push_back(flat);
      else if (state.empty()) { // a step with no state (SGD without momentum) makes no entry, as torch's
        const std::vector<StateSpec> specs = optimizer_->param_state_specs(flat);
        if (std::any_of(specs.begin(), specs.end(), [](const StateSpec& spec) { return spec.visible; }))
          missing.push_back(flat);
      }
    }
  }
  return missing;
}

nb::list TorchStep::new_state(int64_t flat) const {
  if (flat < 0 || flat >= param_count())
    throw Error("param " + std::to_string(flat) + " is not one of the " + std::to_string(param_count()) + " params");
  nb::list entries;
  for (const StateSpec& spec : optimizer_->param_state_specs(flat))
    if (spec.visible)
      entries.append(nb::make_tuple(spec.name, state_kind_name(spec.kind), spec.initial, spec.copies_param));
  return entries;
}

void TorchStep::adopt(int64_t flat, nb::dict state, bool loaded) {
  if (flat < 0 || flat >= param_count())
    throw Error("param " + std::to_string(flat) + " is not one of the " + std::to_string(param_count()) + " params");
  BoundParam& p = params_[static_cast<std::size_t>(flat)];
  ParamState views;
  std::vector<std::pair<nb::object, nb::object>> held;
  for (auto [key, tensor] : state) {
    const std::string name = nb::cast<std::string>(key);
    views.emplace_back(name, torch_.view(tensor, "state '" + name + "' of " + p.name));
    held.emplace_back(nb::borrow(key), nb::borrow(tensor));
  }
  optimizer_->adopt_state(flat, views, loaded ? Optimizer::StateOrigin::Loaded : Optimizer::StateOrigin::Fresh);
  p.state = std::move(held);
}

void TorchStep::sync_state(nb::handle state) {
  if (!PyDict_Check(state.ptr()))
    throw Error("the optimizer's state is a " + text(nb::type_name(state.type())) +
                ", not a dict: torch.optim keeps a dict (a defaultdict) of each param's state");
  // One walk over the dict finds each param's entries: looking each param up would call torch's Python
  // Tensor.__hash__ once per param and step. Keys are the params themselves (a tensor hashes and compares by identity).
  entries_seen_.assign(params_.size(), nb::object());
  Py_ssize_t position = 0;
  PyObject *key = nullptr, *value = nullptr;
  while (PyDict_Next(state.ptr(), &position, &key, &value))
    if (const auto it = flat_of_param_.find(key); it != flat_of_param_.end())
      entries_seen_[it->second] = nb::borrow(value); // held: adopt() below runs Python code
  for (std::size_t flat = 0; flat < params_.size(); ++flat) {
    BoundParam& p = params_[flat];
    PyObject* entries = entries_seen_[flat].ptr();
    if (entries && !PyDict_Check(entries))
      throw Error("the state of " + p.name + " is a " + text(nb::type_name(nb::handle(entries).type())) +
                  ", not a dict");
    const Py_ssize_t count = entries ? PyDict_Size(entries) : 0;
    bool same = count == static_cast<Py_ssize_t>(p.state.size());
    for (std::size_t k = 0; same && k < p.state.size(); ++k) {
      PyObject* entry = PyDict_GetItemWithError(entries, p.state[k].first.ptr()); // str keys: no Python hash
      if (!entry && PyErr_Occurred())
        throw nb::python_error();
      same = entry == p.state[k].second.ptr();
    }
    if (!same)
      adopt(static_cast<int64_t>(flat), entries ? nb::borrow<nb::dict>(entries) : nb::dict(), /*loaded=*/true);
  }
}

nb::list TorchStep::params_with_grads() {
  if (!params_with_grads_) {
    nb::list list;
    for (const BoundParam& p : params_)
      if (p.has_grad)
        list.append(p.param);
    params_with_grads_ = std::move(list);
  }
  return *params_with_grads_;
}

bool TorchStep::update() {
  nb::gil_scoped_release release;
  const int64_t skipped_before = step_->metrics().skipped_steps;
  step_->update();
  return step_->metrics().skipped_steps == skipped_before;
}

int TorchStep::kernel_count() { return step_->kernel_count(); }

nb::dict TorchStep::metrics() const {
  const StepMetrics& m = step_->metrics();
  nb::dict d;
  d["steps"] = m.steps;
  d["skipped_steps"] = m.skipped_steps;
  d["compiles"] = m.compiles;
  d["recompiles"] = m.recompiles;
  d["rebinds"] = m.rebinds;
  d["kernels_generated"] = m.kernels_generated;
  d["cache_hits"] = m.cache_hits;
  d["compile_ms"] = m.compile_ms;
  d["dispatch_ms"] = m.dispatch_ms;
  d["recompile_reasons"] = nb::cast(m.recompile_reasons);
  return d;
}

std::string TorchStep::dump(const std::string& stage, int gpu_sm) { return step_->dump(parse_stage(stage), gpu_sm); }

} // namespace optjit::python
