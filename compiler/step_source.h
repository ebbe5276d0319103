// StepSource: what the driver compiles and runs, seen from below the frontend. An optimizer (frontend/optim) is
// one: it owns the params, their state and the param groups, splits the params into buckets that share one traced
// list graph, traces a bucket, and gathers a bucket's arguments for one step. The driver never sees an optimizer's
// options or algorithm, only these answers.
#pragma once

#include "compiler/guards.h"
#include "compiler/param_state.h"
#include "ir/arguments.h"
#include "ir/ir.h"
#include "ir/op_semantics.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace optjit {

struct BucketMember {
  int group;    // its param group
  int64_t flat; // its index over all params, in group order
};

// Params that run under one traced list graph: the same device, dtype and group structure.
struct ParamBucket {
  Dtype dtype;
  Device device;
  std::string structure_key;       // the group structure the graph was traced for ("amsgrad=1,maximize=0")
  std::vector<Dtype> state_dtypes; // the storage dtype of each state entry, in the source's order (a quantized
                                   // entry's: its codes')
  std::vector<std::optional<SlotBlocks>> state_blocks; // per state entry: its block-quantized format, if any
  std::vector<BucketMember> members;
  // The params are on a device and some of their scalar state entries in host memory (torch's steps that are not
  // capturable), bit k for the k-th entry, the same in every member: the driver runs the bucket
  // with_scalar_state_on_host (compiler/backends/host_scalar_state.h).
  uint64_t host_scalar_entries = 0;
};

// The carried values a grad pass graph stores each tensor's results in: its contribution to the total norm, and the
// sum of its elements times 0 (0 when every element is finite, NaN when one is an inf or a NaN).
inline constexpr const char* kGradNormCarry = "grad_norm";
inline constexpr const char* kGradNonfiniteCarry = "grad_nonfinite";

// What a step's grad pass computes (StepSource::grad_pass): the driver builds each bucket's pass from it
// (compiler/grad_pass.h) and runs it before the update.
struct GradPass {
  bool clips = false;         // each tensor's contribution to the total grad norm (clip_grad_norm_ fused)
  double norm_type = 2.0;     // 2 or infinity
  bool checks_finite = false; // the in-step inf check: whether an element is an inf or a NaN
  std::string grad_divisor;   // the hyperparameter the grads are divided by before the norm (grad_scale); empty: none
  std::string coefficient; // with clips: the hyperparameter the update multiplies the grads by (the clip coefficient)
  bool any() const { return clips || checks_finite; }
};

// A clipping step's total grad norm from each tensor's contribution (its sum of squares for the 2-norm, its largest
// |element| for the infinity norm), combined in the order they are added: a sum then its square root, or the largest
// (NaN-propagating). No tensor at all gives 0, as clip_grad_norm_ of no grads does. The driver and the forloop
// reference combine with it alike.
class GradNormTotal {
public:
  explicit GradNormTotal(double norm_type)
      : l2_(norm_type == 2.0), partial_(l2_ ? 0.0 : -std::numeric_limits<double>::infinity()) {}
  // A tensor's contribution: for the 2-norm its sum of squares, which becomes its norm rounded to the grad's dtype
  // (torch's clip_grad_norm_ takes each norm with _foreach_norm, in the grad's dtype, before it combines them: a
  // bf16 grad's norm is a bf16 number) and squared again; for the infinity norm its largest |element|, exact in any
  // dtype.
  void add(double contribution, Dtype grad_dtype) {
    if (l2_) {
      const double norm = round_to_dtype(grad_dtype, std::sqrt(contribution));
      contribution = norm * norm;
    }
    partial_ = combine(l2_, partial_, contribution);
  }
  // The sum of the contributions (2-norm) or their largest (-inf for none): what other processes' partials combine
  // with (combine) before the total is taken.
  double partial() const { return partial_; }
  double total() const { return total_of(l2_, partial_); }
  static double combine(bool l2, double a, double b) { return l2 ? a + b : max_propagating_nan(a, b); }
  static double total_of(bool l2, double partial) {
    return l2 ? std::sqrt(partial) : partial == -std::numeric_limits<double>::infinity() ? 0.0 : partial;
  }

private:
  bool l2_;
  double partial_;
};

// One bucket and the graph its params step with.
struct TracedBucket {
  ParamBucket bucket;
  Graph graph;
};

// What a step is, as the driver compiles it (StepSource::describe): one value, read once per compile.
struct StepDescription {
  // Every param in buckets, with a grad or not (which grads are present only changes the binding), each bucket
  // traced.
  std::vector<TracedBucket> buckets;
  // The grad pass (compiler/grad_pass.h), one reduction pass over each bucket's grads run before the update, when
  // the step clips its grads by their total norm or checks them for infs and NaNs itself.
  GradPass grad_pass;
  // Layouts. Kernels walk a param's tensors flat, which needs its param, grad and tensor state to share one dense
  // layout; the driver stages a param whose tensors do not (compiler/layout_staging.h). What it reads for that:
  // whether a param's kernels find rows and columns by element order (they need contiguous tensors then), per param
  // in flat order, and whether the step writes its grads (a staged grad is then copied back too).
  std::vector<bool> walks_rows_and_columns;
  bool writes_grads = false;
};

class StepSource {
public:
  virtual ~StepSource() = default;

  // One step at a time: a step reads and writes the source's params and state throughout, so a second one from
  // another thread is refused with an optjit::Error before it changes anything. Held for the length of a step (the
  // eager update, the driver's step); the same thread may hold it again inside (the eager update runs the driver).
  class Stepping {
  public:
    explicit Stepping(StepSource& source) : source_(source) {
      const std::thread::id me = std::this_thread::get_id();
      if (source_.stepping_owner_.load(std::memory_order_acquire) == me) {
        ++source_.stepping_depth_;
        return;
      }
      std::thread::id none;
      if (!source_.stepping_owner_.compare_exchange_strong(none, me, std::memory_order_acquire))
        throw Error(source_.name() + " is already being stepped (from another thread): step an optimizer from one "
                                     "thread at a time");
      source_.stepping_depth_ = 1;
    }
    ~Stepping() {
      if (--source_.stepping_depth_ == 0)
        source_.stepping_owner_.store(std::thread::id(), std::memory_order_release);
    }
    Stepping(const Stepping&) = delete;
    Stepping& operator=(const Stepping&) = delete;

  private:
    StepSource& source_;
  };

  virtual const std::string& name() const = 0;
  // Held by the source for its whole life. A compiled step keeps only a weak reference to it (it never keeps the
  // source, its params or its state alive) and refuses to run once it has expired.
  virtual std::weak_ptr<const void> lifetime() const = 0;
  virtual int64_t param_count() const = 0;
  virtual const Tensor& flat_param(int64_t flat) const = 0;
  // Per param group: the key of the structure its graph is traced for; a change recompiles.
  virtual int group_count() const = 0;
  virtual std::string group_structure_key(int group) const = 0;
  // Per param, in flat order: the storage dtypes of its state entries, packed (a change recompiles). Read again
  // whenever the state version changes.
  virtual std::vector<uint64_t> state_dtype_facts() const = 0;

  // What the step is, as the driver compiles it: its buckets, each traced, and what it needs around its kernels.
  // Read once per compile (the guards above say when a step needs another).
  virtual StepDescription describe() const = 0;
  // The bucket's tensors by slot (its state must exist: ensure_state()) and this step's hyperparameters.
  virtual ListArguments list_arguments(const ParamBucket& bucket) const = 0;
  // This step's hyperparameters: groups x names, in list_arguments' hyper_names order. Those of `left_on_device`
  // (device_hypers() facts the kernels read on the device) are not read back: their entries hold NaN wherever
  // device_hyper_addresses gives an address.
  virtual std::vector<double> hyper_values(const std::vector<DeviceHyper>& left_on_device) const = 0;
  // Per hyperparameter name that a param group holds in a 1-element f32 or f64 tensor on a device, the first such
  // group's dtype and device (a change recompiles). Read every step.
  virtual std::vector<DeviceHyper> device_hypers() const { return {}; }
  // Groups x names (as hyper_values): the device address of each value of `left_on_device` the group holds in a
  // tensor of that dtype on that device; null elsewhere (a number, or a tensor another fact would not describe).
  virtual std::vector<const void*> device_hyper_addresses(const std::vector<DeviceHyper>& left_on_device) const {
    (void)left_on_device;
    return {};
  }

  // The grad pass (StepDescription::grad_pass) runs every bucket's pass, combines the values over all buckets in a
  // fixed order (GradNormTotal; any non-zero check value is an inf or NaN) and hands the totals to take_grad_pass,
  // before reading hyper_values().
  struct GradPassTotals {
    double norm_partial = 0; // when the step clips: GradNormTotal::partial() over this process's grads
    bool nonfinite = false;  // whether a grad holds an inf or NaN, when the step checks
  };
  // Whether the source combines the grad pass's totals over processes itself (Optimizer::set_grad_norm_reducer,
  // set_inf_check_reducer); a step over shards (CompileOptions::shard_reducer) combines them through its reducer.
  virtual bool reduces_grad_pass_over_processes() const { return false; }
  // Takes the grad pass's totals; may throw optjit::Error (error_if_nonfinite). Returns false when the step must
  // change nothing: the check found an inf or NaN (found_inf is written, and the state this step created is gone).
  virtual bool take_grad_pass(const GradPassTotals& totals) = 0;
  // Whether this step's grad pass may leave its totals where its kernels ran, never read on the host
  // (DeviceGradTotal): the step decides nothing from them on the host (no error_if_nonfinite, no reducer of its own;
  // an in-step inf check only where the update's kernels skip on found_inf themselves). Read each step as a guard
  // fact (GuardFacts::grad_totals_may_stay_on_device): a change compiles the other program or finds it cached.
  virtual bool grad_totals_may_stay_on_device() const { return false; }
  // When they stay there, each step: first take_grad_totals_on_device gets the f64 1-element tensors on the device
  // that this step's total norm and clip coefficient will be in, before any hyperparameter is read. The total the
  // source may read when asked (a copy back then); the coefficient it gives as a hyperparameter on the device
  // (device_hyper_addresses, for GradPass::coefficient as a DeviceHyper of that tensor). Then clip_max_norm(), and
  // where else to write the total norm (an f64 1-element tensor on that device, or undefined).
  virtual void take_grad_totals_on_device(const Tensor& total_norm, const Tensor& coefficient) {
    (void)total_norm;
    (void)coefficient;
  }
  virtual double clip_max_norm() const { return 0; }
  virtual Tensor grad_norm_copy() const { return {}; }
  // With the in-step inf check: the f32 1-element tensor on that device to write 1 to for an inf or NaN (0 before
  // the step); the update's kernels read it there and change nothing when it is set.
  virtual Tensor found_inf_to_fill() const { return {}; }

  // Step-time checks, run before anything changes; they throw optjit::Error.
  virtual void check_hyperparameters() const = 0;
  virtual void check_grad(int64_t flat) const = 0;
  // Run when a param's data was replaced (or first bound): its state still fits it.
  virtual void check_state(int64_t flat) const = 0;
  // Run when any param's data or the state was replaced (or first bound): no two params that step, or their state
  // tensors, share memory (a step reads every param and state tensor before it writes any).
  virtual void check_params_distinct() const {}
  // Whether this step must change nothing (a gradient scaler found an inf or NaN): the driver then runs no check,
  // creates no state and launches nothing.
  virtual bool step_skipped() const = 0;
  // Asked after step_skipped() when the program that last ran does not read hyperparameters on the device
  // (Program::reads_hypers_on_device is false, or no program ran yet): for a step whose kernels decide whether to
  // skip (Optimizer::InfCheck::InKernels) on a flag that lives on a device, whether it is set, read back on the host
  // (the copy back is made anyway), so that the driver skips as step_skipped() would. False for any other step.
  virtual bool kernels_would_skip() const { return false; }
  // Creates the missing state of every param with a grad; returns whether any was created.
  virtual bool ensure_state() = 0;
  // Changes whenever state is created or a state buffer is replaced: bindings hold state addresses.
  virtual uint64_t state_version() const = 0;

  // A param's state: what layout staging copies (compiler/layout_staging.h).
  virtual const ParamState& flat_state(int64_t flat) const = 0;
  // After the launches of a step that was not skipped.
  virtual void after_step() = 0;

  // Runs the closure (when given), then `update`, between the step hooks; returns the closure's loss.
  virtual double run_with_step_hooks(const std::function<void()>& update,
                                     const std::function<double()>& closure = {}) = 0;

private:
  std::atomic<std::thread::id> stepping_owner_{};
  int stepping_depth_ = 0; // touched by the owner only
};

} // namespace optjit
