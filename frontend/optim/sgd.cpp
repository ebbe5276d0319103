#include "frontend/optim/sgd.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

namespace optjit {
namespace {

// Internal flag (hidden from torch's keys): whether momentum_buffer holds a value yet. torch's buffer starts as
// a copy of the first (decayed) gradient, with no dampening; the kernel picks that case per tensor.
constexpr const char* kBufferStarted = "_momentum_buffer_started";

// torch's _single_tensor_sgd for one param.
template <class T>
void sgd_forloop(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), momentum = group.get("momentum"), dampening = group.get("dampening");
  const double weight_decay = group.get("weight_decay");
  const bool nesterov = group.get("nesterov") != 0, maximize = group.get("maximize") != 0;
  T* p = param.data_as<T>();
  const T* g = grad.data_as<T>();
  T* buf = nullptr;
  bool started = true;
  if (momentum != 0) {
    buf = find_state(state, "momentum_buffer").data_as<T>();
    Tensor flag = find_state(state, kBufferStarted);
    started = flag.item() != 0;
    flag.set_item(0, 1);
  }
  for (int64_t i = 0; i < param.numel(); ++i) {
    T d = maximize ? -g[i] : g[i];
    if (weight_decay != 0)
      d = d + static_cast<T>(weight_decay) * p[i];
    if (momentum != 0) {
      buf[i] = started ? buf[i] * static_cast<T>(momentum) + static_cast<T>(1 - dampening) * d : d;
      d = nesterov ? d + static_cast<T>(momentum) * buf[i] : buf[i];
    }
    p[i] = p[i] + static_cast<T>(-lr) * d;
  }
}

} // namespace

SGD::SGD(std::vector<ParamGroupSpec> groups, const SGDOptions& o)
    : Optimizer("SGD", option_map(o), o.foreach.value_or(false), flag_names(o)) {
  validate_options(defaults());
  add_param_groups(std::move(groups));
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o) : SGD(one_param_group(std::move(params)), o) {}

void SGD::validate_options(const OptionMap& o) const {
  // SGD compares with `x < 0.0`, so NaN passes these checks, as in torch.
  if (o.at("lr") < 0.0)
    throw Error("Invalid learning rate: " + python_float(o.at("lr")));
  if (o.at("momentum") < 0.0)
    throw Error("Invalid momentum value: " + python_float(o.at("momentum")));
  if (o.at("weight_decay") < 0.0)
    throw Error("Invalid weight_decay value: " + python_float(o.at("weight_decay")));
  if (o.at("nesterov") != 0 && (o.at("momentum") <= 0 || o.at("dampening") != 0))
    throw Error("Nesterov momentum requires a momentum and zero dampening");
}

Structure SGD::structure(const ParamGroup& group) const {
  Structure s;
  s.set("momentum", group.get("momentum") != 0);
  s.set("nesterov", group.get("nesterov") != 0);
  s.set("maximize", group.get("maximize") != 0);
  s.set("weight_decay", group.get("weight_decay") != 0);
  return s;
}

std::vector<StateSpec> SGD::state_specs(const Structure& s) const {
  if (!s["momentum"])
    return {};
  // A loaded momentum_buffer is one torch had started (torch saves a buffer only once it holds a value).
  return {{"momentum_buffer"}, {kBufferStarted, StateKind::Scalar, 0, /*visible=*/false, /*loaded=*/1}};
}

std::vector<std::string> SGD::hyper_names() const { return {"lr", "momentum", "dampening", "weight_decay"}; }

// torch's _multi_tensor_sgd.
void SGD::trace(Tracer& t, const Structure& s) const {
  Sym params = t.tensors("param"), grads = t.tensors("grad");
  Sym lr = t.hyper("lr");
  if (s["maximize"])
    grads = -grads;
  if (s["weight_decay"])
    grads = foreach_add(grads, params, t.hyper("weight_decay"));
  if (s["momentum"]) {
    Sym momentum = t.hyper("momentum");
    Sym started = t.scalar_state(kBufferStarted);
    Sym continued = foreach_add(t.tensors("momentum_buffer") * momentum, grads, 1.0 - t.hyper("dampening"));
    Sym bufs = where(started, continued, grads);
    t.store("momentum_buffer", bufs);
    t.store_scalar(kBufferStarted, t.constant(1.0));
    grads = s["nesterov"] ? foreach_add(grads, bufs, momentum) : bufs;
  }
  t.store("param", foreach_add(params, grads, -lr));
}

void SGD::forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const {
  visit_compute_dtype(param.dtype(), [&]<class T>() { sgd_forloop<T>(group, param, grad, state); });
}

} // namespace optjit
