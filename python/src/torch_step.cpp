#include "torch_step.h"
#include "frontend/optim/options.h"
#include "frontend/optim/registry.h"
#include "frontend/optim/validation.h"
#include "ir/block_slots.h"
#include "runtime/block_quantization.h"
#include "runtime/error.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

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

// torch.optim classes whose step refuses a state tensor in another dtype than its param: their lerp_ (Adam's
// exp_avg.lerp_(grad, 1 - beta1), RMSprop's centered grad_avg, Adafactor's row and column variances) requires one
// dtype. The others (SGD, Adagrad, Adadelta, Rprop, ASGD) promote, and optjit computes their bucket in the wider dtype.
const std::set<std::string> kStateDtypeIsParams = {"Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop", "Adafactor"};

} // namespace

TorchStep::TorchStep(const std::string& name, nb::list param_groups, const Keywords& defaults,
                     const std::vector<Keywords>& group_options, nb::handle scalar_dtype)
    : param_groups_(std::move(param_groups)), views_complex_as_real_(name != "SGD"),
      state_dtype_is_params_(kStateDtypeIsParams.count(name) != 0) {
  std::vector<ParamGroupSpec> groups;
  for (nb::handle group : param_groups_) {
    ParamGroupSpec spec;
    for (nb::handle param : nb::handle(group)[nb::str("params")]) {
      BoundParam bound;
      bound.param = nb::borrow(param);
      bound.name = "param " + std::to_string(params_.size());
      nb::object local = torch_.local(param);
      bound.view = param_view(bound, local);
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
        if (const auto* triple = triple_option_keys(torch_key))
          for (int k = 0; k < 3; ++k)
            if ((*triple)[static_cast<std::size_t>(k)] == option)
              source = {option, torch_key, k, nb::none()};
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
    if (value.is_none()) { // torch's None (Adafactor's eps1, Muon's adjust_lr_fn): its default
      if (!none_values.is_none() && nb::cast<nb::dict>(none_values).contains(source.name.c_str())) {
        value = none_values[source.name.c_str()];
      } else {
        group.set(source.name, kOptionNone);
        continue;
      }
    }
    if (nb::isinstance<nb::str>(value)) { // a choice by name (Muon's adjust_lr_fn)
      group.set(source.name, named_option_value(source.torch_key, nb::cast<std::string>(value)));
      continue;
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

void TorchStep::check_conjugation(TorchTensors::LazyBits bits, const std::string& what) const {
  if (views_complex_as_real_ && bits.conjugated)
    throw Error(what + " is a conjugate view (.conj()), which torch's step refuses: view_as_real doesn't work on "
                       "unresolved conjugated tensors; resolve it with .resolve_conj() (a copy, not an alias)");
}

Tensor TorchStep::param_view(BoundParam& p, nb::handle local) {
  const TorchTensors::LazyBits bits = torch_.lazy_bits(local);
  check_conjugation(bits, p.name);
  if (!bits.any()) {
    p.staged = nb::none();
    return torch_.view(local, p.name, bits);
  }
  p.staged = torch_.resolved(local);
  any_staged_ = true;
  return torch_.view(p.staged, p.name, {});
}

void TorchStep::refresh_staged() {
  if (!any_staged_)
    return;
  for (BoundParam& p : params_)
    if (!p.staged.is_none())
      p.staged.attr("copy_")(torch_.local(p.param));
  // Staged state entries are fresh copies: sync_state adopts them again at every step (their views never match).
}

void TorchStep::write_back_staged() {
  if (!any_staged_)
    return;
  nb::object no_grad = nb::module_::import_("torch").attr("no_grad")();
  no_grad.attr("__enter__")();
  try {
    for (BoundParam& p : params_) {
      if (!p.staged.is_none())
        torch_.local(p.param).attr("copy_")(p.staged);
      for (const HeldState& held : p.state)
        if (!held.staged.is_none())
          torch_.local(held.tensor).attr("copy_")(held.staged);
    }
  } catch (...) {
    no_grad.attr("__exit__")(nb::none(), nb::none(), nb::none());
    throw;
  }
  no_grad.attr("__exit__")(nb::none(), nb::none(), nb::none());
}

void TorchStep::sync_param(BoundParam& p) {
  nb::object local = torch_.local(p.param);
  if (const uintptr_t data = torch_.data_ptr(local); data != p.data) { // `p.data = ...` since the last step
    p.view.set_data(param_view(p, local));
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
  if (p.has_grad && !p.grad_resolved && p.grad().is(grad) && torch_.data_ptr(torch_.local(grad)) == p.grad_data)
    return;
  // A grad with a lazy bit (`c.conj().imag`) is read through a resolved copy, made again at every step: its values
  // may change in place between steps.
  const TorchTensors::LazyBits bits = torch_.lazy_bits(grad);
  check_conjugation(bits, "the grad of " + p.name);
  p.grad_resolved = bits.any();
  p.resolved_grad = p.grad_resolved ? torch_.resolved(grad) : nb::object();
  Tensor view = p.grad_resolved ? torch_.view(p.resolved_grad, "the grad of " + p.name, {})
                                : torch_.view(grad, "the grad of " + p.name, bits);
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
  // A found_inf on a GPU is read by the kernels there (reading it here would wait for the device), as torch's fused
  // kernels read it; on the CPU the host reads it, and a skipped step creates no state.
  const Optimizer::InfCheck check = check_in_step ? Optimizer::InfCheck::InStep
                                    : inf.defined() && inf.device().kind != DeviceKind::cpu
                                        ? Optimizer::InfCheck::InKernels
                                        : Optimizer::InfCheck::ByCaller;
  // The grads are left unscaled, as torch's fused kernels leave them.
  optimizer_->set_grad_scaling(scale, inf, Optimizer::GradsAfterStep::Unscaled, check);
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

void TorchStep::check_flat(int64_t flat) const {
  if (flat < 0 || flat >= param_count())
    throw Error("param " + std::to_string(flat) + " is not one of the " + std::to_string(param_count()) + " params");
}

int64_t TorchStep::state_block_size(int64_t flat) const {
  check_flat(flat);
  int64_t block = 0;
  for (const StateSpec& spec : optimizer_->param_state_specs(flat))
    if (const std::optional<SlotBlocks> format = optimizer_->state_format(flat, spec))
      block = std::max(block, format->block);
  return block;
}

nb::list TorchStep::new_state(int64_t flat, std::optional<bool> shard_quantizes) const {
  check_flat(flat);
  nb::list entries;
  const Tensor& param = params_[static_cast<std::size_t>(flat)].view;
  const ParamState& held = optimizer_->flat_state(flat);
  for (const StateSpec& spec : optimizer_->param_state_specs(flat)) {
    if (!spec.visible)
      continue;
    nb::object layout = nb::none();
    std::optional<SlotBlocks> blocks = optimizer_->state_blocks(flat, spec);
    if (shard_quantizes && !find_state(held, spec.name).defined())
      blocks = *shard_quantizes ? optimizer_->state_format(flat, spec) : std::nullopt;
    if (blocks) {
      const ConstantBlock start = constant_block(blocks->format, blocks->block, static_cast<float>(spec.initial));
      nb::list shape;
      for (int64_t size : block_codes_shape(blocks->format, param.shape()))
        shape.append(size);
      layout = nb::make_tuple(blocks->format == BlockFormat::Fp8 ? "float8_e4m3fn" : "uint8", shape, start.code_byte,
                              start.scale, blocks->block, block_format_bits(blocks->format));
    }
    entries.append(nb::make_tuple(spec.name, state_kind_name(spec.kind), spec.initial, spec.copies_param, layout));
  }
  return entries;
}

void TorchStep::adopt(int64_t flat, nb::dict state, bool loaded) {
  check_flat(flat);
  BoundParam& p = params_[static_cast<std::size_t>(flat)];
  ParamState views;
  std::vector<HeldState> held;
  for (auto [key, tensor] : state) {
    const std::string name = nb::cast<std::string>(key);
    const std::string what = "state '" + name + "' of " + p.name;
    const nb::object local = torch_.is_tensor(tensor) ? torch_.local(tensor) : nb::borrow(tensor);
    if (torch_.is_tensor(tensor) && nb::hasattr(local, "codes") && nb::hasattr(local, "scale")) {
      HeldState quantized; // torchao's: its codes and scales (of this process's shard under FSDP2), zero-copy
      quantized.key = nb::borrow(key);
      quantized.tensor = nb::borrow(tensor);
      view_quantized_state(flat, name, local, quantized, views);
      held.push_back(std::move(quantized));
      continue;
    }
    if (torch_.is_tensor(tensor) && torch_.holds_codes(tensor)) {
      HeldState codes; // the codes of state_dtype's quantized state, beside their "<name>.scale" entry
      codes.key = nb::borrow(key);
      codes.tensor = nb::borrow(tensor);
      codes.view = torch_.codes_view(tensor, what);
      views.emplace_back(name, codes.view);
      held.push_back(std::move(codes));
      continue;
    }
    if (!torch_.is_tensor(tensor)) // view() names it
      views.emplace_back(name, torch_.view(tensor, what));
    const TorchTensors::LazyBits bits = torch_.lazy_bits(tensor);
    check_conjugation(bits, what);
    nb::object staged = bits.any() ? torch_.resolved(tensor) : nb::none();
    any_staged_ = any_staged_ || bits.any();
    views.emplace_back(name, bits.any() ? torch_.view(staged, what, {}) : torch_.view(tensor, what, bits));
    HeldState plain;
    plain.key = nb::borrow(key);
    plain.tensor = nb::borrow(tensor);
    plain.staged = staged;
    plain.view = views.back().second;
    held.push_back(std::move(plain));
  }
  if (loaded)
    check_adopted(p, views);
  optimizer_->adopt_state(flat, views, loaded ? Optimizer::StateOrigin::Loaded : Optimizer::StateOrigin::Fresh);
  p.state = std::move(held);
}

void TorchStep::view_quantized_state(int64_t flat, const std::string& name, nb::handle tensor, HeldState& held,
                                     ParamState& views) const {
  const std::string what = "state '" + name + "' of " + params_[static_cast<std::size_t>(flat)].name;
  held.codes = tensor.attr("codes");
  held.scales = tensor.attr("scale");
  held.view = torch_.codes_view(held.codes, what + " (its codes)");
  held.scales_view = torch_.view(held.scales, what + " (its scales)");
  // torchao keeps the map with each 8-bit and 4-bit state (FP8's codes are values): the kernels hold torchao's own
  // maps as constants, and the entry's spec says which (signed for a first moment), so any other map is refused.
  const std::vector<StateSpec> specs = optimizer_->param_state_specs(flat);
  const auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == name; });
  if (nb::hasattr(tensor, "qmap") && spec != specs.end()) {
    const Tensor qmap = torch_.view(tensor.attr("qmap"), what + " (its qmap)");
    const Tensor host = qmap.device().kind == DeviceKind::cpu ? qmap : qmap.to(Device::cpu());
    const BlockFormat format =
        held_block_format(held.view.dtype(), held.view.numel(), params_[static_cast<std::size_t>(flat)].view.numel(),
                          spec->signed_values);
    const std::span<const float> map = quantization_map(format);
    if (host.dtype() != Dtype::f32 || host.numel() != static_cast<int64_t>(map.size()) || !host.is_contiguous() ||
        std::memcmp(host.data(), map.data(), map.size() * sizeof(float)) != 0)
      throw Error(what + " quantizes with its own map (" + qmap.describe() + "), not torchao's " +
                  block_format_name(format) + " map, which optjit's kernels hold for '" + name + "'");
  }
  views.emplace_back(name, held.view);
  views.emplace_back(scales_slot_name(name), held.scales_view);
}

void TorchStep::check_adopted(const BoundParam& p, const ParamState& views) const {
  const int64_t flat = static_cast<int64_t>(&p - params_.data());
  const std::vector<StateSpec> specs = optimizer_->param_state_specs(flat);
  for (const auto& [name, view] : views) {
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == name; });
    if (spec == specs.end())
      continue; // adopt_state names keys the optimizer does not keep
    if (spec->kind == StateKind::Scalar) {
      if (name == "step" && view.device().kind == DeviceKind::cpu && view.numel() == 1 && view.item() < 0)
        throw Error("state 'step' of " + p.name + " is " + python_float(view.item()) +
                    ": a step count is never negative (torch's next step divides by zero in its bias corrections)");
      continue;
    }
    if (state_dtype_is_params_ && !spec->copies_param && !is_code_dtype(view.dtype()) && view.dtype() != p.view.dtype())
      throw Error("state '" + name + "' of " + p.name + " has dtype " + std::string(dtype_name(view.dtype())) +
                  " and its param " + std::string(dtype_name(p.view.dtype())) + ": " + optimizer_->name() +
                  "'s step in torch refuses state in another dtype than its param (its lerp_ " +
                  "takes one dtype); cast it with .to(param.dtype)");
  }
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
      const HeldState& held = p.state[k];
      PyObject* entry = PyDict_GetItemWithError(entries, held.key.ptr()); // str keys: no Python hash
      if (!entry && PyErr_Occurred())
        throw nb::python_error();
      // The same tensor object may hold other memory now (`m.data = t`, `m.set_(t)`, a storage resized): torch
      // steps the new memory, and the old view would write memory torch freed. (A staged entry's view is of its
      // copy: never the same address, so it is adopted, and copied, again at every step.)
      same = entry == held.tensor.ptr() &&
             (held.codes.is_none()
                  ? torch_.still_views(held.tensor, held.view)
                  : torch_.still_views(held.codes, held.view) && torch_.still_views(held.scales, held.scales_view));
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

nb::object TorchStep::step(nb::object grad_scale, nb::object found_inf, bool check_in_step, nb::handle state,
                           nb::list param_groups, nb::object none_values) {
  if (!binds(param_groups))
    return nb::bool_(false);
  sync_grad_scaling(std::move(grad_scale), std::move(found_inf), check_in_step);
  if (!step_skipped()) { // a skipped step reads nothing else, and makes no state
    sync_state(state);
    sync(std::move(param_groups), std::move(none_values));
    if (!params_without_state().empty())
      return nb::none();
  }
  const bool ran = update();
  return nb::make_tuple(ran, ran ? step_grad_norm() : nb::float_(std::numeric_limits<double>::quiet_NaN()),
                        params_with_grads());
}

nb::object TorchStep::step_grad_norm() const {
  return optimizer_->grad_norm_copied() ? grad_norm_copy_ : nb::float_(optimizer_->total_grad_norm());
}

void TorchStep::set_grad_norm_copy(nb::object copy) {
  optimizer_->set_grad_norm_copy(copy.is_none() ? Tensor() : torch_.view(copy, "the grad norm's copy"));
  grad_norm_copy_ = std::move(copy); // the view's memory, kept alive while the optimizer may write it
}

bool TorchStep::update() {
  refresh_staged();
  const int64_t skipped_before = step_->metrics().skipped_steps;
  {
    nb::gil_scoped_release release;
    step_->update();
  }
  write_back_staged();
  return step_->metrics().skipped_steps == skipped_before;
}

int TorchStep::kernel_count() { return step_->kernel_count(); }
int TorchStep::library_call_count() { return step_->library_call_count(); }

nb::dict TorchStep::metrics() const {
  const StepMetrics& m = step_->metrics();
  nb::dict d;
  d["steps"] = m.steps - m.skipped_steps; // steps that updated: torch's step never runs for a skipped one
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
