// Strided params. Kernels walk a param's tensors flat: element k of the param, of its grad and of each of its tensor
// state entries lies at offset k of each one's memory. That holds whenever they share one dense layout: contiguous,
// or the same permutation of a dense block, as a transposed param and the state made like it (torch's
// preserve_format, Tensor::empty_like) do. Such params run in place at full speed, whatever their strides.
//
// Entries of another shape that kernels index by row or column (Adafactor's row_var and col_var) must be
// contiguous. A param whose tensors do not share one layout (a slice with gaps, or a grad in another layout than its
// param), or whose rows or columns are not contiguous, is staged instead: it runs on contiguous copies of its param,
// grad and tensor state, copied in before every launch, and the tensors the step writes (param and state, and the grad
// when the step writes its grads: Optimizer::writes_grads) copied back after it. That costs a pass over each of its
// tensors; params that share a layout cost nothing here.
#pragma once

#include "frontend/optim/param_state.h"
#include "runtime/tensor.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace optjit {

class LayoutStaging {
public:
  // Whether kernels can walk `param`, `grad` and the tensor entries of `state` flat, and index its entries of other
  // shapes (rows and columns) contiguously; per-tensor scalars are neither.
  static bool walkable_flat(const Tensor& param, const Tensor& grad, const ParamState& state);

  // Makes param `flat`'s staging copies (keeping the buffers it already has for the same shapes and dtypes).
  void stage(int64_t flat, const Tensor& param, const ParamState& state);
  // Forgets every param staged before (their buffers are kept for a param staged again).
  void clear() { staged_now_.clear(); }
  bool is_staged(int64_t flat) const { return staged_now_.contains(flat); }
  bool empty() const { return staged_now_.empty(); }

  // The copies kernels run on for a staged param, in its entries' order; the scalar entries are the originals.
  const Tensor& param_copy(int64_t flat) const { return buffers_.at(flat).param; }
  const Tensor& grad_copy(int64_t flat) const { return buffers_.at(flat).grad; }
  Tensor state_copy(int64_t flat, const std::string& key) const;

  // Before a launch: every staged param's current tensors (grads re-read from `params`) into its copies.
  void copy_in(const std::vector<Tensor>& params, const std::vector<ParamState>& states) const;
  // After a launch: the copies of what the step wrote back into the tensors (grads too when `grads_written`).
  void copy_out(const std::vector<Tensor>& params, const std::vector<ParamState>& states, bool grads_written) const;

private:
  struct Buffers {
    Tensor param, grad;
    ParamState state; // contiguous copies of the tensor entries only
  };
  std::map<int64_t, Buffers> buffers_;
  std::set<int64_t> staged_now_;
};

} // namespace optjit
