#include "frontend/optim/layout_staging.h"

namespace optjit {

namespace {

// The entries that are tensors like the param, walked flat beside it.
bool walked(const Tensor& param, const Tensor& entry) { return entry.shape() == param.shape() && entry.dim() > 0; }
// The entries kernels index by row or column (Adafactor's row_var [..., m, 1] and col_var [..., 1, n]): tensors of
// another shape than the param's, found at their contiguous offset.
bool indexed(const Tensor& param, const Tensor& entry) { return entry.shape() != param.shape() && entry.dim() > 0; }

// A contiguous buffer like `t`, the one in `kept` when it already fits.
Tensor buffer_like(const Tensor& t, const Tensor& kept) {
  if (kept.defined() && kept.shape() == t.shape() && kept.dtype() == t.dtype() && kept.device() == t.device())
    return kept;
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}

// Param `flat`'s state entry `key`, which it had when it was staged (a new entry rebinds and stages again).
Tensor staged_entry(const std::vector<ParamState>& states, int64_t flat, const std::string& key) {
  Tensor t = find_state(states[static_cast<std::size_t>(flat)], key);
  OPTJIT_ASSERT(t.defined(), "staged state entry " + key + " missing");
  return t;
}

} // namespace

bool LayoutStaging::walkable_flat(const Tensor& param, const Tensor& grad, const ParamState& state) {
  if (param.is_contiguous() && (!grad.defined() || grad.is_contiguous())) {
    bool all_contiguous = true; // the common case, decided without looking at strides
    for (const auto& [key, t] : state)
      all_contiguous &= t.is_contiguous();
    if (all_contiguous)
      return true;
  }
  if (grad.defined() && !grad.same_dense_layout(param))
    return false;
  if (!param.is_dense())
    return false;
  for (const auto& [key, t] : state)
    if ((walked(param, t) && !t.same_dense_layout(param)) || (indexed(param, t) && !t.is_contiguous()))
      return false;
  return true;
}

void LayoutStaging::stage(int64_t flat, const Tensor& param, const ParamState& state) {
  Buffers& b = buffers_[flat];
  b.param = buffer_like(param, b.param);
  b.grad = buffer_like(param, b.grad); // the grad has its param's shape, dtype and device (checked)
  ParamState copies;
  for (const auto& [key, t] : state)
    if (walked(param, t) || indexed(param, t))
      copies.emplace_back(key, buffer_like(t, find_state(b.state, key)));
  b.state = std::move(copies);
  staged_now_.insert(flat);
}

Tensor LayoutStaging::state_copy(int64_t flat, const std::string& key) const {
  return find_state(buffers_.at(flat).state, key); // undefined for a scalar entry: not staged
}

void LayoutStaging::copy_in(const std::vector<Tensor>& params, const std::vector<ParamState>& states) const {
  for (int64_t flat : staged_now_) {
    const Tensor& p = params[static_cast<std::size_t>(flat)];
    const Tensor grad = p.grad();
    if (!grad.defined())
      continue; // not launched this step
    const Buffers& b = buffers_.at(flat);
    b.param.copy_from(p);
    b.grad.copy_from(grad);
    for (const auto& [key, copy] : b.state)
      copy.copy_from(staged_entry(states, flat, key));
  }
}

void LayoutStaging::copy_out(const std::vector<Tensor>& params, const std::vector<ParamState>& states,
                             bool grads_written) const {
  for (int64_t flat : staged_now_) {
    const Tensor& p = params[static_cast<std::size_t>(flat)];
    const Tensor grad = p.grad();
    if (!grad.defined())
      continue;
    const Buffers& b = buffers_.at(flat);
    p.copy_from(b.param);
    if (grads_written)
      grad.copy_from(b.grad);
    for (const auto& [key, copy] : b.state)
      staged_entry(states, flat, key).copy_from(copy);
  }
}

} // namespace optjit
