#include "frontend/optim/lowbit_adam.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <cmath>

namespace optjit {
namespace {

// x ** y as torchao's compiled CPU step computes it: powf on f32 operands (not a double pow rounded to f32).
Sym powf_of(Tracer& t, Sym base, Sym exponent) {
  GraphBuilder& b = t.builder();
  const ValueId pow = b.binary(Op::pow, b.cast(base.id(), Dtype::f32), b.cast(exponent.id(), Dtype::f32));
  return t.wrap(b.cast(pow, Dtype::f64));
}

// The scalars of one step of one param, as torchao's compiled step rounds them (docs/torchao_lowbit.md, section 4.4):
// Python floats rounded once to f32, the lerp weights' double subtractions rounded after, f32 bias corrections.
template <class T> struct StepScalars {
  T lr, weight_decay, eps, bias_correction1, bias_correction2_sqrt;
  T weight1, weight1_other, weight2, weight2_other; // each lerp's weight, and the other branch's (w - 1)
  bool small1, small2;                              // |w| < 0.5: the lerp's first branch

  StepScalars(const ParamGroup& group, float step) {
    lr = static_cast<T>(static_cast<float>(group.get("lr")));
    weight_decay = static_cast<T>(static_cast<float>(group.get("weight_decay")));
    eps = static_cast<T>(static_cast<float>(group.get("eps")));
    const double beta1 = group.get("beta1"), beta2 = group.get("beta2");
    bias_correction1 = static_cast<T>(1.0f - std::pow(static_cast<float>(beta1), step));
    bias_correction2_sqrt = static_cast<T>(std::sqrt(1.0f - std::pow(static_cast<float>(beta2), step)));
    const double w1 = 1.0 - beta1, w2 = 1.0 - beta2;
    weight1 = static_cast<T>(static_cast<float>(w1));
    weight1_other = static_cast<T>(static_cast<float>(w1 - 1.0));
    weight2 = static_cast<T>(static_cast<float>(w2));
    weight2_other = static_cast<T>(static_cast<float>(w2 - 1.0));
    small1 = std::fabs(w1) < 0.5;
    small2 = std::fabs(w2) < 0.5;
  }
};

// torch's lerp as inductor decomposes it, without a fused multiply-add: start + (end - start) w, or from the end.
template <class T> T lerp_unfused(T start, T end, T weight, T other_weight, bool small) {
  const T diff = end - start;
  return small ? start + diff * weight : end + diff * other_weight;
}

// The reference for one param (its state's values, dequantized: Optimizer::forloop_step_in_compute_dtype).
template <class T>
void lowbit_adam_forloop(const ParamGroup& group, bool decoupled, const Tensor& param, const Tensor& grad,
                         ParamState& state) {
  Tensor step = find_state(state, "step");
  const float t = static_cast<float>(step.item()) + 1.0f; // torchao's f32 step tensor, counted before the math
  step.fill(t);
  const StepScalars<T> s(group, t);
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* m = find_state(state, "exp_avg").data_as<T>();
  T* v = find_state(state, "exp_avg_sq").data_as<T>();
  const Tensor max_sq = find_state(state, "max_exp_avg_sq");
  T* vmax = max_sq.defined() ? max_sq.data_as<T>() : nullptr;
  const T lr_decay = s.lr * s.weight_decay;
  for (int64_t i = 0; i < param.numel(); ++i) {
    T pi = p[i], gi = g[i];
    if (decoupled)
      pi = pi - lr_decay * pi;
    else
      gi = gi + s.weight_decay * pi;
    const T mi = lerp_unfused(m[i], gi, s.weight1, s.weight1_other, s.small1);
    const T square = gi * gi;
    const T vi = lerp_unfused(v[i], square, s.weight2, s.weight2_other, s.small2);
    m[i] = mi;
    v[i] = vi;
    T denominator_of = vi;
    if (vmax) {
      vmax[i] = std::isnan(vmax[i]) || std::isnan(vi) ? std::numeric_limits<T>::quiet_NaN() : std::max(vmax[i], vi);
      denominator_of = vmax[i];
    }
    const T denominator = std::sqrt(denominator_of) / s.bias_correction2_sqrt + s.eps;
    p[i] = pi - (s.lr * (mi / s.bias_correction1)) / denominator;
  }
}

// block_size 0: the format's own default (torchao's: 128 for 4 bits, 256 otherwise).
OptionMap with_default_block(OptionMap options, StateDtype state) {
  if (options.at("block_size") == 0)
    options["block_size"] = static_cast<double>(
        default_block_size(state == StateDtype::int4 ? BlockFormat::Signed4 : BlockFormat::Signed8));
  return options;
}

} // namespace

LowBitAdam::LowBitAdam(std::string name, StateDtype state, bool decoupled, std::vector<ParamGroupSpec> groups,
                       OptionMap defaults, std::optional<bool> foreach, std::set<std::string> flags)
    : Optimizer(std::move(name), with_default_block(std::move(defaults), state), foreach.value_or(false),
                std::move(flags)),
      state_(state), decoupled_(decoupled) {
  validate_options(this->defaults());
  add_param_groups(std::move(groups));
}

// torchao's checks and messages (torchao/optim/adam.py), then block_size's.
void LowBitAdam::validate_options(const OptionMap& o) const {
  if (!(o.at("lr") >= 0.0))
    throw Error("Invalid learning rate: " + python_float(o.at("lr")));
  if (!(o.at("eps") >= 0.0))
    throw Error("Invalid epsilon value: " + python_float(o.at("eps")));
  for (int index : {0, 1}) {
    const double beta = o.at(index == 0 ? "beta1" : "beta2");
    if (!(beta >= 0.0 && beta < 1.0))
      throw Error("Invalid beta parameter at index " + std::to_string(index) + ": " + python_float(beta));
  }
  if (!std::isfinite(o.at("weight_decay")))
    throw Error("Invalid weight_decay value: " + python_float(o.at("weight_decay")));
  const double block = o.at("block_size");
  if (!(block >= 1 && block <= static_cast<double>(kMaxQuantizationBlock) && block == std::floor(block)) ||
      (state_ == StateDtype::int4 && std::fmod(block, 2.0) != 0))
    throw Error(fmt::format("Invalid block_size: {} ({} keeps whole blocks of 1 to {} values{})", python_float(block),
                            this->name(), kMaxQuantizationBlock,
                            state_ == StateDtype::int4 ? ", an even number: two 4-bit codes share a byte" : ""));
}

Structure LowBitAdam::structure(const ParamGroup& group) const {
  Structure s;
  s.set("amsgrad", group.get("amsgrad") != 0);
  return s;
}

std::vector<StateSpec> LowBitAdam::state_specs(const Structure& s) const {
  std::vector<StateSpec> specs = {
      {"step", StateKind::Scalar}, {"exp_avg"}, {.name = "exp_avg_sq", .signed_values = false}};
  if (s["amsgrad"])
    specs.push_back({.name = "max_exp_avg_sq", .signed_values = false});
  return specs;
}

std::vector<std::string> LowBitAdam::hyper_names() const { return {"lr", "beta1", "beta2", "eps", "weight_decay"}; }

std::optional<SlotBlocks> LowBitAdam::state_format(int64_t flat, const StateSpec& spec) const {
  const auto block =
      static_cast<int64_t>(param_groups()[static_cast<std::size_t>(group_of_flat(flat))].get("block_size"));
  return state_dtype_format(state_, spec, block);
}

// torchao's single_param_adam over tensor lists, in f32 (docs/torchao_lowbit.md, section 4.4).
void LowBitAdam::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  const auto f32 = [&](Sym x) { return t.rounded(Dtype::f32, x); };
  Sym step = t.store_scalar("step", t.scalar_state("step") + 1.0);
  Sym lr = f32(t.hyper("lr")), weight_decay = f32(t.hyper("weight_decay"));
  if (decoupled_)
    params = params - f32(lr * weight_decay) * params;
  else
    grads = grads + weight_decay * params;
  Sym beta1 = t.hyper("beta1"), beta2 = t.hyper("beta2");
  Sym bias_correction1 = f32(1.0 - powf_of(t, f32(beta1), f32(step)));
  Sym bias_correction2_sqrt = f32(sqrt(f32(1.0 - powf_of(t, f32(beta2), f32(step)))));
  // The lerps as inductor decomposes them: start + (end - start) w when |w| < 0.5, else end + (end - start)(w - 1).
  const auto lerp = [&](Sym start, Sym end, Sym beta) {
    Sym weight = 1.0 - beta, diff = end - start;
    Sym small = less(abs(weight), t.constant(0.5));
    return where(small, start, end) + diff * f32(where(small, weight, weight - 1.0));
  };
  Sym exp_avg = lerp(t.tensors("exp_avg"), grads, beta1);
  Sym exp_avg_sq = lerp(t.tensors("exp_avg_sq"), grads * grads, beta2);
  t.store("exp_avg", exp_avg);
  t.store("exp_avg_sq", exp_avg_sq);
  Sym second = exp_avg_sq;
  if (s["amsgrad"]) {
    second = maximum(t.tensors("max_exp_avg_sq"), exp_avg_sq);
    t.store("max_exp_avg_sq", second);
  }
  Sym denominator = sqrt(second) / bias_correction2_sqrt + f32(t.hyper("eps"));
  t.store("param", params - (lr * (exp_avg / bias_correction1)) / denominator);
}

void LowBitAdam::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                              ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { lowbit_adam_forloop<T>(group, decoupled_, param, grad, state); });
}

} // namespace optjit
