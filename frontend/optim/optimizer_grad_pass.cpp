// The grad pass: gradient scaling (GradScaler's grad_scale and found_inf), the in-step inf check and fused grad-norm
// clipping, described for the driver (which builds and runs it before the update: compiler/grad_pass.h), its totals
// taken; and the same on the host for the eager steps.
#include "frontend/optim/optimizer.h"
#include "frontend/optim/optimizer_parts.h"
#include "frontend/optim/validation.h"
#include "ir/op_semantics.h"
#include "runtime/error.h"

#include <algorithm>
#include <cmath>
#include <spdlog/spdlog.h>
#include <utility>

namespace optjit {

using namespace optimizer_detail;

void Optimizer::set_grad_scaling(Tensor grad_scale, Tensor found_inf, GradsAfterStep grads, InfCheck check) {
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor&>{"grad_scale", grad_scale}, {"found_inf", found_inf}})
    if (t.defined() && (t.numel() != 1 || t.dtype() != Dtype::f32))
      throw Error(fmt::format("{} is {}: a gradient scaler's {} holds one f32 element", name, t.describe(), name));
  if (check == InfCheck::InStep && !found_inf.defined())
    throw Error("found_inf is undefined, and an in-step inf check writes what it finds there: pass a found_inf "
                "tensor holding 0");
  if (check == InfCheck::InKernels && !found_inf.defined())
    throw Error("found_inf is undefined, and InfCheck::InKernels has the kernels read it: pass the caller's found_inf");
  grad_scale_ = std::move(grad_scale);
  found_inf_ = std::move(found_inf);
  grads_after_step_ = grads;
  inf_check_ = check;
}

bool Optimizer::step_skipped() const {
  found_inf_read_.reset(); // a new step
  return found_inf_.defined() && !skips_in_kernels() && found_inf_.item() != 0;
}

// Whether nothing about the grad pass's totals is decided on the host: no error_if_nonfinite (the norm of an inf
// step must not raise), no reducer of the optimizer's own over processes.
static bool grad_totals_decide_nothing_on_host(const Optimizer& opt) {
  return !(opt.grad_clipping() && opt.grad_clipping()->error_if_nonfinite) && !opt.reduces_grad_pass_over_processes();
}

bool Optimizer::skips_in_kernels() const {
  if (!found_inf_.defined() || inf_check_ == InfCheck::ByCaller)
    return false;
  if (!clipping_ && inf_check_ == InfCheck::InKernels)
    return true;
  // A clipping step or an in-step check: where their totals may stay on found_inf's device.
  return found_inf_.device().kind != DeviceKind::cpu && grad_totals_decide_nothing_on_host(*this);
}

bool Optimizer::kernels_would_skip() const {
  // An in-step check fills found_inf in the step itself (it is 0 before it).
  if (!skips_in_kernels() || inf_check_ != InfCheck::InKernels || found_inf_.device().kind == DeviceKind::cpu)
    return false;
  found_inf_read_ = found_inf_.item();
  return *found_inf_read_ != 0;
}

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

Tensor optimizer_detail::unscaled(const Tensor& grad, double scale) {
  return transformed(grad, scale, [](auto v, auto s) { return v / s; });
}

Tensor optimizer_detail::clipped(const Tensor& grad, double coefficient) {
  return transformed(grad, coefficient, [](auto v, auto c) { return v * c; });
}

// A grad's elements in its compute dtype, contiguous (the forloop's norm and inf check walk them flat).
static Tensor contiguous_compute_values(const Tensor& grad) {
  const Tensor g = grad.real_view().to(compute_dtype(grad.real_view().dtype()));
  return g.is_contiguous() ? g : g.clone();
}

// The forloop's partial grad norm: each grad's sum of squares (or largest |element|) in f64, combined in param order
// (GradNormTotal: each norm rounded to its grad's dtype, as torch's).
double optimizer_detail::forloop_grad_norm(const std::vector<Tensor>& grads, double norm_type) {
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

void Optimizer::set_grad_clipping(std::optional<GradClipping> clipping) {
  if (clipping) {
    // Any max_norm, as clip_grad_norm_ takes it: inf clips nothing (the coefficient clamps to 1) and only logs the
    // norm; a negative one flips the grads, as torch's coefficient does.
    if (clipping->norm_type != 2.0 && clipping->norm_type != std::numeric_limits<double>::infinity())
      throw Error("norm_type is " + python_float(clipping->norm_type) + ": fused clipping takes 2 or inf");
  }
  clipping_ = clipping;
  state_created_since_grad_pass_.clear();
  grad_norm_on_device_ = clip_coefficient_on_device_ = Tensor();
}

GradPass Optimizer::grad_pass() const {
  GradPass pass;
  pass.clips = clips_grads();
  pass.norm_type = clipping_ ? clipping_->norm_type : 2.0;
  pass.checks_finite = checks_grads_finite();
  if (grad_scale_.defined()) // the norm is of the unscaled grads, as clip_grad_norm_ after GradScaler's unscale_
    pass.grad_divisor = "grad_scale";
  if (clipping_)
    pass.coefficient = kClipCoefficient;
  return pass;
}

bool Optimizer::grad_totals_may_stay_on_device() const {
  return has_grad_pass() && grad_totals_decide_nothing_on_host(*this) && (!checks_grads_finite() || skips_in_kernels());
}

// A copy on another device or of another kind is not written (grad_norm_copied() says so): the caller reads the norm
// back instead.
Tensor Optimizer::grad_norm_copy() const { return grad_norm_copied() ? grad_norm_copy_ : Tensor(); }

bool Optimizer::grad_norm_copied() const {
  const Tensor& copy = grad_norm_copy_;
  return grad_norm_on_device_.defined() && copy.defined() && copy.dtype() == Dtype::f64 && copy.numel() == 1 &&
         copy.device() == grad_norm_on_device_.device();
}

void Optimizer::take_grad_totals_on_device(const Tensor& total_norm, const Tensor& coefficient) {
  grad_norm_on_device_ = total_norm;
  clip_coefficient_on_device_ = coefficient;
}

void Optimizer::drop_state_created_since_grad_pass() {
  const std::vector<int64_t> created = std::exchange(state_created_since_grad_pass_, {});
  for (int64_t i : created)
    states_[static_cast<std::size_t>(i)].clear();
  if (!created.empty())
    ++state_version_;
}

bool Optimizer::take_grad_pass(const GradPassTotals& totals) {
  grad_norm_on_device_ = clip_coefficient_on_device_ = Tensor(); // this step's totals are the host's
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

} // namespace optjit
