#include "compiler/grad_pass.h"

#include "ir/builder.h"
#include "runtime/error.h"

#include <algorithm>
#include <iterator>

namespace optjit {

Graph build_grad_pass(const GradPass& pass, const Slot& grad_slot, Dtype dtype) {
  OPTJIT_ASSERT(pass.any(), "a grad pass with neither clipping nor an in-step inf check");
  GraphBuilder b("grad_pass", dtype);
  b.declare_slot(grad_slot);
  // The check reads the grads as given, before grad_scale divides them, as GradScaler's check does. A sum of g * 0,
  // not a max: a max of vectors is a chain of compares and blends per step, which made the pass latency-bound (3x a
  // sum's time); a sum of squares would overflow on large finite grads. (fold_constants keeps x * 0.)
  if (pass.checks_finite) {
    const ValueId grads = b.tensor(grad_slot.name);
    const ValueId zero = b.constant(0.0);
    b.add_store(Store{StoreKind::Carry, kGradNonfiniteCarry, b.reduce(Op::reduce_sum, b.binary(Op::mul, grads, zero))});
  }
  ValueId grads = b.tensor(grad_slot.name);
  if (!pass.grad_divisor.empty())
    grads = b.binary(Op::div, grads, b.hyper(pass.grad_divisor));
  if (pass.clips) {
    const ValueId contribution = pass.norm_type == 2.0 ? b.reduce(Op::reduce_sum, b.binary(Op::mul, grads, grads))
                                                       : b.reduce(Op::reduce_max, b.unary(Op::abs, grads));
    b.add_store(Store{StoreKind::Carry, kGradNormCarry, contribution});
  }
  return b.finish();
}

ListArguments grad_pass_arguments(const ListArguments& bucket_arguments, const std::string& grad_slot) {
  ListArguments args;
  args.slot_names = {grad_slot};
  args.slot_tensors = {bucket_arguments.slot(grad_slot)};
  args.hyper_names = bucket_arguments.hyper_names;
  args.hyper = bucket_arguments.hyper;
  args.group_of = bucket_arguments.group_of;
  args.shapes = bucket_arguments.shapes;
  return args;
}

} // namespace optjit
