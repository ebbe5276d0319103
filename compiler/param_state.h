// A param's optimizer state: its entries by torch's key, in torch's key order. Scalar entries are 1-element tensors.
#pragma once

#include "runtime/tensor.h"

#include <string>
#include <utility>
#include <vector>

namespace optjit {

using ParamState = std::vector<std::pair<std::string, Tensor>>;

// The entry `key` of `state`; an undefined tensor when it has none.
Tensor find_state(const ParamState& state, const std::string& key);

} // namespace optjit
