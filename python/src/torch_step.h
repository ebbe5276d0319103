// A torch.optim optimizer compiled by optjit: the C++ side of optjit.compile(opt). It builds optjit's optimizer of
// the same class over zero-copy views of the torch params, and at every step reads what torch users change between
// steps straight from the torch objects: hyperparameters (floats or tensors) from opt.param_groups, each param's
// grad (None, the same tensor, or a new one), a param whose data was replaced. The optimizer state stays torch's:
// the Python side creates it as torch does and hands it over (adopt), and the kernels update those tensors in place.
#pragma once

#include "compiler/compiled_step.h"
#include "frontend/optim/optimizer.h"
#include "torch_tensors.h"

#include <nanobind/nanobind.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace optjit::python {

// Keyword options as the registry takes them: numbers, flags as 0 or 1, pairs as two values.
using Keywords = std::map<std::string, std::vector<double>>;

class TorchStep {
public:
  // `name`: torch's class name; `param_groups`: the optimizer's live list of group dicts (read again every step);
  // `defaults` and `group_options`: its options as keywords; `scalar_dtype`: the torch dtype torch keeps scalar
  // state in.
  TorchStep(const std::string& name, nb::list param_groups, const Keywords& defaults,
            const std::vector<Keywords>& group_options, nb::handle scalar_dtype);

  // Whether `param_groups` (torch's list now) holds exactly the params this step was built over, group by group,
  // in order: a param replaced in a group's list (`group["params"][0] = other`) needs a new step.
  bool binds(nb::list param_groups) const;
  // Reads this step's hyperparameters from `param_groups` (torch's list now: load_state_dict replaces it), and
  // replaced param data and grads from the params. `none_values` (a dict per group, or None) says what a None
  // option of a group stands for in this step where the Python side knows better than the optimizer's own rule
  // (Adafactor's eps1 in torch's foreach step: the dtype torch's grouping puts first).
  void sync(nb::list param_groups, nb::object none_values);
  // GradScaler's `optimizer.grad_scale` and `optimizer.found_inf` (each a 1-element f32 tensor, or None) for this
  // step: optjit divides the grads by the scale inside the kernel and skips a step whose found_inf is non-zero.
  // `check_in_step`: found_inf holds 0, and the step checks the grads for infs and NaNs itself (in its grad pass),
  // writing 1 there and skipping when it finds one.
  void sync_grad_scaling(nb::object grad_scale, nb::object found_inf, bool check_in_step);
  // Gradient clipping fused into the step (torch.nn.utils.clip_grad_norm_ over every param with a grad, before the
  // update): `max_norm` None turns it off; `norm_type` 2 or inf.
  void set_grad_clipping(std::optional<double> max_norm, double norm_type, bool error_if_nonfinite);
  // For params that are shards spread over processes: `reducer(partial, l2)` all-reduces the norm's partial (a sum of
  // squares, or the largest |element|) and returns it; None: this process's alone. Called with the GIL taken.
  void set_grad_norm_reducer(nb::object reducer);
  // Likewise for the in-step inf check: `reducer(found)` returns whether any process found an inf or NaN.
  void set_inf_check_reducer(nb::object reducer);
  // The total grad norm of the last clipped step (NaN before one): read back when it stayed on the device.
  double total_grad_norm() const { return optimizer_->total_grad_norm(); }
  // The same as a step returns it: the copy set_grad_norm_copy gave when the norm stayed on the device and went
  // there (no copy back), a float otherwise.
  nb::object step_grad_norm() const;
  // Where a step whose norm stays on the device writes it too (Optimizer::set_grad_norm_copy): a 0-d float64 torch
  // tensor on the params' device, or None.
  void set_grad_norm_copy(nb::object copy);
  // Stochastic rounding's step count (the stream's position; seed 0): carried from a step built before, or from a
  // checkpoint, so that a rebuilt or resumed step continues the stream instead of drawing step 0's bits again.
  uint64_t stochastic_rounding_steps() const { return optimizer_->stochastic_rounding_steps(); }
  void set_stochastic_rounding_steps(uint64_t steps) { optimizer_->set_stochastic_rounding(0, steps); }
  // Whether this step changes nothing (found_inf is non-zero): step() then syncs nothing and makes no state.
  bool step_skipped() const { return optimizer_->step_skipped(); }
  // Params with a grad and no state yet, or without the master weights their group now keeps, by flat index (group
  // order): the Python side creates what they lack.
  std::vector<int64_t> params_without_state() const;
  // The state param `flat` gets, in torch's key order: (key, kind: "tensor", "scalar", "rows" or "cols", starting
  // value, starts as an f32 copy of the param, block-quantized layout or None), visible entries only. A
  // block-quantized entry (the group option state_dtype) is two tensors: its codes under `key` and its f32 scales
  // under "<key>.scale"; its layout says how to make them: (codes dtype "uint8" or "float8_e4m3fn", codes shape, the
  // byte every code starts as, the value each scale starts as, the block, the bits per code).
  // `shard_quantizes`: for a param that is a process's shard of a larger tensor (FSDP2's DTensor), whether the
  // whole tensor's state is quantized (decided for the whole tensor so that every process holds the same format,
  // python/optjit/_quantized_shards.py); none: the param's own size decides (torchao's rule, quantizes_param_of).
  nb::list new_state(int64_t flat, std::optional<bool> shard_quantizes) const;
  // The block of the quantized format param `flat`'s group keeps its state in (the largest over its entries); 0 for
  // plain state.
  int64_t state_block_size(int64_t flat) const;
  // Makes torch's `state` tensors (key -> tensor) the state of param `flat`; `loaded`: they come from a checkpoint
  // or an earlier step rather than being made for this one. An empty dict drops the param's state.
  void adopt(int64_t flat, nb::dict state, bool loaded);
  // Adopts again, as loaded, the state of every param whose entries in `state` (torch's opt.state, which users and
  // load_state_dict may edit between steps: an entry replaced, the param's dict replaced, emptied or deleted) are not
  // the tensors adopted. O(params) dict lookups, no Python call.
  void sync_state(nb::handle state);
  // The params that had a grad at the last sync(), as torch objects (the step writes them; the Python side counts up
  // their autograd versions). The same list object until a grad appears or goes.
  nb::list params_with_grads();
  // One compiled step (the update alone: the Python side runs torch's hooks around it), without the GIL. Returns
  // whether it ran: false when its own inf check skipped it (it then dropped the state it made; the Python side
  // drops torch's entries too).
  bool update();
  // A whole step in one call, as a steady-state step takes it: whether `param_groups` still holds this step's params
  // (binds), GradScaler's tensors (sync_grad_scaling), then, unless found_inf skips the step, torch's state
  // (sync_state) and this step's options and grads (sync), then the update. Returns False, having changed nothing,
  // when a group's list holds another param (the Python side builds a new step); None, before the update, when a
  // param steps for the first time (params_without_state): the Python side makes torch's state for it, adopts it and
  // calls update(). Else (whether the update ran, the total grad norm of a clipped step that ran or NaN,
  // params_with_grads()).
  nb::object step(nb::object grad_scale, nb::object found_inf, bool check_in_step, nb::handle state,
                  nb::list param_groups, nb::object none_values);

  int kernel_count();
  int library_call_count();
  nb::dict metrics() const;
  std::string dump(const std::string& stage, int gpu_sm);
  int64_t param_count() const { return static_cast<int64_t>(params_.size()); }

private:
  void check_flat(int64_t flat) const; // an Error for an index that is not a param's

  // A state entry adopted from torch: its key, the torch tensor, and the view the kernels write: of the tensor
  // itself, or of `staged`, a resolved copy of a tensor with torch's lazy negation or conjugation bit (written back
  // after each step, through torch, which resolves the bit as its own in-place ops do).
  // A torchao state tensor (OptimState8bit, OptimState4bit, OptimStateFp8) is held as its codes (`codes`, viewed by
  // `view`) and its scales (`scales`, viewed by `scales_view`), the memory its own step reads and writes.
  struct HeldState {
    nb::object key, tensor, staged = nb::none();
    Tensor view;
    nb::object codes = nb::none(), scales = nb::none();
    Tensor scales_view;
  };
  // Views of a torchao state tensor's codes and scales, as the optimizer's state entries `name` and `name.scale`,
  // after checking that its quantization map is the one optjit's kernels hold for that entry.
  void view_quantized_state(int64_t flat, const std::string& name, nb::handle tensor, HeldState& held,
                            ParamState& views) const;
  struct BoundParam {
    nb::object param;   // the torch param (a DTensor under FSDP2)
    std::string name;   // "param 3" in messages
    uintptr_t data = 0; // the local tensor's data_ptr the view was made at
    // The grad the view's grad slot was made from, by a weak reference: holding the grad would keep its memory
    // after zero_grad(set_to_none=True) until the next step, a whole set of grads more at the peak of a forward
    // pass, and would free it inside the next step (on a GPU, a call into torch's allocator per param).
    nb::object grad;                // a weakref.ref (None without a grad)
    bool has_grad = false;          // the view has a grad slot (its tensor may be gone since: the weak reference says)
    uintptr_t grad_data = 0;        // its data_ptr then (`grad.data = ...` keeps the object, not the memory)
    bool grad_resolved = false;     // the grad has a lazy bit: read through a resolved copy, made again every step
    nb::object resolved_grad;       // that copy, held for the step
    Tensor view;                    // optjit's param: a view of the local tensor (or of `staged`)
    nb::object staged = nb::none(); // a param with a lazy bit: its resolved copy, refreshed and written back
    std::vector<HeldState> state;   // torch's state its state views point into
  };
  // Where a C++ group option is read from: torch's key, and the element of a pair (-1: not a pair).
  struct OptionSource {
    std::string name, torch_key;
    int element = -1;
    nb::object tensor; // the torch tensor the option is held in, when it is one (Tensor lr)
    uintptr_t tensor_data = 0;
  };

  // A torch tensor a view was made of, and the memory it viewed, to make a view again only when either changes.
  struct HeldTensor {
    nb::object tensor = nb::none();
    uintptr_t data = 0;
    Tensor view;
  };
  // `held`'s view of `tensor` (undefined for None), made again only when the tensor or its memory changed.
  const Tensor& hold(HeldTensor& held, nb::object tensor, const std::string& what);
  void sync_options(std::size_t group, nb::handle none_values);
  void sync_param(BoundParam& p);
  // A view of `local` (param `p`'s local tensor) for the kernels: of the tensor itself, or of a resolved copy staged
  // in p.staged when it has a lazy negation or conjugation bit.
  Tensor param_view(BoundParam& p, nb::handle local);
  // Refuses a complex tensor with the conjugation bit where torch's step does: every optimizer but SGD views
  // complex tensors as real (torch.view_as_real), which refuses it.
  void check_conjugation(TorchTensors::LazyBits bits, const std::string& what) const;
  // Refuses adopted state torch's step would raise on: a tensor entry in another dtype than its param where torch's
  // ops refuse it, a loaded step count below 0 (torch's bias corrections divide by zero at its next step).
  void check_adopted(const BoundParam& p, const ParamState& views) const;
  // Staged tensors: their copies take the torch tensors' values before a step, and give them back after it.
  void refresh_staged();
  void write_back_staged();

  TorchTensors torch_;
  nb::list param_groups_;      // torch's list of group dicts at the last sync
  bool views_complex_as_real_; // torch's step views complex tensors as real (all but SGD)
  bool state_dtype_is_params_; // torch's step refuses state in another dtype than its param (its lerp_ does)
  bool any_staged_ = false;    // some param or state entry is staged
  std::vector<BoundParam> params_;
  std::unordered_map<PyObject*, std::size_t> flat_of_param_; // params_ by their torch object (held by params_)
  std::vector<nb::object> entries_seen_;                     // sync_state's walk: each param's state dict
  std::optional<nb::list> params_with_grads_;                // params_with_grads(), until a grad appears or goes
  std::vector<std::vector<OptionSource>> options_;
  HeldTensor grad_scale_, found_inf_;
  nb::object grad_norm_reducer_, inf_check_reducer_; // held here: the optimizer's reducers call them
  nb::object grad_norm_copy_;                        // the torch tensor the optimizer's norm copy views
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<CompiledStep> step_;
};

} // namespace optjit::python
