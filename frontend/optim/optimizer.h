// The Optimizer base, as torch.optim.Optimizer: param groups with per-group options over the defaults, per-param
// state created lazily on a param's first step with a grad, step() and zero_grad(). A subclass supplies its
// algorithm three ways: traced foreach ops (trace), a plain scalar forloop reference (forloop_step), and the
// structure of a group (the options that change the algorithm's shape rather than its numbers).
#pragma once

#include "compiler/compiled_step.h"
#include "compiler/param_state.h"
#include "compiler/step_source.h"
#include "frontend/optim/hooks.h"
#include "frontend/optim/param_group.h"
#include "frontend/optim/state_spec.h"
#include "frontend/trace/foreach.h"
#include "ir/arguments.h"
#include "ir/ir.h"
#include "runtime/tensor.h"

#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace optjit {

class Optimizer;
using StepHook = std::function<void(Optimizer&)>;
using StateDictHook = std::function<void(Optimizer&, StateDict&)>;
using Closure = std::function<double()>; // re-evaluates the model, sets the grads and returns the loss

// Step hooks of every optimizer (torch.optim.optimizer.register_optimizer_step_pre_hook / _post_hook): global pre
// hooks run before an optimizer's own, global post hooks after its own.
HookHandle register_optimizer_step_pre_hook(StepHook hook);
HookHandle register_optimizer_step_post_hook(StepHook hook);

class Optimizer : public StepSource {
public:
  ~Optimizer() override;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& name() const override { return name_; }
  std::weak_ptr<const void> lifetime() const override { return lifetime_; }
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const OptionMap& defaults() const { return defaults_; }
  bool foreach () const { return foreach_; }
  // Whether `option` is a flag (0 or 1, printed True or False).
  bool is_flag(const std::string& option) const { return flags_.count(option) > 0; }
  // torch's print(opt) (Optimizer.__repr__): the class name, then each group's options sorted by key, as Python
  // prints them: "Adam (\nParameter Group 0\n    amsgrad: False\n    betas: (0.9, 0.999)\n ...)". The keys are
  // the options optjit keeps (torch's capturable, differentiable and fused are not among them) and foreach.
  std::string repr() const;
  // torch's copy.deepcopy(opt): an optimizer of the same class over copies of the params (their grads, values and
  // layouts copied), with its own param groups, defaults and state, so stepping either changes nothing of the
  // other. As torch's copy (Optimizer.__getstate__), it has no hooks and no gradient scaler; optjit's stochastic
  // rounding seed and step count are copied. The copied params are its param_groups()' params.
  std::unique_ptr<Optimizer> deep_copy() const;

  // One eager step: the forloop reference (foreach=false) or the interpreted foreach graph (foreach=true), between
  // the step hooks. Throws before anything changes when a grad or a hyperparameter is invalid.
  void step();
  // torch's step(closure): evaluates the closure (which sets the grads) after the pre hooks, then steps; returns
  // its loss.
  double step(const Closure& closure);
  // Runs the closure, when given, then `update`, between the step pre hooks (global, then this optimizer's) and
  // the post hooks (this optimizer's, then global), as torch's step wrapper does; returns the closure's loss (0
  // without one). Compiled steps run through it too.
  double run_with_step_hooks(const std::function<void()>& update, const Closure& closure = {}) override;
  // What the eager foreach steps' driver did (compiles of the interpreted graph, rebinds, staged params); null
  // before the first such step.
  const StepMetrics* eager_metrics() const;
  // set_to_none: every grad becomes None; otherwise grads are zeroed in place (buffers kept).
  void zero_grad(bool set_to_none = true);

  // A new group over params no group has yet; options not given take the defaults (torch's add_param_group).
  void add_param_group(ParamGroupSpec group);

  // torch's state_dict() and load_state_dict(). Loading checks everything first (optimizer, group count and sizes,
  // options, state keys and shapes) and changes nothing when any check fails; state tensors are copied into the
  // param's dtype. Group options are replaced by the loaded ones.
  StateDict state_dict();
  void load_state_dict(StateDict state_dict);

  HookHandle register_step_pre_hook(StepHook hook) { return step_pre_hooks_.add(std::move(hook)); }
  HookHandle register_step_post_hook(StepHook hook) { return step_post_hooks_.add(std::move(hook)); }
  // Pre: hook(optimizer) before the dict is built. Post: hook(optimizer, dict) may change the dict returned.
  HookHandle register_state_dict_pre_hook(StepHook hook, bool prepend = false) {
    return state_dict_pre_hooks_.add(std::move(hook), prepend);
  }
  HookHandle register_state_dict_post_hook(StateDictHook hook, bool prepend = false) {
    return state_dict_post_hooks_.add(std::move(hook), prepend);
  }
  // Pre: hook(optimizer, dict) may change the dict before it is checked and loaded. Post: hook(optimizer) after.
  HookHandle register_load_state_dict_pre_hook(StateDictHook hook, bool prepend = false) {
    return load_state_dict_pre_hooks_.add(std::move(hook), prepend);
  }
  HookHandle register_load_state_dict_post_hook(StepHook hook, bool prepend = false) {
    return load_state_dict_post_hooks_.add(std::move(hook), prepend);
  }

  // State, by param identity. Entries hidden from torch's key set are left out of visible_state().
  const ParamState* state(const Tensor& param) const;
  ParamState visible_state(const Tensor& param) const;
  // Replaces one state buffer (same shape and dtype); compiled steps rebind to it.
  void set_state(const Tensor& param, const std::string& key, const Tensor& value);
  void clear_state();

  // The dtype new per-tensor scalar state (step, eta, mu, ...) is stored in: by default the dtype each param computes
  // in (its own, f32 for bf16 and f16). torch keeps it in its scalar dtype (f32 unless its default dtype is f64); a
  // step over torch's state sets that here.
  void set_scalar_state_dtype(std::optional<Dtype> dtype) {
    scalar_state_dtype_ = dtype;
    ++state_version_; // the dtypes of state yet to be made changed: compiled steps read them again
  }
  // A param whose state exists but lacks an entry its group's options now keep (amsgrad turned on after the state
  // was made): by default the step creates the entry; a step over torch's state refuses, as torch's step does (it
  // raises KeyError), since an entry torch's state lacks would live only in optjit.
  void set_refuse_incomplete_state(bool refuse) { refuse_incomplete_state_ = refuse; }
  Dtype new_state_dtype(const Tensor& param, const StateSpec& spec) const {
    if (spec.kind == StateKind::Scalar)
      return number_dtype(param.dtype());
    return spec.copies_param ? compute_dtype(param.dtype()) : param.dtype();
  }
  // The block-quantized format (ir.h's SlotBlocks: codes, and the f32 scales in the entry "<name>.scale") param
  // `flat`'s group keeps state entry `spec` in, whatever the param's size; none: plain. The default reads the group
  // option state_dtype.
  virtual std::optional<SlotBlocks> state_format(int64_t flat, const StateSpec& spec) const;
  // Whether new state entry `spec` of param `flat` is kept block-quantized, and how: state_format for a param under
  // torchao's size rule (quantizes_param_of); none: plain, in new_state_dtype. Held state keeps the format it was
  // made or adopted with (held_state_blocks).
  std::optional<SlotBlocks> new_state_blocks(int64_t flat, const StateSpec& spec) const;
  // The format of param `flat`'s state entry `spec`: as held (codes and scales say it, as torchao derives it), or as
  // new_state_blocks makes it; none for plain state.
  std::optional<SlotBlocks> state_blocks(int64_t flat, const StateSpec& spec) const;
  // The dtype of the 0-d tensors torch makes from Python numbers (torch.as_tensor: its default dtype) for params of
  // `param_dtype`: the scalar state dtype when set, otherwise the dtype the param computes in (f32 for bf16).
  Dtype number_dtype(Dtype param_dtype) const { return scalar_state_dtype_.value_or(compute_dtype(param_dtype)); }
  // The entries a new state of a param in group `group` gets, in torch's key order, with their starting values.
  std::vector<StateSpec> new_state_specs(int group) const;
  // The state param `flat` gets (its group's, with its own flags).
  std::vector<StateSpec> param_state_specs(int64_t flat) const;
  // Where adopted state comes from: made for a first step (hidden entries start at their initial value), or loaded
  // from a checkpoint (hidden entries take the value a loaded state implies).
  enum class StateOrigin { Fresh, Loaded };
  // Makes `visible` (torch's keys, any order; tensors the caller keeps alive, such as views of torch's) the whole
  // state of param `flat`; an empty list drops its state. Checks keys, shapes and devices first and changes nothing
  // when one is wrong; entries keep their own dtypes, which compiled steps guard on.
  void adopt_state(int64_t flat, const ParamState& visible, StateOrigin origin);
  uint64_t state_version() const override { return state_version_; }

  void after_step() override;

  // Gradient scaling as torch's fused optimizers take it (GradScaler sets `optimizer.grad_scale` and
  // `optimizer.found_inf`). `grad_scale`, when defined, divides every grad inside the step, in the compute dtype,
  // before maximize, weight decay and everything else; the grads themselves are never written. `found_inf`, when
  // defined and non-zero at a step, makes that step change nothing: no param, no state entry, no step counter, and no
  // state is created. Both are 1-element tensors, read at every step, so their values never recompile; switching
  // grad_scale on or off traces the step again. An undefined tensor turns either off. Every mode follows it.
  // `grads`: what a step that is not skipped leaves in the grads: the scaled grads as they were (never written), or
  // the unscaled ones, stored by the same kernel as torch's fused kernels do (GradScaler users read unscaled grads
  // after scaler.step(), whichever path torch took).
  // `check`: who fills found_inf. ByCaller: the caller did (GradScaler's own unscale-and-check pass). InStep (with a
  // found_inf that is 0 at the step): the step checks its grads itself, as given (before grad_scale divides them, as
  // GradScaler's check reads them), in the grad pass that also computes a clipping norm (one kernel per bucket before
  // the update); when any element is an inf or NaN it writes 1 to found_inf and changes nothing else, as a step
  // skipped by the caller's found_inf. The caller zeroes found_inf again before a step it wants checked.
  // InKernels: the caller filled found_inf, and the kernels read it (on the device where it lives, with no copy back
  // and no wait): a step with a non-zero found_inf writes every slot's old value back, so it changes nothing, as
  // torch's fused kernels return; the host does not decide, so state the step creates for first-time params stays
  // (zeros and step 0, as torch's fused step leaves it) and the step is not counted as skipped. Where the kernels
  // cannot read it on its device (kernels_would_skip), and with fused clipping whose norm must be read on the host
  // (error_if_nonfinite, which must not see the inf grads of a skipped step; a reducer), the host reads it and skips,
  // as ByCaller. An InStep check on a device likewise leaves its finding there for the kernels, where the grad
  // pass's totals may stay on the device (skips_in_kernels).
  enum class GradsAfterStep { Scaled, Unscaled };
  enum class InfCheck { ByCaller, InStep, InKernels };
  void set_grad_scaling(Tensor grad_scale, Tensor found_inf, GradsAfterStep grads = GradsAfterStep::Scaled,
                        InfCheck check = InfCheck::ByCaller);
  const Tensor& grad_scale() const { return grad_scale_; }

  // Gradient clipping fused into the step: exactly torch.nn.utils.clip_grad_norm_(params with grads, max_norm,
  // norm_type, error_if_nonfinite) before every step, over every group, dtype and device together (one norm for the
  // model): total = the 2-norm of all grads (norm_type 2) or their largest |element| (infinity); every grad is
  // multiplied by min(max_norm / (total + 1e-6), 1) inside the step, and the grads themselves are never written. The
  // norm is a reduction pass of its own over the grads (compiled and eager steps: a kernel per bucket before the
  // update), so a clipped step is two passes over the grads. A grad_scale divides the grads before the norm. A
  // non-finite norm with error_if_nonfinite throws even when an in-step inf check skips the step, after writing 1 to
  // found_inf (as clip_grad_norm_ throws between GradScaler's unscale_, which has found the inf, and step).
  // std::nullopt turns it off; switching it on or off traces the step again, max_norm is a value.
  struct GradClipping {
    double max_norm = 1.0;
    double norm_type = 2.0; // 2 or infinity
    bool error_if_nonfinite = false;
  };
  void set_grad_clipping(std::optional<GradClipping> clipping);
  // When the params are shards of tensors spread over processes (FSDP2's DTensors), the norm is over the whole
  // tensors: `reducer(partial, l2)` gets this process's partial (its sum of squares for the 2-norm, its largest
  // |element| otherwise, -inf for none) and returns the partial over every process (an all-reduce with sum or max),
  // before the square root. Called from the step, on the stepping thread; empty: this process's alone.
  using GradNormReducer = std::function<double(double partial, bool l2)>;
  void set_grad_norm_reducer(GradNormReducer reducer) { grad_norm_reducer_ = std::move(reducer); }
  // Likewise for the in-step inf check over shards: `reducer(found)` returns whether any process found an inf or NaN
  // (an all-reduce with max, as torch's DTensor check reduces found_inf), so that every process skips the same
  // steps. Called at every checked step before the norm's reducer.
  using InfCheckReducer = std::function<bool(bool found)>;
  void set_inf_check_reducer(InfCheckReducer reducer) { inf_check_reducer_ = std::move(reducer); }
  const std::optional<GradClipping>& grad_clipping() const { return clipping_; }
  // The total norm of the last clipped step, before clipping (what clip_grad_norm_ returns); NaN before one. A
  // compiled step on a GPU may leave it there (grad_totals_may_stay_on_device): reading it copies it back then.
  double total_grad_norm() const {
    return grad_norm_on_device_.defined() ? grad_norm_on_device_.item() : total_grad_norm_;
  }
  // Where a step whose norm stays on the device writes it too: an f64 1-element tensor on that device, or undefined
  // for none. The Python package gives one per step (its total_norm).
  void set_grad_norm_copy(Tensor copy) { grad_norm_copy_ = std::move(copy); }
  // Whether the last clipped step left its norm on the device, and wrote it into the copy set (one on another device
  // or of another kind is not written).
  bool grad_norm_on_device() const { return grad_norm_on_device_.defined(); }
  bool grad_norm_copied() const;

  // Stochastic rounding (group option stochastic_rounding, bf16 params): the bits of element e of param p's slot s at
  // this optimizer's n-th step are rounding_bits(rounding_counter(seed, n), p x 16 + s, e), the same in every mode
  // and on every device. `n` counts the steps taken (skipped ones excluded) and is not part of state_dict: a resumed
  // run sets it back with the seed to continue the same stream.
  void set_stochastic_rounding(uint64_t seed, uint64_t steps_taken = 0) {
    rounding_seed_ = seed;
    rounding_steps_ = steps_taken;
  }
  uint64_t stochastic_rounding_steps() const { return rounding_steps_; }
  const Tensor& found_inf() const { return found_inf_; }
  bool step_skipped() const override; // found_inf is set and non-zero now, and the host decides (not InKernels)
  // On the CPU the kernels read found_inf's value from their table (no wait): only a device's is read back here,
  // once a step (hyper_values uses the value read).
  bool kernels_would_skip() const override;

  // What compiled and eager steps build on (compiler/step_source.h).
  using Member = BucketMember;
  using Bucket = ParamBucket;
  // Params grouped by (device, dtype, structure); one list graph (one kernel) each. Eager steps bucket the params
  // with grads; compiled steps bucket every param, since which grads are present only changes the binding.
  enum class BucketMembers { WithGrads, All };
  std::vector<Bucket> make_buckets(BucketMembers members = BucketMembers::WithGrads) const;
  // The step as the driver compiles it: every param's bucket (BucketMembers::All) traced, the grad pass, and what
  // layout staging reads.
  StepDescription describe() const override;
  Graph trace_bucket(const ParamBucket& bucket) const;
  // The dtype a bucket's step computes element values in: its params' compute dtype (bf16 and f16 in f32, complex in
  // its component), or f64 where a state tensor is f64 beside narrower params: torch's ops on them promote.
  Dtype bucket_compute_dtype(const ParamBucket& bucket) const;
  // The dtype a step computes in for params and state of `dtype`: their compute dtype (f32 for bf16 and f16). An
  // optimizer that computes in f32 whatever its params (torchao's low-bit Adams: f64 params too) says so.
  virtual Dtype step_compute_dtype(Dtype dtype) const { return compute_dtype(dtype); }
  // The slots a bucket's step declares, by role: the param and its grad in the bucket's dtype, then each state
  // entry in its storage dtype.
  std::vector<Slot> slots(const Structure& structure, const ParamBucket& bucket) const;
  ListArguments list_arguments(const ParamBucket& bucket) const override;
  // What the step's grad pass computes (compiler/step_source.h): gradient clipping, the in-step inf check.
  GradPass grad_pass() const;
  bool has_grad_pass() const { return grad_pass().any(); }
  bool clips_grads() const { return clipping_.has_value(); }
  bool checks_grads_finite() const { return inf_check_ == InfCheck::InStep && found_inf_.defined(); }
  // Whether the update's kernels keep every old value when found_inf is set (the traced structure's
  // found_inf_in_kernels): InKernels without clipping; and, for a found_inf on a device, InKernels with clipping and
  // the in-step check, where the grad pass's totals may stay on that device (nothing decided on the host from them).
  bool skips_in_kernels() const;
  bool take_grad_pass(const GradPassTotals& totals) override;
  bool reduces_grad_pass_over_processes() const override { return grad_norm_reducer_ || inf_check_reducer_; }
  bool grad_totals_may_stay_on_device() const override;
  Tensor found_inf_to_fill() const override { return checks_grads_finite() ? found_inf_ : Tensor(); }
  double clip_max_norm() const override { return clipping_ ? clipping_->max_norm : 0.0; }
  Tensor grad_norm_copy() const override;
  void take_grad_totals_on_device(const Tensor& total_norm, const Tensor& coefficient) override;
  // This step's hyperparameters: groups x step_hyper_names(), read from the groups' options (and grad_scale), those
  // held on a device as `left_on_device` describes left there (NaN).
  std::vector<double> hyper_values(const std::vector<DeviceHyper>& left_on_device) const override;
  // The hyperparameters the groups hold in tensors on a device (tensor options, a GradScaler's scale there).
  std::vector<DeviceHyper> device_hypers() const override;
  std::vector<const void*> device_hyper_addresses(const std::vector<DeviceHyper>& left_on_device) const override;
  // hyper_names(), and "grad_scale" while gradient scaling is on (the same value in every group).
  std::vector<std::string> step_hyper_names() const;
  // The 1-element f32 or f64 tensor on a device (not the CPU) that group `g` holds hyperparameter `name` in (for
  // "grad_scale", the scaler's), or null.
  const Tensor* device_operand(std::size_t g, const std::string& name) const;
  // The tensor of group `g`'s `name` when it is one of `left_on_device` (that fact's dtype and device), or null.
  const Tensor* left_on_device_operand(std::size_t g, const std::string& name,
                                       const std::vector<DeviceHyper>& left_on_device) const;
  // The flags a group's step is traced with: the subclass's structure(), whether grads are unscaled and whether
  // the group keeps master weights.
  Structure traced_structure(const ParamGroup& group) const;
  // The same, with the flags a subclass adds for one param (param_structure): what param `flat` is stepped with.
  Structure param_traced_structure(int64_t flat) const;
  // Whether param `flat`'s step keeps rows or columns (its kernels then walk contiguous tensors).
  bool param_traced_structure_has_axes(int64_t flat) const;
  // Whether param `flat`'s kernels find rows and columns by element order (its rows or columns state, or a step
  // that sums along them), so that a param that is not contiguous steps through contiguous copies.
  virtual bool walks_rows_and_columns(int64_t flat) const { return param_traced_structure_has_axes(flat); }
  // The state a param of a group with these flags keeps: the subclass's state_specs(), then `master_param` (an f32
  // copy of a bf16 or f16 param the step updates, rounding the param from it) when master_weights is on, and the
  // hidden `_rounding_stream` (the param's index) when stochastic_rounding is on.
  std::vector<StateSpec> step_state_specs(const Structure& structure) const;
  // Step-time checks, run before anything is mutated. Hyperparameters must be finite (a grad scale positive too, and
  // the params of a group with master weights bf16 or f16); a grad must have its param's shape, dtype and device,
  // and neither may overlap itself in memory.
  void check_hyperparameters() const override;
  void check_grad(int64_t flat) const override;
  // The param's state has the shapes the param's own give (`p.data = x` of another shape keeps the old state, which
  // the kernels would read past: torch refuses that step too) and the param's device.
  void check_state(int64_t flat) const override;
  // Params with grads, and their tensor state, that share memory (`buf[:, ::2]` and `buf.t()[0]`, or a param that
  // is its own exp_avg) are refused: a step reads every param and state tensor before it writes any, where torch's
  // single-tensor step writes one before it reads the next.
  void check_params_distinct() const override;
  void check_step() const; // every hyperparameter, every present grad and its param's state, distinct params
  // Creates the missing state of every param that has a grad; returns whether any was created.
  bool ensure_state() override;
  // The storage dtypes of a param's state entries (the dtypes they would be created in, for entries not made yet).
  std::vector<uint64_t> state_dtype_facts() const override;
  int group_count() const override { return static_cast<int>(groups_.size()); }
  std::string group_structure_key(int group) const override {
    return traced_structure(groups_[static_cast<std::size_t>(group)]).key();
  }

  int64_t param_count() const override { return static_cast<int64_t>(flat_params_.size()); }
  const Tensor& flat_param(int64_t i) const override { return flat_params_[static_cast<std::size_t>(i)]; }
  const ParamState& flat_state(int64_t i) const override { return states_[static_cast<std::size_t>(i)]; }
  void check_precision_options() const;
  // A group's state_dtype: one of its values, on an optimizer whose state it can hold, over real params.
  void check_state_dtype(const ParamGroup& group, std::size_t index) const;
  bool any_stochastic_rounding() const;
  int group_of_flat(int64_t i) const { return flat_group_[static_cast<std::size_t>(i)]; }

  virtual Structure structure(const ParamGroup& group) const = 0;
  // Flags that depend on the param itself, beside its group's (Adafactor factors params of rank >= 2): params whose
  // flags differ run in buckets, and keep state, of their own.
  virtual void param_structure(const Tensor& /*param*/, Structure& /*s*/) const {}
  // Whether param_structure adds anything (else the per-group structures serve every param, computed once).
  virtual bool has_param_structure() const { return false; }
  virtual std::vector<StateSpec> state_specs(const Structure& structure) const = 0;
  virtual std::vector<std::string> hyper_names() const = 0;
  // The options a step reads and checks for finiteness before anything changes: the hyperparameters, and any option
  // that seeds new state (Rprop's lr).
  virtual std::vector<std::string> step_options() const { return hyper_names(); }
  // Hyperparameter `name`'s value for this step of `group`: its option, unless the optimizer makes more of it
  // (Adafactor's default eps1 depends on the group's params). A value held in a tensor on a device that the kernels
  // read there does not pass through here: an override must be the identity on tensor-held values.
  virtual double hyper_value(const ParamGroup& group, const std::string& name) const { return group.get(name); }
  virtual void trace(Tracer& tracer, const Structure& structure) const = 0;
  // The forloop reference (foreach=false): the algorithm for one param, element by element, in the param's compute
  // dtype. Optional for an optimizer written outside optjit: one that has none keeps has_forloop_reference() false,
  // and a forloop step then throws optjit::Error saying so, before anything changes.
  virtual void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const;
  virtual bool has_forloop_reference() const { return false; }
  // Throws optjit::Error with torch's message when a group's options break the optimizer's rules.
  virtual void validate_options(const OptionMap& options) const = 0;
  // Step-time checks of a group's options, which may have changed since construction (torch checks them only
  // there): options its step cannot take at all, refused before anything changes.
  virtual void check_step_options(const ParamGroup& /*group*/, std::size_t /*index*/) const {}
  // Why this optimizer cannot keep `group`'s state block-quantized (the group option state_dtype, state_dtype.h),
  // or empty where it can: its state is not per-element moments (Adafactor's factored rows and columns, ASGD's
  // average of the param), its step reads state another way (Muon's products), or it subtracts two moments that
  // are rounded apart (centered RMSprop).
  virtual std::string state_dtype_refusal(const ParamGroup& /*group*/) const { return {}; }
  // Whether the step refuses non-finite hyperparameters (torch.optim's options are finite); a step function takes
  // whatever its caller passes, as torch's ops take any number (a max_norm of inf only measures the norm).
  virtual bool requires_finite_hyperparameters() const { return true; }

  // Whether a step writes its grads: the unscaled grads of gradient scaling, or a step function that stores to its
  // grad list. A staged param's grad copy is then written back after the launch, and an overlapping grad refused.
  virtual bool writes_grads() const { return stores_unscaled_grads(); }

protected:
  // `flags`: the options that are flags (0 or 1 in every group, loaded ones included).
  Optimizer(std::string name, OptionMap defaults, bool foreach, std::set<std::string> flags);
  // Throws unless every flag option of `options` is 0 or 1; `where` names the group in the message.
  void check_flags(const OptionMap& options, const std::string& where) const;
  // Validates each group's options (the subclass's rules) and adds the groups. Call from the subclass
  // constructor, where the subclass's validate_options is callable.
  void add_param_groups(std::vector<ParamGroupSpec> groups);
  // Creates the state of every param now, grad or not (torch's Adagrad does so in its constructor).
  void create_state_for_every_param();
  // Whether params get their state as soon as they join (Adagrad), rather than on their first step with a grad.
  virtual bool creates_state_on_add() const { return false; }
  // The value a new state entry starts at; the spec's `initial` unless a group option decides it.
  virtual double initial_state_value(const ParamGroup& group, const StateSpec& spec) const;
  // Whether a state dict saved by the optimizer class `saved` loads into this one. torch checks no class at all;
  // optjit loads the state of its own class, and of classes that are this one under other options (AdamW is Adam
  // with decoupled_weight_decay), whose state has the same keys and meaning.
  virtual bool loads_state_of(const std::string& saved) const;
  // A loaded group's options as this class keeps them (AdamW's decoupled_weight_decay is always true, as torch's
  // AdamW.__setstate__ makes it).
  virtual void adjust_loaded_options(OptionMap&) const {}

private:
  std::string name_;
  std::shared_ptr<const int> lifetime_ = std::make_shared<const int>(0);
  OptionMap defaults_;
  bool foreach_;
  std::vector<ParamGroup> groups_;
  std::vector<Tensor> flat_params_;
  std::vector<int> flat_group_;
  std::vector<ParamState> states_;
  std::optional<Dtype> scalar_state_dtype_;
  bool refuse_incomplete_state_ = false;
  Tensor grad_scale_, found_inf_;
  std::optional<GradClipping> clipping_;
  double total_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  double clip_coefficient_ = 1.0; // of this step: min(max_norm / (total + 1e-6), 1)
  // Of a step whose grad totals stayed on the device (take_grad_totals_on_device): the tensors they are in there.
  Tensor grad_norm_on_device_, clip_coefficient_on_device_;
  Tensor grad_norm_copy_;
  InfCheck inf_check_ = InfCheck::ByCaller;
  mutable std::optional<double> found_inf_read_; // this step's, as kernels_would_skip read it (step_skipped clears)
  // Params given their first state by this step before its grad pass: dropped again when the pass refuses the step.
  std::vector<int64_t> state_created_since_grad_pass_;
  uint64_t rounding_seed_ = 0, rounding_steps_ = 0;
  // The total norm from this process's partial (GradNormTotal::partial), over every process with a reducer.
  double total_over_processes(double partial) const;
  GradNormReducer grad_norm_reducer_;
  // The state version, then the layout id of each param with a grad and of its tensor state, when
  // check_params_distinct last passed.
  mutable std::vector<uint64_t> distinct_params_checked_;
  InfCheckReducer inf_check_reducer_;
  // Whether this step's check found an inf or NaN in any process's grads.
  bool found_in_any_process(bool found) const { return inf_check_reducer_ ? inf_check_reducer_(found) : found; }
  // Clipping's total norm of this step: total_grad_norm_ and clip_coefficient_; throws for error_if_nonfinite.
  void set_total_grad_norm(double total);
  void drop_state_created_since_grad_pass();
  // Whether any element of the (unscaled) grads is an inf or NaN: the forloop's in-step inf check.
  static bool any_nonfinite(const std::vector<Tensor>& grads);
  // Whether a step writes the unscaled grads back (gradient scaling with GradsAfterStep::Unscaled).
  bool stores_unscaled_grads() const { return grad_scale_.defined() && grads_after_step_ == GradsAfterStep::Unscaled; }
  GradsAfterStep grads_after_step_ = GradsAfterStep::Scaled;
  std::unordered_map<uint64_t, int64_t> flat_index_of_uid_;
  std::set<std::string> flags_;
  uint64_t state_version_ = 0;
  HookList<StepHook> step_pre_hooks_, step_post_hooks_, state_dict_pre_hooks_, load_state_dict_post_hooks_;
  HookList<StateDictHook> state_dict_post_hooks_, load_state_dict_pre_hooks_;
  bool create_missing_state(bool only_params_with_grads);
  void eager_update();
  // forloop_step on a param stored in its compute dtype, or on compute-dtype copies of a low-precision param, its
  // grad and state, rounded back once at the end (see compute_dtype). Complex tensors step on their real views.
  void forloop_step_in_compute_dtype(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                                     ParamState& state);
  // forloop_step_in_compute_dtype over state without quantized entries (their values, dequantized, stand for them).
  void forloop_step_in_storage(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state);
  // load_state_dict's checks and the state it would install, per flat param; throws on the first mismatch.
  std::vector<ParamState> checked_loaded_state(const StateDict& loaded) const;
  // The whole state param `param` keeps under `specs`, from `given` (its visible entries by torch's keys, any
  // order), for load_state_dict and adopt_state: each visible entry is `visible_entry(spec, given tensor)` (which
  // checks and converts it), hidden entries start at their `loaded` value (`loaded`) or their initial one, and the
  // keys given must be exactly the visible keys kept. `id` names the param in messages; `flat` is its index.
  ParamState state_from_entries(const Tensor& param, const std::vector<StateSpec>& specs, const ParamState& given,
                                int64_t id, int64_t flat, bool loaded,
                                const std::function<Tensor(const StateSpec&, const Tensor&)>& visible_entry) const;
  std::unique_ptr<CompiledStep> eager_step_; // the foreach path: the driver with the interpreter backend
};

// The flags most optimizers trace with: maximize, weight_decay (non-zero) and, for optimizers with the option,
// decoupled_weight_decay (set only with a non-zero weight decay).
Structure maximize_and_weight_decay(const ParamGroup& group);

// What torch's decoupled weight decay multiplies the params by, 1 - lr * weight_decay. With the structure flag
// "lr_f32_tensor" (an f32 tensor lr) torch computes it in 0-d f32 tensors, each Python-float operand rounded to f32
// first, and a param of a wider dtype is multiplied by that f32 value (a 0-d tensor does not promote it).
Sym decoupled_decay_factor(Tracer& t, const Structure& s, Sym lr, Sym weight_decay);
// lr / divisor (a bias correction) as torch computes it: with "lr_f32_tensor", a 0-d f32 tensor, the Python-float
// divisor rounded to f32 first.
Sym lr_divided_by(Tracer& t, const Structure& s, Sym lr, Sym divisor);

// Declares an optimizer class's two constructors (a plain param list, or param groups; each with its options
// struct) and the algorithm it supplies to the Optimizer base.
#define OPTJIT_DECLARE_OPTIMIZER(Class, OptionsStruct)                                                                 \
  using Options = OptionsStruct;                                                                                       \
  Class(std::vector<Tensor> params, const Options& options = {});                                                      \
  Class(std::vector<ParamGroupSpec> groups, const Options& options = {});                                              \
  Structure structure(const ParamGroup& group) const override;                                                         \
  std::vector<StateSpec> state_specs(const Structure& structure) const override;                                       \
  std::vector<std::string> hyper_names() const override;                                                               \
  void trace(Tracer& tracer, const Structure& structure) const override;                                               \
  void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state)               \
      const override;                                                                                                  \
  bool has_forloop_reference() const override { return true; }                                                         \
  void validate_options(const OptionMap& options) const override;

// A constructor's plain list of params as one param group; an empty list is torch's error.
std::vector<ParamGroupSpec> one_param_group(std::vector<Tensor> params);

// The state entry of master weights (group option master_weights).
inline const std::string kMasterParam = "master_param";
// The hidden state entry holding a param's stochastic rounding stream (its flat index), and the step's counter.
inline const std::string kRoundingStream = "_rounding_stream";
inline const std::string kRoundingCounter = "rounding_counter";
// The hyperparameter a clipping step multiplies its grads by: min(max_norm / (total norm + 1e-6), 1).
inline const std::string kClipCoefficient = "clip_coef";
// The hyperparameter whose non-zero value has every store of a step keep the old value (InfCheck::InKernels).
inline const std::string kFoundInf = "found_inf";

} // namespace optjit
