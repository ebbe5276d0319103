// What an optimizer's state is made of: the kind and starting value of each entry (StateSpec), and torch.optim's
// state_dict() as a value (StateDict).
#pragma once

#include "compiler/param_state.h"
#include "frontend/optim/param_group.h"
#include "runtime/tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace optjit {

// Per element (the param's shape), one per tensor, or one per row ([..., m, 1]) or per column ([..., 1, n]) of a param
// of rank >= 2 (Adafactor's factored second moment).
enum class StateKind { Tensor, Scalar, Rows, Cols };
// The shape of a state entry of `kind` for a param of shape `param`.
Shape state_shape(StateKind kind, const Shape& param);

struct StateSpec {
  std::string name;
  StateKind kind = StateKind::Tensor;
  double initial = 0;             // every element starts at this value
  bool visible = true;            // false: internal bookkeeping, not part of torch's state keys (named "_...")
  double loaded = 0;              // hidden entries: the value a param's state loaded by load_state_dict implies
  bool copies_param = false;      // starts as a copy of its param, stored in the compute dtype (master weights)
  bool holds_param_index = false; // holds its param's flat index (the stochastic rounding stream)
  // Tensor entries an optimizer may keep block-quantized (Optimizer::new_state_blocks): whether their values take
  // both signs (a first moment: the signed map) or none (a second moment, a max of them: the unsigned map).
  bool signed_values = true;
};

// torch.optim's state_dict(): each group's options with its params as indices (groups in order, params in group
// order, counting from 0), and the state of every param that has any, by index, in torch's key order. The
// tensors are copies: a state dict is a snapshot.
struct StateDict {
  struct Group {
    OptionMap options;
    std::vector<int64_t> params;
    std::vector<std::string> param_names = {}; // torch >= 2.6's named state dicts: one per param, or empty
  };
  std::string optimizer; // torch's class name
  std::vector<Group> param_groups;
  std::map<int64_t, ParamState> state;
};

} // namespace optjit
