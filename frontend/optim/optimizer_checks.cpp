// The checks every step runs before anything changes: hyperparameters, grads, state shapes and devices, precision
// options, and params that share memory.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "frontend/optim/state_dtype.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"
#include "runtime/shared_memory.h"
#include "runtime/stochastic_rounding.h"

#include <algorithm>
#include <cmath>
#include <spdlog/spdlog.h>
#include <utility>

namespace optjit {

using namespace optimizer_detail;

bool Optimizer::any_stochastic_rounding() const {
  for (const ParamGroup& group : groups_)
    if (group.get("stochastic_rounding") != 0)
      return true;
  return false;
}

void Optimizer::check_hyperparameters() const {
  const std::vector<std::string> names = step_options();
  for (std::size_t g = 0; g < groups_.size(); ++g) { // a flag set to 0.5 (ParamGroup::set) would step as true
    check_flags(groups_[g].options, "param group " + std::to_string(g));
    check_state_dtype(groups_[g], g);
    check_step_options(groups_[g], g);
  }
  // Values in tensors on a device are not read back to check them (a copy and a wait each step), as torch's
  // capturable and fused steps do not check them either.
  for (std::size_t g = 0; g < groups_.size() && requires_finite_hyperparameters(); ++g)
    for (const std::string& name : names)
      if (groups_[g].held_on_device(name))
        continue;
      else if (double v = groups_[g].get(name); !std::isfinite(v))
        throw Error("hyperparameter " + name + " of param group " + std::to_string(g) + " is " + python_float(v) +
                    ": hyperparameters must be finite");
  for (const Tensor* t : {&grad_scale_, &found_inf_}) // on the CPU, or where params are (read there each step)
    if (t->defined() && t->device().kind != DeviceKind::cpu &&
        std::none_of(flat_params_.begin(), flat_params_.end(),
                     [&](const Tensor& p) { return p.device() == t->device(); }))
      throw Error(fmt::format("{} is {}, a device none of the params is on: a gradient scaler's tensors are on the "
                              "CPU or on the params' device",
                              t == &grad_scale_ ? "grad_scale" : "found_inf", t->describe()));
  if (grad_scale_.defined() && grad_scale_.device().kind == DeviceKind::cpu)
    if (const double scale = grad_scale_.item(); !(std::isfinite(scale) && scale > 0))
      throw Error("grad_scale is " + python_float(scale) +
                  ": a gradient scale must be a positive finite number (grads are divided by it)");
  check_precision_options();
}

void Optimizer::check_grad(int64_t flat) const {
  const Tensor& p = flat_param(flat);
  if (is_code_dtype(p.dtype()))
    throw Error(fmt::format("param {} is {}: an optimizer steps floating-point or complex params ({} is the storage of "
                            "quantized state codes)",
                            flat, p.describe(), dtype_name(p.dtype())));
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

void Optimizer::check_state_dtype(const ParamGroup& group, std::size_t index) const {
  const StateDtype dtype = state_dtype_option(group, static_cast<int64_t>(index));
  const int64_t block = state_block_size_option(group, static_cast<int64_t>(index), dtype); // refuses a non-block
  if (dtype == StateDtype::plain && block == 0)
    return;
  if (const std::string refusal = state_dtype_refusal(group); !refusal.empty())
    throw Error(fmt::format("param group {} has {}, which {} cannot keep: {}", index,
                            dtype != StateDtype::plain ? fmt::format("state_dtype='{}'", state_dtype_name(dtype))
                                                       : fmt::format("state_block_size={}", block),
                            name_, refusal));
  if (dtype == StateDtype::plain)
    return;
  for (std::size_t k = 0; k < group.params.size(); ++k)
    if (is_complex(group.params[k].dtype()))
      throw Error(fmt::format("param group {} has state_dtype='{}' and a complex param ({}): block-quantized state "
                              "holds real values; put complex params in a group of their own with plain state",
                              index, state_dtype_name(dtype), group.params[k].describe()));
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

} // namespace optjit
