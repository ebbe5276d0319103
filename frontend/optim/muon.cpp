#include "frontend/optim/muon.h"
#include "frontend/optim/lerp.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"
#include "runtime/gemm.h"
#include "runtime/low_precision.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace optjit {

namespace {

// torch's _adjust_lr: the learning rate for a matrix of `rows` x `cols`, computed as Python does, in doubles.
double adjusted_lr(double lr, double code, int64_t rows, int64_t cols) {
  const double a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (code == kOptionNone || code == static_cast<double>(MuonAdjustLr::original))
    return lr * std::sqrt(std::max(1.0, a / b));
  if (code == static_cast<double>(MuonAdjustLr::match_rms_adamw))
    return lr * (0.2 * std::sqrt(std::max(a, b)));
  return lr * std::sqrt(a / b); // spectral_unclamped
}

} // namespace

void put_option(OptionMap& map, const std::string& name, const std::optional<MuonAdjustLr>& value) {
  map[name] = value ? static_cast<double>(*value) : kOptionNone;
}

void keyword_value(std::optional<MuonAdjustLr>& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values) {
  if (values.size() != 1)
    throw Error(fmt::format("{} option '{}' takes one value, got {}", cls, key, values.size()));
  if (values[0] == kOptionNone) {
    member.reset();
    return;
  }
  for (int code = 0; code < 3; ++code)
    if (values[0] == code) {
      member = static_cast<MuonAdjustLr>(code);
      return;
    }
  throw Error(fmt::format("Adjust learning rate function {} is not supported", python_float(values[0])));
}

Muon::Muon(std::vector<ParamGroupSpec> groups, const MuonOptions& o)
    : Optimizer("Muon", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
  for (int64_t i = 0; i < param_count(); ++i)
    check_matrix(flat_param(i));
}

Muon::Muon(std::vector<Tensor> params, const MuonOptions& o) : Muon(one_param_group(std::move(params)), o) {}

void Muon::check_matrix(const Tensor& param) const {
  if (param.dim() != 2)
    throw Error("Muon only supports 2D parameters whereas we found a parameter with size: torch.Size([" + [&] {
      std::string dims;
      for (int64_t d : param.shape())
        dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      return dims;
    }() + "])");
}

void Muon::validate_options(const OptionMap& o) const {
  if (!(o.at("lr") >= 0.0))
    throw Error("Learning rate should be >= 0 but is: " + python_float(o.at("lr")));
  if (!(o.at("momentum") >= 0.0))
    throw Error("momentum should be >= 0 but is: " + python_float(o.at("momentum")));
  if (!(o.at("weight_decay") >= 0.0))
    throw Error("weight decay should be >= 0 but is: " + python_float(o.at("weight_decay")));
  const double adjust = o.at("adjust_lr_fn");
  if (adjust != kOptionNone && adjust != 0 && adjust != 1 && adjust != 2)
    throw Error("Adjust learning rate function " + python_float(adjust) + " is not supported");
}

// torch checks these as its step reaches them (after stepping the params before); here before anything changes.
void Muon::check_step_options(const ParamGroup& group, std::size_t) const {
  const double steps = group.get("ns_steps");
  if (steps != std::floor(steps))
    throw Error("ns_steps is " + python_float(steps) + ": the number of Newton-Schulz steps is an integer");
  if (steps >= 100)
    throw Error("Number of steps must be less than 100 for computational efficiency");
}

void Muon::check_grad(int64_t flat) const {
  const Tensor& p = flat_param(flat);
  if (is_complex(p.dtype()))
    throw Error("Muon does not support complex parameters");
  if (p.dim() != 2)
    throw Error("Param gradient must be a 2D matrix");
  const double adjust = param_groups()[static_cast<std::size_t>(group_of_flat(flat))].get("adjust_lr_fn");
  if (p.shape()[1] == 0 && adjust != static_cast<double>(MuonAdjustLr::match_rms_adamw))
    throw Error("Muon: a param of shape " + shape_to_string(p.shape()) +
                " has no columns: torch's adjust_lr_fn divides its rows by its columns (float division by zero)");
  Optimizer::check_grad(flat);
}

// The iterations unroll into the traced graph, so their count is structure: ns_steps in binary (it is below 100).
constexpr int kStepBits = 7;

Structure Muon::structure(const ParamGroup& group) const {
  Structure s;
  s.set("nesterov", group.get("nesterov") != 0);
  s.set("f32_iterations", group.get("f32_iterations") != 0);
  const auto steps = static_cast<int64_t>(std::clamp(group.get("ns_steps"), 0.0, 127.0));
  for (int bit = 0; bit < kStepBits; ++bit)
    s.set("ns_steps_bit" + std::to_string(bit), ((steps >> bit) & 1) != 0);
  return s;
}

// Tall matrices iterate on their transpose: their products read other operands transposed (a bucket of their own).
void Muon::param_structure(const Tensor& param, Structure& s) const {
  s.set("tall", param.dim() == 2 && param.shape()[0] > param.shape()[1]);
}

std::vector<StateSpec> Muon::state_specs(const Structure&) const { return {{"momentum_buffer"}}; }

std::vector<std::string> Muon::hyper_names() const {
  return {"lr", "weight_decay", "momentum", "ns_a", "ns_b", "ns_c", "eps", "ns_steps", "adjust_lr_fn"};
}

// torch's _single_tensor_muon over the lists. The iterations are torch's addmm in bf16 (ops mm and addmm); a tall
// matrix X iterates as X^T does in torch, written on X itself: A = X^T X and X = a X + X B^T.
void Muon::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad"), buffers = t.tensors("momentum_buffer");
  Sym momentum = t.hyper("momentum");
  Sym buffer = foreach_lerp(buffers, grads, 1.0 - momentum);
  Sym x = s["nesterov"] ? foreach_lerp(grads, buffer, momentum) : buffer;
  // grad.to(bf16).div_(norm().clamp(min=eps)): bf16 values, a bf16 norm and eps, each quotient rounded; with
  // f32_iterations the same in f32 (the products' operands are f32).
  const Dtype ns = s["f32_iterations"] ? Dtype::f32 : Dtype::bf16;
  if (ns == Dtype::bf16) {
    x = round_bf16(x);
    Sym norm = t.rounded(Dtype::bf16, sqrt(sum(x * x)));
    x = round_bf16(x / maximum(norm, t.rounded(Dtype::bf16, t.hyper("eps"))));
  } else {
    x = x / maximum(sqrt(sum(x * x)), t.hyper("eps"));
  }
  int64_t steps = 0;
  for (int bit = 0; bit < kStepBits; ++bit)
    steps |= static_cast<int64_t>(s["ns_steps_bit" + std::to_string(bit)]) << bit;
  const bool tall = s["tall"];
  Sym ns_a = t.hyper("ns_a"), ns_b = t.hyper("ns_b"), ns_c = t.hyper("ns_c"), one = t.constant(1.0);
  for (int64_t step = 0; step < steps; ++step) {
    Sym gram = mm(x, x, tall, !tall, ns);
    Sym polynomial = addmm(gram, gram, gram, ns_b, ns_c, false, false, ns);
    x = tall ? addmm(x, x, polynomial, ns_a, one, false, true, ns)
             : addmm(x, polynomial, x, ns_a, one, false, false, ns);
  }
  // The adjusted learning rate (torch's _adjust_lr, per matrix) and the decoupled weight decay.
  Sym lr = t.hyper("lr"), rows = t.size(-2), cols = t.size(-1), adjust = t.hyper("adjust_lr_fn");
  Sym original = sqrt(maximum(t.constant(1.0), rows / cols));
  Sym ratio = where(equal(adjust, t.constant(static_cast<double>(MuonAdjustLr::match_rms_adamw))),
                    0.2 * sqrt(maximum(rows, cols)),
                    where(equal(adjust, t.constant(static_cast<double>(MuonAdjustLr::spectral_unclamped))),
                          sqrt(rows / cols), original));
  Sym decayed = params * (1.0 - lr * t.hyper("weight_decay"));
  t.store("param", foreach_add(decayed, x, -(lr * ratio)));
  t.store("momentum_buffer", buffer);
}

namespace {

// Newton-Schulz on X (rows x cols, row-major, in E: bfloat16 as torch's, or float for f32_iterations), in place. X is
// rows x cols; torch's iterations run on X^T when it is tall, which are the same products transposed: A = X^T X, and
// X = a X + X B^T. Each is torch's addmm, in the library: the addend copied in, then C = beta C + alpha A B in f32,
// rounded once to E.
template <class E>
void newton_schulz(std::vector<E>& x, int64_t rows, int64_t cols, const ParamGroup& group, Dtype dtype) {
  const bool tall = rows > cols;
  const int64_t k = std::min(rows, cols); // the Gram matrix's side
  const double ns_a = group.get("ns_a"), ns_b = group.get("ns_b"), ns_c = group.get("ns_c");
  const Gemm& gram = prepared_gemm({.m = k,
                                    .n = k,
                                    .k = tall ? rows : cols,
                                    .transpose_a = tall,
                                    .transpose_b = !tall,
                                    .operands = dtype,
                                    .result = dtype});
  const Gemm& polynomial =
      prepared_gemm({.m = k, .n = k, .k = k, .operands = dtype, .result = dtype, .alpha = ns_c, .beta = ns_b});
  const Gemm& apply = prepared_gemm(
      {.m = rows, .n = cols, .k = k, .transpose_b = tall, .operands = dtype, .result = dtype, .beta = ns_a});
  std::vector<E> gram_matrix(static_cast<std::size_t>(k * k)), update(gram_matrix.size()), next(x.size());
  for (int64_t step = 0; step < static_cast<int64_t>(group.get("ns_steps")); ++step) {
    gram.run(x.data(), x.data(), gram_matrix.data());
    update = gram_matrix; // torch.addmm(A, A, A, beta=b, alpha=c)
    polynomial.run(gram_matrix.data(), gram_matrix.data(), update.data());
    next = x; // torch.addmm(X, B, X, beta=a)
    if (tall)
      apply.run(x.data(), update.data(), next.data());
    else
      apply.run(update.data(), x.data(), next.data());
    std::swap(x, next);
  }
}

} // namespace

// torch's _single_tensor_muon for one param, in T (f32 or f64): the momentum and the final update in T, the
// Newton-Schulz iterations in bf16 with f32 products from the library, each rounded to bf16 as torch's are (in f32
// throughout with f32_iterations).
void Muon::forloop_step(const ParamGroup& group, const Tensor& param_in, const Tensor& grad_in,
                        ParamState& state) const {
  // Matrices are read row-major: a param in another layout steps on contiguous copies.
  const bool contiguous = param_in.is_contiguous() && grad_in.is_contiguous();
  const Tensor param = contiguous ? param_in : param_in.clone(), grad = contiguous ? grad_in : grad_in.clone();
  const Tensor buf_in = find_state(state, "momentum_buffer");
  const Tensor buf = buf_in.is_contiguous() ? buf_in : buf_in.clone();
  const int64_t rows = param.shape()[0], cols = param.shape()[1], count = param.numel();
  const double momentum = group.get("momentum");
  const bool nesterov = group.get("nesterov") != 0;
  visit_compute_dtype(param.dtype(), [&]<class T>() {
    T* p = param.data_as<T>();
    const T* g = grad.data_as<T>();
    T* b = buf.data_as<T>();
    // The momentum, then the update X normalized and orthogonalized in E (the type of `element`), made T.
    const auto orthogonalized = [&](auto element) {
      using E = decltype(element);
      const Dtype dtype = std::is_same_v<E, float> ? Dtype::f32 : Dtype::bf16;
      std::vector<E> x(static_cast<std::size_t>(count));
      double sum_of_squares = 0;
      for (int64_t i = 0; i < count; ++i) {
        b[i] = torch_lerp(b[i], g[i], static_cast<T>(1.0 - momentum));
        x[i] = E(nesterov ? torch_lerp(g[i], b[i], static_cast<T>(momentum)) : b[i]);
        const double v = static_cast<float>(x[i]);
        sum_of_squares += v * v;
      }
      // ortho_grad.div_(ortho_grad.norm().clamp(min=eps)): a norm and eps in E (bf16: rounded), each quotient
      // rounded.
      const float norm = static_cast<float>(E(static_cast<float>(std::sqrt(sum_of_squares))));
      const float divisor = std::max(norm, static_cast<float>(E(static_cast<float>(group.get("eps")))));
      for (E& v : x)
        v = E(static_cast<float>(v) / divisor);
      newton_schulz(x, rows, cols, group, dtype);
      std::vector<T> update(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        update[i] = static_cast<T>(static_cast<float>(x[i]));
      return update;
    };
    const std::vector<T> x = group.get("f32_iterations") != 0 ? orthogonalized(float{}) : orthogonalized(bfloat16{});
    // param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adjusted_lr), each a Python double made T.
    const double lr = group.get("lr");
    const T decay = static_cast<T>(1.0 - lr * group.get("weight_decay"));
    const T step_size = static_cast<T>(-adjusted_lr(lr, group.get("adjust_lr_fn"), rows, cols));
    for (int64_t i = 0; i < count; ++i)
      p[i] = std::fma(step_size, x[static_cast<std::size_t>(i)], p[i] * decay);
  });
  if (!contiguous) {
    param_in.copy_from(param);
  }
  if (!buf.same(buf_in))
    buf_in.copy_from(buf);
}

} // namespace optjit
