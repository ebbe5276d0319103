// The op vocabulary optimizers are written in: foreach ops over tensor lists (as torch._foreach_*) and scalar
// math, recorded by a Tracer into a graph. A `Sym` is a traced value: a whole tensor list, or one scalar per list
// entry (hyperparameters, state scalars, bias corrections). Each foreach op keeps torch's order of evaluation,
// so float32 results round as torch's do.
#pragma once

#include "ir/builder.h"

#include <string>
#include <vector>

namespace optjit {

class Tracer;

class Sym {
public:
  Sym(Tracer* tracer, ValueId id) : tracer_(tracer), id_(id) {}
  ValueId id() const { return id_; }
  Tracer& tracer() const { return *tracer_; }

private:
  Tracer* tracer_;
  ValueId id_;
};

class Tracer {
public:
  // A tracer for a step whose element math runs in `dtype`, over the slots it declares: an algorithm reads and
  // writes only these (a slot it does not declare is an optjit::Error naming the declared ones).
  Tracer(std::string name, Dtype dtype, const std::vector<Slot>& slots) : builder_(std::move(name), dtype) {
    for (const Slot& slot : slots) {
      builder_.declare_slot(slot);
      if (slot.role == SlotRole::Grad)
        grad_slots_.push_back(slot.name);
    }
  }

  // The tensors of a slot. The grad slot reads as grad / grad_divisor while divide_grads_by is on.
  Sym tensors(const std::string& slot);
  // Gradient scaling (torch's fused optimizers' grad_scale): every read of the grad slot is divided by hyperparameter
  // `hyper_name` before the algorithm sees it, so an optimizer's trace unscales without knowing. With
  // `store_unscaled`, the step also stores the unscaled grads back (what torch's fused kernels leave in the grads).
  void divide_grads_by(std::string hyper_name, bool store_unscaled) {
    grad_divisor_ = std::move(hyper_name);
    store_unscaled_grads_ = store_unscaled;
  }
  // Gradient clipping: every read of the grad slot (after divide_grads_by) is multiplied by hyperparameter
  // `hyper_name`, the step's clip coefficient.
  void multiply_grads_by(std::string hyper_name) { grad_multiplier_ = std::move(hyper_name); }
  // Hands per-tensor value `value` on as carried value `name` (what a later kernel, or the driver, reads).
  void store_carry(const std::string& name, Sym value) {
    builder_.add_store(Store{StoreKind::Carry, name, value.id()});
  }
  // Master weights: every read of the param slot reads `master_slot` (a copy in the compute dtype), and every store
  // to the param slot stores to the master and, rounded to the param's storage dtype, to the param: the one pass
  // that updates the master writes the low-precision param, so an optimizer's trace keeps master weights unaware.
  void update_through_master(std::string master_slot) { master_slot_ = std::move(master_slot); }
  // Stochastic rounding: every element value stored to a bf16 tensor slot is rounded stochastically (op sround)
  // with the step's counter (hyperparameter `counter_hyper`) and a stream per param and slot (per-tensor scalar state
  // `stream_state` x 16 + the slot's position), instead of to nearest when stored.
  void round_stochastically(std::string counter_hyper, std::string stream_state) {
    rounding_counter_ = std::move(counter_hyper);
    rounding_stream_ = std::move(stream_state);
  }
  // A step that may be skipped where the kernels run (GradScaler's found_inf read on the device, as torch's fused
  // kernels read it): every store to a tensor or scalar-state slot writes the slot's old value when hyperparameter
  // `hyper_name` is not 0, so such a step changes nothing; carried values are the kernels' own and stay as computed.
  void keep_old_values_when(std::string hyper_name) { keep_old_when_ = std::move(hyper_name); }
  // How many slots a stream's param has room for: stream = param stream x kSlotsPerStream + slot position.
  static constexpr int kSlotsPerStream = 16;
  Sym scalar_state(const std::string& slot) { return wrap(builder_.scalar_state(slot)); }
  Sym hyper(const std::string& name) { return wrap(builder_.hyper(name)); }
  Sym constant(double value) { return wrap(builder_.constant(value)); }
  // The sizes of each tensor of the lists (the params' shape), per-tensor values read from its shape (a new shape
  // rebinds, never recompiles): its element count (torch's numel()), and size(-1) and size(-2), the n and m of a
  // shape [..., m, n] (1 where the tensor has no such dimension). Other dimensions are an optjit::Error.
  Sym numel() { return extent("numel"); }
  Sym size(int dim);
  void store(const std::string& slot, Sym value);
  // Stores a per-tensor state scalar and returns the value as stored: rounded to the slot's storage dtype, as
  // torch reads back a 0-d state tensor it has just updated in place.
  Sym store_scalar(const std::string& slot, Sym value) {
    if (!keep_old_when_.empty())
      value = unless_kept(value, scalar_state(slot));
    builder_.store_scalar(slot, value.id());
    return as_stored(slot, value);
  }

  // `value` rounded to the slot's storage dtype: the operand torch uses when it updates a 0-d state tensor in place
  // with a Python number (`mu_product *= mu` multiplies in the tensor's dtype).
  Sym as_stored(const std::string& slot, Sym value) { return rounded(builder_.slot(slot).dtype, value); }
  // `value` rounded to `dtype` (and back to the f64 of per-tensor math).
  Sym rounded(Dtype dtype, Sym value) { return wrap(builder_.cast(builder_.cast(value.id(), dtype), Dtype::f64)); }

  Sym wrap(ValueId id) { return Sym(this, id); }
  GraphBuilder& builder() { return builder_; }
  Graph finish();

private:
  Sym extent(const char* which);
  bool is_param_through_master(const std::string& slot) const;
  Sym rounded_for(const std::string& slot, Sym value); // what a store to `slot` writes
  Sym unless_kept(Sym value, Sym old);                 // `old` when keep_old_values_when's hyper is not 0
  GraphBuilder builder_;
  std::string grad_divisor_;    // empty: grads are read as stored
  std::string grad_multiplier_; // empty: grads are not clipped
  bool store_unscaled_grads_ = false;
  std::vector<std::string> grad_slots_;            // the slots of role grad
  std::string master_slot_;                        // empty: the param is read and written as stored
  std::string rounding_counter_, rounding_stream_; // empty: stores round to nearest
  std::string keep_old_when_;                      // empty: stores write what the step computed
};

Sym operator+(Sym a, Sym b);
Sym operator-(Sym a, Sym b);
Sym operator*(Sym a, Sym b);
Sym operator/(Sym a, Sym b);
Sym operator-(Sym a);
Sym operator+(Sym a, double b);
Sym operator-(Sym a, double b);
Sym operator*(Sym a, double b);
Sym operator/(Sym a, double b);
Sym operator+(double a, Sym b);
Sym operator-(double a, Sym b);
Sym operator*(double a, Sym b);
Sym operator/(double a, Sym b);
Sym sqrt(Sym a);
Sym fma(Sym a, Sym b, Sym c); // a * b + c, rounded once
Sym round_bf16(Sym a);        // a rounded to bf16, to nearest even (torch's .to(torch.bfloat16)), held in a's dtype
Sym abs(Sym a);
Sym sign(Sym a);
Sym exp(Sym a);
Sym log(Sym a);
Sym pow(Sym base, Sym exponent);
Sym maximum(Sym a, Sym b);
Sym minimum(Sym a, Sym b);
Sym less(Sym a, Sym b);
Sym greater(Sym a, Sym b);
Sym equal(Sym a, Sym b);
Sym where(Sym condition, Sym if_true, Sym if_false);

// Reductions over each tensor of a list: one per-tensor f64 value per list entry. A value that uses one exists only
// after a whole pass over the data, so it runs in the step's next kernel (the planner splits there).
Sym sum(Sym a);          // the sum of the elements (0 for an empty tensor)
Sym max_of(Sym a);       // the largest element, NaN-propagating (-inf for an empty tensor)
Sym foreach_norm(Sym a); // torch._foreach_norm(a): the L2 norm of each tensor, sqrt(sum(a * a))

// Sums along one dimension of each tensor of shape [..., m, n], broadcast back over its elements (element values, in
// the element dtype; accumulated in f64 in element order): row_sum is torch's a.sum(dim=-1, keepdim=True), col_sum
// a.sum(dim=-2, keepdim=True), and the means divide by size(-1) and size(-2). A rows state ([..., m, 1],
// StateKind::Rows) reads at each element as its row's value and a columns state ([..., 1, n]) as its column's, so
// Adafactor's factored second moment is row_var * col_var / col_mean(row_var). The sums add element values: row_sum of
// a rows state is n times it, where torch's sum(dim=-1) of the [..., m, 1] tensor is the tensor itself. Like the
// per-tensor reductions, a value that uses one runs in the next kernel. col_sum needs tensors of rank >= 2 (binding one
// of lower rank is an optjit::Error, as torch's sum(dim=-2) refuses it); row_sum of a 1-D tensor is its sum.
Sym row_sum(Sym a);
Sym col_sum(Sym a);
Sym row_mean(Sym a); // a.mean(dim=-1, keepdim=True): row_sum(a) / size(-1)
Sym col_mean(Sym a); // a.mean(dim=-2, keepdim=True): col_sum(a) / size(-2)

// Reductions over the list: a per-tensor f64 value (such as a reduction's) combined over every param of the step
// (every group, dtype and device: a step runs as one bucket per (device, dtype, structure), combined together), in
// bucket then list order, the same value for every tensor after it. The host combines it when the kernels computing
// it have ended, so a value that uses it runs in the next kernel: the global grad norm of clip_grad_norm_ is
// sqrt(list_sum(sum(g * g))), two kernels per bucket with the update. Buckets must trace the same list reductions
// (groups whose options change them are refused when the step compiles).
Sym list_sum(Sym a); // the sum over the list
Sym list_max(Sym a); // the largest over the list, NaN-propagating
// The same over each param group alone (its tensors in every bucket): per-group norms, such as clipping each group
// by its own grad norm, sqrt(group_sum(sum(g * g))).
Sym group_sum(Sym a); // the sum over the tensor's param group
Sym group_max(Sym a); // the largest over the tensor's param group, NaN-propagating

// torch._foreach_* with torch's evaluation order.
Sym foreach_add(Sym self, Sym other, Sym alpha);          // self + alpha * other
Sym foreach_addcmul(Sym self, Sym t1, Sym t2, Sym value); // self + value * t1 * t2
Sym foreach_addcdiv(Sym self, Sym t1, Sym t2, Sym value); // self + value * (t1 / t2)
// torch.mm and torch.addmm of each tensor's matrices (ops mm, addmm: ir/ops.def), op(X) being X^T where `transpose_`
// says: op(a) op(b), and beta input + alpha op(a) op(b) (beta, alpha per-tensor), the products in `dtype` (bf16 or
// f32: operands rounded to it, f32 sums, the result rounded once).
Sym mm(Sym a, Sym b, bool transpose_a, bool transpose_b, Dtype dtype);
Sym addmm(Sym input, Sym a, Sym b, Sym beta, Sym alpha, bool transpose_a, bool transpose_b, Dtype dtype);
Sym foreach_lerp(Sym self, Sym end, Sym weight); // torch's: self + weight * (end - self) for |weight| < 0.5,
                                                 // end - (end - self) * (1 - weight) otherwise

} // namespace optjit
