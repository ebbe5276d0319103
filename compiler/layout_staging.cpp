#include "compiler/layout_staging.h"
#include "runtime/log.h"

#include <algorithm>

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
Tensor staged_entry(const StepSource& source, int64_t flat, const std::string& key) {
  Tensor t = find_state(source.flat_state(flat), key);
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

bool LayoutStaging::needed(const StepSource& source, const std::vector<bool>& walks_rows_and_columns, int64_t flat) {
  const Tensor& p = source.flat_param(flat);
  if (!p.impl()->grad)
    return false;
  // Rows and columns are found by element order: such a param's kernels walk contiguous tensors.
  if (walks_rows_and_columns.at(static_cast<std::size_t>(flat)) && !(p.is_contiguous() && p.grad().is_contiguous()))
    return true;
  return !walkable_flat(p, p.grad(), source.flat_state(flat));
}

void LayoutStaging::prepare(const StepSource& source, const std::vector<bool>& walks_rows_and_columns) {
  staged_now_.clear();
  for (int64_t i = 0; i < source.param_count(); ++i)
    if (needed(source, walks_rows_and_columns, i)) {
      OPTJIT_LOG(guards, "{}: param {} ({}, grad {}) shares no dense layout with its grad and state: staged",
                 source.name(), i, source.flat_param(i).describe(), source.flat_param(i).grad().describe());
      stage(i, source.flat_param(i), source.flat_state(i));
    }
}

void LayoutStaging::substitute(ListArguments& args, const ParamBucket& present, const std::vector<Slot>& slots) const {
  if (staged_now_.empty())
    return;
  for (std::size_t k = 0; k < args.slot_names.size(); ++k) {
    const auto slot =
        std::find_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == args.slot_names[k]; });
    if (slot == slots.end())
      continue; // a slot the graph does not declare: its kernels never touch it
    for (std::size_t t = 0; t < present.members.size(); ++t) {
      const int64_t flat = present.members[t].flat;
      if (!is_staged(flat))
        continue;
      const Buffers& b = buffers_.at(flat);
      const Tensor copy = slot->role == SlotRole::Param  ? b.param
                          : slot->role == SlotRole::Grad ? b.grad
                                                         : find_state(b.state, slot->name); // none: a scalar entry
      if (copy.defined())
        args.slot_tensors[k][t] = copy.real_view(); // complex tensors run as their (re, im) components
    }
  }
}

Tensor LayoutStaging::kernel_grad(const StepSource& source, int64_t flat) const {
  return (is_staged(flat) ? buffers_.at(flat).grad : source.flat_param(flat).grad()).real_view();
}

void LayoutStaging::copy_in(const StepSource& source) const {
  for (int64_t flat : staged_now_) {
    const Tensor& p = source.flat_param(flat);
    const Tensor grad = p.grad();
    if (!grad.defined())
      continue; // not launched this step
    const Buffers& b = buffers_.at(flat);
    b.param.copy_from(p);
    b.grad.copy_from(grad);
    for (const auto& [key, copy] : b.state)
      copy.copy_from(staged_entry(source, flat, key));
  }
}

void LayoutStaging::copy_out(const StepSource& source, bool grads_written) const {
  for (int64_t flat : staged_now_) {
    const Tensor& p = source.flat_param(flat);
    const Tensor grad = p.grad();
    if (!grad.defined())
      continue;
    const Buffers& b = buffers_.at(flat);
    p.copy_from(b.param);
    if (grads_written)
      grad.copy_from(b.grad);
    for (const auto& [key, copy] : b.state)
      staged_entry(source, flat, key).copy_from(copy);
  }
}

} // namespace optjit
