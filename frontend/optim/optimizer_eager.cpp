// The eager steps: the forloop reference (foreach=false) per param in its compute dtype, and the interpreted foreach
// graph (foreach=true), between the step hooks.
#include "compiler/layout_staging.h"
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "ir/block_slots.h"
#include "runtime/error.h"
#include "runtime/stochastic_rounding.h"

#include <algorithm>
#include <set>

namespace optjit {

using namespace optimizer_detail;

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
  const auto quantized = [](const auto& entry) { return is_code_dtype(entry.second.dtype()); };
  if (std::none_of(complex_or_real_state.begin(), complex_or_real_state.end(), quantized))
    return forloop_step_in_storage(group, complex_or_real_param, complex_or_real_grad, complex_or_real_state);
  // Block-quantized entries: the reference steps on their values (dequantized, f32), which are then quantized back,
  // as the kernels load and store them (ir/block_slots.h).
  Structure structure = traced_structure(group);
  param_structure(complex_or_real_param, structure);
  const std::vector<StateSpec> specs = step_state_specs(structure);
  std::set<std::string> scales_keys; // a quantized entry's scales go with it
  for (const auto& [key, t] : complex_or_real_state)
    if (is_code_dtype(t.dtype()))
      scales_keys.insert(scales_slot_name(key));
  ParamState values;
  std::vector<std::pair<Slot, std::size_t>> stored; // each quantized entry's slot, and its place in `values`
  for (const auto& [key, t] : complex_or_real_state) {
    if (!is_code_dtype(t.dtype())) {
      if (!scales_keys.count(key))
        values.emplace_back(key, t);
      continue;
    }
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == key; });
    OPTJIT_ASSERT(spec != specs.end(), "quantized state '" + key + "' has no spec");
    const Tensor scales = find_state(complex_or_real_state, scales_slot_name(key));
    const Slot slot{key, SlotRole::State, SlotKind::Tensor, Dtype::f32,
                    held_blocks(*spec, t, scales, complex_or_real_param.numel())};
    stored.emplace_back(slot, values.size());
    values.emplace_back(key, load_block_slot(slot, t, scales, complex_or_real_param.shape()));
  }
  forloop_step_in_storage(group, complex_or_real_param, complex_or_real_grad, values);
  for (const auto& [slot, at] : stored)
    store_block_slot(slot, values[at].second, find_state(complex_or_real_state, slot.name),
                     find_state(complex_or_real_state, scales_slot_name(slot.name)));
}

void Optimizer::forloop_step_in_storage(const ParamGroup& group, const Tensor& complex_or_real_param,
                                        const Tensor& complex_or_real_grad, ParamState& complex_or_real_state) {
  // A complex param steps on its real view, as torch's optimizers do: every formula acts per component.
  const Tensor param = complex_or_real_param.real_view(), grad = complex_or_real_grad.real_view();
  ParamState state;
  for (const auto& [key, t] : complex_or_real_state)
    state.emplace_back(key, t.real_view()); // the same memory: updates land in the complex state
  const Dtype compute = step_compute_dtype(param.dtype());
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

const StepMetrics* Optimizer::eager_metrics() const { return eager_step_ ? &eager_step_->metrics() : nullptr; }

void Optimizer::eager_update() {
  const Stepping exclusive(*this);                    // the interpreted driver below holds it again
  if (found_inf_.defined() && found_inf_.item() != 0) // the host's own decision, InfCheck::InKernels too
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
