#include "frontend/optim/optimizer.h"
#include "frontend/optim/validation.h"
#include "ir/builder.h"
#include "ir/interpreter.h"
#include "ir/op_semantics.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/shared_memory.h"
#include "runtime/stochastic_rounding.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <utility>

namespace optjit {

double ParamGroup::get(const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end())
    throw Error("param group has no option '" + name + "'");
  if (!tensor_options.empty())
    if (auto held = tensor_options.find(name); held != tensor_options.end()) {
      if (held->second.numel() != 1) // its data may have been replaced since it was set
        throw Error("Tensor " + name + " must be 1-element, but holds " + held->second.describe());
      return held->second.item();
    }
  return it->second;
}

void ParamGroup::set(const std::string& name, double value) {
  if (!has(name))
    throw Error("param group has no option '" + name + "'");
  put(name, value);
}

void ParamGroup::set(const std::string& name, const Tensor& value) {
  auto it = options.find(name);
  if (it == options.end())
    throw Error("param group has no option '" + name + "'");
  if (!value.defined() || value.numel() != 1)
    throw Error("Tensor " + name + " must be 1-element");
  // Read again at every step (get()); on a GPU that read is a synchronous copy to the host.
  it->second = value.item();
  tensor_options[name] = value;
}

void ParamGroup::put(const std::string& name, double value) {
  options[name] = value;
  if (auto held = tensor_options.find(name); held != tensor_options.end())
    held->second.fill(value);
}

bool ParamGroup::is_scheduler_key(const std::string& name) {
  return name == "initial_lr" || name == "max_lr" || name == "min_lr" || name == "max_momentum" ||
         name == "base_momentum";
}

bool Structure::operator[](const std::string& name) const {
  for (const auto& [flag, value] : flags_)
    if (flag == name)
      return value;
  OPTJIT_ASSERT(false, "structure has no flag " + name);
}

Structure Structure::with_every_flag() const {
  Structure every;
  for (const auto& [flag, value] : flags_)
    every.set(flag, true);
  return every;
}

std::string Structure::key() const {
  std::string key;
  for (const auto& [flag, value] : flags_)
    key += (key.empty() ? "" : ",") + flag + "=" + (value ? "1" : "0");
  return key;
}

Structure maximize_and_weight_decay(const ParamGroup& group) {
  const bool weight_decay = group.get("weight_decay") != 0;
  Structure s;
  s.set("maximize", group.get("maximize") != 0);
  s.set("weight_decay", weight_decay);
  if (group.options.count("decoupled_weight_decay"))
    s.set("decoupled_weight_decay", weight_decay && group.get("decoupled_weight_decay") != 0);
  return s;
}

Sym decoupled_decay_factor(Tracer& t, const Structure& s, Sym lr, Sym weight_decay) {
  if (!s["lr_f32_tensor"])
    return 1.0 - lr * weight_decay;
  return t.rounded(Dtype::f32, 1.0 - t.rounded(Dtype::f32, lr * t.rounded(Dtype::f32, weight_decay)));
}

Sym lr_divided_by(Tracer& t, const Structure& s, Sym lr, Sym divisor) {
  if (!s["lr_f32_tensor"])
    return lr / divisor;
  return t.rounded(Dtype::f32, lr / t.rounded(Dtype::f32, divisor));
}

std::vector<ParamGroupSpec> one_param_group(std::vector<Tensor> params) {
  if (params.empty())
    throw Error("optimizer got an empty parameter list");
  return {ParamGroupSpec{std::move(params), {}}};
}

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(std::string name, OptionMap defaults, bool foreach, std::set<std::string> flags)
    : name_(std::move(name)), defaults_(std::move(defaults)), foreach_(foreach), flags_(std::move(flags)) {
  check_graph_name(name_); // it names the traced graphs and the kernels' symbols
  check_flags(defaults_, "the defaults");
}

void Optimizer::check_flags(const OptionMap& options, const std::string& where) const {
  for (const std::string& flag : flags_)
    if (const auto it = options.find(flag); it != options.end() && it->second != 0 && it->second != 1)
      throw Error(fmt::format("{} of {} has {} = {}: a flag is 0 or 1 (false or true)", where, name_, flag,
                              python_float(it->second)));
}

namespace {

HookList<StepHook>& global_step_pre_hooks() {
  static HookList<StepHook> hooks;
  return hooks;
}

HookList<StepHook>& global_step_post_hooks() {
  static HookList<StepHook> hooks;
  return hooks;
}

} // namespace

HookHandle register_optimizer_step_pre_hook(StepHook hook) { return global_step_pre_hooks().add(std::move(hook)); }
HookHandle register_optimizer_step_post_hook(StepHook hook) { return global_step_post_hooks().add(std::move(hook)); }

void Optimizer::add_param_group(ParamGroupSpec group) {
  std::vector<ParamGroupSpec> one;
  one.push_back(std::move(group));
  add_param_groups(std::move(one));
  if (creates_state_on_add())
    create_state_for_every_param();
}

void Optimizer::add_param_groups(std::vector<ParamGroupSpec> specs) {
  if (specs.empty())
    throw Error("optimizer got an empty parameter list");
  // Every group is checked before any is added, so a rejected group leaves the optimizer as it was.
  std::set<uint64_t> seen_in_other_groups;
  for (const Tensor& p : flat_params_)
    seen_in_other_groups.insert(p.uid());
  std::vector<ParamGroup> added;
  for (std::size_t index = 0; index < specs.size(); ++index) {
    const std::size_t g = groups_.size() + index; // the group's index once added
    const ParamGroupSpec& spec = specs[index];
    ParamGroup group;
    group.options = defaults_;
    for (const auto& [key, value] : spec.options) {
      if (!defaults_.count(key))
        throw Error(name_ + " has no option '" + key + "' (param group " + std::to_string(g) + ")");
      group.options[key] = value;
    }
    check_flags(group.options, "param group " + std::to_string(g));
    validate_options(group.options);
    if (!spec.param_names.empty() && spec.param_names.size() != spec.params.size())
      throw Error(fmt::format("param group {} has {} param names for {} params: give one name per param, or none", g,
                              spec.param_names.size(), spec.params.size()));
    std::set<uint64_t> seen_here;
    bool warned = false;
    for (std::size_t k = 0; k < spec.params.size(); ++k) {
      const Tensor& p = spec.params[k];
      if (!p.defined())
        throw Error("params argument given to the optimizer should be an iterable of Tensors or dicts, but got "
                    "an undefined tensor in param group " +
                    std::to_string(g));
      if (seen_in_other_groups.count(p.uid()))
        throw Error("some parameters appear in more than one parameter group");
      if (!seen_here.insert(p.uid()).second) {
        if (!warned)
          spdlog::warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                       "cause an error; see github.com/pytorch/pytorch/issues/40967 for more information "
                       "(optjit keeps the first occurrence)");
        warned = true;
        continue;
      }
      group.params.push_back(p);
      if (!spec.param_names.empty())
        group.param_names.push_back(spec.param_names[k]);
    }
    seen_in_other_groups.insert(seen_here.begin(), seen_here.end());
    added.push_back(std::move(group));
  }
  for (ParamGroup& group : added) {
    const int g = static_cast<int>(groups_.size());
    for (const Tensor& p : group.params) {
      flat_index_of_uid_[p.uid()] = static_cast<int64_t>(flat_params_.size());
      flat_params_.push_back(p);
      flat_group_.push_back(g);
      states_.emplace_back();
    }
    groups_.push_back(std::move(group));
  }
  ++state_version_;
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = flat_index_of_uid_.find(param.uid());
  if (it == flat_index_of_uid_.end())
    return nullptr;
  return &states_[static_cast<std::size_t>(it->second)];
}

ParamState Optimizer::visible_state(const Tensor& param) const {
  ParamState visible;
  const ParamState* all = state(param);
  if (!all)
    return visible;
  for (const auto& entry : *all)
    if (entry.first.empty() || entry.first[0] != '_')
      visible.push_back(entry);
  return visible;
}

void Optimizer::set_state(const Tensor& param, const std::string& key, const Tensor& value) {
  auto it = flat_index_of_uid_.find(param.uid());
  if (it == flat_index_of_uid_.end())
    throw Error("set_state: the tensor is not a parameter of this optimizer");
  for (auto& [name, tensor] : states_[static_cast<std::size_t>(it->second)])
    if (name == key) {
      if (value.shape() != tensor.shape() || value.dtype() != tensor.dtype() || value.device() != tensor.device())
        throw Error("set_state: state '" + key + "' is " + tensor.describe() + ", the replacement is " +
                    value.describe() + "; shape, dtype and device must match");
      tensor = value;
      ++state_version_;
      return;
    }
  throw Error("set_state: the parameter has no state '" + key + "'");
}

void Optimizer::clear_state() {
  for (ParamState& s : states_)
    s.clear();
  ++state_version_;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : flat_params_) {
    if (set_to_none) {
      p.reset_grad();
    } else if (Tensor g = p.grad(); g.defined()) {
      g.real_view().fill(0);
    }
  }
}

std::vector<double> Optimizer::hyper_values() const {
  const std::vector<std::string> names = hyper_names();
  const double scale = grad_scale_.defined() ? grad_scale_.item() : 0.0; // read once: a device scale costs a copy
  const bool rounding = any_stochastic_rounding();
  const double counter = // exact: < 2^53
      rounding ? static_cast<double>(rounding_counter(rounding_seed_, rounding_steps_)) : 0.0;
  std::vector<double> values;
  values.reserve(groups_.size() * (names.size() + 2));
  for (const ParamGroup& group : groups_) {
    for (const std::string& name : names)
      values.push_back(hyper_value(group, name));
    if (grad_scale_.defined())
      values.push_back(scale);
    if (clipping_)
      values.push_back(clip_coefficient_);
    if (rounding)
      values.push_back(counter);
  }
  return values;
}

std::vector<std::string> Optimizer::step_hyper_names() const {
  std::vector<std::string> names = hyper_names();
  if (grad_scale_.defined())
    names.emplace_back("grad_scale");
  if (clipping_)
    names.emplace_back(kClipCoefficient);
  if (any_stochastic_rounding())
    names.emplace_back(kRoundingCounter);
  return names;
}

bool Optimizer::any_stochastic_rounding() const {
  for (const ParamGroup& group : groups_)
    if (group.get("stochastic_rounding") != 0)
      return true;
  return false;
}

void Optimizer::after_step() {
  ++rounding_steps_;
  state_created_since_grad_pass_.clear(); // a step that ran keeps the state it made
}

Structure Optimizer::traced_structure(const ParamGroup& group) const {
  Structure s = structure(group);
  s.set("grad_scale", grad_scale_.defined());
  s.set("clip_grad_norm", clipping_.has_value());
  s.set("check_finite_grads", checks_grads_finite()); // the grad pass is compiled with the step
  s.set("unscaled_grads_stored", stores_unscaled_grads());
  s.set("master_weights", group.get("master_weights") != 0);
  s.set("stochastic_rounding", group.get("stochastic_rounding") != 0);
  return s;
}

Structure Optimizer::param_traced_structure(int64_t flat) const {
  Structure s = traced_structure(groups_[static_cast<std::size_t>(group_of_flat(flat))]);
  param_structure(flat_param(flat), s);
  return s;
}

Shape state_shape(StateKind kind, const Shape& param) {
  switch (kind) {
  case StateKind::Tensor:
    return param;
  case StateKind::Scalar:
    return {};
  case StateKind::Rows:
  case StateKind::Cols: {
    if (param.size() < 2)
      throw Error("a state of rows or columns needs a param of rank 2 or more, not " + std::to_string(param.size()));
    Shape s = param;
    s[s.size() - (kind == StateKind::Rows ? 1 : 2)] = 1;
    return s;
  }
  }
  __builtin_unreachable();
}

std::vector<StateSpec> Optimizer::step_state_specs(const Structure& structure) const {
  std::vector<StateSpec> specs = state_specs(structure);
  if (structure["master_weights"])
    specs.push_back({.name = kMasterParam, .copies_param = true});
  if (structure["stochastic_rounding"])
    specs.push_back({.name = kRoundingStream, .kind = StateKind::Scalar, .visible = false, .holds_param_index = true});
  return specs;
}

void Optimizer::check_hyperparameters() const {
  const std::vector<std::string> names = step_options();
  for (std::size_t g = 0; g < groups_.size(); ++g) { // a flag set to 0.5 (ParamGroup::set) would step as true
    check_flags(groups_[g].options, "param group " + std::to_string(g));
    check_step_options(groups_[g], g);
  }
  for (std::size_t g = 0; g < groups_.size() && requires_finite_hyperparameters(); ++g)
    for (const std::string& name : names)
      if (double v = groups_[g].get(name); !std::isfinite(v))
        throw Error("hyperparameter " + name + " of param group " + std::to_string(g) + " is " + python_float(v) +
                    ": hyperparameters must be finite");
  for (const Tensor* t : {&grad_scale_, &found_inf_}) // on the CPU, or where params are (read there each step)
    if (t->defined() && t->device().kind != DeviceKind::cpu &&
        std::none_of(flat_params_.begin(), flat_params_.end(),
                     [&](const Tensor& p) { return p.device() == t->device(); }))
      throw Error(fmt::format("{} is {}, a device none of the params is on: a gradient scaler's tensors are on the "
                              "CPU or on the params' device",
                              t == &grad_scale_ ? "grad_scale" : "found_inf", t->describe()));
  if (grad_scale_.defined())
    if (const double scale = grad_scale_.item(); !(std::isfinite(scale) && scale > 0))
      throw Error("grad_scale is " + python_float(scale) +
                  ": a gradient scale must be a positive finite number (grads are divided by it)");
  check_precision_options();
}

void Optimizer::set_grad_scaling(Tensor grad_scale, Tensor found_inf, GradsAfterStep grads, InfCheck check) {
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor&>{"grad_scale", grad_scale}, {"found_inf", found_inf}})
    if (t.defined() && (t.numel() != 1 || t.dtype() != Dtype::f32))
      throw Error(fmt::format("{} is {}: a gradient scaler's {} holds one f32 element", name, t.describe(), name));
  if (check == InfCheck::InStep && !found_inf.defined())
    throw Error("found_inf is undefined, and an in-step inf check writes what it finds there: pass a found_inf "
                "tensor holding 0");
  grad_scale_ = std::move(grad_scale);
  found_inf_ = std::move(found_inf);
  grads_after_step_ = grads;
  inf_check_ = check;
}

bool Optimizer::step_skipped() const { return found_inf_.defined() && found_inf_.item() != 0; }

// A copy of `grad` in its compute dtype with every element f(element, number) (the forloop's unscaling and clipping).
template <class F> static Tensor transformed(const Tensor& grad, double number, F f) {
  Tensor g = grad.to(compute_dtype(grad.dtype()));
  if (g.same(grad))
    g = grad.clone();
  visit_compute_dtype(g.dtype(), [&]<class T>() {
    T* values = g.data_as<T>();
    for (int64_t i = 0; i < g.numel(); ++i)
      values[i] = f(values[i], static_cast<T>(number));
  });
  return g;
}

static Tensor unscaled(const Tensor& grad, double scale) {
  return transformed(grad, scale, [](auto v, auto s) { return v / s; });
}

static Tensor clipped(const Tensor& grad, double coefficient) {
  return transformed(grad, coefficient, [](auto v, auto c) { return v * c; });
}

// A grad's elements in its compute dtype, contiguous (the forloop's norm and inf check walk them flat).
static Tensor contiguous_compute_values(const Tensor& grad) {
  const Tensor g = grad.real_view().to(compute_dtype(grad.real_view().dtype()));
  return g.is_contiguous() ? g : g.clone();
}

// The forloop's partial grad norm: each grad's sum of squares (or largest |element|) in f64, combined in param order
// (GradNormTotal: each norm rounded to its grad's dtype, as torch's).
static double forloop_grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  GradNormTotal total(norm_type);
  for (const Tensor& grad : grads) {
    if (!grad.defined())
      continue;
    const Tensor g = contiguous_compute_values(grad);
    double contribution = norm_type == 2.0 ? 0.0 : -std::numeric_limits<double>::infinity();
    visit_compute_dtype(g.dtype(), [&]<class T>() {
      const T* values = g.data_as<T>();
      for (int64_t i = 0; i < g.numel(); ++i) {
        const double v = static_cast<double>(values[i]);
        contribution = norm_type == 2.0 ? contribution + v * v : max_propagating_nan(contribution, std::fabs(v));
      }
    });
    total.add(contribution, grad.dtype());
  }
  return total.partial();
}

bool Optimizer::any_nonfinite(const std::vector<Tensor>& grads) {
  for (const Tensor& grad : grads)
    if (grad.defined()) {
      const Tensor g = contiguous_compute_values(grad);
      bool found = false;
      visit_compute_dtype(g.dtype(), [&]<class T>() {
        const T* values = g.data_as<T>();
        for (int64_t i = 0; i < g.numel() && !found; ++i)
          found = !std::isfinite(values[i]);
      });
      if (found)
        return true;
    }
  return false;
}

void Optimizer::check_grad(int64_t flat) const {
  const Tensor& p = flat_param(flat);
  const Tensor g = p.grad();
  if (g.dtype() != p.dtype() || g.shape() != p.shape() || g.device() != p.device())
    throw Error("grad of param " + std::to_string(flat) + " is " + g.describe() + " but the param is " + p.describe() +
                ": a grad must have its param's shape, dtype and device");
  // A grad is only read (staged through a contiguous copy when it overlaps, as an expanded grad does, which torch
  // steps too), unless the step writes the unscaled grads back. A param is always written.
  if (!p.is_non_overlapping())
    throw Error(fmt::format("param {} is {}: its elements overlap in memory, and an optimizer step writes each "
                            "element at an address of its own (pass a copy)",
                            flat, p.describe()));
  if (!g.is_non_overlapping() && writes_grads())
    throw Error(fmt::format("grad of param {} is {}: its elements overlap in memory, and this step writes the "
                            "grads (the unscaled grads of gradient scaling, or a step function's): pass a copy",
                            flat, g.describe()));
}

// Whether state entry `t` has the shape `spec` gives it for `param`: one element for a scalar, else state_shape.
static bool state_fits(const StateSpec& spec, const Tensor& t, const Tensor& param) {
  return spec.kind == StateKind::Scalar ? t.numel() == 1 : t.shape() == state_shape(spec.kind, param.shape());
}

// Whether state entry `t` may live where it does for `param`: on the param's device or, for a scalar entry of a
// param on a GPU, in host memory (where torch keeps `step` for steps that are not capturable).
static bool state_device_fits(const StateSpec& spec, const Tensor& t, const Tensor& param) {
  return t.device() == param.device() || (spec.kind == StateKind::Scalar && param.device().kind == DeviceKind::cuda &&
                                          t.device().kind == DeviceKind::cpu);
}

// Which entries of the param's state are scalars held in host memory while the param is on a GPU
// (state_device_fits): bit k for the k-th entry. torch keeps `step` there for steps that are not capturable, and
// load_state_dict moves the other scalars (NAdam's mu_product, ASGD's eta) to the param's device, so a param may
// have some of each.
static uint64_t host_scalar_entries(const ParamState& state, const Tensor& param) {
  uint64_t mask = 0;
  if (param.device().kind != DeviceKind::cuda)
    return mask;
  for (std::size_t k = 0; k < state.size() && k < 64; ++k)
    if (state[k].second.numel() == 1 && state[k].second.device().kind == DeviceKind::cpu)
      mask |= uint64_t{1} << k;
  return mask;
}

void Optimizer::check_state(int64_t flat) const {
  const Tensor& p = flat_param(flat);
  const ParamState& state = states_[static_cast<std::size_t>(flat)];
  if (state.empty())
    return;
  for (const StateSpec& spec : param_state_specs(flat)) {
    const Tensor t = find_state(state, spec.name);
    if (!t.defined())
      continue;
    if (!state_fits(spec, t, p) || !state_device_fits(spec, t, p))
      throw Error(fmt::format("state '{}' of param {} is {}, but the param is now {}: its data was replaced by a "
                              "tensor of another shape or device, and its state was not (reset or load its state)",
                              spec.name, flat, t.describe(), p.describe()));
  }
}

// Every step, O(groups) unless a group keeps master weights or rounds stochastically: then each of its params must
// be bf16 or f16, or bf16.
void Optimizer::check_precision_options() const {
  int64_t flat = 0;
  for (const ParamGroup& group : groups_) {
    const bool master = group.get("master_weights") != 0, stochastic = group.get("stochastic_rounding") != 0;
    for (std::size_t k = 0; (master || stochastic) && k < group.params.size(); ++k) {
      const Tensor& p = flat_param(flat + static_cast<int64_t>(k));
      if (master && !is_low_precision(p.dtype()))
        throw Error(fmt::format("param {} is {}, in a group with master_weights=true: master weights are f32 copies "
                                "of bf16 and f16 params",
                                flat + static_cast<int64_t>(k), p.describe()));
      if (stochastic && p.dtype() != Dtype::bf16)
        throw Error(fmt::format("param {} is {}, in a group with stochastic_rounding=true: stochastic rounding "
                                "stores bf16 params and state",
                                flat + static_cast<int64_t>(k), p.describe()));
    }
    flat += static_cast<int64_t>(group.params.size());
  }
}

void Optimizer::check_step() const {
  check_hyperparameters();
  for (int64_t i = 0; i < param_count(); ++i)
    if (flat_param(i).impl()->grad) {
      check_grad(i);
      check_state(i);
    }
  check_params_distinct();
}

void Optimizer::check_params_distinct() const {
  // visit(tensor, param, state entry or "" for the param itself) for each param with a grad and its tensor state
  // (not the per-tensor scalars).
  const auto for_each_stepping = [&](const auto& visit) {
    for (int64_t i = 0; i < param_count(); ++i)
      if (const Tensor& p = flat_param(i); p.impl()->grad) {
        visit(p, i, std::string());
        for (const auto& [key, t] : flat_state(i))
          if (t.defined() && t.dim() > 0)
            visit(t, i, key);
      }
  };
  // Their layouts unchanged since the last check (an eager step calls it every step), it holds still.
  std::vector<uint64_t> layouts = {state_version_};
  for_each_stepping([&](const Tensor& t, int64_t, const std::string&) { layouts.push_back(t.impl()->layout_id); });
  if (layouts == distinct_params_checked_)
    return;
  std::vector<Tensor> stepping;
  std::vector<std::pair<int64_t, std::string>> labels; // (param, state entry or "" for the param itself)
  for_each_stepping([&](const Tensor& t, int64_t param, const std::string& key) {
    stepping.push_back(t);
    labels.emplace_back(param, key);
  });
  if (const auto pair = first_shared_memory(stepping)) {
    const Tensor &a = stepping[pair->first], &b = stepping[pair->second];
    const auto name = [&](std::size_t k) {
      const auto& [param, entry] = labels[k];
      return entry.empty() ? fmt::format("param {}", param) : fmt::format("state '{}' of param {}", entry, param);
    };
    const bool twice = a.data() == b.data() && a.shape() == b.shape() && a.strides() == b.strides();
    throw Error(fmt::format("{} and {} share memory ({} and {}{}): a compiled step reads every param and state "
                            "tensor before it writes any, where torch's steps them one after the other; give each "
                            "its own memory",
                            name(pair->first), name(pair->second), a.describe(), b.describe(),
                            twice ? ": the same tensor twice" : ""));
  }
  distinct_params_checked_ = std::move(layouts);
}

bool Optimizer::ensure_state() { return create_missing_state(/*only_params_with_grads=*/true); }

void Optimizer::create_state_for_every_param() { create_missing_state(/*only_params_with_grads=*/false); }

double Optimizer::initial_state_value(const ParamGroup&, const StateSpec& spec) const { return spec.initial; }

namespace {

// The structure key and state specs each param steps with: derived once per group, or once per param when the
// optimizer adds flags per param (Optimizer::param_structure).
class ParamStructures {
public:
  struct Entry {
    std::string key;
    std::vector<StateSpec> specs;
  };
  explicit ParamStructures(const Optimizer& o) : optimizer_(o) {
    if (!o.has_param_structure())
      for (const ParamGroup& group : o.param_groups())
        by_group_.push_back(entry(o.traced_structure(group)));
  }
  // Valid until the next call.
  const Entry& of(int64_t flat) {
    if (!by_group_.empty())
      return by_group_[static_cast<std::size_t>(optimizer_.group_of_flat(flat))];
    return this_param_ = entry(optimizer_.param_traced_structure(flat));
  }

private:
  Entry entry(const Structure& s) const { return {s.key(), optimizer_.step_state_specs(s)}; }
  const Optimizer& optimizer_;
  std::vector<Entry> by_group_;
  Entry this_param_;
};

} // namespace

bool Optimizer::create_missing_state(bool only_params_with_grads) {
  bool created = false;
  ParamStructures structures(*this);
  for (int64_t i = 0; i < param_count(); ++i) {
    const Tensor& p = flat_param(i);
    if (only_params_with_grads && !p.impl()->grad)
      continue;
    ParamState& s = states_[static_cast<std::size_t>(i)];
    const auto g = static_cast<std::size_t>(flat_group_[static_cast<std::size_t>(i)]);
    const std::vector<StateSpec>& specs = structures.of(i).specs;
    if (s.empty() && ((clipping_ && clipping_->error_if_nonfinite) || checks_grads_finite()))
      state_created_since_grad_pass_.push_back(i); // dropped again if this step's grad pass refuses the step
    for (const StateSpec& spec : specs) {
      if (find_state(s, spec.name).defined())
        continue;
      if (refuse_incomplete_state_ && spec.visible && !s.empty())
        throw Error(fmt::format("the state of param {} has no '{}', which {} keeps with its group's options now: an "
                                "option that adds state (amsgrad, centered, momentum) was turned on after the state "
                                "was made, or the loaded state was saved without it (torch's step raises "
                                "KeyError: '{}' here)",
                                i, spec.name, name_, spec.name));
      Shape shape = state_shape(spec.kind, p.shape());
      // A complex param's state starts with every component at the value, as torch's optimizers see it through
      // view_as_real (Adagrad's sum is complex(v, v), Rprop's step_size complex(lr, lr)).
      // Tensor state takes its param's layout (torch's preserve_format), so kernels walk both flat.
      Tensor t = spec.kind != StateKind::Tensor ? Tensor::empty(shape, new_state_dtype(p, spec), p.device())
                                                : Tensor::empty_like(p, new_state_dtype(p, spec), p.device());
      if (spec.copies_param)
        t.copy_from(p.to(t.dtype())); // master weights start as the param's values
      else if (spec.holds_param_index)
        t.fill(static_cast<double>(i));
      else
        t.real_view().fill(initial_state_value(groups_[g], spec));
      s.emplace_back(spec.name, std::move(t));
      created = true;
    }
  }
  if (created)
    ++state_version_;
  return created;
}

std::vector<StateSpec> Optimizer::new_state_specs(int group) const {
  const ParamGroup& g = groups_.at(static_cast<std::size_t>(group));
  std::vector<StateSpec> specs = step_state_specs(traced_structure(g));
  for (StateSpec& spec : specs)
    spec.initial = initial_state_value(g, spec);
  return specs;
}

std::vector<StateSpec> Optimizer::param_state_specs(int64_t flat) const {
  const ParamGroup& g = groups_.at(static_cast<std::size_t>(group_of_flat(flat)));
  std::vector<StateSpec> specs = step_state_specs(param_traced_structure(flat));
  for (StateSpec& spec : specs)
    spec.initial = initial_state_value(g, spec);
  return specs;
}

// The storage dtype of each of the param's state entries, existing or still to be created.
static std::vector<Dtype> state_dtypes_of(const Optimizer& o, int64_t flat, const std::vector<StateSpec>& specs) {
  std::vector<Dtype> dtypes;
  for (const StateSpec& spec : specs) {
    const Tensor held = find_state(o.flat_state(flat), spec.name);
    dtypes.push_back(held.defined() ? held.dtype() : o.new_state_dtype(o.flat_param(flat), spec));
  }
  return dtypes;
}

std::vector<uint64_t> Optimizer::state_dtype_facts() const {
  ParamStructures structures(*this); // once per group where it can: the per-param loop stays cheap
  std::vector<uint64_t> facts;
  facts.reserve(static_cast<std::size_t>(param_count()));
  for (int64_t i = 0; i < param_count(); ++i) {
    uint64_t fact = host_scalar_entries(flat_state(i), flat_param(i));
    for (Dtype dtype : state_dtypes_of(*this, i, structures.of(i).specs))
      fact = fact * 257 + static_cast<uint64_t>(dtype) + 1; // 8 bits per entry: the fact changes with any of them
    facts.push_back(fact);
  }
  return facts;
}

ParamState
Optimizer::state_from_entries(const Tensor& param, const std::vector<StateSpec>& specs, const ParamState& given,
                              int64_t id, int64_t flat, bool loaded,
                              const std::function<Tensor(const StateSpec&, const Tensor&)>& visible_entry) const {
  std::set<std::string> given_keys, kept_keys;
  for (const auto& entry : given)
    given_keys.insert(entry.first);
  // Hidden scalar entries (a stochastic rounding stream) live beside visible ones held in host memory, if any.
  const Device hidden_device = host_scalar_entries(given, param) != 0 ? Device::cpu() : param.device();
  ParamState state;
  for (const StateSpec& spec : specs) {
    if (!spec.visible) {
      const double value = spec.holds_param_index ? static_cast<double>(flat) : loaded ? spec.loaded : spec.initial;
      state.emplace_back(spec.name, Tensor::full({}, value, new_state_dtype(param, spec), hidden_device));
      continue;
    }
    const Tensor t = find_state(given, spec.name);
    if (!t.defined() && spec.copies_param)
      continue; // master weights turned on after the state was made start from the param, as new state does
    kept_keys.insert(spec.name);
    if (t.defined()) // a missing key is reported below, with all
      state.emplace_back(spec.name, visible_entry(spec, t));
  }
  // An entry these options do not use but other options of the optimizer's algorithm do (max_exp_avg_sq once
  // amsgrad is switched off, SGD's momentum_buffer once momentum is 0) is kept as given, as torch keeps it: the
  // optimizer's own state_dict() after such a switch loads back, and switching the option on again continues from
  // it, with the hidden entries that go with it at their loaded values. Keys no options keep are refused, and so is
  // a master copy (master_param) in a group without master weights: its presence would change the forloop's math.
  std::set<std::string> known_keys = kept_keys;
  const Structure every = param_traced_structure(flat).with_every_flag();
  const std::vector<StateSpec> every_spec = state_specs(every); // the algorithm's own, without optjit's extras
  bool kept_extra = false;
  for (const StateSpec& spec : every_spec)
    if (spec.visible && !kept_keys.count(spec.name))
      if (const Tensor t = find_state(given, spec.name); t.defined()) {
        known_keys.insert(spec.name);
        state.emplace_back(spec.name, visible_entry(spec, t));
        kept_extra = true;
      }
  for (const StateSpec& spec : every_spec)
    if (kept_extra && !spec.visible && !find_state(state, spec.name).defined())
      state.emplace_back(spec.name, Tensor::full({}, loaded ? spec.loaded : spec.initial, new_state_dtype(param, spec),
                                                 hidden_device));
  if (!std::includes(given_keys.begin(), given_keys.end(), kept_keys.begin(), kept_keys.end()) ||
      !std::includes(known_keys.begin(), known_keys.end(), given_keys.begin(), given_keys.end()))
    throw Error(fmt::format("state of param {} has keys {}, but {} with these options keeps {}", id, given_keys, name_,
                            kept_keys));
  return state;
}

void Optimizer::adopt_state(int64_t flat, const ParamState& visible, StateOrigin origin) {
  if (flat < 0 || flat >= param_count())
    throw Error(fmt::format("adopt_state: param {} is not one of the {} params", flat, param_count()));
  const Tensor& param = flat_param(flat);
  ParamState adopted;
  if (!visible.empty())
    adopted = state_from_entries(
        param, param_state_specs(flat), visible, flat, flat, origin == StateOrigin::Loaded,
        [&](const StateSpec& spec, const Tensor& t) {
          const bool scalar = spec.kind == StateKind::Scalar;
          if (!state_fits(spec, t, param))
            throw Error(fmt::format("state '{}' of param {} is {}, but {}", spec.name, flat, t.describe(),
                                    scalar ? std::string("a scalar state holds one element")
                                    : spec.kind == StateKind::Tensor
                                        ? "the param is " + param.describe()
                                        : fmt::format("it holds the param's rows or "
                                                      "columns, shape [{}]",
                                                      fmt::join(state_shape(spec.kind, param.shape()), ", "))));
          if (!scalar && is_complex(t.dtype()) != is_complex(param.dtype()))
            throw Error(fmt::format("state '{}' of param {} is {}, but the param is {}: a complex param keeps complex "
                                    "state, a real param real state",
                                    spec.name, flat, t.describe(), param.describe()));
          if (spec.copies_param && t.dtype() != Dtype::f32)
            throw Error(fmt::format("state '{}' of param {} is {}: master weights are f32 (torch's load_state_dict "
                                    "casts every state entry but step to the param's dtype; optjit.compile keeps "
                                    "the f32 copy across it)",
                                    spec.name, flat, t.describe()));
          if (!state_device_fits(spec, t, param) || !t.is_non_overlapping())
            throw Error(fmt::format("state '{}' of param {} is {}: it must be on the param's device ({}; a scalar "
                                    "state of a GPU param may be on the CPU), each element at an address of its own",
                                    spec.name, flat, t.describe(), param.device().to_string()));
          return t;
        });
  states_[static_cast<std::size_t>(flat)] = std::move(adopted);
  ++state_version_;
}

std::vector<Optimizer::Bucket> Optimizer::make_buckets(BucketMembers members) const {
  std::vector<Bucket> buckets;
  ParamStructures structures(*this);
  for (int64_t i = 0; i < param_count(); ++i) {
    const Tensor& p = flat_param(i);
    if (members == BucketMembers::WithGrads && !p.grad().defined())
      continue;
    int g = flat_group_[static_cast<std::size_t>(i)];
    const ParamStructures::Entry& structure = structures.of(i);
    const std::string& key = structure.key;
    std::vector<Dtype> state_dtypes = state_dtypes_of(*this, i, structure.specs);
    const uint64_t on_host = host_scalar_entries(flat_state(i), p);
    Bucket* bucket = nullptr;
    for (Bucket& b : buckets)
      if (b.dtype == p.dtype() && b.device == p.device() && b.structure_key == key && b.state_dtypes == state_dtypes &&
          b.host_scalar_entries == on_host)
        bucket = &b;
    if (!bucket) {
      buckets.push_back(Bucket{p.dtype(), p.device(), key, std::move(state_dtypes), {}, on_host});
      bucket = &buckets.back();
    }
    bucket->members.push_back({g, i});
  }
  return buckets;
}

static SlotKind slot_kind_of(StateKind kind) {
  switch (kind) {
  case StateKind::Tensor:
    return SlotKind::Tensor;
  case StateKind::Scalar:
    return SlotKind::Scalar;
  case StateKind::Rows:
    return SlotKind::Rows;
  case StateKind::Cols:
    return SlotKind::Cols;
  }
  __builtin_unreachable();
}

std::vector<Slot> Optimizer::slots(const Structure& structure, const ParamBucket& bucket) const {
  // Kernels run on real views: a complex bucket's tensors are slots of their component dtype.
  const Dtype stored = component_dtype(bucket.dtype);
  std::vector<Slot> slots = {{"param", SlotRole::Param, SlotKind::Tensor, stored},
                             {"grad", SlotRole::Grad, SlotKind::Tensor, stored}};
  const std::vector<StateSpec> specs = step_state_specs(structure);
  OPTJIT_ASSERT(bucket.state_dtypes.size() == specs.size(), "the bucket's state dtypes do not match its state specs");
  for (std::size_t k = 0; k < specs.size(); ++k)
    slots.push_back(
        {specs[k].name, SlotRole::State, slot_kind_of(specs[k].kind), component_dtype(bucket.state_dtypes[k])});
  return slots;
}

Dtype Optimizer::bucket_compute_dtype(const ParamBucket& bucket) const {
  const std::vector<StateSpec> specs = step_state_specs(param_traced_structure(bucket.members.front().flat));
  Dtype widest = compute_dtype(bucket.dtype);
  for (std::size_t k = 0; k < specs.size() && k < bucket.state_dtypes.size(); ++k)
    if (specs[k].kind != StateKind::Scalar && !specs[k].copies_param &&
        compute_dtype(bucket.state_dtypes[k]) == Dtype::f64)
      widest = Dtype::f64;
  return widest;
}

Graph Optimizer::trace_bucket(const ParamBucket& bucket) const {
  std::string graph_name = name_;
  for (char& c : graph_name)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const Structure s = param_traced_structure(bucket.members.front().flat); // the bucket's members share it
  // bf16 and f16 compute in f32, complex dtypes in their component dtype
  Tracer tracer(graph_name, bucket_compute_dtype(bucket), slots(s, bucket));
  if (s["grad_scale"])
    tracer.divide_grads_by("grad_scale", s["unscaled_grads_stored"]);
  if (s["clip_grad_norm"])
    tracer.multiply_grads_by(kClipCoefficient);
  if (s["master_weights"])
    tracer.update_through_master(kMasterParam);
  if (s["stochastic_rounding"])
    tracer.round_stochastically(kRoundingCounter, kRoundingStream);
  trace(tracer, s);
  return tracer.finish();
}

void Optimizer::set_grad_clipping(std::optional<GradClipping> clipping) {
  if (clipping) {
    // Any max_norm, as clip_grad_norm_ takes it: inf clips nothing (the coefficient clamps to 1) and only logs the
    // norm; a negative one flips the grads, as torch's coefficient does.
    if (clipping->norm_type != 2.0 && clipping->norm_type != std::numeric_limits<double>::infinity())
      throw Error("norm_type is " + python_float(clipping->norm_type) + ": fused clipping takes 2 or inf");
  }
  clipping_ = clipping;
  state_created_since_grad_pass_.clear();
}

Graph Optimizer::trace_grad_pass(const ParamBucket& bucket) const {
  OPTJIT_ASSERT(has_grad_pass(), "trace_grad_pass with neither clipping nor an in-step inf check");
  const Structure s = param_traced_structure(bucket.members.front().flat); // the bucket's members share it
  std::vector<Slot> grad_slot;
  for (const Slot& slot : slots(s, bucket))
    if (slot.role == SlotRole::Grad)
      grad_slot.push_back(slot);
  Tracer tracer("grad_pass", compute_dtype(bucket.dtype), grad_slot);
  // The check reads the grads as given, before grad_scale divides them, as GradScaler's check does. x * 0 is 0 for a
  // finite x and NaN for an inf or a NaN, so the sum of g * 0 is NaN exactly when an element is one (never folded:
  // fold_constants keeps x * 0). A sum, not a max: a max of vectors is a chain of compares and blends per step,
  // which made the pass latency-bound (3x a sum's time); a sum of squares would overflow on large finite grads.
  if (checks_grads_finite())
    tracer.store_carry(kGradNonfiniteCarry, sum(tracer.tensors(grad_slot.front().name) * 0.0));
  if (s["grad_scale"])
    tracer.divide_grads_by("grad_scale", false);
  Sym grads = tracer.tensors(grad_slot.front().name);
  if (clipping_)
    tracer.store_carry(kGradNormCarry, clipping_->norm_type == 2.0 ? sum(grads * grads) : max_of(abs(grads)));
  return tracer.finish();
}

ListArguments Optimizer::grad_arguments(const ParamBucket& bucket) const {
  ListArguments args;
  args.hyper_names = step_hyper_names();
  args.hyper = hyper_values();
  args.slot_names = {"grad"};
  args.slot_tensors.emplace_back();
  for (const BucketMember& m : bucket.members) {
    args.slot_tensors.front().push_back(kernel_grad(m.flat));
    args.group_of.push_back(m.group);
    args.shapes.push_back(flat_param(m.flat).real_view().shape());
  }
  return args;
}

void Optimizer::drop_state_created_since_grad_pass() {
  const std::vector<int64_t> created = std::exchange(state_created_since_grad_pass_, {});
  for (int64_t i : created)
    states_[static_cast<std::size_t>(i)].clear();
  if (!created.empty())
    ++state_version_;
}

bool Optimizer::take_grad_pass(const GradPassTotals& totals) {
  const bool skipped = checks_grads_finite() && found_in_any_process(totals.nonfinite);
  if (skipped) // written before clipping may throw: GradScaler's unscale_ has found the inf when clip_grad_norm_ raises
    found_inf_.set_item(0, 1.0);
  if (clipping_)
    set_total_grad_norm(total_over_processes(totals.norm_partial)); // may throw
  if (skipped)
    drop_state_created_since_grad_pass(); // the step is skipped: the state it made for first-time params goes too
  return !skipped;
}

double Optimizer::total_over_processes(double partial) const {
  const bool l2 = clipping_->norm_type == 2.0;
  if (grad_norm_reducer_)
    partial = grad_norm_reducer_(partial, l2);
  return GradNormTotal::total_of(l2, partial);
}

void Optimizer::set_total_grad_norm(double total) {
  OPTJIT_ASSERT(clipping_.has_value(), "set_total_grad_norm without clipping");
  if (clipping_->error_if_nonfinite && !std::isfinite(total)) {
    drop_state_created_since_grad_pass(); // the step is refused: the state it made for first-time params goes too
    throw Error("The total norm of order " + python_float(clipping_->norm_type) +
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
                "scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`");
  }
  total_grad_norm_ = total;
  const double coefficient = clipping_->max_norm / (total + 1e-6);
  clip_coefficient_ = std::isnan(coefficient) ? coefficient : std::min(coefficient, 1.0); // torch's clamp(max=1)
}

ListArguments Optimizer::list_arguments(const ParamBucket& bucket) const {
  ListArguments args;
  args.hyper_names = step_hyper_names();
  args.hyper = hyper_values();
  const std::vector<Slot> declared = slots(param_traced_structure(bucket.members.front().flat), bucket);
  for (const Slot& slot : declared) {
    args.slot_names.push_back(slot.name);
    args.slot_tensors.emplace_back();
  }
  for (const Member& m : bucket.members) {
    const Tensor& p = flat_param(m.flat);
    const bool staged = staging_.is_staged(m.flat); // its kernels run on contiguous copies
    args.group_of.push_back(m.group);
    args.shapes.push_back(p.real_view().shape());
    for (std::size_t k = 0; k < declared.size(); ++k) {
      Tensor t;
      switch (declared[k].role) {
      case SlotRole::Param:
        t = staged ? staging_.param_copy(m.flat) : p;
        break;
      case SlotRole::Grad:
        t = staged ? staging_.grad_copy(m.flat) : p.grad();
        break;
      case SlotRole::State:
        t = staged ? staging_.state_copy(m.flat, declared[k].name) : Tensor();
        if (!t.defined()) // not staged, or a scalar entry
          t = find_state(flat_state(m.flat), declared[k].name);
        OPTJIT_ASSERT(t.defined(), "state " + declared[k].name + " missing; ensure_state() runs first");
        break;
      }
      args.slot_tensors[k].push_back(t.real_view()); // complex tensors run as their (re, im) components
    }
  }
  return args;
}

bool Optimizer::needs_staging(int64_t flat) const {
  const Tensor& p = flat_param(flat);
  if (!p.impl()->grad)
    return false;
  // Rows and columns are found by element order: such a param's kernels walk contiguous tensors.
  if (walks_rows_and_columns(flat) && !(p.is_contiguous() && p.grad().is_contiguous()))
    return true;
  return !LayoutStaging::walkable_flat(p, p.grad(), flat_state(flat));
}

bool Optimizer::param_traced_structure_has_axes(int64_t flat) const {
  if (!has_param_structure())
    return false;
  for (const StateSpec& spec : step_state_specs(param_traced_structure(flat)))
    if (spec.kind == StateKind::Rows || spec.kind == StateKind::Cols)
      return true;
  return false;
}

void Optimizer::prepare_staging() {
  staging_.clear();
  for (int64_t i = 0; i < param_count(); ++i)
    if (needs_staging(i)) {
      OPTJIT_LOG(guards, "{}: param {} ({}, grad {}) shares no dense layout with its grad and state: staged", name_, i,
                 flat_param(i).describe(), flat_param(i).grad().describe());
      staging_.stage(i, flat_param(i), flat_state(i));
    }
}

void Optimizer::stage_in() const {
  if (!staging_.empty())
    staging_.copy_in(flat_params_, states_);
}

void Optimizer::stage_out() const {
  if (!staging_.empty())
    staging_.copy_out(flat_params_, states_, writes_grads());
}

Tensor Optimizer::kernel_grad(int64_t flat) const {
  return (staging_.is_staged(flat) ? staging_.grad_copy(flat) : flat_param(flat).grad()).real_view();
}

double Optimizer::run_with_step_hooks(const std::function<void()>& update, const Closure& closure) {
  global_step_pre_hooks().run(*this);
  step_pre_hooks_.run(*this);
  const double loss = closure ? closure() : 0.0;
  update();
  step_post_hooks_.run(*this);
  global_step_post_hooks().run(*this);
  return loss;
}

void Optimizer::step() {
  run_with_step_hooks([this] { eager_update(); });
}

double Optimizer::step(const Closure& closure) {
  return run_with_step_hooks([this] { eager_update(); }, closure);
}

// f32 `from` (a reference's result) into bf16 `to`, rounded stochastically: element k of `from`'s memory draws the
// bits of index k, as the kernels walk it (`from` shares `to`'s dense layout, or is contiguous while `to` is staged).
static void store_stochastically(const Tensor& to, const Tensor& from, uint64_t counter, uint64_t stream) {
  const float* values = from.data_as<float>();
  const bool flat = to.same_dense_layout(from);
  for (int64_t k = 0; k < from.numel(); ++k) {
    const float rounded = stochastic_round_bf16(values[k], rounding_bits(counter, stream, static_cast<uint64_t>(k)));
    if (flat)
      to.data_as<bfloat16>()[k] = bfloat16(rounded); // exact: `rounded` is a bf16 value
    else
      to.set_item(k, rounded);
  }
}

void Optimizer::forloop_step_in_compute_dtype(const ParamGroup& group, const Tensor& complex_or_real_param,
                                              const Tensor& complex_or_real_grad, ParamState& complex_or_real_state) {
  // A complex param steps on its real view, as torch's optimizers do: every formula acts per component.
  const Tensor param = complex_or_real_param.real_view(), grad = complex_or_real_grad.real_view();
  ParamState state;
  for (const auto& [key, t] : complex_or_real_state)
    state.emplace_back(key, t.real_view()); // the same memory: updates land in the complex state
  const Dtype compute = compute_dtype(param.dtype());
  const bool flat = LayoutStaging::walkable_flat(param, grad, state); // the references index memory flat
  if (compute == param.dtype() && flat)
    return forloop_step(group, param, grad, state);
  // Low-precision storage: the f32 reference on f32 copies, then one rounding per stored value (torch's opmath).
  // Tensors that share no dense layout: the reference on contiguous copies. (Tensor::to keeps a tensor already in
  // the compute dtype, such as the scalar state, so the formula updates it in place unless it must be copied.)
  auto working = [&](const Tensor& t) { return flat || t.is_contiguous() ? t.to(compute) : t.to(compute).clone(); };
  ParamState state_f;
  for (const auto& [key, t] : state)
    state_f.emplace_back(key, working(t));
  // With master weights the reference updates the f32 master, and the param is rounded from it.
  const Tensor master = group.get("master_weights") != 0 ? find_state(state_f, kMasterParam) : Tensor();
  const Tensor param_f = master.defined() ? master : working(param);
  forloop_step(group, param_f, working(grad), state_f);
  // Each result rounded once into its storage: to nearest, or stochastically with the kernels' stream (the slot's
  // position among the graph's slots: param, grad, then the state entries in spec order).
  const bool stochastic = group.get("stochastic_rounding") != 0;
  const std::vector<StateSpec> specs = stochastic ? [&] {
    Structure s = traced_structure(group);
    param_structure(complex_or_real_param, s);
    return step_state_specs(s);
  }()
                                                  : std::vector<StateSpec>{};
  const uint64_t counter = rounding_counter(rounding_seed_, rounding_steps_);
  auto store = [&](const Tensor& to, const Tensor& from, const std::string& slot) {
    if (!stochastic || to.dtype() != Dtype::bf16)
      return to.copy_from(from.to(to.dtype()));
    int64_t position = 0; // "param"
    for (std::size_t k = 0; k < specs.size(); ++k)
      if (specs[k].name == slot)
        position = 2 + static_cast<int64_t>(k);
    const auto stream = static_cast<uint64_t>(find_state(state, kRoundingStream).item()) * Tracer::kSlotsPerStream +
                        static_cast<uint64_t>(position);
    store_stochastically(to, from, counter, stream);
  };
  if (!param_f.same(param))
    store(param, param_f, "param");
  for (std::size_t k = 0; k < state.size(); ++k)
    if (!state_f[k].second.same(state[k].second))
      store(state[k].second, state_f[k].second, state[k].first);
}

void Optimizer::forloop_step(const ParamGroup&, const Tensor&, const Tensor&, ParamState&) const {
  OPTJIT_ASSERT(false, name_ + " has no forloop reference; eager_update checks has_forloop_reference() first");
}

void Optimizer::eager_update() {
  const Stepping exclusive(*this); // the interpreted driver below holds it again
  if (step_skipped())
    return;
  if (!foreach_ && !has_forloop_reference())
    throw Error(name_ + " has no forloop reference (foreach=false): step it with foreach=true or compile it");
  check_step();
  for (int64_t i = 0; i < param_count(); ++i)
    if (const Tensor& p = flat_param(i); p.grad().defined() && p.device().kind == DeviceKind::cuda)
      throw Error(name_ + ": param " + std::to_string(i) + " is on " + p.device().to_string() +
                  ", and eager and forloop steps run on the CPU: compile the step (optjit::compile) to run it on "
                  "the GPU");
  if (!foreach_) {
    std::vector<Tensor> used(static_cast<std::size_t>(param_count())); // what each step reads as its grad
    for (int64_t i = 0; i < param_count(); ++i)
      if (const Tensor g = flat_param(i).grad(); g.defined())
        used[static_cast<std::size_t>(i)] = grad_scale_.defined() ? unscaled(g.real_view(), grad_scale_.item()) : g;
    const std::vector<Tensor> unclipped = used;
    if (has_grad_pass()) { // the compiled steps' grad pass, on the host, taken the same way
      GradPassTotals totals;
      if (clipping_)
        totals.norm_partial = forloop_grad_norm(used, clipping_->norm_type);
      if (checks_grads_finite()) {
        std::vector<Tensor> given; // the grads as given, before grad_scale divides them
        for (int64_t i = 0; i < param_count(); ++i)
          given.push_back(flat_param(i).grad());
        totals.nonfinite = any_nonfinite(given);
      }
      if (!take_grad_pass(totals)) // may throw; no state was created yet
        return;
    }
    if (clipping_)
      for (Tensor& g : used)
        if (g.defined())
          g = clipped(g.real_view(), clip_coefficient_);
    ensure_state();
    for (int64_t i = 0; i < param_count(); ++i) {
      const Tensor& p = flat_param(i);
      Tensor g = p.grad();
      if (!g.defined())
        continue;
      forloop_step_in_compute_dtype(groups_[static_cast<std::size_t>(group_of_flat(i))], p,
                                    used[static_cast<std::size_t>(i)], states_[static_cast<std::size_t>(i)]);
      if (stores_unscaled_grads())
        g.real_view().copy_from(unclipped[static_cast<std::size_t>(i)].to(component_dtype(g.dtype())));
    }
    after_step();
    return;
  }
  ensure_state();
  if (!eager_step_) {
    CompileOptions interpreted;
    interpreted.execution = Execution::Interpreted;
    eager_step_ = std::make_unique<CompiledStep>(*this, interpreted);
  }
  eager_step_->update();
}

} // namespace optjit
