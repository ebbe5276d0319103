#include "frontend/optim/adafactor.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace optjit {
namespace {

// torch.finfo(dtype).eps of a param's dtype: eps1's default.
double machine_epsilon(Dtype dtype) {
  switch (dtype) {
  case Dtype::f32:
  case Dtype::c64:
    return std::numeric_limits<float>::epsilon();
  case Dtype::f64:
  case Dtype::c128:
    return std::numeric_limits<double>::epsilon();
  case Dtype::bf16:
    return 0x1p-7;
  case Dtype::f16:
    return 0x1p-10;
  case Dtype::u8: // never a param's (check_grad)
  case Dtype::e4m3:
    break;
  }
  __builtin_unreachable();
}

// eps1 for the group's step: the option, or torch's default (None): finfo(dtype).eps of the first param of the
// group that has a grad. torch's single-tensor step sets it at the first param it steps and keeps it for the
// group's others, so an f32 LayerNorm in a bf16 model steps with bf16's eps when a bf16 param comes first.
double eps1_of(const ParamGroup& group) {
  const double eps1 = group.get("eps1");
  if (eps1 != kOptionNone)
    return eps1;
  for (const Tensor& p : group.params)
    if (p.grad().defined())
      return machine_epsilon(p.dtype());
  return machine_epsilon(group.params.empty() ? Dtype::f32 : group.params.front().dtype());
}

// The reference for one param (golden/FORMAT_NEXT.md's Adafactor), on contiguous data in T, norms and means in f64.
template <class T>
void adafactor_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), decay = group.get("beta2_decay"), eps2 = group.get("eps2");
  const double d = group.get("d"), weight_decay = group.get("weight_decay");
  const double eps1 = eps1_of(group);
  const bool maximize = group.get("maximize") != 0;
  const Tensor step_state = find_state(state, "step");
  const double step = step_state.item(0) + 1;
  step_state.set_item(0, step);
  const T w = static_cast<T>(std::pow(step, decay));
  const double rho = std::min(lr, 1.0 / std::sqrt(step));
  const int64_t numel = param.numel();
  T* p = param.data_as<T>();
  std::vector<T> g(static_cast<std::size_t>(numel));
  double p_sum = 0;
  for (int64_t i = 0; i < numel; ++i) {
    g[static_cast<std::size_t>(i)] = maximize ? -grad.data_as<T>()[i] : grad.data_as<T>()[i];
    p_sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  }
  const double alpha = std::max(eps2, std::sqrt(p_sum) / std::sqrt(static_cast<double>(numel))) * rho;
  if (weight_decay != 0)
    for (int64_t i = 0; i < numel; ++i)
      p[i] = p[i] * static_cast<T>(1 - lr * weight_decay);
  std::vector<T> var(static_cast<std::size_t>(numel));
  if (param.dim() > 1) {
    const int64_t n = param.shape().back(), m = param.shape()[param.shape().size() - 2];
    const int64_t batches = m * n == 0 ? 0 : numel / (m * n);
    T* row_var = find_state(state, "row_var").data_as<T>();
    T* col_var = find_state(state, "col_var").data_as<T>();
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t at = b * m * n;
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += static_cast<double>(g[at + i * n + j]) * g[at + i * n + j];
        row_var[b * m + i] = torch_lerp(row_var[b * m + i], static_cast<T>(sum / static_cast<double>(n)), w);
      }
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t i = 0; i < m; ++i)
          sum += static_cast<double>(g[at + i * n + j]) * g[at + i * n + j];
        col_var[b * n + j] = torch_lerp(col_var[b * n + j], static_cast<T>(sum / static_cast<double>(m)), w);
      }
      double row_sum = 0;
      for (int64_t i = 0; i < m; ++i)
        row_sum += row_var[b * m + i];
      const T row_mean = std::max(static_cast<T>(row_sum / static_cast<double>(m)), static_cast<T>(eps1));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          var[static_cast<std::size_t>(at + i * n + j)] = row_var[b * m + i] * col_var[b * n + j] / row_mean;
    }
  } else {
    T* variance = find_state(state, "variance").data_as<T>();
    for (int64_t i = 0; i < numel; ++i) {
      variance[i] = torch_lerp(variance[i], g[static_cast<std::size_t>(i)] * g[static_cast<std::size_t>(i)], w);
      var[static_cast<std::size_t>(i)] = variance[i];
    }
  }
  double u_sum = 0;
  for (int64_t i = 0; i < numel; ++i) {
    T& u = var[static_cast<std::size_t>(i)];
    u = g[static_cast<std::size_t>(i)] / std::sqrt(std::max(u, static_cast<T>(eps1 * eps1)));
    u_sum += static_cast<double>(u) * static_cast<double>(u);
  }
  const double denom = std::max(1.0, std::sqrt(u_sum) / (std::sqrt(static_cast<double>(numel)) * d));
  for (int64_t i = 0; i < numel; ++i)
    p[i] = p[i] + var[static_cast<std::size_t>(i)] * static_cast<T>(-alpha / denom);
}

} // namespace

Adafactor::Adafactor(std::vector<ParamGroupSpec> groups, const AdafactorOptions& o)
    : Optimizer("Adafactor", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

Adafactor::Adafactor(std::vector<Tensor> params, const AdafactorOptions& o)
    : Adafactor(one_param_group(std::move(params)), o) {}

// torch's messages, in torch's order.
void Adafactor::validate_options(const OptionMap& o) const {
  if (!(o.at("lr") >= 0.0))
    throw Error("Learning rate should be >= 0 but is: " + python_float(o.at("lr")));
  if (!(o.at("beta2_decay") <= 0.0))
    throw Error("beta2_decay should be <= 0 but is: " + python_float(o.at("beta2_decay")));
  if (o.at("eps1") != kOptionNone && !(o.at("eps1") >= 0.0))
    throw Error("epsilon1 should be >= 0 but is: " + python_float(o.at("eps1")));
  if (!(o.at("eps2") >= 0.0))
    throw Error("epsilon2 should be >= 0 but is: " + python_float(o.at("eps2")));
  if (!(o.at("d") >= 1.0))
    throw Error("Clipping threshold d should be >= 1 but is: " + python_float(o.at("d")));
  if (!(o.at("weight_decay") >= 0.0))
    throw Error("weight_decay should be >= 0 but is: " + python_float(o.at("weight_decay")));
}

Structure Adafactor::structure(const ParamGroup& group) const {
  Structure s;
  s.set("maximize", group.get("maximize") != 0);
  s.set("weight_decay", group.get("weight_decay") != 0);
  return s;
}

// A param of rank 2 or more keeps row and column variances; the others a full one.
void Adafactor::param_structure(const Tensor& param, Structure& s) const { s.set("factored", param.dim() > 1); }

void Adafactor::check_grad(int64_t flat) const {
  if (is_complex(flat_param(flat).dtype()))
    throw Error("Adafactor does not support complex parameters");
  // torch's step divides the param's norm by sqrt(numel) as Python floats, and raises ZeroDivisionError for an empty
  // param (after stepping the params before it); refused here before any param steps.
  if (flat_param(flat).numel() == 0)
    throw Error("Adafactor cannot step param " + std::to_string(flat) + " of shape " +
                shape_to_string(flat_param(flat).shape()) +
                ": it has no elements, and its relative step size divides by the param's RMS over them (torch's step "
                "raises ZeroDivisionError)");
  Optimizer::check_grad(flat);
}

std::vector<StateSpec> Adafactor::state_specs(const Structure& s) const {
  if (s["factored"])
    return {{"step", StateKind::Scalar}, {"row_var", StateKind::Rows}, {"col_var", StateKind::Cols}};
  return {{"step", StateKind::Scalar}, {"variance"}};
}

double Adafactor::hyper_value(const ParamGroup& group, const std::string& name) const {
  return name == "eps1" ? eps1_of(group) : Optimizer::hyper_value(group, name);
}

std::vector<std::string> Adafactor::hyper_names() const {
  return {"lr", "beta2_decay", "eps1", "eps2", "d", "weight_decay"};
}

namespace {

// Python's max(a, b), which torch's Adafactor takes of two Python floats: b when b > a, else a (a NaN b gives a).
Sym python_max(Sym a, Sym b) { return where(greater(b, a), b, a); }

} // namespace

// Over tensor lists, as torch's single-tensor step: the step's decay rate w = t^beta2_decay and relative step size,
// the second moment (factored into row and column means, or full), the update g / sqrt(V), clipped by its RMS.
void Adafactor::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  if (s["maximize"])
    grads = -grads;
  Sym lr = t.hyper("lr");
  Sym eps1 = t.hyper("eps1"); // its default is resolved per group and step (hyper_value)
  Sym step = t.scalar_state("step") + 1.0;
  t.store_scalar("step", step);
  step = t.as_stored("step", step); // torch reads the updated step tensor back (step_t.item())
  Sym w = pow(step, t.hyper("beta2_decay"));
  Sym rho = minimum(lr, 1.0 / sqrt(step));
  Sym root_numel = sqrt(t.numel());
  Sym alpha = python_max(t.hyper("eps2"), foreach_norm(params) / root_numel) * rho;
  if (s["weight_decay"])
    params = params * (1.0 - lr * t.hyper("weight_decay"));
  Sym squares = grads * grads;
  Sym second_moment = squares;
  if (s["factored"]) {
    Sym row_var = foreach_lerp(t.tensors("row_var"), row_mean(squares), w);
    Sym col_var = foreach_lerp(t.tensors("col_var"), col_mean(squares), w);
    t.store("row_var", row_var);
    t.store("col_var", col_var);
    second_moment = row_var * col_var / maximum(col_mean(row_var), eps1);
  } else {
    second_moment = foreach_lerp(t.tensors("variance"), squares, w);
    t.store("variance", second_moment);
  }
  Sym update = grads / sqrt(maximum(second_moment, eps1 * eps1));
  Sym denom = python_max(t.constant(1.0), foreach_norm(update) / (root_numel * t.hyper("d")));
  t.store("param", params + update * (-alpha / denom));
}

void Adafactor::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                             ParamState& state) const {
  // Rows and columns are indexed in element order: a param in another layout steps through contiguous copies.
  const Tensor p = param.is_contiguous() ? param : param.clone();
  const Tensor g = grad.is_contiguous() ? grad : grad.clone();
  visit_compute_dtype(param.dtype(), [&]<class T>() { adafactor_forloop<T>(group, p, g, state); });
  if (!p.same(param))
    param.copy_from(p);
}

} // namespace optjit
