// The grad pass: one reduction pass over a bucket's grads, run by the driver before the update when the step clips its
// grads by their total norm (clip_grad_norm_ fused), checks them for infs and NaNs itself, or both. A step source
// says what the pass computes (StepSource::grad_pass, as data); the driver builds its graph here, over the grad slot
// of the bucket's own graph, compiles it with the bucket and binds it to the bucket's grads.
#pragma once

#include "compiler/step_source.h"
#include "ir/arguments.h"
#include "ir/ir.h"

namespace optjit {

// The graph of `pass` over grad slot `grad_slot`, with element math in `dtype` (the grads' compute dtype). It stores
// each tensor's results as carried values: the sum of its elements times 0 as kGradNonfiniteCarry (x * 0 is 0 for a
// finite x and NaN for an inf or a NaN), read as given, before any divisor; then, with the grads divided by
// pass.grad_divisor, its contribution to the norm as kGradNormCarry (its sum of squares for the 2-norm, its largest
// |element| for the infinity norm).
Graph build_grad_pass(const GradPass& pass, const Slot& grad_slot, Dtype dtype);

// The grad pass's arguments from the bucket's own (ListArguments of its graph, staged copies substituted): the grad
// slot's tensors alone, with the same hyperparameters, groups and shapes.
ListArguments grad_pass_arguments(const ListArguments& bucket_arguments, const std::string& grad_slot);

} // namespace optjit
