// What the files of the Optimizer class share (frontend/optim/optimizer*.cpp): host-side grad values of the eager
// steps, state checks, and the per-param structures the state and the step source derive. Internal: not installed.
#pragma once

#include "frontend/optim/optimizer.h"

#include <string>
#include <vector>

namespace optjit::optimizer_detail {

// `grad` divided by a grad scale, and multiplied by a clip coefficient: in the compute dtype, contiguous, as the
// eager steps read them.
Tensor unscaled(const Tensor& grad, double scale);
Tensor clipped(const Tensor& grad, double coefficient);

// The forloop's partial grad norm: each grad's sum of squares (or largest |element|) in f64, combined in param order
// (GradNormTotal: each norm rounded to its grad's dtype, as torch's).
double forloop_grad_norm(const std::vector<Tensor>& grads, double norm_type);

// The format of held block-quantized codes and scales (ir/block_slots.h's held_block_format, the spec saying which
// map), and their block: the values over the scales (0 when there are none: refused by name when bound). An empty
// param's (a process's empty shard) show neither: `group_format`, its group's, when its codes are of that format.
SlotBlocks held_blocks(const StateSpec& spec, const Tensor& codes, const Tensor& scales, int64_t numel,
                       const std::optional<SlotBlocks>& group_format = std::nullopt);
// A new block-quantized state entry of `param`, every value `initial`: its codes and its scales.
std::pair<Tensor, Tensor> new_block_state(const SlotBlocks& blocks, const Tensor& param, double initial);
// The block-quantized format of each of the param's state entries (none for plain ones), held or to be created.
std::vector<std::optional<SlotBlocks>> state_blocks_of(const Optimizer& o, int64_t flat,
                                                       const std::vector<StateSpec>& specs);
// Whether state entry `t` has the shape `spec` gives it for `param`: one element for a scalar, else state_shape.
bool state_fits(const StateSpec& spec, const Tensor& t, const Tensor& param);

// Whether state entry `t` may live where it does for `param`: on the param's device or, for a scalar entry of a
// param on a GPU, in host memory (where torch keeps `step` for steps that are not capturable).
bool state_device_fits(const StateSpec& spec, const Tensor& t, const Tensor& param);

// Which entries of the param's state are scalars held in host memory while the param is on a GPU
// (state_device_fits): bit k for the k-th entry. torch keeps `step` there for steps that are not capturable, and
// load_state_dict moves the other scalars (NAdam's mu_product, ASGD's eta) to the param's device, so a param may
// have some of each.
uint64_t host_scalar_entries(const ParamState& state, const Tensor& param);

// The storage dtype of each of the param's state entries, existing or still to be created.
std::vector<Dtype> state_dtypes_of(const Optimizer& o, int64_t flat, const std::vector<StateSpec>& specs);

// The structure key and state specs each param steps with: derived once per group, or once per param when the
// optimizer adds flags per param (Optimizer::param_structure).
class ParamStructures {
public:
  struct Entry {
    std::string key;
    std::vector<StateSpec> specs;
  };
  explicit ParamStructures(const Optimizer& o) : optimizer_(o) {
    if (!o.has_param_structure())
      for (const ParamGroup& group : o.param_groups())
        by_group_.push_back(entry(o.traced_structure(group)));
  }
  // Valid until the next call.
  const Entry& of(int64_t flat) {
    if (!by_group_.empty())
      return by_group_[static_cast<std::size_t>(optimizer_.group_of_flat(flat))];
    return this_param_ = entry(optimizer_.param_traced_structure(flat));
  }

private:
  Entry entry(const Structure& s) const { return {s.key(), optimizer_.step_state_specs(s)}; }
  const Optimizer& optimizer_;
  std::vector<Entry> by_group_;
  Entry this_param_;
};

} // namespace optjit::optimizer_detail
