// Strided params. Kernels walk a param's tensors flat: element k of the param, of its grad and of each of its tensor
// state entries lies at offset k of each one's memory. That holds whenever they share one dense layout: contiguous,
// or the same permutation of a dense block, as a transposed param and the state made like it (torch's
// preserve_format, Tensor::empty_like) do. Such params run in place at full speed, whatever their strides.
//
// Entries of another shape that kernels index by row or column (Adafactor's row_var and col_var) must be
// contiguous. A param whose tensors do not share one layout (a slice with gaps, or a grad in another layout than its
// param), or whose rows or columns are not contiguous, is staged instead: it runs on contiguous copies of its param,
// grad and tensor state, copied in before every launch, and the tensors the step writes (param and state, and the grad
// when the step writes its grads: StepDescription::writes_grads) copied back after it. That costs a pass over each of
// its tensors; params that share a layout cost nothing here. The driver owns the staging (compiler/compiled_step.cpp):
// it stages when it binds, hands the kernels the copies and copies around every launch.
#pragma once

#include "compiler/param_state.h"
#include "compiler/step_source.h"
#include "ir/arguments.h"
#include "ir/ir.h"
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
  // Whether param `flat` of `source` needs staging with the tensors it holds now: it has a grad, and its tensors share
  // no dense layout, or its kernels find rows and columns by element order (`walks_rows_and_columns`, as
  // StepDescription says per param) and they are not contiguous.
  static bool needed(const StepSource& source, const std::vector<bool>& walks_rows_and_columns, int64_t flat);

  // Stages every param of `source` that needs it now (keeping the buffers it had for the same shapes and dtypes),
  // and forgets the others.
  void prepare(const StepSource& source, const std::vector<bool>& walks_rows_and_columns);
  bool is_staged(int64_t flat) const { return staged_now_.contains(flat); }
  int64_t staged_count() const { return static_cast<int64_t>(staged_now_.size()); }

  // The kernels' tensors of the bucket `present` (in list_arguments' or grad_arguments' order): a staged param's
  // param, grad and tensor state entries replaced by its copies. `slots` are the graph's: they give each slot's role.
  void substitute(ListArguments& args, const ParamBucket& present, const std::vector<Slot>& slots) const;
  // What a kernel reads as param `flat`'s grad: its staging copy, or the grad itself (a complex one's real view).
  Tensor kernel_grad(const StepSource& source, int64_t flat) const;

  // Before a launch: every staged param's current tensors (grads re-read) into its copies.
  void copy_in(const StepSource& source) const;
  // After a launch: the copies of what the step wrote back into the tensors (grads too when `grads_written`: the
  // step writes its grads, StepDescription::writes_grads).
  void copy_out(const StepSource& source, bool grads_written) const;

private:
  // Makes param `flat`'s staging copies (keeping the buffers it already has for the same shapes and dtypes).
  void stage(int64_t flat, const Tensor& param, const ParamState& state);

  struct Buffers {
    Tensor param, grad;
    ParamState state; // contiguous copies of the tensor entries only
  };
  std::map<int64_t, Buffers> buffers_;
  std::set<int64_t> staged_now_;
};

} // namespace optjit
