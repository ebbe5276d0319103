#include "compiler/program_binding.h"
#include "compiler/grad_pass.h"
#include "runtime/log.h"

namespace optjit {

void check_arguments(const StepSource& source, const Program& program, const LayoutStaging& staging,
                     ArgumentChanges& changes) {
  changes.replaced_grads.clear();
  const char* reason = !program.bound                                          ? "first step of this variant"
                       : program.bound_state_version != source.state_version() ? "optimizer state created or replaced"
                                                                               : nullptr;
  bool params_replaced = reason != nullptr; // first bound, or the state was replaced
  for (int64_t i = 0; i < source.param_count(); ++i) {
    const TensorImpl& p = *source.flat_param(i).impl();
    const TensorImpl* g = p.grad.get();
    const std::size_t at = static_cast<std::size_t>(i);
    // Layout ids are never 0, so a bound layout of 0 means the param was bound without a grad.
    const bool was_bound_with_grad = program.bound && program.bound_grad_layout[at] != 0;
    if (!g) {
      if (was_bound_with_grad && !reason)
        reason = "a grad became None";
      continue;
    }
    const bool same_param = program.bound && p.layout_id == program.bound_param_layout[at];
    if (same_param && g->layout_id == program.bound_grad_layout[at])
      continue;
    source.check_grad(i);
    if (!same_param)
      source.check_state(i);
    params_replaced |= !same_param || !was_bound_with_grad;
    if (program.bound && !was_bound_with_grad && !reason)
      reason = "a grad appeared";
    if (!same_param && !reason)
      reason = "a param's data was replaced";
    // A new contiguous grad of an unstaged contiguous param (the usual zero_grad(set_to_none=True) step) leaves the
    // staging decision as the bind made it: it depends on the grad only through the grad's layout.
    const bool still_flat = same_param && !staging.is_staged(i) && p.contiguous && g->contiguous;
    if (!still_flat && LayoutStaging::needed(source, program.walks_rows_and_columns, i) != staging.is_staged(i) &&
        !reason)
      reason = "a param's tensors stopped or started sharing one memory layout";
    changes.replaced_grads.push_back(i);
  }
  if (params_replaced)
    source.check_params_distinct();
  changes.rebind_reason = reason;
}

void repoint_grads(StepSource& source, Program& program, const LayoutStaging& staging,
                   const std::vector<int64_t>& replaced, StepMetrics& metrics) {
  OPTJIT_LOG(guards, "{}: {} grad buffer(s) replaced at step #{}, repointing them", source.name(), replaced.size(),
             metrics.steps);
  for (int64_t i : replaced) {
    const auto [bucket, entry] = program.entry_of_flat[static_cast<std::size_t>(i)];
    BucketProgram& bp = program.buckets[static_cast<std::size_t>(bucket)];
    const Tensor kernel_grad = staging.kernel_grad(source, i); // a staging copy, or the grad's real view
    bp.code->repoint(bp.grad_slot, entry, kernel_grad);
    if (bp.grad_pass_code)
      bp.grad_pass_code->repoint(bp.grad_slot, entry, kernel_grad);
    program.bound_grad_layout[static_cast<std::size_t>(i)] = source.flat_param(i).impl()->grad->layout_id;
  }
  ++metrics.rebinds;
}

void bind(StepSource& source, Program& program, LayoutStaging& staging, const char* reason, StepMetrics& metrics) {
  OPTJIT_LOG(guards, "{}: rebinding arguments at step #{}: {}", source.name(), metrics.steps, reason);
  source.ensure_state();
  staging.prepare(source, program.walks_rows_and_columns);
  metrics.staged_params = staging.staged_count();
  program.entry_of_flat.assign(static_cast<std::size_t>(source.param_count()), {-1, 0});
  for (std::size_t b = 0; b < program.buckets.size(); ++b) {
    BucketProgram& bp = program.buckets[b];
    const ParamBucket present = members_with_grads(source, bp.bucket);
    bp.launched = !present.members.empty();
    if (!bp.launched)
      continue;
    ListArguments args = source.list_arguments(present);
    staging.substitute(args, present, bp.pipeline.traced.slots);
    bp.code->bind(args);
    if (bp.grad_pass_code) {
      bp.grad_pass_code->bind(grad_pass_arguments(args, bp.grad_slot)); // its grads staged as the update's
    }
    for (std::size_t t = 0; t < present.members.size(); ++t)
      program.entry_of_flat[static_cast<std::size_t>(present.members[t].flat)] = {static_cast<int>(b),
                                                                                  static_cast<int64_t>(t)};
  }
  if (program.grad_total) { // over the launched buckets' grad passes, in bucket order (as the host combines)
    std::vector<const Executable*> passes;
    std::vector<Dtype> grad_dtypes;
    for (const BucketProgram& bp : program.buckets)
      if (bp.launched) {
        passes.push_back(bp.grad_pass_code.get());
        grad_dtypes.push_back(bp.bucket.dtype);
      }
    program.grad_total->bind(passes, grad_dtypes);
  }
  program.bound_param_layout.assign(static_cast<std::size_t>(source.param_count()), 0);
  program.bound_grad_layout.assign(static_cast<std::size_t>(source.param_count()), 0);
  for (int64_t i = 0; i < source.param_count(); ++i) {
    const TensorImpl& p = *source.flat_param(i).impl();
    program.bound_param_layout[static_cast<std::size_t>(i)] = p.layout_id;
    program.bound_grad_layout[static_cast<std::size_t>(i)] = p.grad ? p.grad->layout_id : 0;
  }
  program.bound_state_version = source.state_version();
  program.bound = true;
  ++metrics.rebinds;
}

} // namespace optjit
