// What the compiler sees of an optimizer (compiler/step_source.h): buckets of params, the traced graph of each, the
// slots and argument lists, and this step's hyperparameters.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "runtime/error.h"
#include "runtime/stochastic_rounding.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace optjit {

using namespace optimizer_detail;

// The value of a hyperparameter the kernels read on the device: never read on the host.
static constexpr double kLeftOnDevice = std::numeric_limits<double>::quiet_NaN();

const Tensor* Optimizer::device_operand(std::size_t g, const std::string& name) const {
  const Tensor* held = nullptr;
  if (name == "grad_scale") {
    held = grad_scale_.defined() ? &grad_scale_ : nullptr;
  } else if (name == kFoundInf) {
    held = found_inf_.defined() ? &found_inf_ : nullptr;
  } else if (name == kClipCoefficient) { // where this step's grad totals stay on the device
    held = clip_coefficient_on_device_.defined() ? &clip_coefficient_on_device_ : nullptr;
  } else {
    const auto& options = groups_[g].tensor_options;
    const auto it = options.find(name);
    held = it == options.end() ? nullptr : &it->second;
  }
  if (!held || held->device().kind == DeviceKind::cpu || held->numel() != 1 ||
      (held->dtype() != Dtype::f32 && held->dtype() != Dtype::f64))
    return nullptr;
  return held;
}

const Tensor* Optimizer::left_on_device_operand(std::size_t g, const std::string& name,
                                                const std::vector<DeviceHyper>& left_on_device) const {
  for (const DeviceHyper& h : left_on_device)
    if (h.name == name) {
      const Tensor* t = device_operand(g, name);
      return t && t->dtype() == h.dtype && t->device() == h.device ? t : nullptr;
    }
  return nullptr;
}

std::vector<DeviceHyper> Optimizer::device_hypers() const {
  std::vector<DeviceHyper> hypers;
  const bool scaler_on_device = (grad_scale_.defined() && grad_scale_.device().kind != DeviceKind::cpu) ||
                                (skips_in_kernels() && found_inf_.device().kind != DeviceKind::cpu);
  if (!scaler_on_device &&
      std::all_of(groups_.begin(), groups_.end(), [](const ParamGroup& g) { return g.tensor_options.empty(); }))
    return hypers; // the usual step: numbers only
  for (const std::string& name : step_hyper_names())
    for (std::size_t g = 0; g < groups_.size(); ++g)
      if (const Tensor* t = name == kClipCoefficient ? nullptr : device_operand(g, name)) { // the program's own
        hypers.push_back({name, t->dtype(), t->device()});
        break;
      }
  return hypers;
}

std::vector<const void*> Optimizer::device_hyper_addresses(const std::vector<DeviceHyper>& left_on_device) const {
  if (left_on_device.empty())
    return {};
  const std::vector<std::string> names = step_hyper_names();
  std::vector<const void*> addresses(groups_.size() * names.size(), nullptr);
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t k = 0; k < names.size(); ++k)
      if (const Tensor* t = left_on_device_operand(g, names[k], left_on_device))
        addresses[g * names.size() + k] = t->data();
  return addresses;
}

std::vector<double> Optimizer::hyper_values(const std::vector<DeviceHyper>& left_on_device) const {
  const std::vector<std::string> names = hyper_names();
  const bool scale_left = grad_scale_.defined() && left_on_device_operand(0, "grad_scale", left_on_device);
  // Read once: a scale on a device costs a copy and a wait, unless the kernels read it there.
  const double scale = grad_scale_.defined() && !scale_left ? grad_scale_.item() : kLeftOnDevice;
  const bool found_inf_left = skips_in_kernels() && left_on_device_operand(0, kFoundInf, left_on_device);
  double found_inf = kLeftOnDevice;
  if (skips_in_kernels() && !found_inf_left) {
    if (found_inf_read_) // the value kernels_would_skip read this step
      found_inf = *found_inf_read_;
    else if (inf_check_ == InfCheck::InStep) // 0 before the step's check, which skips the update on the host if set
      found_inf = 0;
    else
      found_inf = found_inf_.item();
  }
  const bool coefficient_left = clipping_ && left_on_device_operand(0, kClipCoefficient, left_on_device);
  const bool rounding = any_stochastic_rounding();
  const double counter = // exact: < 2^53
      rounding ? static_cast<double>(rounding_counter(rounding_seed_, rounding_steps_)) : 0.0;
  std::vector<double> values;
  values.reserve(groups_.size() * (names.size() + 2));
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    for (const std::string& name : names)
      values.push_back(left_on_device_operand(g, name, left_on_device) ? kLeftOnDevice : hyper_value(group, name));
    if (grad_scale_.defined())
      values.push_back(scale);
    if (skips_in_kernels())
      values.push_back(found_inf);
    if (clipping_)
      values.push_back(coefficient_left ? kLeftOnDevice : clip_coefficient_);
    if (rounding)
      values.push_back(counter);
  }
  return values;
}

std::vector<std::string> Optimizer::step_hyper_names() const {
  std::vector<std::string> names = hyper_names();
  if (grad_scale_.defined())
    names.emplace_back("grad_scale");
  if (skips_in_kernels())
    names.emplace_back(kFoundInf);
  if (clipping_)
    names.emplace_back(kClipCoefficient);
  if (any_stochastic_rounding())
    names.emplace_back(kRoundingCounter);
  return names;
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
  s.set("found_inf_in_kernels", skips_in_kernels());
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
    std::vector<std::optional<SlotBlocks>> state_blocks = state_blocks_of(*this, i, structure.specs);
    const uint64_t on_host = host_scalar_entries(flat_state(i), p);
    Bucket* bucket = nullptr;
    for (Bucket& b : buckets)
      if (b.dtype == p.dtype() && b.device == p.device() && b.structure_key == key && b.state_dtypes == state_dtypes &&
          b.state_blocks == state_blocks && b.host_scalar_entries == on_host)
        bucket = &b;
    if (!bucket) {
      buckets.push_back(
          Bucket{p.dtype(), p.device(), key, std::move(state_dtypes), std::move(state_blocks), {}, on_host});
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
  std::vector<Slot> slots = {{"param", SlotRole::Param, SlotKind::Tensor, stored, {}},
                             {"grad", SlotRole::Grad, SlotKind::Tensor, stored, {}}};
  const std::vector<StateSpec> specs = step_state_specs(structure);
  OPTJIT_ASSERT(bucket.state_dtypes.size() == specs.size(), "the bucket's state dtypes do not match its state specs");
  for (std::size_t k = 0; k < specs.size(); ++k)
    slots.push_back({specs[k].name, SlotRole::State, slot_kind_of(specs[k].kind),
                     bucket.state_blocks.at(k) ? Dtype::f32 : component_dtype(bucket.state_dtypes[k]),
                     bucket.state_blocks.at(k)});
  return slots;
}

Dtype Optimizer::bucket_compute_dtype(const ParamBucket& bucket) const {
  const std::vector<StateSpec> specs = step_state_specs(param_traced_structure(bucket.members.front().flat));
  Dtype widest = step_compute_dtype(bucket.dtype);
  for (std::size_t k = 0; k < specs.size() && k < bucket.state_dtypes.size(); ++k)
    if (specs[k].kind != StateKind::Scalar && !specs[k].copies_param &&
        step_compute_dtype(bucket.state_dtypes[k]) == Dtype::f64)
      widest = Dtype::f64;
  return widest;
}

StepDescription Optimizer::describe() const {
  StepDescription step;
  for (ParamBucket& bucket : make_buckets(BucketMembers::All)) {
    Graph graph = trace_bucket(bucket);
    step.buckets.push_back({std::move(bucket), std::move(graph)});
  }
  step.grad_pass = grad_pass();
  step.walks_rows_and_columns.resize(static_cast<std::size_t>(param_count()));
  for (int64_t i = 0; i < param_count(); ++i)
    step.walks_rows_and_columns[static_cast<std::size_t>(i)] = walks_rows_and_columns(i);
  step.writes_grads = writes_grads();
  return step;
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
  if (s["found_inf_in_kernels"])
    tracer.keep_old_values_when(kFoundInf);
  trace(tracer, s);
  return tracer.finish();
}

ListArguments Optimizer::list_arguments(const ParamBucket& bucket) const {
  ListArguments args;
  args.hyper_names = step_hyper_names();
  args.hyper = hyper_values(device_hypers()); // placeholders: each step sets its own
  const std::vector<Slot> declared = slots(param_traced_structure(bucket.members.front().flat), bucket);
  for (const Slot& slot : declared) {
    args.slot_names.push_back(slot.name);
    args.slot_tensors.emplace_back();
  }
  std::vector<std::string> scales; // each block-quantized state slot's scales, after the declared slots
  for (const Slot& slot : declared)
    if (slot.blocks) {
      scales.push_back(scales_slot_name(slot.name));
      args.slot_names.push_back(scales.back());
      args.slot_tensors.emplace_back();
    }
  for (const Member& m : bucket.members) {
    const Tensor& p = flat_param(m.flat);
    args.group_of.push_back(m.group);
    args.shapes.push_back(p.real_view().shape());
    for (std::size_t k = 0; k < declared.size(); ++k) {
      Tensor t;
      switch (declared[k].role) {
      case SlotRole::Param:
        t = p; // or its staging copy: the driver substitutes it (compiler/layout_staging.h)
        break;
      case SlotRole::Grad:
        t = p.grad();
        break;
      case SlotRole::State:
        t = find_state(flat_state(m.flat), declared[k].name);
        OPTJIT_ASSERT(t.defined(), "state " + declared[k].name + " missing; ensure_state() runs first");
        break;
      case SlotRole::Scratch:
        OPTJIT_ASSERT(false, "an optimizer declares no scratch slot: " + declared[k].name);
      }
      args.slot_tensors[k].push_back(t.real_view()); // complex tensors run as their (re, im) components
    }
    for (std::size_t k = 0; k < scales.size(); ++k) {
      const Tensor t = find_state(flat_state(m.flat), scales[k]);
      OPTJIT_ASSERT(t.defined(), "state " + scales[k] + " missing; ensure_state() runs first");
      args.slot_tensors[declared.size() + k].push_back(t);
    }
  }
  return args;
}

bool Optimizer::param_traced_structure_has_axes(int64_t flat) const {
  if (!has_param_structure())
    return false;
  for (const StateSpec& spec : step_state_specs(param_traced_structure(flat)))
    if (spec.kind == StateKind::Rows || spec.kind == StateKind::Cols)
      return true;
  return false;
}

} // namespace optjit
