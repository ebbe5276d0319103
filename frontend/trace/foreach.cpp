#include "frontend/trace/foreach.h"

#include <algorithm>

namespace optjit {
namespace {

Sym binary(Op op, Sym a, Sym b) { return a.tracer().wrap(a.tracer().builder().binary(op, a.id(), b.id())); }
Sym unary(Op op, Sym a) { return a.tracer().wrap(a.tracer().builder().unary(op, a.id())); }
Sym lift(Sym like, double value) { return like.tracer().constant(value); }
Sym reduce(Op op, Sym a) { return a.tracer().wrap(a.tracer().builder().reduce(op, a.id())); }

} // namespace

Sym sum(Sym a) { return reduce(Op::reduce_sum, a); }
Sym max_of(Sym a) { return reduce(Op::reduce_max, a); }
Sym foreach_norm(Sym a) { return sqrt(sum(a * a)); }
Sym list_sum(Sym a) { return reduce(Op::list_sum, a); }
Sym list_max(Sym a) { return reduce(Op::list_max, a); }
Sym group_sum(Sym a) { return reduce(Op::group_sum, a); }
Sym group_max(Sym a) { return reduce(Op::group_max, a); }
Sym row_sum(Sym a) { return reduce(Op::row_sum, a); }
Sym col_sum(Sym a) { return reduce(Op::col_sum, a); }
Sym row_mean(Sym a) { return row_sum(a) / a.tracer().size(-1); }
Sym col_mean(Sym a) { return col_sum(a) / a.tracer().size(-2); }

Sym Tracer::extent(const char* which) {
  Node n;
  n.op = Op::extent;
  n.name = which;
  return wrap(builder_.add(std::move(n)));
}

Sym Tracer::size(int dim) {
  if (dim != -1 && dim != -2)
    throw Error("size(" + std::to_string(dim) +
                "): a traced step reads size(-1) and size(-2) of each tensor (and numel()), not other dimensions");
  return extent(dim == -1 ? "n" : "m");
}

bool Tracer::is_param_through_master(const std::string& slot) const {
  return !master_slot_.empty() && builder_.slot(slot).role == SlotRole::Param;
}

void Tracer::store(const std::string& slot, Sym value) {
  const auto old = [&](const std::string& s) { return wrap(builder_.tensor(s)); }; // as stored, not unscaled
  if (is_param_through_master(slot))
    builder_.store(master_slot_, keep_old_when_.empty() ? value.id() : unless_kept(value, old(master_slot_)).id());
  const Sym stored = rounded_for(slot, value);
  builder_.store(slot, keep_old_when_.empty() ? stored.id() : unless_kept(stored, old(slot)).id());
}

Sym Tracer::unless_kept(Sym value, Sym old) { return where(hyper(keep_old_when_), old, value); }

Sym Tracer::rounded_for(const std::string& slot, Sym value) {
  if (rounding_counter_.empty() || builder_.node(value.id()).level != Level::Element ||
      builder_.slot(slot).dtype != Dtype::bf16)
    return value; // rounded to nearest by the store (a per-tensor value stored to every element too)
  const auto& slots = builder_.graph_slots();
  const auto position = std::find_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == slot; });
  OPTJIT_ASSERT(position - slots.begin() < kSlotsPerStream, "more slots than a rounding stream has room for");
  const Sym stream = scalar_state(rounding_stream_) * static_cast<double>(kSlotsPerStream) +
                     static_cast<double>(position - slots.begin());
  Node n;
  n.op = Op::sround;
  n.inputs = {value.id(), hyper(rounding_counter_).id(), stream.id()};
  return wrap(builder_.add(n));
}

Sym Tracer::tensors(const std::string& slot) {
  if (is_param_through_master(slot))
    return wrap(builder_.tensor(master_slot_));
  Sym stored = wrap(builder_.tensor(slot));
  if (builder_.slot(slot).role != SlotRole::Grad)
    return stored;
  if (!grad_divisor_.empty())
    stored = stored / hyper(grad_divisor_);
  if (!grad_multiplier_.empty())
    stored = stored * hyper(grad_multiplier_);
  return stored;
}

Graph Tracer::finish() {
  if (store_unscaled_grads_)
    for (const std::string& slot : grad_slots_)
      store(slot, wrap(builder_.tensor(slot)) / hyper(grad_divisor_)); // unscaled, never clipped
  return builder_.finish();
}

Sym operator+(Sym a, Sym b) { return binary(Op::add, a, b); }
Sym operator-(Sym a, Sym b) { return binary(Op::sub, a, b); }
Sym operator*(Sym a, Sym b) { return binary(Op::mul, a, b); }
Sym operator/(Sym a, Sym b) { return binary(Op::div, a, b); }
Sym operator-(Sym a) { return unary(Op::neg, a); }
Sym operator+(Sym a, double b) { return a + lift(a, b); }
Sym operator-(Sym a, double b) { return a - lift(a, b); }
Sym operator*(Sym a, double b) { return a * lift(a, b); }
Sym operator/(Sym a, double b) { return a / lift(a, b); }
Sym operator+(double a, Sym b) { return lift(b, a) + b; }
Sym operator-(double a, Sym b) { return lift(b, a) - b; }
Sym operator*(double a, Sym b) { return lift(b, a) * b; }
Sym operator/(double a, Sym b) { return lift(b, a) / b; }
Sym sqrt(Sym a) { return unary(Op::sqrt, a); }
Sym round_bf16(Sym a) { return unary(Op::round_bf16, a); }
Sym fma(Sym a, Sym b, Sym c) { return a.tracer().wrap(a.tracer().builder().fma(a.id(), b.id(), c.id())); }
Sym abs(Sym a) { return unary(Op::abs, a); }
Sym sign(Sym a) { return unary(Op::sign, a); }
Sym exp(Sym a) { return unary(Op::exp, a); }
Sym log(Sym a) { return unary(Op::log, a); }
Sym pow(Sym base, Sym exponent) { return binary(Op::pow, base, exponent); }
Sym maximum(Sym a, Sym b) { return binary(Op::maximum, a, b); }
Sym minimum(Sym a, Sym b) { return binary(Op::minimum, a, b); }
Sym less(Sym a, Sym b) { return binary(Op::lt, a, b); }
Sym greater(Sym a, Sym b) { return binary(Op::gt, a, b); }
Sym equal(Sym a, Sym b) { return binary(Op::eq, a, b); }

Sym where(Sym condition, Sym if_true, Sym if_false) {
  return condition.tracer().wrap(condition.tracer().builder().select(condition.id(), if_true.id(), if_false.id()));
}

Sym foreach_add(Sym self, Sym other, Sym alpha) { return self + alpha * other; }
Sym foreach_addcmul(Sym self, Sym t1, Sym t2, Sym value) { return self + value * t1 * t2; }
Sym foreach_addcdiv(Sym self, Sym t1, Sym t2, Sym value) { return self + value * (t1 / t2); }
Sym mm(Sym a, Sym b, bool transpose_a, bool transpose_b, Dtype dtype) {
  GraphBuilder& builder = a.tracer().builder();
  return a.tracer().wrap(builder.add(Node{Op::mm,
                                          Level::Element,
                                          builder.dtype(),
                                          {a.id(), b.id()},
                                          0,
                                          matrix_product_name({transpose_a, transpose_b, dtype})}));
}

Sym addmm(Sym input, Sym a, Sym b, Sym beta, Sym alpha, bool transpose_a, bool transpose_b, Dtype dtype) {
  GraphBuilder& builder = a.tracer().builder();
  return a.tracer().wrap(builder.add(Node{Op::addmm,
                                          Level::Element,
                                          builder.dtype(),
                                          {input.id(), a.id(), b.id(), beta.id(), alpha.id()},
                                          0,
                                          matrix_product_name({transpose_a, transpose_b, dtype})}));
}

// torch's lerp: self + weight * (end - self) while |weight| < 0.5, else end - (end - self) * (1 - weight), which is
// exact at weight 1 (and NaN where end - self is inf - inf, as torch's). Written as one select of the base and one of
// the coefficient: end + (weight - 1) * (end - self) is the second form bit for bit, since weight - 1 = -(1 - weight)
// exactly. The product and the sum round once (a fused multiply-add), as torch's vectorized kernel's fmadd does. A
// per-tensor weight is first rounded to the element dtype, as torch takes a Python scalar.
Sym foreach_lerp(Sym self, Sym end, Sym weight) {
  Tracer& t = self.tracer();
  GraphBuilder& b = t.builder();
  const bool elements = b.node(self.id()).level == Level::Element || b.node(end.id()).level == Level::Element;
  if (elements && b.node(weight.id()).level == Level::PerTensor)
    weight = t.rounded(b.dtype(), weight);
  Sym small = less(abs(weight), t.constant(0.5));
  return fma(where(small, weight, weight - 1.0), end - self, where(small, self, end));
}

} // namespace optjit
